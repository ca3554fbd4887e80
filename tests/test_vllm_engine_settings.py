""":class:`VLLMEngineSettings`: what a vLLM engine is built from, checked on creation (no engine).

The keyword form of :class:`VLLMEngine` and :func:`runners.start_engine` both go through it, so its
checks and the ``vllm.LLM`` arguments it yields are those of every engine.
"""

from __future__ import annotations

import dataclasses

import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.integrations.vllm import runners
from relaxspec.integrations.vllm.offline import (
    DEFAULT_KV_CACHE_GIB,
    VLLMEngineSettings,
    engine_env,
    kv_cache_bytes,
    llm_arguments,
    model_dirs,
)
from relaxspec.models import model_dir
from relaxspec.params import DEFAULT_K


def test_keywords_split_into_fields_and_rule_parameters():
    s = VLLMEngineSettings.of("nucleus", theta=0.9, k=4, max_model_len=512)
    assert s == VLLMEngineSettings("nsd", {"theta": 0.9}, k=4, max_model_len=512)
    assert (s.method, s.k, s.max_model_len, dict(s.rule_params)) == ("nsd", 4, 512, {"theta": 0.9})
    assert s.rule is not None and s.rule.label() == "nsd(theta=0.9)"
    ar = VLLMEngineSettings.of("ar", stock=True)
    assert ar.rule is None and ar.k == DEFAULT_K and ar.stock
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.k = 8  # type: ignore[misc]


@pytest.mark.parametrize(
    ("keywords", "message"),
    [
        ({"method": "bogus"}, "unknown rule 'bogus'"),
        ({"method": "nsd", "stock": True}, "stock vLLM has no 'nsd' rule"),
        ({"method": "ar", "theta": 0.5}, "method 'ar' takes no rule parameters, got theta"),
        ({"method": "sd", "foo": 1}, r"unknown parameter\(s\) foo; rule parameters are theta"),
        ({"method": "sd", "rule": "nsd"}, r"unknown parameter\(s\) rule"),  # a derived field
        ({"method": "nsd", "theta": 1.5}, "theta must be a number in"),
        ({"method": "sd", "k": 0}, "k .draft length. must be an integer >= 1"),
        ({"method": "sd", "k": True}, "k .draft length. must be an integer"),
        ({"method": "sd", "tensor_parallel_size": 0}, "tensor_parallel_size must be an integer >= 1"),
        ({"method": "sd", "proposer": "eagle9"}, "proposer must be one of draft, block"),
        ({"method": "sd", "proposer": "diffusion", "stock": True}, "needs the relaxspec plugin"),
        ({"method": "sd", "prompt_lookup_max": 3}, "prompt_lookup_max is an option of proposer=ngram"),
        ({"method": "sd", "proposer": "ngram", "prompt_lookup_min": 5, "prompt_lookup_max": 2}, "at most"),
        ({"method": "sd", "proposer": "ngram", "draft": "models/draft"}, "drafts without a model"),
        ({"method": "sd", "kv_cache_gib": 0}, "kv_cache_gib .KV cache space in GiB. must be a number >="),
        ({"method": "sd", "kv_cache_gib": float("nan")}, "kv_cache_gib"),
    ],
)
def test_bad_settings_fail_on_creation(keywords, message):
    with pytest.raises(RelaxSpecError, match=message):
        VLLMEngineSettings.of(**keywords)


def test_llm_arguments_per_proposer():
    s = VLLMEngineSettings.of("nsd", theta=0.9, k=4, seed=3, max_model_len=256, llm_kwargs={"seed": 7})
    kwargs = llm_arguments(s, *model_dirs(s))
    assert kwargs["model"] == kwargs["tokenizer"] == str(model_dir("target"))
    assert kwargs["seed"] == 7 and kwargs["max_model_len"] == 256  # llm_kwargs last, over the rest
    assert kwargs["speculative_config"] == {
        "method": "draft_model",
        "model": str(model_dir("draft")),
        "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic",
    }
    stock = VLLMEngineSettings.of("sd", k=2, stock=True)
    assert llm_arguments(stock, *model_dirs(stock))["speculative_config"]["draft_sample_method"] == "greedy"
    ngram = VLLMEngineSettings.of("sd", proposer="ngram", k=3, prompt_lookup_min=2)
    assert model_dirs(ngram)[1] is None
    assert llm_arguments(ngram, *model_dirs(ngram))["speculative_config"]["method"] == "ngram"
    ar = VLLMEngineSettings.of("ar")
    assert model_dirs(ar)[1] is None and "speculative_config" not in llm_arguments(ar, *model_dirs(ar))
    with pytest.raises(RelaxSpecError, match="more than k = 2"):
        late = VLLMEngineSettings.of("sd", k=2, num_speculative_tokens_per_batch_size=[(1, 4, 4)])
        llm_arguments(late, *model_dirs(late))


def test_kv_cache_space_is_the_settings_or_vllms_variable(monkeypatch):
    """vLLM lets ``$VLLM_CPU_KVCACHE_SPACE`` (whole GiB) override ``kv_cache_memory_bytes``: the
    engine passes the bytes and keeps the variable out of vLLM's environment."""
    s = VLLMEngineSettings.of("sd", kv_cache_gib=0.25)
    assert llm_arguments(s, *model_dirs(s))["kv_cache_memory_bytes"] == 2**28
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert kv_cache_bytes(None) == DEFAULT_KV_CACHE_GIB * 2**30
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "3")
    assert kv_cache_bytes(None) == 3 * 2**30 and kv_cache_bytes(0.5) == 2**29
    for bad in ("1.5", "0"):
        monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", bad)
        with pytest.raises(RelaxSpecError, match="VLLM_CPU_KVCACHE_SPACE"):
            kv_cache_bytes(None)
    assert all(engine_env(stock, False)["VLLM_CPU_KVCACHE_SPACE"] is None for stock in (True, False))


def test_a_plan_becomes_settings_in_one_place():
    """:func:`runners.engine_settings`: a row's plan, models by role, and the runtime options."""
    plan = runners.row_plan("nsd", runners.resolve("nsd", {"theta": 0.8}), {})
    s = runners.engine_settings(plan, {"draft": "elsewhere"}, seed=5, multiprocessing=False)
    assert (s.method, dict(s.rule_params), s.k, s.proposer) == ("nsd", {"theta": 0.8}, DEFAULT_K, "draft")
    assert (str(s.draft), s.seed, s.multiprocessing, s.stock) == ("elsewhere", 5, False, False)
    peer = runners.engine_settings(runners.row_plan("vllm-ar", {}, {}), {})
    assert (peer.method, peer.stock, peer.target) == ("ar", True, model_dir("target"))
    ngram = runners.row_plan("vllm-ngram", runners.resolve("vllm-ngram", {"prompt_lookup_max": 3}), {})
    s = runners.engine_settings(ngram, {})
    assert (s.proposer, s.draft, s.lookup_window, s.stock) == ("ngram", None, (None, 3), True)


def test_a_calls_counters_cover_its_own_positions_after_a_longer_engine():
    """The worker's counters outlive an engine: after one with K = 8 served in the same process, a
    K = 4 engine's call reports 4 positions (and more only if it drafted deeper)."""
    from relaxspec.integrations.vllm.offline import _delta

    def counters(drafted, accepted, relaxed, rows=0, emitted=0):
        return {"rows": rows, "emitted": emitted, "drafted_per_pos": drafted,
                "accepted_per_pos": accepted, "relaxed_per_pos": relaxed}  # fmt: skip

    before = counters([9] * 8, [5] * 8, [1] * 8, rows=10, emitted=40)
    after = counters([12, 12, 11, 10, 9, 9, 9, 9], [8, 7, 6, 5, 5, 5, 5, 5], [2, 2, 1, 3, 1, 1, 1, 1], 13, 52)
    got = _delta(before, after, 4)
    assert (got["verify_rows"], got["emitted"], got["relaxed_accepted"]) == (3, 12, 4)
    assert got["drafted_per_pos"] == [3, 3, 2, 1] and got["accepted_per_pos"] == [3, 2, 1, 0]
    assert got["relaxed_per_pos"] == [1, 1, 0, 2]
    deeper = counters([12, 12, 11, 10, 10, 9, 9, 9], [8] * 8, [1] * 8)
    assert len(_delta(before, deeper, 4)["drafted_per_pos"]) == 5
    assert _delta(None, after, 4) is None

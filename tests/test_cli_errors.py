"""Issue 36: bad CLI values end in one line on stderr and exit code 2, never a traceback.

Run in-process through :func:`relaxspec.cli.main` (the console script's entry point)."""

from __future__ import annotations

import sys

import pytest

from relaxspec.cli import main


def run_main(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """``relaxspec ARGS`` in this process -> (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["relaxspec", *args])
    with pytest.raises(SystemExit) as exited:
        main()
    out, err = capsys.readouterr()
    return exited.value.code, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in lines[0], err


@pytest.mark.parametrize(
    "flag,value,needles",
    [
        ("--temperature", "1e-300", ("temperature", "greedy")),
        ("--temperature", "1e-40", ("temperature",)),
        ("--top-p", "1e-300", ("top_p",)),
        ("--temperature", "nan", ("temperature",)),
    ],
)
def test_generate_tiny_values(monkeypatch, capsys, model_dirs, flag, value, needles):
    target, draft = model_dirs
    args = ("generate", "--method", "sd", "--target", str(target), "--draft", str(draft), flag, value, "w1")
    assert_one_line_error(*run_main(monkeypatch, capsys, *args)[::2], *needles)


@pytest.mark.parametrize("port", ["70000", "0", "-1"])
def test_serve_port_out_of_range(monkeypatch, capsys, model_dirs, port):
    target, draft = model_dirs
    args = ("serve", "--method", "sd", "--target", str(target), "--draft", str(draft), "--port", port)
    assert_one_line_error(*run_main(monkeypatch, capsys, *args)[::2], "--port", "65535")


@pytest.mark.parametrize(
    "p,needle",
    [
        ("0.5,,0.5", "comma-separated"),
        ("0.5,0.5,", "comma-separated"),
        (",0.5,0.5", "comma-separated"),
        ("0.3,0.3", "summing to 1"),
        ("2,3", "summing to 1"),
        ("", "empty"),
        ("0.5;0.5", "comma-separated"),
    ],
)
def test_theory_malformed_distribution(monkeypatch, capsys, p, needle):
    code, out, err = run_main(monkeypatch, capsys, "theory", "--p", p, "--q", "0.5,0.5")
    assert_one_line_error(code, err, "--p", needle)
    assert out == ""


def test_theory_accepts_rounded_decimals(monkeypatch, capsys):
    code, out, err = run_main(monkeypatch, capsys, "theory", "--p", "0.33,0.33,0.34", "--q", "0.2, 0.3, 0.5")
    assert code == 0, err
    assert '"total_variation"' in out


@pytest.mark.parametrize(
    "args,needle",
    [
        (("generate", "--method", "sd", "--threads", "0", "w1"), "--threads must be an integer in 1..1024"),
        (("bench", "--methods", "ar", "--limit", "1", "--busy-neighbour", "-2"), "--busy-neighbour"),
        (("bench", "--methods", "ar", "--limit", "1", "--threads", "5000"), "--threads"),
    ],
)
def test_thread_and_neighbour_flags(monkeypatch, capsys, model_dirs, args, needle):
    target, draft = model_dirs
    full = (*args[:-1], "--target", str(target), "--draft", str(draft), args[-1])
    if args[0] == "bench":
        full = (*args, "--target", str(target), "--draft", str(draft), "--peers", "none")
    assert_one_line_error(*run_main(monkeypatch, capsys, *full)[::2], needle)

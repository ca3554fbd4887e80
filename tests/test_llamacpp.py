"""llama.cpp as a bench peer (issue 32, item 4): the client and its bench rows, against a stand-in
``llama-server`` (tests/fake_llama_server.py; the real one takes ~30 min to build:
scripts/llamacpp_peer.sh, not part of CI)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.eval.bench import BenchConfig, run_bench
from relaxspec.integrations import llamacpp
from relaxspec.models import bundled

FAKE = Path(__file__).with_name("fake_llama_server.py")


@pytest.fixture
def build(tmp_path, monkeypatch):
    """A llama.cpp directory as scripts/llamacpp_peer.sh lays it out, with the stand-in server."""
    root = tmp_path / "llamacpp"
    (root / "bin").mkdir(parents=True)
    (root / "gguf").mkdir()
    server = root / "bin" / "llama-server"
    server.write_text(
        f"#!{sys.executable}\nimport runpy\nrunpy.run_path({str(FAKE)!r}, run_name='__main__')\n"
    )
    server.chmod(0o755)
    for role in ("target", "draft"):
        for weights in llamacpp.WEIGHTS:
            (root / "gguf" / f"{role}-{weights}.gguf").write_bytes(b"GGUF")
    monkeypatch.setenv("FAKE_LLAMA_TOKENIZER", str(bundled("target")))
    monkeypatch.setenv("FAKE_LLAMA_LOG", str(tmp_path / "log.jsonl"))
    yield root
    llamacpp.close_all()


def _log(build: Path) -> list[dict]:
    return [json.loads(line) for line in (build.parent / "log.jsonl").read_text().splitlines()]


def test_bench_rows_of_llamacpp_ar_and_sd(build, tmp_path):
    config = BenchConfig(
        methods=["ar"],
        peers=["llamacpp-ar", "llamacpp-sd"],
        sets=[f"llamacpp-ar.dir={build}", f"llamacpp-sd.dir={build}", "llamacpp-sd.k=3"],
        limit=2,
        max_new_tokens=3,
        out=str(tmp_path / "out"),
        progress=False,
    )
    rows = {r["method"]: r for r in run_bench(config)["rows"]}
    for name in ("llamacpp-ar", "llamacpp-sd"):
        row = rows[name]
        assert row["errors"] == 0 and row["prompts"] == 2 and row["family"] == "llama.cpp"
        # llama.cpp's own prompt_ms + predicted_ms: 5 ms + 10 ms per token, 3 tokens per prompt
        assert row["new_tokens"] == 6 and row["seconds"] == pytest.approx(2 * 0.035)
    entries = _log(build)
    argvs = [e["argv"] for e in entries if "argv" in e]
    assert len(argvs) == 2  # one server per peer row, reused across prompts
    sd = next(a for a in argvs if "-md" in a)
    assert sd[sd.index("-md") + 1].endswith("gguf/draft-bf16.gguf")
    assert sd[sd.index("--spec-draft-n-max") + 1] == "3" and sd[sd.index("--spec-draft-p-min") + 1] == "0"
    assert sd[sd.index("-t") + 1] == "1" and sd[sd.index("-m") + 1].endswith("gguf/target-bf16.gguf")
    bodies = [e["completion"] for e in entries if "completion" in e]
    assert len(bodies) == 2 + 4  # a warm-up per row, then two prompts each
    assert all(b["cache_prompt"] is False and b["temperature"] == 0.0 for b in bodies)
    assert [b["n_predict"] for b in bodies[2:]] == [3] * 4  # the budget (the warm-ups take fewer)
    assert all(b["stop"] == ["\nQuestion:"] for b in bodies[2:])  # the dataset's stop strings


def test_the_eos_llamacpp_stopped_at_is_not_a_generated_token(build, tmp_path):
    from transformers import AutoTokenizer

    continuation = AutoTokenizer.from_pretrained(bundled("target"))(" 12\n#### 12", add_special_tokens=False)
    config = BenchConfig(methods=["ar"], peers=["llamacpp-ar"], sets=[f"llamacpp-ar.dir={build}"], limit=1,
                         max_new_tokens=64, out=str(tmp_path / "out"), progress=False)  # fmt: skip
    row = next(r for r in run_bench(config)["rows"] if r["method"] == "llamacpp-ar")
    assert row["errors"] == 0 and row["new_tokens"] == len(continuation["input_ids"])


def test_a_gguf_that_tokenizes_differently_fails_its_rows(build, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_LLAMA_SHIFT", "1")
    config = BenchConfig(methods=["ar"], peers=["llamacpp-ar"], sets=[f"llamacpp-ar.dir={build}"], limit=1,
                         max_new_tokens=2, out=str(tmp_path / "out"), progress=False)  # fmt: skip
    row = next(r for r in run_bench(config)["rows"] if r["method"] == "llamacpp-ar")
    assert row["errors"] == 1 and "tokenizes prompt" in row["error"]


def test_bad_parameters_and_missing_builds_are_clear_errors(tmp_path):
    with pytest.raises(RelaxSpecError, match="has no parameter depth"):
        llamacpp.resolve("llamacpp-sd", {"depth": 2})
    with pytest.raises(RelaxSpecError, match="weights of 'llamacpp-ar' must be one of bf16, q8_0"):
        llamacpp.resolve("llamacpp-ar", {"weights": "q4"})
    with pytest.raises(RelaxSpecError, match="threads of 'llamacpp-ar'"):
        llamacpp.resolve("llamacpp-ar", {"threads": 0})
    with pytest.raises(RelaxSpecError, match=r"not found; build llama.cpp .* scripts/llamacpp_peer.sh"):
        llamacpp.server(llamacpp.spec_of("llamacpp-ar", {"dir": str(tmp_path)}))

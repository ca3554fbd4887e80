"""The results directory: ``manifest.json`` plus append-only ``records.jsonl``.

The manifest holds the models with fingerprints and one entry per session with its command line
and environment. ``records.jsonl`` holds one JSON object per line, appended and fsync'ed as soon as
a generation is done: ``record`` lines — one cell on one prompt: tokens, text, seconds, the
engine's stats, quality, diagnostics counters or an error — and ``reference`` lines — greedy AR
tokens for agreement when the grid samples. The manifest is replaced whole
(:mod:`relaxspec.atomic`); a record torn by a kill is the last line, cut off at resume; a resume
refuses records the manifest does not account for (their models would be unknown).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from relaxspec import atomic
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.rows import Cell, latest_records

RECORDS = "records.jsonl"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


# ---------------------------------------------------------------------------------------------
# Results directory: manifest + append-only records


CARD_RECORDS = ("training.json", "sweep.json")


def model_fingerprint(path: Path) -> str:
    """Hash of a model's config, tokenizer and weight files (to detect a changed model on resume).

    The records a model card is written from (``training.json``, ``sweep.json``) are left out:
    recording a metric measured later must not make earlier results look like another model's.
    """
    h = hashlib.sha1()
    files = [path] if path.is_file() else sorted(f for f in path.iterdir() if f.is_file())
    for f in files:
        if f.name in CARD_RECORDS:
            continue
        if f.suffix in (".json", ".safetensors", ".bin", ".pt", ".txt", ".model"):
            h.update(f.name.encode())
            with f.open("rb") as fh:
                for block in iter(lambda: fh.read(1 << 20), b""):
                    h.update(block)
    return h.hexdigest()[:16]


class ResultsStore:
    """``<out>/manifest.json`` (models, sessions) and ``<out>/records.jsonl`` (one JSON per line)."""

    def __init__(self, out: str | Path) -> None:
        self.out = Path(out)
        if self.out.suffix == ".json":
            raise RelaxSpecError(f"--out is a directory for the results, not a .json file: {self.out}")
        try:
            self.out.mkdir(parents=True, exist_ok=True)
            probe = self.out / ".write-test"
            probe.write_text("")
            probe.unlink()
        except OSError as err:
            raise RelaxSpecError(f"cannot write results to {self.out}: {err.strerror or err}") from None
        self.records = load_records(self.out) if (self.out / RECORDS).exists() else []
        self.manifest = load_manifest(self.out)
        check_sessions(self.out, self.records, self.manifest)
        trim_torn_tail(self.out / RECORDS)  # appends start on a line of their own

    def check_models(self, fingerprints: dict[str, dict[str, str]]) -> None:
        """Resuming with different models would mix incomparable numbers: refuse."""
        for role, info in fingerprints.items():
            old = self.manifest["models"].get(role)
            if old is not None and old["fingerprint"] != info["fingerprint"]:
                raise RelaxSpecError(
                    f"{self.out} holds results of a different {role} model ({old['path']}); "
                    "use a new --out directory"
                )
            kernels = info.get("kernels", "-")  # "-": not a transformers model
            old_kernels = old.get("kernels", "hf") if old is not None and kernels != "-" else kernels
            if old_kernels != kernels:
                raise RelaxSpecError(
                    f"{self.out} holds results of the {role} model on {old_kernels} kernels, this run "
                    f"uses {kernels}; pass --kernels {old_kernels} or use a new --out directory"
                )
        self.manifest["models"].update(fingerprints)

    def start_session(self, command: str) -> str:
        session = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.manifest["sessions"].append({"id": session, "command": command, "environment": environment()})
        self.save_manifest()
        return session

    def save_manifest(self) -> None:
        atomic.write_json(self.out / MANIFEST, self.manifest)

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with (self.out / RECORDS).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def done(self) -> set[tuple[str, str]]:
        """(cell key, example) pairs with a successful record."""
        return {k for k, r in latest_records(self.records).items() if r.get("error") is None}


def parse_record(line: str) -> dict[str, Any]:
    """One line of ``records.jsonl`` as a record; ValueError if it is not one."""
    try:
        r = json.loads(line)
        if r.get("type") == "record":
            Cell.from_dict(r["cell"])
            assert isinstance(r["example"], str) and isinstance(r["tokens"], list)
            assert isinstance(r["seconds"], int | float)
        elif r.get("type") == "reference":
            assert isinstance(r["tokens"], list) and isinstance(r["example"], str)
        else:
            raise ValueError(r.get("type"))
    except (ValueError, KeyError, TypeError, AttributeError, AssertionError):
        raise ValueError("not a benchmark record") from None
    return r


def load_records(out: str | Path) -> list[dict[str, Any]]:
    """Every record of ``<out>/records.jsonl``; a malformed line is one clear error.

    A last line without its newline that is not a whole record is an append still in flight (or
    killed midway): it is skipped here, and :func:`trim_torn_tail` drops it before a resume.
    """
    path = Path(out) / RECORDS
    if not path.is_file():
        raise RelaxSpecError(f"no benchmark results in {out} (missing {RECORDS})")
    *lines, tail = path.read_text(encoding="utf-8").split("\n")
    records = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(parse_record(line))
        except ValueError:
            raise RelaxSpecError(
                f"corrupted results file {path}, line {lineno}: not a benchmark record; delete that "
                "line to resume, or use a new --out directory"
            ) from None
    if tail.strip():
        with contextlib.suppress(ValueError):  # an append in flight: not a record yet
            records.append(parse_record(tail))
    return records


def trim_torn_tail(path: Path) -> None:
    """Make ``path`` end in a newline before anything is appended: a last line that is a whole
    record gets its newline, one that is not (a write killed midway) is cut off, with a note."""
    if not path.is_file():
        return
    data = path.read_bytes()
    if not data or data.endswith(b"\n"):
        return
    cut = data.rfind(b"\n") + 1
    try:
        parse_record(data[cut:].decode("utf-8"))
        with path.open("ab") as f:
            f.write(b"\n")
    except (ValueError, UnicodeDecodeError):
        with path.open("r+b") as f:
            f.truncate(cut)
        print(f"note: {path}: dropped an incomplete last record (an interrupted write)", file=sys.stderr)


def check_sessions(out: Path, records: Sequence[dict[str, Any]], manifest: dict[str, Any]) -> None:
    """Records the manifest does not account for cannot be resumed: without their session the
    models they were measured with are unknown, and a resume would mix them with this run's."""
    if records and not (out / MANIFEST).exists():
        raise RelaxSpecError(
            f"{out} holds {len(records)} benchmark records but no {MANIFEST} (the models they were "
            "measured with are unknown): restore it, or use a new --out directory"
        )
    known = {s.get("id") for s in manifest["sessions"]}
    orphans = sorted({r["session"] for r in records if r.get("session") and r["session"] not in known})
    if orphans:
        raise RelaxSpecError(
            f"{out}: records of session {', '.join(orphans)} that {MANIFEST} does not list (a manifest "
            "from elsewhere?): restore the right one, or use a new --out directory"
        )


def load_manifest(out: str | Path) -> dict[str, Any]:
    path = Path(out) / MANIFEST
    if not path.exists():
        return {"version": FORMAT_VERSION, "models": {}, "sessions": []}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        assert manifest["version"] == FORMAT_VERSION
        assert isinstance(manifest["models"], dict) and isinstance(manifest["sessions"], list)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise RelaxSpecError(
            f"corrupted results manifest {path} (not the JSON manifest a bench writes): restore it, or "
            "use a new --out directory"
        ) from None
    return manifest


def environment() -> dict[str, Any]:
    import transformers

    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "threads": torch.get_num_threads(),
        "cpus": os.cpu_count(),
        "machine": platform.machine(),
        "processor": platform.processor() or platform.machine(),
        "platform": platform.platform(),
        "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }

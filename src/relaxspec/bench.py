"""``relaxspec bench``: a grid of methods × parameters × datasets × seeds, in one process (DESIGN §6).

Measurement rules:

- models are loaded once; every runner is warmed up before the first timed generation;
- prompts are the outer loop and the grid's cells the inner one, their order rotating per prompt,
  so machine drift hits all cells alike;
- throughput is total new tokens / total in-flight seconds of a cell (never a mean of per-prompt
  rates); speedup is a cell's throughput over that of the ``ar`` cell of the *same run*, dataset,
  seed and sampling settings (``ar`` is always part of the grid);
- Hugging Face ``generate()``, assisted generation (``assistant_model=``) and prompt lookup
  (``prompt_lookup_num_tokens=``) run as peers on the same models and prompts, as their own rows;
- quality (math exact match, HumanEval pass@1) and agreement with greedy AR are computed outside
  the timed region.

Every (cell, prompt) result is appended to ``<out>/records.jsonl`` as soon as it exists, so an
interrupted run resumes where it stopped (finished prompts are skipped; failed ones run again).
Rows are always recomputed from the records (:func:`build_rows`), by the benchmark and by the
report alike. A crash in one cell is recorded in that cell and the grid goes on.
"""

from __future__ import annotations

import contextlib
import csv
import hashlib
import io
import itertools
import json
import os
import platform
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch

from relaxspec import diagnostics
from relaxspec.datasets import Example, load_examples, truncate
from relaxspec.engine import GenerationStats
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ROLE_LOADERS, ModelSet, build_engine, get_method, resolve_params
from relaxspec.models import LoadedModel, bundled
from relaxspec.sampling import SamplingParams

RECORDS = "records.jsonl"
MANIFEST = "manifest.json"
FORMAT_VERSION = 1


# ---------------------------------------------------------------------------------------------
# Peers: Hugging Face decoding as rows of the grid


@dataclass(frozen=True)
class PeerSpec:
    """A Hugging Face ``generate()`` configuration run as a peer (``kwargs`` builds its arguments)."""

    name: str
    summary: str
    needs: tuple[str, ...]
    params: dict[str, Any]
    kwargs: Callable[[ModelSet, dict[str, Any]], dict[str, Any]]


def _assisted_kwargs(models: ModelSet, p: dict[str, Any]) -> dict[str, Any]:
    assistant = models.require("draft", "hf-assisted").model
    # Like for like with our sd: K draft tokens per round, not HF's adaptive schedule.
    assistant.generation_config.num_assistant_tokens = p["k"]
    assistant.generation_config.num_assistant_tokens_schedule = "constant"
    return {"assistant_model": assistant}


PEERS: dict[str, PeerSpec] = {
    p.name: p
    for p in (
        PeerSpec("hf-generate", "Hugging Face generate(), plain decoding", ("target",), {}, lambda m, p: {}),
        PeerSpec(
            "hf-assisted",
            "Hugging Face assisted generation (assistant_model=draft, k tokens per round)",
            ("target", "draft"),
            {"k": 8},
            _assisted_kwargs,
        ),
        PeerSpec(
            "hf-lookup",
            "Hugging Face prompt lookup decoding (prompt_lookup_num_tokens=k)",
            ("target",),
            {"k": 10},
            lambda m, p: {"prompt_lookup_num_tokens": p["k"]},
        ),
    )
}


def is_peer(name: str) -> bool:
    return name in PEERS


def runner_needs(name: str) -> tuple[str, ...]:
    return PEERS[name].needs if is_peer(name) else get_method(name).needs


def runner_params(name: str) -> dict[str, Any]:
    """Parameter names and defaults of a method preset or a peer (unknown name: clear error)."""
    return PEERS[name].params if is_peer(name) else get_method(name).params


def resolve_runner(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Validated parameters of a method preset (:func:`resolve_params`) or a peer."""
    if not is_peer(name):
        return resolve_params(name, params)
    spec = PEERS[name]
    unknown = sorted(set(params) - set(spec.params))
    if unknown:
        allowed = ", ".join(spec.params) or "none"
        raise RelaxSpecError(f"peer {name!r} has no parameter {', '.join(unknown)} (parameters: {allowed})")
    resolved = {**spec.params, **params}
    k = resolved.get("k", 1)
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RelaxSpecError(f"k of {name!r} must be an integer >= 1, got {k!r}")
    return resolved


def family(name: str) -> str:
    """Method family for grouping in tables and plots, from the models a method needs."""
    if is_peer(name):
        return "hugging face"
    try:
        needs = runner_needs(name)
    except RelaxSpecError:
        return "unregistered"
    for role, fam in (
        ("diffusion", "diffusion drafter"),
        ("block", "block proposer"),
        ("draft", "draft model"),
    ):
        if role in needs:
            return fam
    return "autoregressive"


# ---------------------------------------------------------------------------------------------
# The grid


@dataclass(frozen=True)
class Cell:
    """One row of the results: a runner with fixed parameters on one dataset with one seed."""

    method: str
    params: dict[str, Any]
    dataset: str
    seed: int
    sampling: dict[str, Any]  # temperature, top_k, top_p, max_new_tokens

    @property
    def key(self) -> str:
        return json.dumps([self.method, self.params, self.dataset, self.sampling, self.seed], sort_keys=True)

    @property
    def label(self) -> str:
        return label(self.method, self.params)

    def to_dict(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "params": self.params,
            "dataset": self.dataset,
            "seed": self.seed,
            "sampling": self.sampling,
        }

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Cell:
        return Cell(d["method"], dict(d["params"]), d["dataset"], int(d["seed"]), dict(d["sampling"]))


def label(method: str, params: dict[str, Any]) -> str:
    return " ".join([method, *(f"{k}={v}" for k, v in sorted(params.items()))])


def parse_value(text: str) -> Any:
    """A ``--set`` value: a JSON scalar (number, true/false) as such, anything else as a string."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, int | float | bool | str) else text


def parse_sets(items: Sequence[str]) -> dict[str | None, dict[str, list[Any]]]:
    """``["nsd.theta=0.9,0.95", "k=4,8"]`` -> ``{"nsd": {"theta": [0.9, 0.95]}, None: {"k": [4, 8]}}``.

    ``method.name=values`` sweeps one method's parameter; ``name=values`` every method that has it.
    """
    out: dict[str | None, dict[str, list[Any]]] = {}
    for item in items:
        lhs, sep, rhs = item.partition("=")
        values = [v.strip() for v in rhs.split(",")]
        if not sep or not lhs.strip() or not all(values):
            raise RelaxSpecError(f"--set expects [method.]name=value[,value...], got {item!r}")
        method, _, name = lhs.strip().rpartition(".")
        out.setdefault(method or None, {})[name] = [parse_value(v) for v in values]
    return out


def _grid_params(name: str, sets: dict[str | None, dict[str, list[Any]]]) -> list[dict[str, Any]]:
    """Every combination of the swept values of ``name``'s parameters, validated."""
    known = runner_params(name)
    swept = {k: v for k, v in sets.get(None, {}).items() if k in known}
    swept.update(sets.get(name, {}))
    names = sorted(swept)
    combos = [
        dict(zip(names, values, strict=True)) for values in itertools.product(*(swept[n] for n in names))
    ]
    return [resolve_runner(name, combo) for combo in combos]


def expand_grid(
    methods: Sequence[str],
    peers: Sequence[str],
    sets: dict[str | None, dict[str, list[Any]]],
    datasets: Sequence[str],
    seeds: Sequence[int],
    sampling: dict[str, Any],
) -> list[Cell]:
    """All cells, ``ar`` first; unknown methods, peers or parameter names fail with one message.

    ``hf-assisted`` follows the ``k`` values of ``sd`` unless its own ``k`` is swept, so that our
    speculative decoding and Hugging Face's run with the same draft length.
    """
    for name in methods:
        get_method(name)
    for name in peers:
        if not is_peer(name):
            raise RelaxSpecError(f"unknown peer {name!r}; choose from {', '.join(PEERS)}")
    runners = list(dict.fromkeys(["ar", *methods, *peers]))
    for method in sets:
        if method is not None and method not in runners:
            raise RelaxSpecError(f"--set names {method!r}, which is not in --methods or --peers")
    for name in sets.get(None, {}):
        if not any(name in runner_params(r) for r in runners):
            raise RelaxSpecError(f"--set {name}=...: no method in the grid has a parameter {name!r}")
    params = {r: _grid_params(r, sets) for r in runners}
    if "hf-assisted" in params and "k" not in {**sets.get(None, {}), **sets.get("hf-assisted", {})}:
        ks = sorted({p["k"] for p in params.get("sd", [])}) or [get_method("sd").params["k"]]
        params["hf-assisted"] = [resolve_runner("hf-assisted", {"k": k}) for k in ks]
    return [
        Cell(r, p, d, s, dict(sampling)) for d in datasets for s in seeds for r in runners for p in params[r]
    ]


# ---------------------------------------------------------------------------------------------
# Measurement arithmetic (pure)


def throughput(tokens: int, seconds: float) -> float:
    """Total new tokens / total in-flight seconds (0 when nothing was timed)."""
    return tokens / seconds if seconds > 0 else 0.0


def speedup(tokens_per_second: float, ar_tokens_per_second: float | None) -> float | None:
    """Throughput relative to AR of the same run (None without an AR measurement)."""
    if not ar_tokens_per_second:
        return None
    return tokens_per_second / ar_tokens_per_second


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def merged_stats(stats: Iterable[dict[str, Any]]) -> GenerationStats | None:
    """Sum of per-generation stats (as stored by ``GenerationStats.to_dict``), via ``merge``."""
    names = {f.name for f in fields(GenerationStats)}
    total: GenerationStats | None = None
    for d in stats:
        s = GenerationStats(**{k: v for k, v in d.items() if k in names})
        total = s if total is None else total.merge(s)
    return total


# ---------------------------------------------------------------------------------------------
# Rows


@dataclass
class Row:
    """Aggregate of one cell over its prompts (everything the tables, CSV and plots show)."""

    key: str
    method: str
    label: str
    family: str
    peer: bool
    params: dict[str, Any]
    dataset: str
    seed: int
    temperature: float
    top_k: int
    top_p: float
    max_new_tokens: int
    prompts: int = 0
    errors: int = 0
    error: str | None = None
    new_tokens: int = 0
    seconds: float = 0.0
    tokens_per_second: float = 0.0
    speedup: float | None = None
    tau: float | None = None
    verifier_calls_per_token: float | None = None
    draft_calls_per_token: float | None = None
    verify_ms_per_token: float | None = None
    verify_ms_per_call: float | None = None
    time_split: dict[str, float] | None = None  # draft / verify / other, fractions of wall time
    position_acceptance: list[float] = field(default_factory=list)
    accepted_by_relaxation: int | None = None
    skipped_tokens: int | None = None
    quality: float | None = None
    quality_metric: str | None = None
    ar_identical: float | None = None  # share of prompts token-identical to greedy AR
    ar_prefix: float | None = None  # mean tokens in common with greedy AR before the first difference
    diagnostics: dict[str, dict[str, Any]] = field(default_factory=dict)
    sessions: int = 0


def _stats_fields(row: Row, total: GenerationStats) -> None:
    n = max(total.new_tokens, 1)
    row.tau = total.tau
    row.verifier_calls_per_token = total.verifier_calls / n
    row.draft_calls_per_token = total.draft_calls / n
    row.verify_ms_per_token = 1000 * total.verify_seconds / n
    row.verify_ms_per_call = (
        1000 * total.verify_seconds / total.verifier_calls if total.verifier_calls else None
    )
    wall = max(total.total_seconds, 1e-12)
    row.time_split = {
        "draft": total.draft_seconds / wall,
        "verify": total.verify_seconds / wall,
        "other": total.other_seconds / wall,
    }
    row.position_acceptance = total.position_acceptance
    row.accepted_by_relaxation = total.accepted_by_relaxation
    row.skipped_tokens = total.skipped_tokens


def summarize_cell(cell: Cell, records: Sequence[dict[str, Any]], reference: dict[str, list[int]]) -> Row:
    """One :class:`Row` from a cell's records; ``reference`` maps example ids to greedy AR tokens."""
    s = cell.sampling
    row = Row(
        cell.key,
        cell.method,
        cell.label,
        family(cell.method),
        is_peer(cell.method),
        cell.params,
        cell.dataset,
        cell.seed,
        s["temperature"],
        s["top_k"],
        s["top_p"],
        s["max_new_tokens"],
    )
    ok = [r for r in records if r.get("error") is None]
    failed = [r for r in records if r.get("error") is not None]
    row.prompts, row.errors = len(ok), len(failed)
    row.error = failed[0]["error"] if failed else None
    row.sessions = len({r.get("session") for r in records})
    row.new_tokens = sum(len(r["tokens"]) for r in ok)
    row.seconds = sum(r["seconds"] for r in ok)
    row.tokens_per_second = throughput(row.new_tokens, row.seconds)
    total = merged_stats(r["stats"] for r in ok if r.get("stats"))
    if total is not None:
        _stats_fields(row, total)
    scores = [r["quality"] for r in ok if r.get("quality") is not None]
    row.quality = sum(scores) / len(scores) if scores else None
    row.quality_metric = next((r.get("metric") for r in ok if r.get("metric")), None)
    refs = [(r["tokens"], reference[r["example"]]) for r in ok if r["example"] in reference]
    if refs:
        row.ar_identical = sum(a == b for a, b in refs) / len(refs)
        row.ar_prefix = sum(common_prefix(a, b) for a, b in refs) / len(refs)
    counters: dict[str, Any] = {}
    for r in ok:
        if r.get("diagnostics"):
            counters = diagnostics.merge_counters(counters, r["diagnostics"])
    row.diagnostics = diagnostics.summarize(counters)
    return row


def latest_records(records: Iterable[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The last record of every (cell key, example): a re-run supersedes a failed attempt."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for r in records:
        if r.get("type") == "record":
            out[(Cell.from_dict(r["cell"]).key, r["example"])] = r
    return out


def references(records: Iterable[dict[str, Any]]) -> dict[tuple[str, int], dict[str, list[int]]]:
    """Greedy AR tokens per (dataset, max_new_tokens) and example.

    From ``reference`` records (written when the grid samples) and from ``ar`` cells at
    temperature 0 (which *are* greedy AR).
    """
    out: dict[tuple[str, int], dict[str, list[int]]] = {}
    for r in records:
        if r.get("type") == "reference":
            out.setdefault((r["dataset"], r["max_new_tokens"]), {})[r["example"]] = r["tokens"]
        elif r.get("type") == "record" and r.get("error") is None:
            c = r["cell"]
            if c["method"] == "ar" and c["sampling"]["temperature"] == 0:
                key = (c["dataset"], c["sampling"]["max_new_tokens"])
                out.setdefault(key, {})[r["example"]] = r["tokens"]
    return out


def build_rows(records: Sequence[dict[str, Any]], order: Sequence[str] | None = None) -> list[Row]:
    """Rows of every cell in ``records`` (in ``order`` of cell keys first), with speedups vs ``ar``."""
    latest = latest_records(records)
    cells: dict[str, Cell] = {}
    by_cell: dict[str, list[dict[str, Any]]] = {}
    for (key, _example), r in latest.items():
        cells.setdefault(key, Cell.from_dict(r["cell"]))
        by_cell.setdefault(key, []).append(r)
    refs = references(records)
    keys = [k for k in (order or []) if k in cells] + [k for k in cells if k not in set(order or [])]
    rows = [
        summarize_cell(
            cells[k], by_cell[k], refs.get((cells[k].dataset, cells[k].sampling["max_new_tokens"]), {})
        )
        for k in keys
    ]
    ar = {
        (r.dataset, r.seed, r.temperature, r.top_k, r.top_p, r.max_new_tokens): r.tokens_per_second
        for r in rows
        if r.method == "ar"
    }
    for r in rows:
        if r.prompts:
            r.speedup = speedup(
                r.tokens_per_second,
                ar.get((r.dataset, r.seed, r.temperature, r.top_k, r.top_p, r.max_new_tokens)),
            )
    return rows


# ---------------------------------------------------------------------------------------------
# Results directory: manifest + append-only records


def model_fingerprint(path: Path) -> str:
    """Hash of a model directory's config, tokenizer and weight files (to detect a changed model)."""
    h = hashlib.sha1()
    for f in sorted(path.iterdir()):
        if f.is_file() and f.suffix in (".json", ".safetensors", ".bin", ".txt", ".model"):
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

    def check_models(self, fingerprints: dict[str, dict[str, str]]) -> None:
        """Resuming with different models would mix incomparable numbers: refuse."""
        for role, info in fingerprints.items():
            old = self.manifest["models"].get(role)
            if old is not None and old["fingerprint"] != info["fingerprint"]:
                raise RelaxSpecError(
                    f"{self.out} holds results of a different {role} model ({old['path']}); "
                    "use a new --out directory"
                )
        self.manifest["models"].update(fingerprints)

    def start_session(self, command: str) -> str:
        session = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self.manifest["sessions"].append({"id": session, "command": command, "environment": environment()})
        self.save_manifest()
        return session

    def save_manifest(self) -> None:
        (self.out / MANIFEST).write_text(json.dumps(self.manifest, indent=1))

    def append(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        with (self.out / RECORDS).open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
            f.flush()
            os.fsync(f.fileno())

    def done(self) -> set[tuple[str, str]]:
        """(cell key, example) pairs with a successful record."""
        return {k for k, r in latest_records(self.records).items() if r.get("error") is None}


def load_records(out: str | Path) -> list[dict[str, Any]]:
    """Every record of ``<out>/records.jsonl``; a malformed line is one clear error."""
    path = Path(out) / RECORDS
    if not path.is_file():
        raise RelaxSpecError(f"no benchmark results in {out} (missing {RECORDS})")
    records = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
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
            raise RelaxSpecError(
                f"corrupted results file {path}, line {lineno}: not a benchmark record (an interrupted "
                "write?); delete that line to resume, or use a new --out directory"
            ) from None
        records.append(r)
    return records


def load_manifest(out: str | Path) -> dict[str, Any]:
    path = Path(out) / MANIFEST
    if not path.exists():
        return {"version": FORMAT_VERSION, "models": {}, "sessions": []}
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        assert manifest["version"] == FORMAT_VERSION
        assert isinstance(manifest["models"], dict) and isinstance(manifest["sessions"], list)
    except (ValueError, KeyError, TypeError, AssertionError):
        raise RelaxSpecError(f"corrupted results manifest {path}; use a new --out directory") from None
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


# ---------------------------------------------------------------------------------------------
# Runners: one generation of one prompt -> a record (tokens, text, seconds, stats)

Runner = Callable[[Example, int, int | None], dict[str, Any]]  # (example, seed, max_new_tokens)


def _engine_runner(
    method: str, params: dict[str, Any], models: ModelSet, sampling: SamplingParams, collect: bool
) -> Runner:
    engine = build_engine(method, models, **params)

    def run(ex: Example, seed: int, max_new_tokens: int | None = None) -> dict[str, Any]:
        cycles: list = []
        budget = max_new_tokens or sampling.max_new_tokens
        result = engine.generate(
            ex.prompt,
            replace(sampling, seed=seed, stop=ex.stop, max_new_tokens=budget),
            on_cycle=cycles.append if collect else None,
        )
        out = {
            "tokens": result.tokens,
            "text": result.text,
            "seconds": result.stats.total_seconds,
            "stats": result.stats.to_dict(),
        }
        if collect:
            out["diagnostics"] = diagnostics.collect(
                diagnostics.Generation(
                    method, params, cycles, engine.encode(ex.prompt), result.tokens, models
                )
            )
        return out

    return run


def _hf_runner(name: str, params: dict[str, Any], models: ModelSet, sampling: SamplingParams) -> Runner:
    """A Hugging Face ``generate()`` peer, with the same prompt encoding, budget and stop strings."""
    target: LoadedModel = models.require("target", name)
    extra = PEERS[name].kwargs(models, params)
    tok = target.tokenizer
    eos = target.model.generation_config.eos_token_id or tok.eos_token_id
    eos_ids = set(eos if isinstance(eos, list) else [eos])

    def run(ex: Example, seed: int, max_new_tokens: int | None = None) -> dict[str, Any]:
        ids = tok(ex.prompt, return_tensors="pt")["input_ids"]
        budget = min(max_new_tokens or sampling.max_new_tokens, target.context_length - ids.shape[1])
        if budget < 1:
            raise RelaxSpecError(f"the prompt has {ids.shape[1]} tokens; the context window is full")
        kwargs: dict[str, Any] = dict(
            max_new_tokens=budget,
            pad_token_id=tok.pad_token_id,
            eos_token_id=list(eos_ids),
            do_sample=not sampling.greedy,
            **extra,
        )
        if not sampling.greedy:
            kwargs.update(
                temperature=sampling.temperature, top_k=sampling.top_k or None, top_p=sampling.top_p
            )
        if ex.stop:
            kwargs.update(stop_strings=list(ex.stop), tokenizer=tok)
        torch.manual_seed(seed)
        with warnings.catch_warnings(), _quiet_transformers():
            warnings.simplefilter("ignore")
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = target.model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
            seconds = time.perf_counter() - t0
        new = out[0, ids.shape[1] :].tolist()
        while new and (new[-1] in eos_ids or new[-1] == tok.pad_token_id):
            new.pop()
        text = truncate(tok.decode(new, skip_special_tokens=True), ex.stop)
        return {"tokens": new, "text": text, "seconds": seconds, "stats": None}

    return run


@contextlib.contextmanager
def _quiet_transformers():
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def make_runner(cell: Cell, models: ModelSet, collect: bool) -> Runner:
    s = cell.sampling
    sampling = SamplingParams(
        temperature=s["temperature"], top_k=s["top_k"], top_p=s["top_p"], max_new_tokens=s["max_new_tokens"]
    )
    if is_peer(cell.method):
        return _hf_runner(cell.method, cell.params, models, sampling)
    return _engine_runner(cell.method, cell.params, models, sampling, collect)


# ---------------------------------------------------------------------------------------------
# Models


def load_role_models(roles: Iterable[str], paths: dict[str, str | Path | None]) -> ModelSet:
    """Each role once, from ``paths[role]`` or the bundled ``models/<role>``."""
    models = ModelSet()
    for role in dict.fromkeys(roles):
        path = paths.get(role) or bundled(role)
        if not Path(path).exists():
            raise RelaxSpecError(
                f"the grid needs a {role} model: pass --{role} DIR (no bundled model at {path})"
            )
        loader = ROLE_LOADERS.get(role)
        if loader is None:
            raise RelaxSpecError(f"no loader for {role} models is registered")
        setattr(models, role, loader(Path(path)))
    return models


def model_paths(roles: Iterable[str], paths: dict[str, str | Path | None]) -> dict[str, Path]:
    return {role: Path(paths.get(role) or bundled(role)) for role in dict.fromkeys(roles)}


# ---------------------------------------------------------------------------------------------
# The benchmark


@dataclass
class BenchConfig:
    methods: list[str]
    datasets: list[str] = field(default_factory=lambda: ["math"])
    limit: int = 10
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seeds: list[int] = field(default_factory=lambda: [0])
    max_new_tokens: int = 128
    sets: list[str] = field(default_factory=list)  # "[method.]name=v1,v2"
    peers: list[str] | None = None  # None: every peer whose models are available
    models: dict[str, str | None] = field(default_factory=dict)  # role -> directory (default bundled)
    out: str = "results"
    warmup_tokens: int = 16
    diagnostics: bool = False
    exec_timeout: float = 10.0  # seconds per HumanEval test program
    progress: bool = True
    command: str = ""  # the command line, recorded in the manifest


def split_list(text: str) -> list[str]:
    """``"a, b,,c"`` -> ``["a", "b", "c"]``."""
    return [x.strip() for x in text.split(",") if x.strip()]


def parse_seeds(text: str) -> list[int]:
    try:
        return [int(x) for x in split_list(text)]
    except ValueError:
        raise RelaxSpecError(f"--seeds expects comma-separated integers, got {text!r}") from None


def parse_peers(text: str) -> list[str] | None:
    """``auto`` (None: every peer whose models exist), ``none`` or a comma-separated list."""
    if text.strip() == "auto":
        return None
    return [] if text.strip() == "none" else split_list(text)


def parse_models(
    target: str | Path | None, draft: str | Path | None, items: Sequence[str]
) -> dict[str, str | None]:
    """Model directories by role from ``--target``, ``--draft`` and ``--model role=DIR``."""
    models = {"target": str(target) if target else None, "draft": str(draft) if draft else None}
    for item in items:
        role, sep, path = item.partition("=")
        if not sep or not role.strip() or not path.strip():
            raise RelaxSpecError(f"--model expects role=DIR, got {item!r}")
        models[role.strip()] = path.strip()
    return models


def _check_config(config: BenchConfig) -> None:
    if not config.methods:
        raise RelaxSpecError("no methods given")
    if not config.datasets:
        raise RelaxSpecError("no dataset given")
    if isinstance(config.limit, bool) or not isinstance(config.limit, int) or config.limit < 1:
        raise RelaxSpecError(f"--limit must be an integer >= 1, got {config.limit!r}")
    if not config.seeds or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in config.seeds
    ):
        raise RelaxSpecError(f"seeds must be non-negative integers, got {config.seeds!r}")
    SamplingParams(
        temperature=config.temperature,
        top_k=config.top_k,
        top_p=config.top_p,
        max_new_tokens=config.max_new_tokens,
    )


def plan(config: BenchConfig) -> list[Cell]:
    """The grid of ``config`` (validates methods, peers and ``--set`` names before any model loads)."""
    _check_config(config)
    sampling = {
        "temperature": config.temperature,
        "top_k": config.top_k,
        "top_p": config.top_p,
        "max_new_tokens": config.max_new_tokens,
    }
    peers = list(PEERS) if config.peers is None else config.peers
    cells = expand_grid(
        config.methods, peers, parse_sets(config.sets), config.datasets, config.seeds, sampling
    )
    if config.peers is None:  # default peers: only those whose models exist
        have = {r for r in ("target", "draft") if Path(config.models.get(r) or bundled(r)).exists()}
        cells = [c for c in cells if not is_peer(c.method) or set(runner_needs(c.method)) <= have]
    return cells


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}".strip()


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[cell]}"),
        console=Console(stderr=True),
        disable=not enabled,
    )


def run_bench(config: BenchConfig) -> dict[str, Any]:
    """Run (or resume) the grid; write records, JSON, CSV and Markdown to ``config.out``.

    Returns ``{"rows": [...], "out": path}`` for the whole results directory.
    """
    cells = plan(config)
    examples = {d: load_examples(d, config.limit) for d in config.datasets}
    store = ResultsStore(config.out)
    roles = [r for c in cells for r in runner_needs(c.method)]
    paths = model_paths(roles, config.models)
    store.check_models(
        {
            role: {"path": str(p), "fingerprint": model_fingerprint(p)}
            for role, p in paths.items()
            if p.is_dir()
        }
    )
    models = load_role_models(roles, config.models)
    session = store.start_session(config.command or " ".join(sys.argv))

    done = store.done()
    pending = {(c.key, ex.id) for c in cells for ex in examples[c.dataset] if (c.key, ex.id) not in done}
    need_reference = config.temperature > 0
    have_refs = references(store.records)
    broken: dict[str, str] = {}  # runner label -> why it could not be built or warmed up
    failed: dict[str, str] = {}  # cell key -> the error that stopped it in this session
    runners: dict[str, Runner] = {}
    order = 0

    def record(cell: Cell, ex_id: str, **fields_: Any) -> None:
        nonlocal order
        order += 1
        store.append(
            {
                "type": "record",
                "cell": cell.to_dict(),
                "example": ex_id,
                "session": session,
                "order": order,
                "tokens": [],
                "seconds": 0.0,
                "stats": None,
                **fields_,
            }
        )

    # Build and warm up every runner with pending work; a failure here fails that cell only.
    todo = [c for c in cells if any((c.key, ex.id) in pending for ex in examples[c.dataset])]
    for cell in todo:
        if cell.label in runners or cell.label in broken:
            continue
        try:
            run = make_runner(cell, models, config.diagnostics)
            run(Example("warmup", examples[cell.dataset][0].prompt), 0, config.warmup_tokens)
            runners[cell.label] = run
        except Exception as err:  # recorded in the cell, the grid goes on
            broken[cell.label] = _error(err)
    reference_runner = None
    if need_reference:
        ar_cell = Cell("ar", {}, "", 0, {**cells[0].sampling, "temperature": 0.0})
        reference_runner = make_runner(ar_cell, models, False)

    total = len(pending) + (
        sum(
            1
            for d in config.datasets
            for ex in examples[d]
            if ex.id not in have_refs.get((d, config.max_new_tokens), {})
        )
        if need_reference
        else 0
    )
    with _progress(config.progress) as progress:
        task = progress.add_task("bench", total=total, cell="")
        for dataset in config.datasets:
            row_cells = [c for c in cells if c.dataset == dataset]
            for i, ex in enumerate(examples[dataset]):
                if reference_runner is not None and ex.id not in have_refs.get(
                    (dataset, config.max_new_tokens), {}
                ):
                    progress.update(task, cell=f"greedy AR reference · {ex.id}")
                    try:
                        ref = reference_runner(ex, 0, None)
                        store.append(
                            {
                                "type": "reference",
                                "dataset": dataset,
                                "example": ex.id,
                                "max_new_tokens": config.max_new_tokens,
                                "tokens": ref["tokens"],
                            }
                        )
                    except Exception as err:  # agreement is then missing for this prompt
                        print(
                            f"warning: greedy AR reference failed on {ex.id}: {_error(err)}", file=sys.stderr
                        )
                    progress.advance(task)
                shift = i % max(len(row_cells), 1)
                for cell in row_cells[shift:] + row_cells[:shift]:  # rotate to spread drift
                    if (cell.key, ex.id) not in pending:
                        continue
                    progress.update(task, cell=f"{cell.label} · seed {cell.seed} · {ex.id}")
                    error = broken.get(cell.label) or failed.get(cell.key)
                    if error is not None:
                        record(cell, ex.id, error=error)
                    else:
                        try:
                            out = runners[cell.label](ex, cell.seed, None)
                            quality = ex.score(out["text"], config.exec_timeout)
                            record(cell, ex.id, metric=ex.metric, quality=quality, error=None, **out)
                        except Exception as err:  # recorded in the cell, the grid goes on
                            failed[cell.key] = _error(err)
                            record(cell, ex.id, error=failed[cell.key])
                    progress.advance(task)

    rows = build_rows(store.records, [c.key for c in cells])
    write_outputs(store.out, rows, store.manifest)
    grid_keys = {c.key for c in cells}
    print_table([r for r in rows if r.key in grid_keys], title=_title(config))
    return {"rows": [asdict(r) for r in rows], "out": str(store.out)}


def _title(config: BenchConfig) -> str:
    return (
        f"{', '.join(config.datasets)} x{config.limit}, T={config.temperature}, "
        f"seeds={','.join(map(str, config.seeds))}, max_new_tokens={config.max_new_tokens}"
    )


# ---------------------------------------------------------------------------------------------
# Output: JSON, CSV, Markdown, terminal table


def _fmt(x: float | None, f: str = "{:.2f}") -> str:
    return "-" if x is None else f.format(x)


def _split(r: Row) -> str:
    if r.time_split is None:
        return "-"
    return "/".join(f"{100 * r.time_split[k]:.0f}" for k in ("draft", "verify", "other"))


COLUMNS = [
    ("runner", lambda r: r.label),
    ("data", lambda r: dataset_name(r.dataset)),
    ("seed", lambda r: str(r.seed)),
    ("prompts", lambda r: f"{r.prompts}" + (f" ({r.errors} failed)" if r.errors else "")),
    ("new tok", lambda r: str(r.new_tokens)),
    ("sec", lambda r: _fmt(r.seconds)),
    ("tok/s", lambda r: _fmt(r.tokens_per_second, "{:.1f}")),
    ("speedup", lambda r: _fmt(r.speedup, "{:.2f}x")),
    ("τ", lambda r: _fmt(r.tau)),
    ("verif/tok", lambda r: _fmt(r.verifier_calls_per_token, "{:.3f}")),
    ("draft/tok", lambda r: _fmt(r.draft_calls_per_token)),
    ("verify ms/tok", lambda r: _fmt(r.verify_ms_per_token)),
    ("draft/verify/other %", _split),
    ("quality", lambda r: "-" if r.quality is None else f"{r.quality:.3f} {r.quality_metric or ''}".strip()),
    ("= AR", lambda r: _fmt(r.ar_identical)),
    ("AR prefix", lambda r: _fmt(r.ar_prefix, "{:.1f}")),
]


TERMINAL_COLUMNS = [
    c
    for c in COLUMNS
    if c[0] in ("runner", "data", "seed", "prompts", "tok/s", "speedup", "τ", "verif/tok")
    or c[0] in ("draft/verify/other %", "quality", "= AR")
]


def dataset_name(dataset: str) -> str:
    """Short display name: ``math``, ``humaneval``, … or a prompt file's stem."""
    return Path(dataset).stem if dataset.endswith(".jsonl") else dataset


def markdown_table(rows: Sequence[Row], columns: Sequence[tuple[str, Callable[[Row], str]]] = ()) -> str:
    cols = list(columns) or COLUMNS
    lines = [
        "| " + " | ".join(name for name, _ in cols) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(cols))) + "|",
    ]
    for r in rows:
        lines.append("| " + " | ".join(fn(r).replace("|", "\\|") for _, fn in cols) + " |")
    return "\n".join(lines) + "\n"


def print_table(rows: Sequence[Row], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for name, _ in TERMINAL_COLUMNS:
        table.add_column(name, justify="left" if name == "runner" else "right")
    for r in rows:
        table.add_row(*(fn(r) for _, fn in TERMINAL_COLUMNS))
    Console(width=None if sys.stdout.isatty() else 160).print(table)
    for r in rows:
        if r.error:
            print(f"error in {r.label} ({r.dataset}, seed {r.seed}): {r.error}", file=sys.stderr)


def flat_row(r: Row) -> dict[str, Any]:
    """A CSV row: scalars as they are, lists ``;``-joined, dicts flattened with dotted names."""
    out: dict[str, Any] = {}

    def put(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                put(f"{prefix}.{k}", v)
        elif isinstance(value, list):
            out[prefix] = ";".join(
                "" if v is None else f"{v:.4g}" if isinstance(v, float) else str(v) for v in value
            )
        else:
            out[prefix] = value

    for k, v in asdict(r).items():
        if k == "key":
            continue
        put(k, v)
    return out


def write_outputs(out: Path, rows: Sequence[Row], manifest: dict[str, Any]) -> None:
    """``results.json`` (manifest + rows), ``results.csv`` and ``results.md``."""
    (out / "results.json").write_text(
        json.dumps({"manifest": manifest, "rows": [asdict(r) for r in rows]}, indent=1)
    )
    flat = [flat_row(r) for r in rows]
    names = list(dict.fromkeys(k for f in flat for k in f))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=names)
    writer.writeheader()
    writer.writerows(flat)
    (out / "results.csv").write_text(buf.getvalue())
    (out / "results.md").write_text(markdown_table(rows))

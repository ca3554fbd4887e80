"""The offline training corpus (docs/design.md §5): Python standard-library source + synthetic math and code.

:func:`build_corpus` writes, deterministically, JSONL files of stdlib modules (held out by a hash
of the path, :func:`is_heldout_module`), synthetic math (:mod:`relaxspec.data.mathgen`,
:mod:`relaxspec.data.mathvariants`) and synthetic code tasks (:mod:`relaxspec.data.codegen`,
:mod:`relaxspec.data.codevartasks`), each split into training and held-out sets (by seed, by
family or combination, by phrasing), plus ``manifest.json``; its docstring lists every file.
Token counts and the mixing ratio are recorded by the training code once a tokenizer exists
(:mod:`relaxspec.data.tokens`). The corpus as built: docs/models.md ("Corpus").
"""

from __future__ import annotations

import hashlib
import json
import platform
import sysconfig
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from relaxspec import atomic
from relaxspec.data import codegen, codevartasks, mathquotes, mathvariants
from relaxspec.data.mathgen import (
    EVAL_SEED_START,
    HELDOUT_MATH_FAMILIES,
    HELDOUT_PHRASINGS,
    TRAIN_MATH_FAMILIES,
    TRAIN_PHRASINGS,
    eval_problems,
    generate_problem,
    heldout_family_problems,
    heldout_phrasing_problems,
    train_family_problems,
    train_styled_problems,
)
from relaxspec.errors import RelaxSpecError

HELDOUT_BUCKETS = 20  # one module in twenty (by path hash) is held out for evaluation
MAX_MODULE_BYTES = 200_000  # skip generated tables (unicode data, pydoc topics) that teach nothing
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}


@dataclass
class CorpusConfig:
    n_math_train: int = 200_000
    n_math_eval: int = 1_000
    stdlib_dir: str | None = None  # default: this interpreter's standard library
    max_code_files: int | None = None  # for tests: only the first N modules (sorted by path)
    # synthetic code tasks and the broadened math generator (issue 15); None: n_math_train // 2
    n_synthcode_train: int | None = None
    n_math_broad_train: int | None = None
    n_synth_eval: int = 500  # each of the held-out synthcode / math-families eval files
    # compositional code pipelines and math phrasing styles; None: n_math_train // 2
    n_pipes_train: int | None = None
    n_math_styles_train: int | None = None
    # code and math with equivalent solution variants (issue 29); None: n_math_train // 2
    n_codevar_train: int | None = None
    n_mathvar_train: int | None = None

    def sizes(self) -> tuple[int, int]:
        """(synthcode training tasks, broadened math training problems)."""
        half = max(1, self.n_math_train // 2)
        return (
            half if self.n_synthcode_train is None else self.n_synthcode_train,
            half if self.n_math_broad_train is None else self.n_math_broad_train,
        )

    def variant_sizes(self) -> tuple[int, int]:
        """(code tasks with solution variants, math problems with solution variants)."""
        half = max(1, self.n_math_train // 2)
        return (
            half if self.n_codevar_train is None else self.n_codevar_train,
            half if self.n_mathvar_train is None else self.n_mathvar_train,
        )

    def composed_sizes(self) -> tuple[int, int]:
        """(pipeline code training tasks, styled math training problems)."""
        half = max(1, self.n_math_train // 2)
        return (
            half if self.n_pipes_train is None else self.n_pipes_train,
            half if self.n_math_styles_train is None else self.n_math_styles_train,
        )


def is_heldout_module(relative_path: str) -> bool:
    """Whether a stdlib module belongs to the held-out evaluation set (fixed by its path)."""
    digest = hashlib.sha1(relative_path.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_BUCKETS == 0


def stdlib_modules(stdlib_dir: Path, limit: int | None = None) -> list[tuple[str, str]]:
    """``(relative path, source)`` of every usable ``.py`` module, sorted, deduplicated by content."""
    seen: set[str] = set()
    modules = []
    for path in sorted(stdlib_dir.rglob("*.py")):
        rel = path.relative_to(stdlib_dir).as_posix()
        if _SKIP_PARTS.intersection(rel.split("/")[:-1]) or path.name.startswith("test_"):
            continue
        if path.stat().st_size > MAX_MODULE_BYTES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        digest = hashlib.sha1(text.encode()).hexdigest()
        if not text.strip() or digest in seen:
            continue
        seen.add(digest)
        modules.append((rel, text))
        if limit is not None and len(modules) >= limit:
            break
    return modules


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    atomic.write_jsonl(path, rows, ensure_ascii=False)  # a crash never leaves a half-written split


def read_jsonl(path: Path) -> list[dict]:
    """Rows of a corpus file, with a clear error if it is missing or corrupt."""
    if not path.is_file():
        raise RelaxSpecError(f"corpus file not found: {path} (run `relaxspec data build` first)")
    rows = []
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise RelaxSpecError(f"corrupt corpus file {path}, line {lineno}: {err.msg}") from None
    return rows


def build_corpus(out_dir: str | Path, config: CorpusConfig | None = None) -> dict:
    """Write the corpus files into ``out_dir`` and return the manifest.

    Writes, deterministically:

    - ``code_train.jsonl`` / ``code_eval.jsonl`` — one ``{"path", "text"}`` per stdlib module,
      deduplicated by content; a module is held out for evaluation when the SHA-1 of its relative path
      falls in a fixed bucket (:func:`is_heldout_module`), so the split never depends on file order.
    - ``math_train.jsonl`` — ``{"seed", "text"}`` for training seeds ``0..n_math_train-1``.
    - ``math_eval.jsonl`` — ``{"seed", "prompt", "solution", "answer", "steps"}`` from the disjoint
      evaluation seed range.
    - ``synthcode_train.jsonl`` — ``{"seed", "family", "text"}``: synthetic code tasks
      (:mod:`relaxspec.data.codegen`) of the training families on training seeds, held-out specs
      skipped; ``synthcode_eval.jsonl`` / ``synthcode_families_eval.jsonl`` — ``{"seed", "family",
      "prompt", "text"}`` of the held-out seeds / held-out families (for held-out losses; never
      trained on).
    - ``math_broad_train.jsonl`` — ``{"seed", "family", "steps", "text"}``: the broadened math
      generator's training families (1–6 steps); ``math_families_eval.jsonl`` — ``{"seed", "family",
      "prompt", "solution", "answer", "steps", "text"}`` of its held-out scenario families.
    - ``synthpipes_train.jsonl`` — compositional pipeline code tasks (filter × map × aggregator) of
      the training combinations; ``synthpipes_eval.jsonl`` — the held-out combinations.
    - ``math_styles_train.jsonl`` — the broadened math scenarios rendered in phrasing styles, training
      (scenario, style) pairs only; ``math_phrasing_eval.jsonl`` — the held-out (scenario, style)
      pairs (held-out phrasing families).
    - ``codevar_train.jsonl`` / ``mathvar_train.jsonl`` — code and math rendered with one of several
      equivalent correct solutions per example (:mod:`relaxspec.data.codevartasks`,
      :mod:`relaxspec.data.mathvariants`); ``codevar_eval`` / ``codevar_combos_eval`` /
      ``codevar_phrasing_eval`` and ``mathvar_eval`` / ``mathvar_families_eval`` /
      ``mathvar_phrasing_eval`` — held out by seed, by combination (scenario family) and by phrasing;
      ``mathquote_train.jsonl`` — as many math rows whose steps quote their facts
      (:mod:`relaxspec.data.mathquotes`) and ``mathorder_train.jsonl`` as many whose steps follow
      the question's order without quotes, both scored on the same held-out sets.
    - ``manifest.json`` — Python version, counts, held-out module list, characters per source.
    """
    config = config or CorpusConfig()
    _check_sizes(config)
    out = Path(out_dir)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise RelaxSpecError(f"cannot create corpus directory {out}: {err.strerror}") from None
    stdlib_dir = Path(config.stdlib_dir or sysconfig.get_paths()["stdlib"])
    if not stdlib_dir.is_dir():
        raise RelaxSpecError(f"standard library directory not found: {stdlib_dir}")
    files = original_rows(config, stdlib_dir)
    n_synthcode, n_math_broad = config.sizes()
    files.update(synthetic_rows(n_synthcode, n_math_broad, config.n_synth_eval))
    files.update(composed_rows(*config.composed_sizes(), config.n_synth_eval))
    files.update(variant_rows(*config.variant_sizes(), config.n_synth_eval))
    for name, rows in files.items():
        _write_jsonl(out / f"{name}.jsonl", rows)
    manifest = corpus_manifest(config, stdlib_dir, files)
    # written last and whole: its presence means every split above is complete
    atomic.write_json(out / "manifest.json", manifest, indent=2)
    return manifest


def _check_sizes(config: CorpusConfig) -> None:
    """Every split at least one row, training seeds clear of the evaluation range."""
    if config.n_math_train < 1 or config.n_math_eval < 1:
        raise RelaxSpecError("n_math_train and n_math_eval must be at least 1")
    if config.n_math_train > EVAL_SEED_START:
        raise RelaxSpecError(f"n_math_train must be below {EVAL_SEED_START}")
    n_synthcode, n_math_broad = config.sizes()
    if n_synthcode < 1 or n_math_broad < 1 or config.n_synth_eval < 1:
        raise RelaxSpecError("n_synthcode_train, n_math_broad_train and n_synth_eval must be at least 1")
    n_pipes, n_styles = config.composed_sizes()
    if n_pipes < 1 or n_styles < 1:
        raise RelaxSpecError("n_pipes_train and n_math_styles_train must be at least 1")
    if max(n_synthcode, n_math_broad, n_pipes, n_styles) > EVAL_SEED_START // 2:
        raise RelaxSpecError(f"n_synthcode_train and n_math_broad_train must be below {EVAL_SEED_START // 2}")


def original_rows(config: CorpusConfig, stdlib_dir: Path) -> dict[str, list[dict]]:
    """The standard-library code files (held-out modules apart) and the original math problems."""
    modules = stdlib_modules(stdlib_dir, config.max_code_files)
    code_train = [{"path": p, "text": t} for p, t in modules if not is_heldout_module(p)]
    code_eval = [{"path": p, "text": t} for p, t in modules if is_heldout_module(p)]
    math_train = [{"seed": s, "text": generate_problem(s).text} for s in range(config.n_math_train)]
    math_eval = [
        {"seed": p.seed, "prompt": p.prompt, "solution": p.solution, "answer": p.answer, "steps": p.steps}
        for p in eval_problems(config.n_math_eval)
    ]
    # Seeds are disjoint by construction; also make sure no evaluation question was generated
    # verbatim for training (possible in principle with templates).
    train_texts = {r["text"].split("\nAnswer:")[0] for r in math_train}
    math_eval = [r for r in math_eval if r["prompt"].split("\nAnswer:")[0] not in train_texts]
    return {
        "code_train": code_train,
        "code_eval": code_eval,
        "math_train": math_train,
        "math_eval": math_eval,
    }


CHAR_COUNTED = (
    "code_train",
    "code_eval",
    "math_train",
    "synthcode_train",
    "math_broad_train",
    "synthpipes_train",
    "math_styles_train",
    "codevar_train",
    "mathvar_train",
    "mathquote_train",
    "mathorder_train",
)


def corpus_manifest(config: CorpusConfig, stdlib_dir: Path, files: dict[str, list[dict]]) -> dict:
    """What was built: environment, config, rows and characters per file, the held-out sets."""
    return {
        "python_version": platform.python_version(),
        "stdlib_dir": str(stdlib_dir),
        "config": asdict(config),
        "counts": {name: len(rows) for name, rows in files.items()},
        "chars": {name: sum(len(r["text"]) for r in files[name]) for name in CHAR_COUNTED},
        "heldout_modules": [r["path"] for r in files["code_eval"]],
        "math_eval_seed_start": EVAL_SEED_START,
        "synthcode": {
            "generator_version": codegen.GENERATOR_VERSION,
            "train_families": list(codegen.TRAIN_FAMILIES),
            "heldout_families": list(codegen.HELDOUT_FAMILIES),
        },
        "math_broad": {
            "train_families": list(TRAIN_MATH_FAMILIES),
            "heldout_families": list(HELDOUT_MATH_FAMILIES),
        },
        "synthpipes": {
            "generator_version": codegen.GENERATOR_VERSION,
            "train_combos": len(codegen.TRAIN_COMBOS),
            "heldout_combos": list(codegen.HELDOUT_COMBOS),
        },
        "math_styles": {
            "train_phrasings": list(TRAIN_PHRASINGS),
            "heldout_phrasings": list(HELDOUT_PHRASINGS),
        },
    }


def synthetic_rows(n_synthcode: int, n_math_broad: int, n_eval: int) -> dict[str, list[dict]]:
    """The synthetic code and broadened math files (training splits and held-out eval splits).

    The training rows come only from training families and training seeds (held-out specs and
    questions skipped by hash), so no held-out prompt can be in them; the check below makes sure.
    """
    code_train = codegen.train_tasks(n_synthcode)
    code_eval = codegen.eval_tasks(n_eval)
    code_fams = codegen.heldout_family_tasks(n_eval)
    math_train = train_family_problems(n_math_broad)
    math_fams = heldout_family_problems(n_eval)
    train_prompts = {t.prompt for t in code_train} | {p.prompt for p in math_train}
    held = [t.prompt for t in code_eval + code_fams] + [p.prompt for p in math_fams]
    if train_prompts.intersection(held):  # pragma: no cover - excluded by construction
        raise RelaxSpecError("a held-out synthetic prompt is in the training split")
    return {
        "synthcode_train": [_code_row(t) for t in code_train],
        "synthcode_eval": [_code_row(t, held_out=True) for t in code_eval],
        "synthcode_families_eval": [_code_row(t, held_out=True) for t in code_fams],
        "math_broad_train": [_math_row(p) for p in math_train],
        "math_families_eval": [_math_row(p, held_out=True) for p in math_fams],
    }


def _code_row(task: Any, held_out: bool = False) -> dict:
    """A synthetic code task's JSONL row (held-out rows also carry the prompt alone)."""
    row = {"seed": task.seed, "family": task.family}
    return row | ({"prompt": task.prompt} if held_out else {}) | {"text": task.text}


def _math_row(problem: Any, held_out: bool = False) -> dict:
    """A generated math problem's JSONL row (held-out rows also carry prompt, solution, answer)."""
    row = {"seed": problem.seed, "family": problem.family}
    if held_out:
        row |= {"prompt": problem.prompt, "solution": problem.solution, "answer": problem.answer}
    return row | {"steps": problem.steps, "text": problem.text}


def composed_rows(n_pipes: int, n_styles: int, n_eval: int) -> dict[str, list[dict]]:
    """The compositional files: pipeline code tasks and styled math, training and held-out.

    Held-out combinations and (scenario, style) pairs are never generated for training; the
    check below also makes sure no held-out prompt appears verbatim in the training rows.
    """
    pipes_train = codegen.train_pipeline_tasks(n_pipes)
    pipes_eval = codegen.heldout_combo_tasks(n_eval)
    styles_train = train_styled_problems(n_styles)
    phrasing_eval = heldout_phrasing_problems(n_eval)
    train_prompts = {t.prompt for t in pipes_train} | {p.prompt for p in styles_train}
    held = [t.prompt for t in pipes_eval] + [p.prompt for p in phrasing_eval]
    if train_prompts.intersection(held):  # pragma: no cover - excluded by construction
        raise RelaxSpecError("a held-out compositional prompt is in the training split")
    return {
        "synthpipes_train": [_code_row(t) for t in pipes_train],
        "synthpipes_eval": [_code_row(t, held_out=True) for t in pipes_eval],
        "math_styles_train": [_math_row(p) for p in styles_train],
        "math_phrasing_eval": [_math_row(p, held_out=True) for p in phrasing_eval],
    }


def variant_rows(n_code: int, n_math: int, n_eval: int) -> dict[str, list[dict]]:
    """Code and math with equivalent solution variants: training rows and the held-out splits
    (by seed, by combination or scenario family, by phrasing family)."""
    if min(n_code, n_math) < 1:
        raise RelaxSpecError("n_codevar_train and n_mathvar_train must be at least 1")
    code_train = codevartasks.train_variant_tasks(n_code)
    code_held = {
        "codevar_eval": codevartasks.heldout_seed_variant_tasks(n_eval),
        "codevar_combos_eval": codevartasks.heldout_combo_variant_tasks(n_eval),
        "codevar_phrasing_eval": codevartasks.heldout_phrasing_variant_tasks(n_eval),
    }
    math_train = mathvariants.train_variant_problems(n_math)
    quote_train = mathquotes.train_quote_problems(n_math)
    order_train = mathquotes.train_ordered_problems(n_math)  # the questions of quote_train
    math_held = {
        "mathvar_eval": mathvariants.heldout_seed_variant_problems(n_eval),
        "mathvar_families_eval": mathvariants.heldout_family_variant_problems(n_eval),
        "mathvar_phrasing_eval": mathvariants.heldout_phrasing_variant_problems(n_eval),
    }
    train_prompts = {t.prompt for t in code_train} | {p.prompt for p in [*math_train, *quote_train]}
    held = [t.prompt for ts in code_held.values() for t in ts] + [
        p.prompt for ps in math_held.values() for p in ps
    ]
    if train_prompts.intersection(held):  # pragma: no cover - excluded by construction
        raise RelaxSpecError("a held-out variant prompt is in the training split")
    return {
        "codevar_train": [_code_row(t) for t in code_train],
        **{name: [_code_row(t, held_out=True) for t in ts] for name, ts in code_held.items()},
        "mathvar_train": [_math_row(p) for p in math_train],
        "mathquote_train": [_math_row(p) for p in quote_train],
        "mathorder_train": [_math_row(p) for p in order_train],
        **{name: [_math_row(p, held_out=True) for p in ps] for name, ps in math_held.items()},
    }

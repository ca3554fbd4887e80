"""``relaxspec train distill``: align a drafter with its target by knowledge distillation.

A drafter is judged by agreement with its target, not by its own quality. DistillSpec (Zhou et
al., 2024) trains the drafter on *the target's own outputs* with the target's full distribution as
soft labels. Two resumable steps: :func:`build_distill_data` (prompts from the corpus's training
split in the benchmarks' shapes, continued by the teacher — greedily, or sampled so the rows cover
the variants a spread target chooses between — appended batch by batch) and
:func:`train_distill` (the student minimises ``KL(p_teacher || p_student)`` at every position,
mixed with plain corpus windows so it does not forget; the shared loop
:func:`relaxspec.train.loop.train`). Held-out rows (every 20th) give the figure that predicts τ:
top-1 agreement of student and teacher. Models and figures: docs/models.md ("Distillation").
"""

from __future__ import annotations

import ast
import json
import random
import textwrap
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from relaxspec.data.codegen import train_pipeline_tasks, train_tasks
from relaxspec.data.codevartasks import train_variant_tasks
from relaxspec.data.corpus import read_jsonl
from relaxspec.data.mathgen import generate_problem, train_styled_problems
from relaxspec.data.mathvariants import train_variant_problems
from relaxspec.data.tokens import TokenMixture, training_data
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.evaluate import heldout_losses
from relaxspec.models import load_model
from relaxspec.train.ar import export_model
from relaxspec.train.loop import (
    TrainConfig,
    TrainState,
    finished_run_record,
    make_config,
    train,
    write_run_record,
)

HELDOUT_EVERY = 20  # every 20th distillation row is held out for the agreement metric


# ---------------------------------------------------------------------------------------------
# 1. Prompts and teacher continuations
# ---------------------------------------------------------------------------------------------


def function_prompts(module_source: str) -> list[str]:
    """HumanEval-shaped prompts from one module: each documented function's header and docstring.

    The prompt runs from the ``def`` line (decorators dropped) to the end of the docstring,
    dedented (methods become top-level-looking functions) and without trailing whitespace, as the
    benchmark's HumanEval prompts are.
    """
    try:
        tree = ast.parse(module_source)
    except (SyntaxError, ValueError):
        return []
    lines = module_source.splitlines()
    prompts = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or ast.get_docstring(node) is None:
            continue
        doc = node.body[0]
        text = textwrap.dedent("\n".join(lines[node.lineno - 1 : doc.end_lineno])).rstrip()
        if text.startswith(("def ", "async def ")):
            prompts.append(text)
    return prompts


@dataclass(frozen=True)
class TeacherPrompts:
    """Which training prompts the teacher continues: how many of each kind, shuffled by ``seed``.

    ``n_code`` function prompts, ``n_math`` math prompts, ``n_synthcode`` synthetic code task
    prompts (half hand-written families, half compositional pipelines; training seeds and
    combinations only, :mod:`relaxspec.data.codegen`), ``n_math_styles`` math questions in the
    training phrasing styles (:func:`relaxspec.data.mathgen.train_styled_problems`), ``n_codevar``
    code tasks and ``n_mathvar`` math problems of the variant family
    (:mod:`relaxspec.data.codevartasks`, :mod:`relaxspec.data.mathvariants`), all from the
    *training* splits.
    """

    n_code: int = 2000
    n_math: int = 1000
    n_synthcode: int = 0
    n_math_styles: int = 0
    n_codevar: int = 0
    n_mathvar: int = 0
    seed: int = 0

    def check(self) -> None:
        counts = (
            self.n_code,
            self.n_math,
            self.n_synthcode,
            self.n_math_styles,
            self.n_codevar,
            self.n_mathvar,
        )
        if min(counts) < 0 or sum(counts) == 0:
            raise RelaxSpecError(
                "n_code, n_math, n_synthcode, n_math_styles, n_codevar and n_mathvar "
                "must be >= 0 and not all 0"
            )


@dataclass(frozen=True)
class TeacherDecoding:
    """How the teacher continues them: greedily (``temperature`` 0) or sampled at ``temperature`` /
    ``top_p``, ``max_new_tokens`` each, prompts over ``max_prompt_tokens`` dropped, ``batch_size``
    prompts per forward."""

    max_new_tokens: int = 96
    max_prompt_tokens: int = 160
    batch_size: int = 32
    temperature: float = 0.0
    top_p: float = 1.0

    def check(self) -> None:
        if self.max_new_tokens < 1 or self.batch_size < 1 or self.max_prompt_tokens < 1:
            raise RelaxSpecError("max_new_tokens, max_prompt_tokens and batch_size must be >= 1")
        if not self.temperature >= 0 or not 0 < self.top_p <= 1:
            raise RelaxSpecError(
                f"temperature must be >= 0 and top_p in (0, 1]; got {self.temperature}, {self.top_p}"
            )


def distill_prompts(corpus_dir: str | Path, want: TeacherPrompts) -> list[dict]:
    """The prompts ``want`` asks for, ``{"source", "prompt"}`` each, shuffled by ``want.seed``."""
    n_code, n_math, n_synthcode = want.n_code, want.n_math, want.n_synthcode
    n_math_styles, n_codevar, n_mathvar, seed = want.n_math_styles, want.n_codevar, want.n_mathvar, want.seed
    corpus = Path(corpus_dir)
    rng = random.Random(seed)
    code: list[str] = []
    if n_code > 0:
        for row in read_jsonl(corpus / "code_train.jsonl"):
            code.extend(function_prompts(row["text"]))
        code = sorted(set(code))
        rng.shuffle(code)
        if len(code) < n_code:
            raise RelaxSpecError(f"only {len(code)} documented functions in the corpus; asked {n_code}")
    math: list[str] = []
    if n_math > 0:
        rows = read_jsonl(corpus / "math_train.jsonl")
        if len(rows) < n_math:
            raise RelaxSpecError(f"only {len(rows)} math training problems; asked {n_math}")
        math = [generate_problem(rows[i]["seed"]).prompt for i in rng.sample(range(len(rows)), n_math)]
    prompts = [{"source": "code", "prompt": p} for p in code[:n_code]]
    prompts += [{"source": "math", "prompt": p} for p in math]
    if n_synthcode > 0:
        tasks = train_tasks(n_synthcode - n_synthcode // 2) + train_pipeline_tasks(n_synthcode // 2)
        prompts += [{"source": "synthcode", "prompt": t.prompt} for t in tasks]
    if n_math_styles > 0:
        styled = train_styled_problems(n_math_styles)
        prompts += [{"source": "math_styles", "prompt": p.prompt} for p in styled]
    if n_codevar > 0:
        prompts += [{"source": "codevar", "prompt": t.prompt} for t in train_variant_tasks(n_codevar)]
    if n_mathvar > 0:
        prompts += [{"source": "mathvar", "prompt": p.prompt} for p in train_variant_problems(n_mathvar)]
    rng.shuffle(prompts)
    return prompts


@torch.no_grad()
def teacher_continuations(
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    max_new_tokens: int,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> list[list[int]]:
    """Token ids ``prompt + continuation`` per prompt (one left-padded batch, cut at EOS): greedy
    at ``temperature`` 0, else sampled at ``temperature`` / ``top_p`` from a generator seeded
    with ``seed`` (so a resumed build redraws the same rows)."""
    tokenizer.padding_side = "left"
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    sampling: dict = {"do_sample": False}
    if temperature > 0:
        torch.manual_seed(seed)
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    out = model.generate(
        **enc.to(model.device),
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **sampling,
    )
    rows = []
    width = enc["input_ids"].shape[1]
    for i in range(len(prompts)):
        prompt_ids = enc["input_ids"][i][enc["attention_mask"][i].bool()].tolist()
        new = out[i, width:].tolist()
        if tokenizer.eos_token_id in new:
            new = new[: new.index(tokenizer.eos_token_id) + 1]
        rows.append(prompt_ids + new)
    return rows


def build_distill_data(
    teacher_dir: str | Path,
    corpus_dir: str | Path,
    out_path: str | Path,
    prompts: TeacherPrompts | None = None,
    decoding: TeacherDecoding | None = None,
    progress: bool = True,
) -> Path:
    """Write ``{"source", "ids", "prompt_len"}`` rows of teacher continuations to ``out_path``.

    Prompts come from the corpus's training split in the shapes the benchmarks use: a function
    signature and docstring from the stdlib training modules (as HumanEval prompts are) and a
    math question ending in ``Answer:`` (``prompts``, :class:`TeacherPrompts`); the teacher continues
    them greedily or samples (``decoding``, :class:`TeacherDecoding`) — sampled rows show the
    student the variants a spread target chooses between, which greedy rows never leave.

    Prompts longer than ``decoding.max_prompt_tokens`` are dropped (HumanEval prompts are shorter) and the
    rest are generated in order of length, so a batch wastes little compute on padding. Appends
    batch by batch; rerunning with the same arguments continues after the rows already written
    (the prompt order is a pure function of the arguments).
    """
    want, how = prompts or TeacherPrompts(), decoding or TeacherDecoding()
    want.check()
    how.check()
    out = Path(out_path)
    teacher = load_model(teacher_dir)
    todo = distill_prompts(corpus_dir, want)
    lengths = [len(ids) for ids in teacher.tokenizer([p["prompt"] for p in todo])["input_ids"]]
    todo = [p | {"prompt_len": n} for p, n in zip(todo, lengths, strict=True) if n <= how.max_prompt_tokens]
    todo.sort(key=lambda p: p["prompt_len"])  # stable: ties keep the shuffled order
    done = 0
    if out.is_file():
        done = len(read_jsonl(out))  # also validates that the existing file is not corrupt
    out.parent.mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=len(todo), initial=done, desc="teacher", disable=not progress, dynamic_ncols=True)
    with out.open("a", encoding="utf-8") as f:
        for start in range(done, len(todo), how.batch_size):
            chunk = todo[start : start + how.batch_size]
            ids = teacher_continuations(
                teacher.model,
                teacher.tokenizer,
                [p["prompt"] for p in chunk],
                how.max_new_tokens,
                how.temperature,
                how.top_p,
                seed=want.seed * 1_000_003 + start,
            )
            for p, row in zip(chunk, ids, strict=True):
                f.write(json.dumps({"source": p["source"], "ids": row, "prompt_len": p["prompt_len"]}) + "\n")
            f.flush()
            bar.update(len(chunk))
    bar.close()
    return out


# ---------------------------------------------------------------------------------------------
# 2. Distillation
# ---------------------------------------------------------------------------------------------


@dataclass
class DistillRecipe:
    corpus_weight: float = 0.25  # share of rows that are plain corpus windows instead of teacher rows
    temperature: float = 1.0  # softens both distributions in the KL (1 = the raw distributions)
    # sources of the plain corpus windows and their weights (relaxspec.data.tokens's sources)
    corpus_mixture: dict[str, float] = field(default_factory=lambda: {"math": 0.5, "code": 0.5})

    def validate(self) -> None:
        if not 0.0 <= self.corpus_weight < 1.0:
            raise RelaxSpecError("corpus_weight must be in [0, 1)")
        if not self.corpus_mixture or any(not w > 0 for w in self.corpus_mixture.values()):
            raise RelaxSpecError(f"corpus_mixture needs positive weights; got {self.corpus_mixture}")
        if self.temperature <= 0:
            raise RelaxSpecError("temperature must be > 0")


def load_rows(path: str | Path, seq_len: int) -> tuple[list[list[int]], list[list[int]]]:
    """(training rows, held-out rows) of a distillation file, each cut to ``seq_len`` tokens."""
    if not Path(path).is_file():
        raise RelaxSpecError(f"distillation rows not found: {path} (run `relaxspec train distill-data`)")
    rows = read_jsonl(Path(path))
    if not rows:
        raise RelaxSpecError(f"no rows in {path}")
    try:
        ids = [[int(t) for t in r["ids"]][:seq_len] for r in rows]
    except (KeyError, TypeError, ValueError):
        raise RelaxSpecError(f"{path} is not a distillation file (rows need an 'ids' list)") from None
    heldout = [r for i, r in enumerate(ids) if i % HELDOUT_EVERY == 0]
    train_rows = [r for i, r in enumerate(ids) if i % HELDOUT_EVERY != 0]
    return train_rows or heldout, heldout


def pad_rows(rows: list[list[int]], seq_len: int, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``input_ids[B, seq_len]`` (right-padded) and ``mask[B, seq_len]`` (1 on real tokens)."""
    ids = torch.full((len(rows), seq_len), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), seq_len), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def kl_to_teacher(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0
) -> torch.Tensor:
    """Mean forward ``KL(p_t || p_s)`` over positions with ``mask`` set; logits ``[B, T, V]``."""
    log_p_s = F.log_softmax(student_logits.float() / temperature, dim=-1)
    log_p_t = F.log_softmax(teacher_logits.float() / temperature, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)  # [B, T]
    weights = mask.float()
    return (kl * weights).sum() / weights.sum().clamp_min(1.0) * temperature**2


@torch.no_grad()
def top1_agreement(
    student: torch.nn.Module,
    teacher: torch.nn.Module,
    rows: list[list[int]],
    pad_id: int,
    batch_size: int = 16,
) -> float:
    """Share of positions of ``rows`` where student and teacher have the same argmax next token."""
    same, total = 0, 0
    for i in range(0, len(rows), batch_size):
        chunk = rows[i : i + batch_size]
        ids, mask = pad_rows(chunk, max(len(r) for r in chunk), pad_id)
        s = student(input_ids=ids, attention_mask=mask).logits.argmax(-1)
        t = teacher(input_ids=ids, attention_mask=mask).logits.argmax(-1)
        same += int(((s == t) & mask.bool()).sum())
        total += int(mask.sum())
    return same / max(total, 1)


def _shown(path: str | Path) -> str:
    """A path as the user would type it: relative to the working directory when inside it."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _distill_notes(record: dict, base: dict) -> str:
    """The card's account of the two stages: pre-training (from the student's record), distillation."""
    d, pre = record["distillation"], record["base_training"]
    text = (
        f"Trained in two stages. **Pre-training** of `{d['student_init']}`"
        + (f" with `{base['command']}`" if base.get("command") else "")
        + (
            f": {pre['checkpoint_step']} steps, {pre['tokens_seen'] / 1e6:.2f}M tokens, "
            f"{pre['wall_seconds'] / 60:.0f} min"
            if {"checkpoint_step", "tokens_seen", "wall_seconds"} <= set(pre)
            else ""
        )
        + f". **Distillation** from `{d['teacher']}` (DistillSpec): `relaxspec train distill-data` had the "
        f"teacher continue {d['rows'] + d['heldout_rows']} training-split prompts (code and math tasks in "
        "the benchmarks' shapes; greedy or sampled, per the data command); the student then "
        f"minimised the forward KL to the teacher on those rows ({1 - d['corpus_weight']:.0%}) and on "
        f"plain corpus windows ({d['corpus_weight']:.0%}). The training table below is the distillation "
        "stage; `agreement` is the student's top-1 agreement with the teacher on held-out rows."
    )
    return text


def _mixed_batches(
    rows: list[list[int]], corpus: TokenMixture, config: TrainConfig, corpus_weight: float, pad_id: int
) -> Callable[[int, int], dict[str, torch.Tensor]]:
    """``batch_fn`` for :func:`train`: teacher rows (padded) and, with probability ``corpus_weight``
    each, plain corpus windows; a pure function of (seed, step, micro), so a resumed run sees
    the same batches."""

    def batch_fn(step: int, micro: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([config.seed, step, micro])
        n_corpus = int(rng.binomial(config.batch_size, corpus_weight))
        picked = [rows[int(i)] for i in rng.integers(0, len(rows), config.batch_size - n_corpus)]
        ids, mask = pad_rows(picked, config.seq_len, pad_id)
        if n_corpus:
            windows = corpus.batch(config.seed, step * config.grad_accum + micro, n_corpus, config.seq_len)
            ids = torch.cat([ids, windows])
            mask = torch.cat([mask, torch.ones_like(windows)])
        return {"input_ids": ids, "attention_mask": mask}

    return batch_fn


def _run_record(
    sources: dict[str, str | Path], recipe: DistillRecipe, n_rows: tuple[int, int], command: str | None
) -> dict:
    """``run.json`` / ``training.json`` of a distillation: the student's preset and base training
    (from its own ``training.json``), the mixture, the inputs and the recipe, and the card's notes.
    ``sources``: student_init, teacher and data paths; ``n_rows``: (training, held-out) rows."""
    record_path = Path(sources["student_init"]) / "training.json"
    base = json.loads(record_path.read_text()) if record_path.is_file() else {}
    record = {
        **{k: v for k, v in base.items() if k in ("preset", "model")},
        "mixture": {"teacher rows": 1 - recipe.corpus_weight, "corpus math/code 1:1": recipe.corpus_weight},
        "command": command or "relaxspec train distill",
        "distillation": {
            **{name: _shown(path) for name, path in sources.items()},
            "rows": n_rows[0],
            "heldout_rows": n_rows[1],
            **asdict(recipe),
        },
        "base_training": {
            k: base[k] for k in ("tokens_seen", "wall_seconds", "checkpoint_step") if k in base
        },
    }
    record["notes"] = _distill_notes(record, base)
    return record


def train_distill(
    student_dir: str | Path,
    teacher_dir: str | Path,
    data_path: str | Path,
    corpus_dir: str | Path,
    run_dir: str | Path,
    export_dir: str | Path | None,
    recipe: DistillRecipe | None = None,
    overrides: dict | None = None,
    progress: bool = True,
    command: str | None = None,
) -> tuple[torch.nn.Module, TrainState]:
    """Distil ``teacher_dir`` into the drafter at ``student_dir``; export when complete."""
    recipe = recipe or DistillRecipe()
    recipe.validate()
    student = load_model(student_dir)
    teacher = load_model(teacher_dir)
    tokenizer = student.tokenizer
    if teacher.tokenizer.get_vocab() != tokenizer.get_vocab():
        raise RelaxSpecError("student and teacher must share a tokenizer")
    defaults = {"steps": 400, "batch_size": 24, "lr": 5e-4, "warmup": 20, "eval_every": 100, "ckpt_every": 50}
    config = make_config(run_dir, defaults, overrides)
    rows, heldout_rows = load_rows(data_path, config.seq_len)
    corpus, heldout = training_data(
        corpus_dir, tokenizer, recipe.corpus_mixture, config.seq_len, heldout_windows=16
    )
    teacher_model = teacher.model.eval().requires_grad_(False)
    pad_id = tokenizer.pad_token_id

    def loss_fn(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        with torch.no_grad():
            teacher_logits = teacher_model(**batch).logits
        return kl_to_teacher(
            model(**batch).logits, teacher_logits, batch["attention_mask"], recipe.temperature
        )

    def eval_fn(model: torch.nn.Module) -> dict[str, float]:
        return {
            **heldout_losses(model, heldout),
            "agreement": top1_agreement(model, teacher_model, heldout_rows, pad_id),
        }

    sources = {"student_init": student_dir, "teacher": teacher_dir, "data": data_path}
    record = _run_record(sources, recipe, (len(rows), len(heldout_rows)), command)
    write_run_record(run_dir, record)
    batch_fn = _mixed_batches(rows, corpus, config, recipe.corpus_weight, pad_id)
    model, state = train(student.model, config, batch_fn, loss_fn, eval_fn, progress=progress)
    if export_dir is not None and state.step >= config.steps:
        export_model(
            model, tokenizer, export_dir, extra={**record, **finished_run_record(model, config, state)}
        )
    return model, state

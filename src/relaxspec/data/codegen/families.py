"""The single-function families' splits (generator version 1), all deterministic.

- **training** — :data:`TRAIN_FAMILIES`, seeds ``[0, EVAL_SEED_START)``, only tasks whose *spec*
  (signature + docstring sentence, without examples) is outside the held-out spec bucket;
- **held-out seeds** — the same families, seeds from :data:`EVAL_SEED_START` on, only tasks whose
  spec falls in the held-out bucket (one spec in :data:`HELDOUT_SPEC_BUCKETS`). No held-out prompt
  can appear in the training stream, whatever the sizes: the bucket is a function of the spec;
- **held-out families** — :data:`HELDOUT_FAMILIES`, never generated for training. Each has close
  training relatives (``sum_odds`` next to ``sum_evens`` and ``count_odds``, ``running_min`` next
  to ``running_max``), so it measures composition of learned pieces, not new knowledge.

Each family draws, from one integer seed, its function name, argument names, docstring phrasing,
constants, whether the signature is annotated, zero to two docstring examples and five or six test
inputs. Expected outputs come from a reference implementation written apart from the body
template, so "every canonical body passes its own tests" checks the two against each other.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from relaxspec.data.codegen import dicts, ints, lists, strings  # noqa: F401  (each registers its families)
from relaxspec.data.codegen.task import _FAMILIES, EVAL_SEED_START, CodeTask, _build_task, is_heldout_spec
from relaxspec.errors import RelaxSpecError

FAMILIES: tuple[str, ...] = tuple(sorted(_FAMILIES))
# Never generated for training. Each has close relatives among the training families.
HELDOUT_FAMILIES: tuple[str, ...] = (
    "any_negative",
    "char_frequency",
    "count_below",
    "count_consonants",
    "keys_above",
    "last_word",
    "max_digit",
    "min_of_three",
    "pairwise_product",
    "running_min",
    "shortest_word",
    "sum_odds",
)
TRAIN_FAMILIES: tuple[str, ...] = tuple(f for f in FAMILIES if f not in HELDOUT_FAMILIES)


def generate_task(seed: int, families: Sequence[str] = TRAIN_FAMILIES) -> CodeTask:
    """The task for ``seed`` drawn from ``families``: deterministic."""
    unknown = set(families) - set(FAMILIES)
    if unknown or not families:
        raise RelaxSpecError(f"unknown code task families: {sorted(unknown)}" if unknown else "no families")
    rng = random.Random(seed)
    family = rng.choice(list(families))
    return _build_task(seed, family, rng, _FAMILIES[family])


def train_tasks(n: int, start: int = 0) -> list[CodeTask]:
    """``n`` training tasks: training families, seeds from ``start`` up, held-out specs skipped."""
    out, seed = [], start
    while len(out) < n:
        if seed >= EVAL_SEED_START:
            raise ValueError("training seeds would overlap the evaluation range")
        task = generate_task(seed, TRAIN_FAMILIES)
        if not is_heldout_spec(task.spec):
            out.append(task)
        seed += 1
    return out


def eval_tasks(n: int) -> list[CodeTask]:
    """Held-out seeds: training families, evaluation seeds, only specs of the held-out bucket."""
    out, seed = [], EVAL_SEED_START
    while len(out) < n:
        task = generate_task(seed, TRAIN_FAMILIES)
        if is_heldout_spec(task.spec):
            out.append(task)
        seed += 1
    return out


def heldout_family_tasks(n: int) -> list[CodeTask]:
    """Held-out families: :data:`HELDOUT_FAMILIES` on the evaluation seeds."""
    return [generate_task(EVAL_SEED_START + i, HELDOUT_FAMILIES) for i in range(n)]

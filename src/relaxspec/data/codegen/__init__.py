"""Synthetic code tasks with unit tests, at the scale of the bundled models (issue 15).

A task is HumanEval-shaped: the prompt is a function signature and docstring, the model writes the
body, and the task's unit tests (``def check(candidate): assert ...``) decide pass@1 in the
sandbox (:func:`relaxspec.eval.sandbox.check_completion`); :mod:`.task` shows one and the
training document. Two generations, one module each:

- **families** (version 1; :mod:`.ints`, :mod:`.lists`, :mod:`.strings`, :mod:`.dicts`, splits in
  :mod:`.families`): small functions whose canonical bodies are 1–6 lines, drawn from one seed;
- **pipelines** (version 2; :mod:`.pieces`, :mod:`.pipelines`): a filter, a map and an aggregator
  composed over a list of integers or the words of a string, with held-out *combinations*.

Adding or changing a family changes which task a seed gives: :data:`GENERATOR_VERSION` says which.
The tasks and the models trained on them: docs/models.md ("Synthetic code tasks").
"""

from relaxspec.data.codegen.families import (
    FAMILIES,
    HELDOUT_FAMILIES,
    TRAIN_FAMILIES,
    eval_tasks,
    generate_task,
    heldout_family_tasks,
    train_tasks,
)
from relaxspec.data.codegen.pieces import _PIECES, _draw_const
from relaxspec.data.codegen.pipelines import (
    HELDOUT_COMBOS,
    PIPELINE_COMBOS,
    TRAIN_COMBOS,
    _piece,
    _pipeline_body,
    _pipeline_inputs,
    generate_pipeline_task,
    heldout_combo_tasks,
    train_pipeline_tasks,
)
from relaxspec.data.codegen.pools import LIST_ARGS, STR_ARGS, WORDS
from relaxspec.data.codegen.task import (
    EVAL_SEED_START,
    GENERATOR_VERSION,
    HELDOUT_SPEC_BUCKETS,
    CodeTask,
    _call,
    is_heldout_spec,
)

__all__ = [
    "EVAL_SEED_START",
    "FAMILIES",
    "GENERATOR_VERSION",
    "HELDOUT_COMBOS",
    "HELDOUT_FAMILIES",
    "HELDOUT_SPEC_BUCKETS",
    "LIST_ARGS",
    "PIPELINE_COMBOS",
    "STR_ARGS",
    "TRAIN_COMBOS",
    "TRAIN_FAMILIES",
    "WORDS",
    "_PIECES",
    "CodeTask",
    "_call",
    "_draw_const",
    "_piece",
    "_pipeline_body",
    "_pipeline_inputs",
    "eval_tasks",
    "generate_pipeline_task",
    "generate_task",
    "heldout_combo_tasks",
    "heldout_family_tasks",
    "is_heldout_spec",
    "train_pipeline_tasks",
    "train_tasks",
]

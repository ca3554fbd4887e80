"""Synthetic grade-school math word problems with step-by-step solutions (docs/design.md §5).

Every problem is generated from one integer seed by ``random.Random(seed)``, so the corpus is
reproducible anywhere and training and evaluation sets are disjoint seed ranges. A problem is a
short story over arithmetic steps on whole numbers; its solution writes one equation per line and
ends with ``#### <answer>``; prompts end with ``"\\nAnswer:"`` (an example: :mod:`.original`).

Three generations, one module each: the **original generator** (:mod:`.original`: five story
families, 2–5 steps; its problems stay byte-identical), the **broadened generator**
(:mod:`.families`: 1–6 steps, 20 more story families in :mod:`.stories` and
:mod:`.heldout_stories`, held-out seeds and held-out scenario families) and **phrasing styles**
(:mod:`.phrasing`): the training scenarios' stories in six styles, with one (scenario, style)
pair per scenario held out. Vocabulary tables live in :mod:`.words`. Models: docs/models.md.
"""

from relaxspec.data.mathgen.families import (
    HELDOUT_MATH_FAMILIES,
    HELDOUT_QUESTION_BUCKETS,
    MATH_FAMILIES,
    MAX_STEPS,
    MIN_STEPS,
    TRAIN_MATH_FAMILIES,
    eval_family_seed_problems,
    generate_family_problem,
    heldout_family_problems,
    is_heldout_question,
    train_family_problems,
)
from relaxspec.data.mathgen.original import FAMILIES, eval_problems, generate_problem, train_problems
from relaxspec.data.mathgen.phrasing import (
    HELDOUT_PHRASINGS,
    NUMBER_WORDS,
    PHRASING_STYLES,
    TRAIN_PHRASINGS,
    generate_styled_problem,
    heldout_phrasing_problems,
    render_style,
    train_styled_problems,
)
from relaxspec.data.mathgen.problem import (
    EVAL_SEED_START,
    MAX_VALUE,
    MathProblem,
    extract_answer,
    format_prompt,
)
from relaxspec.data.mathgen.words import ALL_NAMES

__all__ = [
    "ALL_NAMES",
    "EVAL_SEED_START",
    "FAMILIES",
    "HELDOUT_MATH_FAMILIES",
    "HELDOUT_PHRASINGS",
    "HELDOUT_QUESTION_BUCKETS",
    "MATH_FAMILIES",
    "MAX_STEPS",
    "MAX_VALUE",
    "MIN_STEPS",
    "NUMBER_WORDS",
    "PHRASING_STYLES",
    "TRAIN_MATH_FAMILIES",
    "TRAIN_PHRASINGS",
    "MathProblem",
    "eval_family_seed_problems",
    "eval_problems",
    "extract_answer",
    "format_prompt",
    "generate_family_problem",
    "generate_problem",
    "generate_styled_problem",
    "heldout_family_problems",
    "heldout_phrasing_problems",
    "is_heldout_question",
    "render_style",
    "train_family_problems",
    "train_problems",
    "train_styled_problems",
]

"""Synthetic grade-school math word problems with step-by-step solutions (docs/design.md §5).

Every problem is generated from one integer seed by ``random.Random(seed)``, so the corpus is
reproducible on any machine and the training and evaluation sets are simply disjoint seed ranges.

A problem is a short story over 2–5 arithmetic steps (addition, subtraction, multiplication,
exact division) on whole numbers up to three digits, sometimes with a distractor sentence whose
number plays no part. The solution writes one equation per line and ends with ``#### <answer>``::

    Question: Lena has 124 shells. She finds 3 bags with 15 shells in each. ...
    Answer:
    Shells found: 3 * 15 = 45
    Shells now: 124 + 45 = 169
    #### 169

Prompts end with ``"\\nAnswer:"``; the model continues with the solution lines. Several story
families (an inventory that changes, a shopping bill with change, work at a rate, people compared
to one another, batches packed into boxes) with varied names, objects, units and verbs keep a small
model from memorising one template, so accuracy depends on model size.

Three generations, one module each: the **original generator** (:mod:`.original`: those five
families, 2–5 steps; its problems stay byte-identical), the **broadened generator**
(:mod:`.families`: 1–6 steps, 20 more story families in :mod:`.stories` and
:mod:`.heldout_stories`, held-out seeds and held-out scenario families) and **phrasing styles**
(:mod:`.phrasing`): the training scenarios' stories in six styles, with one (scenario, style)
pair per scenario held out. Vocabulary tables live in :mod:`.words`.
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

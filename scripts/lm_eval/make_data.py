"""Write scripts/lm_eval/math.jsonl: held-out synthetic math problems for the lm-eval smoke tasks.

Each line has the problem for ``relaxspec_math_gen`` (generate_until: ``question``, ``answer``) and
for ``relaxspec_math_mc`` (loglikelihood multiple choice: ``context`` = the prompt and the worked
solution up to ``####``, four ``choices`` for the final number, ``label`` the right one). The
problems are from the evaluation seeds (never trained on), so the file is reproducible:
``PYTHONPATH=src python scripts/lm_eval/make_data.py``.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from relaxspec.data.mathgen import eval_problems

N = 20


def record(problem, rng: random.Random) -> dict:
    steps = problem.solution.rsplit("\n", 1)[0]
    wrong = {problem.answer + d for d in (-10, -1, 1, 2, 10, 100) if problem.answer + d >= 0}
    wrong.discard(problem.answer)
    choices = [problem.answer, *rng.sample(sorted(wrong), 3)]
    rng.shuffle(choices)
    return {
        "question": problem.question,
        "answer": str(problem.answer),
        "context": f"{problem.prompt}\n{steps}\n####",
        "choices": [f" {c}" for c in choices],
        "label": choices.index(problem.answer),
    }


def main() -> None:
    rng = random.Random(36)
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("math.jsonl")
    lines = [json.dumps(record(p, rng)) for p in eval_problems(N)]
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} problems to {out}")


if __name__ == "__main__":
    main()

"""What weight-only int8 costs in output (issue 32 item 2): greedy ``ar`` on ``packed-int8`` vs
``packed-bf16`` on the bench's math prompts, and greedy ``sd`` = ``ar`` on ``packed-int8``.

For each of the first ``--limit`` math prompts, 128 greedy tokens with the bundled target (and
draft, for ``sd`` k = 4) on each kernel choice. Prints the share of identical tokens (position by
position over the bf16 output's length), the prompts whose whole output is identical, exact match
of each (with Wilson intervals), and whether int8 ``sd`` equals int8 ``ar`` token for token::

    RELAXSPEC_THREADS=1 taskset -c 0 python scripts/int8_agreement.py --limit 8
"""

from __future__ import annotations

import argparse

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.threads import configure_threads
from relaxspec.eval.datasets import load_examples
from relaxspec.eval.intervals import format_interval, wilson
from relaxspec.methods import build_engine, load_role
from relaxspec.models import model_dir


def identical_share(a: list[int], b: list[int]) -> tuple[int, int]:
    """(positions where ``b`` has ``a``'s token, ``len(a)``)."""
    return sum(x == y for x, y in zip(a, b, strict=False)), len(a)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--limit", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    args = parser.parse_args()
    configure_threads()
    examples = load_examples("math", args.limit)
    loaded = {
        k: {role: load_role(role, model_dir(role), k) for role in ("target", "draft")}
        for k in ("packed-bf16", "packed-int8")
    }
    same = total = whole = sd_same = 0
    correct = {k: 0 for k in loaded}
    for ex in examples:
        params = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens, stop=ex.stop)
        outs = {k: build_engine("ar", m["target"]).generate(ex.prompt, params) for k, m in loaded.items()}
        int8 = loaded["packed-int8"]
        sd = build_engine("sd", int8["target"], int8["draft"], k=4).generate(ex.prompt, params)
        s, n = identical_share(outs["packed-bf16"].tokens, outs["packed-int8"].tokens)
        same, total = same + s, total + n
        whole += outs["packed-bf16"].tokens == outs["packed-int8"].tokens
        sd_same += sd.tokens == outs["packed-int8"].tokens
        for k, out in outs.items():
            correct[k] += bool(ex.score(out.text))
        print(f"{ex.id}: {s}/{n} identical, int8 sd = int8 ar: {sd.tokens == outs['packed-int8'].tokens}")
    m = len(examples)
    print(f"identical tokens int8 vs bf16: {same}/{total} = {100 * same / max(total, 1):.1f} %")
    print(f"prompts with identical output: {whole}/{m}; int8 sd = int8 ar on {sd_same}/{m}")
    for k, c in correct.items():
        print(f"exact match {k}: {c}/{m} {format_interval(wilson(c, m))}")


if __name__ == "__main__":
    main()

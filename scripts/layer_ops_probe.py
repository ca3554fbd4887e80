"""What the per-operator work of a packed decoder layer costs in place (issue 32): the engine's
layer (engine/packed.py) against variants of it, interleaved forward by forward in one process.

Variants: ``torch-rms-norm`` (torch's RMSNorm instead of the fused layer-norm form the engine
uses), ``joint-rotary`` (q and k rotated as one tensor), ``postop-mlp`` (gate and up as two oneDNN
products with fused swish and multiply, which feed the down product in bf16), ``bf16-mlp`` (SiLU ·
up computed on the gate/up product's bf16 output, no conversions around it). Prints the median
ms of a decode (T = 1) and a verify (T = 9) forward after a 64-token context, the speed-up over the
engine's layer (total time over rounds, a jackknife 95 % interval over the interleaved rounds:
``eval/intervals.py`` ``speed_ratio``), and the largest logit difference from it::

    RELAXSPEC_THREADS=1 taskset -c 0 python scripts/layer_ops_probe.py [--rounds 80]

Figures: docs/performance.md §9 ("Fewer operators per layer").
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import relaxspec.engine.packed as P
from relaxspec.engine.kv import CachedLM
from relaxspec.eval.intervals import format_interval, speed_ratio
from relaxspec.methods import load_role
from relaxspec.models import model_dir

FLAGS: set[str] = set()


def _attention_joint(self: P.PackedLayers, qkv, cache_layer, cos, sin, mask) -> torch.Tensor:
    """:meth:`PackedLayers._attention` with q and k rotated as one ``[B, T, H + Hkv, D]`` tensor."""
    B, T, _ = qkv.shape
    D, H, Hk = self.head_dim, self.heads, self.kv_heads
    qk = qkv[..., : (H + Hk) * D].view(B, T, H + Hk, D)
    half = D // 2
    cos, sin = cos.transpose(1, 2), sin.transpose(1, 2)
    qk = qk * cos + torch.cat((-qk[..., half:], qk[..., :half]), dim=-1) * sin
    q, k = qk.transpose(1, 2).split([H, Hk], dim=1)
    keys, values = cache_layer.update(k, qkv[..., (H + Hk) * D :].view(B, T, Hk, D).transpose(1, 2))
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=Hk != H)
    return out.transpose(1, 2).reshape(B, T, H * D)


def _norm(x: torch.Tensor, weight2: torch.Tensor, eps: float) -> torch.Tensor:
    if "torch-rms-norm" in FLAGS:
        return F.rms_norm(x, x.shape[-1:], weight2[: x.shape[-1]], eps)
    return P.rms_norm(x, weight2, eps)


def variant_layer(self: P.PackedLayers, layer, x, cache_layer, cos, sin, mask) -> torch.Tensor:
    """:meth:`PackedLayers.layer` with the variants in :data:`FLAGS` switched in."""
    h = x if layer.attn_norm is None else _norm(x, layer.attn_norm, self.eps)
    attention = _attention_joint if "joint-rotary" in FLAGS else P.PackedLayers._attention
    x = x + layer.o(attention(self, layer.qkv(h), cache_layer, cos, sin, mask))
    h = _norm(x, layer.mlp_norm, self.eps)
    if "bf16-mlp" in FLAGS:  # SiLU · up on the product's bf16 output, fed to down as it is
        gate, up = torch.ops.mkldnn._linear_pointwise(
            h.to(torch.bfloat16), layer.gate_up.weight, None, "none", [], ""
        ).chunk(2, dim=-1)
        return x + layer.down(F.silu(gate) * up)
    if "postop-mlp" in FLAGS:
        hb = h.to(torch.bfloat16)
        gate = torch.ops.mkldnn._linear_pointwise(hb, layer.gate, None, "swish", [], "")
        return x + layer.down(torch.ops.mkldnn._linear_pointwise.binary(hb, gate, layer.up, None, "mul"))
    gate, up = layer.gate_up(h).chunk(2, dim=-1)
    return x + layer.down(F.silu(gate) * up)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=80)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = load_role("target", model_dir("target", None), kernels="packed-bf16").model
    forward = P.packed_forward(model)
    for packed, hf in zip(forward.layers, model.model.layers, strict=True):  # postop-mlp's weights
        packed.gate = torch.ops.mkldnn._reorder_linear_weight(hf.mlp.gate_proj.weight.detach().bfloat16())
        packed.up = torch.ops.mkldnn._reorder_linear_weight(hf.mlp.up_proj.weight.detach().bfloat16())
    lm = CachedLM(model)
    lm.forward(torch.randint(10, 4000, (1, 64), generator=torch.Generator().manual_seed(0)))
    engine_layer = P.PackedLayers.layer
    variants = {"engine": None, "torch-rms-norm": {"torch-rms-norm"}, "joint-rotary": {"joint-rotary"},
                "postop-mlp": {"postop-mlp"}, "bf16-mlp": {"bf16-mlp"}}  # fmt: skip
    seconds: dict[tuple[str, int], list[float]] = {(v, T): [] for v in variants for T in (1, 9)}
    logits: dict[tuple[str, int], torch.Tensor] = {}
    with torch.inference_mode():
        for _ in range(args.rounds):
            for name, flags in variants.items():
                P.PackedLayers.layer = engine_layer if flags is None else variant_layer
                FLAGS.clear()
                FLAGS.update(flags or ())
                for T in (1, 9):
                    ids = torch.randint(10, 4000, (1, T), generator=torch.Generator().manual_seed(T))
                    start = time.perf_counter()
                    logits[(name, T)] = lm.forward(ids, logits_to_keep=1)
                    seconds[(name, T)].append(time.perf_counter() - start)
                    lm.rollback(64)
    P.PackedLayers.layer = engine_layer
    skip = min(10, args.rounds // 4)  # warm-up rounds
    for T in (1, 9):
        base = seconds[("engine", T)][skip:]
        for name in variants:
            own = seconds[(name, T)][skip:]
            ones = [1.0] * len(own)  # one forward per round: rounds are the paired units
            ratio = speed_ratio(ones, base, ones, own)
            diff = (logits[(name, T)] - logits[("engine", T)]).abs().max().item()
            print(f"T={T} {name:15s} {statistics.median(own) * 1e3:6.2f} ms  engine / this "
                  f"{format_interval(ratio, 3)}  max|Δlogit| {diff:.3g}")  # fmt: skip


if __name__ == "__main__":
    main()

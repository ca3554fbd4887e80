"""Depth up-scaling: start a deeper Llama-style model from a trained shallower one.

A target that has stopped improving at its size (docs/models.md, fine-tune 5d: held-out math
plateaued at 0.70) gets more layers without starting over. The grown model keeps every source
layer in order and inserts copies of evenly spaced ones after them; each copy's attention output
projection and MLP down projection are zeroed, so a copy adds nothing to the residual stream and
the grown model computes exactly the source's function on its first step (the SOLAR-style depth
up-scaling, made function-preserving as in Net2Net). Training then moves the copies away from
zero where the extra depth helps.
"""

from __future__ import annotations

import math
import re

import torch

from relaxspec.errors import RelaxSpecError

_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")
# The projections that write a layer's output into the residual stream (zeroed in a copy).
RESIDUAL_WRITERS = ("self_attn.o_proj.weight", "mlp.down_proj.weight")


def layer_sources(n_source: int, n_grown: int) -> list[tuple[int, bool]]:
    """For each layer of the grown model: (source layer it copies, whether it is an inserted copy).

    The ``n_grown − n_source`` copies (at most one per source layer) follow evenly spaced source
    layers, so every source layer keeps its relative place.
    """
    if not 0 < n_source <= n_grown <= 2 * n_source:
        raise RelaxSpecError(f"cannot grow {n_source} layers into {n_grown} (at most doubling)")
    extra = n_grown - n_source
    # distinct while extra <= n_source: consecutive points lie >= 1 apart, or (doubling) at i + 1 - ε
    after = {math.ceil((i + 1) * n_source / (extra + 1)) - 1 for i in range(extra)}
    plan: list[tuple[int, bool]] = []
    for layer in range(n_source):
        plan.append((layer, False))
        if layer in after:
            plan.append((layer, True))
    return plan


def grow_state_dict(source: dict[str, torch.Tensor], n_source: int, n_grown: int) -> dict[str, torch.Tensor]:
    """The state dict of an ``n_grown``-layer model made from an ``n_source``-layer one.

    Non-layer tensors (embedding, final norm, head) are shared as they are; layer ``j`` of the
    result holds source layer ``layer_sources(...)[j][0]``'s tensors, with :data:`RESIDUAL_WRITERS`
    zeroed in inserted copies.
    """
    plan = layer_sources(n_source, n_grown)
    grown: dict[str, torch.Tensor] = {}
    by_layer: dict[int, dict[str, torch.Tensor]] = {}
    for name, tensor in source.items():
        match = _LAYER.match(name)
        if match is None:
            grown[name] = tensor.clone()
        else:
            by_layer.setdefault(int(match.group(1)), {})[match.group(2)] = tensor
    if sorted(by_layer) != list(range(n_source)):
        raise RelaxSpecError(f"the source has layers {sorted(by_layer)}, not 0..{n_source - 1}")
    for j, (layer, is_copy) in enumerate(plan):
        for part, tensor in by_layer[layer].items():
            zero = is_copy and part in RESIDUAL_WRITERS
            grown[f"model.layers.{j}.{part}"] = torch.zeros_like(tensor) if zero else tensor.clone()
    return grown

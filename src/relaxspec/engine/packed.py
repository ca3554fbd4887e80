"""A packed-weight forward for Llama-family causal LMs on CPU (issue 14; gpt-fast's ``model.py``).

Each weight is reordered once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``) and multiplied with ``mkldnn._linear_pointwise``;
q/k/v and gate/up are fused into one product each, and a layer is a dozen explicit tensor ops
(:class:`PackedForward` says what it computes and in which precision). Why this pays, measured
with ``scripts/verify_cost.py``: docs/performance.md §2.

It reads and writes the model's ordinary cache (:func:`relaxspec.engine.kv.new_cache`) and takes
the batched server's ``attention_mask``/``position_ids``, so every engine runs on it unchanged:
the one entry point is :func:`relaxspec.engine.kv.model_logits`, which uses the forward
:func:`attach` gave the model. Weights are packed when attached: a model trained afterwards must
be attached again. Models it does not cover (other architectures, sliding windows, biases on
o/down, QK norms, a CPU without oneDNN) keep transformers' forward; :func:`kernels_of` says which
one runs and :func:`unsupported_reason` why.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from relaxspec.engine.native import fusion_allowed, layers_module, own_kernels, own_kernels_available
from relaxspec.errors import RelaxSpecError

# What a model's products run on: ``hf`` = transformers' own forward; ``packed`` = this module,
# fp32 weights; ``packed-bf16`` = this module, bf16 weights; ``packed-int8`` = this module,
# weight-only int8 (opt-in: it changes the numbers, docs/performance.md §7); ``auto`` = the fastest
# measured exact-weight one the model and CPU allow (packed-bf16 where oneDNN has bf16 kernels,
# else packed, else hf).
KERNELS = ("auto", "hf", "packed", "packed-bf16", "packed-int8")
WEIGHTS = {"packed": "fp32", "packed-bf16": "bf16", "packed-int8": "int8"}  # kernels -> weights
ATTRIBUTE = "relaxspec_packed_forward"  # where attach() leaves the forward on the model
SUPPORTED_TYPES = ("llama", "qwen2")


def _bf16_kernels() -> bool:
    return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def unsupported_reason(model: PreTrainedModel) -> str | None:
    """Why :class:`PackedForward` cannot run ``model`` (None: it can)."""
    config = model.config
    if not torch.backends.mkldnn.is_available():
        return "torch was built without oneDNN"
    if model.device.type != "cpu":
        return f"the model is on {model.device.type}, the packed kernels are CPU-only"
    if config.model_type not in SUPPORTED_TYPES:
        return f"architecture {config.model_type!r} (packed forward: {', '.join(SUPPORTED_TYPES)})"
    if getattr(config, "use_sliding_window", False) or (
        config.model_type != "qwen2" and getattr(config, "sliding_window", None)
    ):
        return "sliding-window attention"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r} (packed forward: silu)"
    layer = model.model.layers[0]
    if getattr(layer.self_attn, "q_norm", None) is not None:
        return "QK norms"
    if (
        getattr(layer.self_attn.o_proj, "bias", None) is not None
        or getattr(layer.mlp.down_proj, "bias", None) is not None
    ):
        return "biases on the output projections"
    return None


def resolve_kernels(model: PreTrainedModel, kernels: str) -> str:
    """The kernels ``kernels`` (one of :data:`KERNELS`) means for ``model``: never ``auto``."""
    if kernels not in KERNELS:
        raise RelaxSpecError(f"unknown kernels {kernels!r} (choose from {', '.join(KERNELS)})")
    if kernels == "hf":
        return "hf"
    reason = unsupported_reason(model)
    if reason is not None:
        if kernels == "auto":
            return "hf"
        raise RelaxSpecError(f"--kernels {kernels} cannot run this model: {reason}")
    if kernels in ("packed-bf16", "packed-int8") and not _bf16_kernels():
        raise RelaxSpecError(f"--kernels {kernels} needs a CPU with bf16 instructions (oneDNN reports none)")
    if kernels == "auto":
        return "packed-bf16" if _bf16_kernels() else "packed"
    return kernels


def attach(model: PreTrainedModel, kernels: str = "auto") -> str:
    """Run ``model``'s decoding forwards on ``kernels``; returns the resolved choice.

    ``hf`` detaches any packed forward. The model itself is not modified (its weights stay what
    training and transformers' forward use); the packed copies live beside it.
    """
    resolved = resolve_kernels(model, kernels)
    if resolved == "hf":
        model.__dict__.pop(ATTRIBUTE, None)
    else:  # a plain attribute, not a submodule
        model.__dict__[ATTRIBUTE] = PackedForward(model, WEIGHTS[resolved])
    return resolved


def packed_forward(model: PreTrainedModel) -> PackedForward | None:
    """The forward :func:`attach` gave ``model`` (None: transformers' own)."""
    return model.__dict__.get(ATTRIBUTE)


def kernels_of(model: PreTrainedModel) -> str:
    """``hf``, ``packed``, ``packed-bf16`` or ``packed-int8``: what
    :func:`relaxspec.engine.kv.model_logits` runs."""
    forward = packed_forward(model)
    if forward is None:
        return "hf"
    return {weights: kernels for kernels, weights in WEIGHTS.items()}[forward.weights]


def _fused(linears: Sequence[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The float32 weights ``[Σ out, in]`` and bias (None if none has one) of ``linears`` stacked."""
    weight = torch.cat([lin.weight.detach().float() for lin in linears])
    if all(lin.bias is None for lin in linears):
        return weight, None
    biases = [lin.bias if lin.bias is not None else lin.weight.new_zeros(lin.out_features) for lin in linears]
    return weight, torch.cat([b.detach().float() for b in biases])


class PackedLinear:
    """``y = x Wᵀ + b`` for ``x[..., in]`` with ``W[out, in]`` reordered once for oneDNN.

    Several ``torch.nn.Linear`` of the same input are fused into one product (their rows
    concatenated: q/k/v, gate/up). Inputs are cast to the packed dtype; outputs come back in
    float32 ``[..., out]``. Where the few-row kernel runs (engine/native.py ``own_kernels``: products
    of at most ``small_rows()`` input rows), bf16 weights are also kept in the layout it reads
    (``vnni``, :func:`vnni_layout`).
    """

    def __init__(self, linears: Sequence[torch.nn.Linear], dtype: torch.dtype) -> None:
        weight, bias = _fused(linears)
        self.dtype = dtype
        self.out_features, self.in_features = weight.shape
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight.to(dtype).contiguous())
        self.bias = None if bias is None else bias.to(dtype)
        fits = dtype == torch.bfloat16 and self.in_features % 2 == 0 and self.out_features % 16 == 0
        self.vnni = vnni_layout(weight.to(dtype)) if fits and own_kernels_available() else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        kernel = None if self.vnni is None else own_kernels()
        if kernel is not None and 0 < x.numel() <= kernel.small_rows() * self.in_features:
            return kernel.small_product(x, self.vnni, self.bias, None)
        y = torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.weight, self.bias, "none", [], "")
        return y.float()

    def parts(self, own: bool) -> list[torch.Tensor | None]:
        """``[weight, bias, scale, vnni]`` as the C++ loop takes a product (csrc/layers.cpp
        ``Linear``; no ``vnni`` unless ``own``: the module's own kernels run)."""
        return [self.weight, self.bias, None, self.vnni if own else None]


def vnni_layout(weight: torch.Tensor) -> torch.Tensor:
    """bf16 or int8 ``W[out, in]`` -> ``[out/16, in/2, 32]``: for each block of 16 outputs and each pair of
    inputs, the 32 weights one ``vdpbf16ps`` multiplies (16 outputs of 2 inputs each), the
    order the few-row kernel streams them in (csrc/kernels.h)."""
    out, inputs = weight.shape
    blocks = weight.view(out // 16, 16, inputs // 2, 2).permute(0, 2, 1, 3)  # [out/16, in/2, 16, 2]
    return blocks.contiguous().view(out // 16, inputs // 2, 32)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: ``W ≈ q · s[:, None]`` with ``s = max_j |W_ij| / 127``.

    Returns ``(q int8[out, in], s float32[out])``; an all-zero row gets scale 1 (q = 0).
    """
    scale = weight.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
    return q.contiguous(), scale


class Int8Linear:
    """``y = x (q · s)ᵀ + b``: weight-only int8 (:func:`quantize_int8`), bf16 activations.

    ``torch.ops.aten._weight_int8pack_mm(x bf16[M, in], q int8[out, in], s bf16[out])`` converts each
    weight to bf16 on the fly and scales the product's columns: half the bytes of bf16 weights
    read per product. Where the few-row kernel runs, ``q`` is also kept in its layout (``vnni``)
    and every product takes it, ``small_rows()`` rows at a time (faster than torch's at any size).
    ``x[..., in]`` -> float32 ``[..., out]``; several linears fuse as in :class:`PackedLinear`.
    """

    def __init__(self, linears: Sequence[torch.nn.Linear]) -> None:
        weight, bias = _fused(linears)
        self.q, scale = quantize_int8(weight)
        self.scale = scale.to(torch.bfloat16)
        self.bias = bias
        self.out_features, self.in_features = weight.shape
        fits = self.in_features % 2 == 0 and self.out_features % 16 == 0
        self.vnni = vnni_layout(self.q) if fits and own_kernels_available() else None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        kernel = None if self.vnni is None else own_kernels()
        if kernel is not None and x.numel() > 0:  # any number of rows, small_rows() at a time
            return kernel.small_product(x, self.vnni, self.bias, self.scale)
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        y = torch.ops.aten._weight_int8pack_mm(flat, self.q, self.scale).float()
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def parts(self, own: bool) -> list[torch.Tensor | None]:
        """``[weight, bias, scale, vnni]`` as the C++ loop takes a product (csrc/layers.cpp ``Linear``)."""
        return [self.q, self.bias, self.scale, self.vnni if own else None]


def packed_linear(linears: Sequence[torch.nn.Linear], weights: str) -> PackedLinear | Int8Linear:
    """The product of ``linears`` (fused) on ``weights`` = ``fp32``, ``bf16`` or ``int8``."""
    if weights == "int8":
        return Int8Linear(linears)
    return PackedLinear(linears, torch.bfloat16 if weights == "bf16" else torch.float32)


def doubled(weight: torch.Tensor) -> torch.Tensor:
    """``[w ; w]`` float32 ``[2·H]``: an RMSNorm weight ``w[H]`` as :func:`rms_norm` takes it."""
    return torch.cat([weight.detach().float(), weight.detach().float()])


def rms_norm(x: torch.Tensor, weight2: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x[..., H]``: ``x / sqrt(mean(x²) + eps) · w``, ``weight2 = [w ; w]`` (:func:`doubled`).

    Computed as one layer norm over ``[x ; −x]``, whose mean is 0 and variance ``mean(x²)``:
    torch's CPU layer norm is one fused kernel where its RMSNorm is several ops, and every op
    costs in a decode step (docs/performance.md §9). Same value up to float32 rounding.
    """
    H = x.shape[-1]
    return F.layer_norm(torch.cat([x, -x], dim=-1), (2 * H,), weight2, None, eps)[..., :H]


@dataclass
class PackedLayer:
    qkv: PackedLinear | Int8Linear
    o: PackedLinear | Int8Linear
    gate_up: PackedLinear | Int8Linear
    down: PackedLinear | Int8Linear
    attn_norm: torch.Tensor | None  # [2·hidden] doubled RMSNorm weights (None: no input norm, EAGLE-1)
    mlp_norm: torch.Tensor  # [2·hidden] doubled (rms_norm)

    @classmethod
    def of(cls, layer: torch.nn.Module, weights: str) -> PackedLayer:
        """A transformers Llama decoder layer's products packed on ``weights``."""
        norm = getattr(layer.input_layernorm, "weight", None)  # an nn.Identity has none
        return cls(
            qkv=packed_linear([getattr(layer.self_attn, f"{x}_proj") for x in "qkv"], weights),
            o=packed_linear([layer.self_attn.o_proj], weights),
            gate_up=packed_linear([layer.mlp.gate_proj, layer.mlp.up_proj], weights),
            down=packed_linear([layer.mlp.down_proj], weights),
            attn_norm=None if norm is None else doubled(norm),
            mlp_norm=doubled(layer.post_attention_layernorm.weight),
        )

    def parts(self, own: bool) -> list[torch.Tensor | None]:
        """The layer's 18 tensors in the C++ loop's order: norms, then qkv, o, gate_up, down."""
        products = (self.qkv, self.o, self.gate_up, self.down)
        return [self.attn_norm, self.mlp_norm, *(t for lin in products for t in lin.parts(own))]


class PackedLayers:
    """The attention geometry of packed decoder layers and one layer's step (shared by
    :class:`PackedForward` and the EAGLE head's packed forward)."""

    def __init__(self, config, weights: str) -> None:
        self.weights = weights  # "fp32", "bf16" or "int8" (WEIGHTS)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.eps = float(config.rms_norm_eps)
        self.rotary: torch.nn.Module | None = None  # the model's rotary embedding (set by subclasses)
        self.positions = int(getattr(config, "max_position_embeddings", 0))
        self.cos = self.sin = torch.empty(0, self.head_dim)

    def _table(self, size: int) -> None:
        """Grow the rotary tables (cos, sin ``float32[P, D]`` of positions 0 .. P − 1, the rotary
        module's own numbers) to at least ``size`` positions, by doubling."""
        if size > self.cos.shape[0]:
            assert self.rotary is not None
            size = max(size, 2 * self.cos.shape[0], self.positions)
            cos, sin = self.rotary(torch.zeros(1, 1, 1), torch.arange(size)[None])
            self.cos, self.sin = cos[0].float(), sin[0].float()

    def rotary_rows(self, start: int, T: int) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``float32[1, 1, T, D]`` of positions ``start .. start + T − 1`` (views of the table)."""
        self._table(start + T)
        return self.cos[None, None, start : start + T], self.sin[None, None, start : start + T]

    def rotary_at(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``float32[B, 1, T, D]`` of the positions ``position_ids[B, T]``."""
        if int(position_ids.min()) < 0:  # no table row for these: the rotary module's own numbers
            assert self.rotary is not None
            cos, sin = self.rotary(torch.zeros(1, 1, 1), position_ids)
            return cos[:, None].float(), sin[:, None].float()
        self._table(int(position_ids.max()) + 1)
        return self.cos[position_ids][:, None], self.sin[position_ids][:, None]

    def run_layers(
        self,
        layers: Sequence[PackedLayer],
        x: torch.Tensor,
        cache_layers,
        cos: torch.Tensor,
        sin: torch.Tensor,
        mask,
        causal: bool = False,
    ) -> torch.Tensor:
        """``layers`` in turn on ``x float32[B, T, hidden]``, each appending to its cache layer.

        The C++ loop (engine/native.py: the same ops, without Python's cost per op) where it is
        built and every cache layer hands out its buffers (``reserve``: the position-indexed
        cache); else :meth:`layer` one by one. ``causal``: ``mask`` is the plain causal one (the
        new tokens see the cache and themselves in order), which lets the C++ loop fuse a forward
        of one sequence (engine/native.py).
        """
        native = layers_module()
        if native is None or not all(hasattr(c, "reserve") for c in cache_layers):
            for layer, cache_layer in zip(layers, cache_layers, strict=True):
                x = self.layer(layer, x, cache_layer, cos, sin, mask)
            return x
        B, T = x.shape[:2]
        past, keys, values = _reserve(cache_layers, B, T, self.kv_heads, self.head_dim, x)
        own = own_kernels() is not None
        parts = self._parts(layers, own)
        x = native.run_layers(
            x, parts, keys, values, past, cos, sin, mask, causal,
            self.heads, self.kv_heads, self.head_dim, self.eps, own, own and fusion_allowed(),
        )  # fmt: skip
        _advance(cache_layers, past, T)
        return x

    def _parts(self, layers: Sequence[PackedLayer], own: bool) -> list[torch.Tensor | None]:
        """The flat tensor list of ``layers`` for the C++ loop (made once per list of layers and
        choice of kernels)."""
        cached = self.__dict__.get("_parts_of")
        if cached is None or cached[0] is not layers or cached[1] != own:
            flat = [t for layer in layers for t in layer.parts(own)]
            cached = self.__dict__["_parts_of"] = (layers, own, flat)
        return cached[2]

    def layer(
        self, layer: PackedLayer, x: torch.Tensor, cache_layer, cos: torch.Tensor, sin: torch.Tensor, mask
    ) -> torch.Tensor:
        """One decoder layer on the residual stream ``x float32[B, T, hidden]``; appends to the cache."""
        h = x if layer.attn_norm is None else rms_norm(x, layer.attn_norm, self.eps)
        x = x + layer.o(self._attention(layer.qkv(h), cache_layer, cos, sin, mask))
        h = rms_norm(x, layer.mlp_norm, self.eps)
        gate, up = layer.gate_up(h).chunk(2, dim=-1)
        return x + layer.down(F.silu(gate) * up)

    def _attention(
        self, qkv: torch.Tensor, cache_layer, cos: torch.Tensor, sin: torch.Tensor, mask
    ) -> torch.Tensor:
        """``qkv[B, T, (H + 2·Hkv)·D]`` → attention output ``[B, T, H·D]``; appends k/v to the cache."""
        B, T, _ = qkv.shape
        D = self.head_dim
        q, k, v = qkv.split([self.heads * D, self.kv_heads * D, self.kv_heads * D], dim=-1)
        q = _rotate(q.view(B, T, self.heads, D).transpose(1, 2), cos, sin)
        k = _rotate(k.view(B, T, self.kv_heads, D).transpose(1, 2), cos, sin)
        keys, values = cache_layer.update(k, v.view(B, T, self.kv_heads, D).transpose(1, 2))
        keys, values, gqa = keys.float(), values.float(), self.kv_heads != self.heads
        native = own_kernels()  # a decode step's attention kernel, where the module has it
        if native is not None:
            out = native.attend(q, keys, values, mask, gqa)
        else:
            out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
        return out.transpose(1, 2).reshape(B, T, self.heads * D)


class PackedForward(PackedLayers):
    """The decoding forward of one Llama-family model on packed weights.

    What it computes is transformers' Llama forward (RMSNorm → fused qkv → rotary → attention over
    the cache → o → residual → RMSNorm → fused gate/up → SiLU·up → down → residual), with

    - the residual stream, norms, rotary, softmax and the returned logits in float32;
    - products with ``weights="fp32"`` in float32 (same numbers as transformers' fp32 forward up
      to summation order), or with ``weights="bf16"`` on bf16 inputs and weights (outputs rounded
      to bf16, as in a bf16 model; the bundled checkpoints are stored in bf16, so the weights are
      exact), or with ``weights="int8"`` (``--kernels packed-int8``, opt-in) on bf16 inputs and
      weight-only int8 weights with one scale per output channel (:class:`Int8Linear`;
      docs/performance.md §9).
    """

    def __init__(self, model: PreTrainedModel, weights: str = "bf16") -> None:
        super().__init__(model.config, weights)
        base = model.model
        self.embed = base.embed_tokens
        self.rotary = base.rotary_emb
        self.fusable = True  # until the C++ side declines a forward of one sequence (fused)
        self.norm = doubled(base.norm.weight)
        self.lm_head = packed_linear([model.lm_head], weights)
        self.layers = [PackedLayer.of(layer, weights) for layer in base.layers]

    def __call__(
        self,
        input_ids: torch.Tensor,
        cache,
        logits_to_keep: int = 0,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Logits ``float32[B, T', V]`` of ``input_ids[B, T]`` after the ``cache``'s entries.

        ``T' = logits_to_keep`` last positions (T if 0); the other arguments as :meth:`hidden`.
        """
        T = input_ids.shape[1]
        keep = T if logits_to_keep == 0 else min(logits_to_keep, T)
        if attention_mask is None and position_ids is None:
            fused = self.fused(input_ids, cache, keep)
            if fused is not None:
                return fused[0]
        return self.lm_head(self.hidden(input_ids, cache, attention_mask, position_ids, keep))

    @torch.inference_mode()
    def fused(self, input_ids: torch.Tensor, cache, keep: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The whole forward of one sequence in one C++ call, where it fits (engine/native.py:
        own kernels, fusion allowed, a position cache; the C++ side checks the model and the
        length): ``(logits float32[1, keep, V], normed hidden float32[1, T, hidden])``, else None.
        ``input_ids[1, T]`` are fed after the cache's entries under the plain causal mask."""
        native = own_kernels() if layers_module() is not None else None  # not in python_layers()
        layers, T = cache.layers, input_ids.shape[1]
        if native is None or not fusion_allowed() or input_ids.shape[0] != 1 or not self.fusable:
            return None
        if not 1 <= T <= native.fused_rows() or not all(hasattr(c, "reserve") for c in layers):
            return None
        past, keys, values = _reserve(layers, 1, T, self.kv_heads, self.head_dim, self.cos)
        cos, sin = self.rotary_rows(past[0], T)
        out = native.fused_forward(
            input_ids, self.embed.weight, self.norm, self.lm_head.parts(True), keep,
            self._parts(self.layers, True), keys, values, past, cos, sin,
            self.heads, self.kv_heads, self.head_dim, self.eps,
        )  # fmt: skip
        if out is None:  # the model itself does not fit (biases, fp32 products, its head dim): not
            self.fusable = False  # worth asking again every step
            return None
        _advance(layers, past, T)
        return out

    def logits_and_hidden(
        self, input_ids: torch.Tensor, cache, keep: int, **inputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of the last ``keep`` positions and the normed hidden states of all T
        (``[B, keep, V]``, ``[B, T, hidden]``): one fused call where it fits, else :meth:`hidden`
        then :meth:`logits`."""
        if not inputs:
            fused = self.fused(input_ids, cache, keep)
            if fused is not None:
                return fused
        T = input_ids.shape[1]
        states = self.hidden(input_ids, cache, keep=T, **inputs)
        return self.logits(states[:, T - keep :]), states

    @torch.inference_mode()
    def hidden(
        self,
        input_ids: torch.Tensor,
        cache,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        keep: int | None = None,
    ) -> torch.Tensor:
        """Final normed hidden states ``float32[B, keep, hidden]`` (the LM head's inputs) of the
        last ``keep`` (default all T) of ``input_ids[B, T]``, fed after the ``cache``'s S entries.

        ``attention_mask``: ``[B, S+T]`` with 1 = attend (padding; causal order is added), or an
        explicit ``[B|1, 1, T, S+T]`` mask (bool, or additive float: 0 = attend), used as given
        (the diffusion drafter's block mask). ``position_ids[B, T]`` default to ``S .. S+T-1``.
        The cache grows by T per layer.
        """
        B, T = input_ids.shape
        past = cache.get_seq_length()
        x = self.embed(input_ids).float()  # [B, T, hidden]
        cos, sin = self.rotary_rows(past, T) if position_ids is None else self.rotary_at(position_ids)
        causal = attention_mask is None  # the mask below is then the plain causal one
        if attention_mask is not None and attention_mask.dim() == 4:
            mask = attention_mask if attention_mask.dtype == torch.bool else attention_mask.float()
        else:
            mask = self._mask(B, T, past, attention_mask)
        x = self.run_layers(self.layers, x, cache.layers, cos, sin, mask, causal)
        keep = T if keep is None else keep
        return rms_norm(x[:, T - keep :], self.norm, self.eps)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head on ``hidden[..., hidden_size]`` -> float32 logits ``[..., V]``."""
        return self.lm_head(hidden)

    @staticmethod
    def _mask(B: int, T: int, past: int, attention_mask: torch.Tensor | None) -> torch.Tensor | None:
        """Bool ``[B|1, 1, T, S+T]``: new token t sees cache columns ≤ its own, where the mask allows.

        None when every query may see every key (one new token, no padding). A query always sees
        itself, so a padding position's (discarded) output stays finite.
        """
        if attention_mask is None and T == 1:
            return None
        total = past + T
        columns = torch.arange(total)
        own = past + torch.arange(T)
        allowed = columns[None, :] <= own[:, None]  # [T, S+T] causal
        if attention_mask is None:
            return allowed[None, None]
        allowed = allowed[None] & attention_mask[:, None, :total].bool()
        allowed |= columns[None, None, :] == own[None, :, None]
        return allowed[:, None]


def _reserve(
    cache_layers, B: int, T: int, kv_heads: int, head_dim: int, like: torch.Tensor
) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
    """Each position-cache layer's length and its key and value buffers, with room for T more
    positions of B rows (what the C++ loop writes into; :func:`_advance` then moves the lengths)."""
    past = [c.get_seq_length() for c in cache_layers]
    buffers = [c.reserve(B, kv_heads, T, head_dim, like) for c in cache_layers]
    return past, [k for k, _ in buffers], [v for _, v in buffers]


def _advance(cache_layers, past: list[int], T: int) -> None:
    for cache_layer, start in zip(cache_layers, past, strict=True):
        cache_layer.set_length(start + T)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x[B, heads, T, D]`` (transformers' ``apply_rotary_pos_emb``)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin

"""EagleProposer: an EAGLE-style head drafts from the target's own hidden states (EAGLE §3).

The head is EAGLE-1's: ``fc([e(x_{t+1}) ; f_t])`` (2H → H, no bias), then one Llama decoder layer
without its input norm: ``f_t`` the target's last (normed) hidden state at position t, ``e`` the
target's input embedding. Its output ``f̂_{t+1}`` predicts the target's next feature, and the
target's own LM head turns it into the law of ``x_{t+2}``. The head reuses the target's embedding
and LM head (frozen); an export stores only the head's weights, under the names vLLM's ``eagle``
proposer loads (``fc.weight``, ``layers.0.*``: the same directory serves both engines), and a
config naming the target it was trained for (hidden size, vocabulary, hashes of the embedding and
LM head) — :func:`check_fits` refuses any other target.

How a chain of K is drafted from the target's recorded features: :class:`EagleProposer`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import LlamaConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.kv import CachedLM, new_cache
from relaxspec.engine.packed import PackedLayer, PackedLayers, packed_forward, packed_linear
from relaxspec.engine.proposers.base import Proposal, draft_chain
from relaxspec.engine.proposers.draft_vocab import ReducedHead, load_ranking
from relaxspec.engine.proposers.rows import drafter_logits
from relaxspec.errors import RelaxSpecError

ARCHITECTURE = "RelaxSpecEagleHead"  # format 1's "architectures" (recognised, refused with its version)
MARKER = "relaxspec_eagle"  # config.json key: the head format's version
TARGET_KEY = "relaxspec_target"  # config.json key: the fingerprint of the target it was trained for
FORMAT_VERSION = 2  # 2: EAGLE-1 / vLLM layout (fc([e ; f]) without bias, no input norm)
WEIGHTS = "model.safetensors"


def _digest(weight: torch.Tensor) -> str:
    """sha256 of a weight rounded to bf16 (the dtype models are stored in), first 16 hex digits."""
    data = weight.detach().to(torch.bfloat16).contiguous().view(torch.int16).cpu().numpy().tobytes()
    return hashlib.sha256(data).hexdigest()[:16]


def target_fingerprint(target: PreTrainedModel) -> dict[str, Any]:
    """What a head records of its target: hidden size, vocabulary, embedding and LM-head hashes."""
    embed = target.get_input_embeddings().weight
    head = target.get_output_embeddings().weight
    return {
        "hidden_size": int(embed.shape[1]),
        "vocab_size": int(head.shape[0]),
        "embedding_sha256": _digest(embed),
        "lm_head_sha256": _digest(head),
    }


def stored_fingerprint(model_dir: str | Path) -> dict[str, Any]:
    """:func:`target_fingerprint` of a model directory's safetensors, reading only its embedding
    and LM head (for engines that load the target themselves, e.g. vLLM); tied heads share one."""
    from safetensors import safe_open

    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        where = {name: root / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    else:
        with safe_open(str(root / WEIGHTS), framework="pt") as f:
            where = dict.fromkeys(f.keys(), root / WEIGHTS)
    embed = next((n for n in where if n.endswith("embed_tokens.weight")), None)
    if embed is None:
        raise RelaxSpecError(f"{root} has no input embedding (no *embed_tokens.weight tensor)")
    head = "lm_head.weight" if "lm_head.weight" in where else embed

    def tensor(name: str) -> torch.Tensor:
        with safe_open(str(where[name]), framework="pt") as f:
            return f.get_tensor(name)

    e, h = tensor(embed), tensor(head)
    return {"hidden_size": int(e.shape[1]), "vocab_size": int(h.shape[0]),
            "embedding_sha256": _digest(e), "lm_head_sha256": _digest(h)}  # fmt: skip


def check_fits(
    recorded: dict[str, Any], target: PreTrainedModel | dict[str, Any], where: str = "the EAGLE head"
) -> None:
    """One clear error if ``target`` (a model, or its :func:`target_fingerprint`) is not the model
    the head was trained on (its ``recorded`` fingerprint)."""
    actual = target if isinstance(target, dict) else target_fingerprint(target)
    for key, what in (
        ("hidden_size", "hidden size"),
        ("vocab_size", "vocabulary size"),
        ("embedding_sha256", "input embedding (hash)"),
        ("lm_head_sha256", "LM head (hash)"),
    ):
        if recorded.get(key) != actual[key]:
            raise RelaxSpecError(
                f"{where} was trained for another target: its target's {what} is {recorded.get(key)}, "
                f"this target's is {actual[key]}; train a head for this target with "
                "`relaxspec train eagle --target DIR`"
            )


def _head_config(path: Path) -> dict[str, Any]:
    """A head directory's config.json, its format version checked."""
    try:
        data = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as err:
        raise RelaxSpecError(f"cannot load the EAGLE head from {path}: {type(err).__name__}: {err}") from None
    if data.get(MARKER) != FORMAT_VERSION:
        raise RelaxSpecError(
            f"cannot load the EAGLE head from {path}: format version {data.get(MARKER)!r}, this "
            f"relaxspec reads {FORMAT_VERSION}: retrain it with `relaxspec train eagle`"
        )
    return data


def recorded_target(path: str | Path) -> dict[str, Any]:
    """The fingerprint a head directory records of the target it was trained for."""
    return dict(_head_config(Path(path))[TARGET_KEY])


def head_config(target: PreTrainedModel) -> LlamaConfig:
    """The head's decoder-layer shape: one Llama layer as wide as the target's layers."""
    c = target.config
    heads = int(c.num_attention_heads)
    config = LlamaConfig(
        vocab_size=int(target.get_output_embeddings().weight.shape[0]),
        hidden_size=int(c.hidden_size),
        intermediate_size=int(getattr(c, "intermediate_size", 4 * c.hidden_size)),
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=int(getattr(c, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(c, "head_dim", None) or c.hidden_size // heads),
        max_position_embeddings=int(getattr(c, "max_position_embeddings", 2048)),
        rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-6)),
        rope_parameters=getattr(c, "rope_parameters", None),
    )
    config._attn_implementation = "sdpa"
    return config


class EagleHead(nn.Module):
    """``f̂ = Layer(fc([e ; f]))``: features ``[B, T, H]`` and token embeddings ``[B, T, H]`` at
    ``position_ids [B, T]`` -> predicted next features ``[B, T, H]`` (EAGLE §3.1). As vLLM's
    ``EagleLlamaForCausalLM`` (``model_executor/models/llama_eagle.py``): fc without bias, the
    layer's input norm skipped, no final norm (the target's LM head reads ``f̂`` as it is)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        config._attn_implementation = "sdpa"
        self.config = config
        H = config.hidden_size
        self.fc = nn.Linear(2 * H, H, bias=False)
        layer = LlamaDecoderLayer(config, layer_idx=0)
        layer.input_layernorm = nn.Identity()
        self.layers = nn.ModuleList([layer])
        self.rotary = LlamaRotaryEmbedding(config)

    def forward(
        self,
        features: torch.Tensor,
        embeds: torch.Tensor,
        position_ids: torch.Tensor,
        mask: torch.Tensor | None,
        cache: Any = None,
    ) -> torch.Tensor:
        """``mask``: additive float ``[B|1, 1, T, S+T]`` (0 = attend) over the ``cache``'s S entries;
        None when every new position sees every key (one new token)."""
        x = self.fc(torch.cat([embeds, features.to(embeds.dtype)], dim=-1))
        return self.layers[0](
            x,
            attention_mask=None if mask is None else mask.to(x.dtype),
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=cache is not None,
            position_embeddings=self.rotary(x, position_ids),
        )


class PackedEagleHead(PackedLayers):
    """:class:`EagleHead`'s step on packed weights (engine/packed.py), for a target whose own
    forwards run packed: the layer's products on ``weights`` (``fp32``/``bf16``/``int8``), the
    residual stream, norm, rotary and attention in float32.

    Two things are computed once instead of per drafted token: fc's embedding half for every token,
    ``R = E · W_eᵀ`` (``float32[V, H]``; ``fc([e ; f]) = W_e e + W_f f``), so a step reads one row
    of R and multiplies only the feature half; and the rotary cos/sin of every position.
    """

    def __init__(self, head: EagleHead, weights: str, embedding: nn.Embedding) -> None:
        super().__init__(head.config, weights)
        H = head.config.hidden_size
        fc = head.fc.weight.detach().float()  # [H, 2H]: [embedding half | feature half]
        self.token_rows = embedding.weight.detach().float() @ fc[:, :H].T  # [V, H]
        feature_half = nn.Linear(H, H, bias=False)
        feature_half.weight.data = fc[:, H:].clone()
        self.fc = packed_linear([feature_half], weights)
        self.blocks = [PackedLayer.of(head.layers[0], weights)]
        self.rotary = head.rotary

    @torch.inference_mode()
    def __call__(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        cache: Any,
        causal: bool = False,
    ) -> torch.Tensor:
        """As :meth:`HeadStep.__call__`."""
        x = F.embedding(tokens, self.token_rows) + self.fc(features.float())  # fc([e ; f]) [B, T, H]
        cos, sin = self.rotary_rows(start, tokens.shape[1])
        return self.run_layers(self.blocks, x, cache.layers, cos, sin, mask, causal)


class HeadStep:
    """:class:`EagleHead`'s own forward (transformers' layer) as one drafting step."""

    def __init__(self, head: EagleHead, embedding: nn.Embedding) -> None:
        self.head, self.embedding = head, embedding

    @torch.inference_mode()
    def __call__(
        self,
        features: torch.Tensor,
        tokens: torch.Tensor,
        start: int,
        mask: torch.Tensor | None,
        cache: Any,
        causal: bool = False,
    ) -> torch.Tensor:
        """Pairs ``(features[B, T, H], tokens[B, T])`` at positions ``start ..`` -> ``f̂ [B, T, H]``;
        ``mask`` as :meth:`EagleHead.forward` (``causal``, that it is the plain causal one, lets
        the packed step fuse; transformers' layer reads the mask alone)."""
        positions = torch.arange(start, start + tokens.shape[1])[None]
        return self.head(features, self.embedding(tokens), positions, mask, cache)


PACKED_ATTRIBUTE = "relaxspec_packed_head"  # where head_forward keeps the head's packed copy
REDUCED_ATTRIBUTE = "relaxspec_reduced_head"  # where reduced_head keeps the draft-vocabulary head


def _one_copy(head: EagleHead, attribute: str, owner: Any, key: tuple, make: Any) -> Any:
    """The copy kept on ``head`` under ``attribute`` if it was made for this ``owner`` object (held
    by the entry, so its id cannot be reused) and ``key``; else ``make()``, replacing it."""
    cached = head.__dict__.get(attribute)
    if cached is None or cached[0] is not owner or cached[1] != key:
        cached = head.__dict__[attribute] = (owner, key, make())
    return cached[2]


def head_forward(head: EagleHead, target: PreTrainedModel) -> PackedEagleHead | HeadStep:
    """What runs a drafting step: the head packed like its target's forwards (same weights), else
    the module.

    The packed copy is made once per head, weights and target embedding (a server builds an engine
    per request) and made again if the head's or the embedding's weights changed in place since
    (training: their version)."""
    embedding = target.get_input_embeddings()
    packed = packed_forward(target)
    if packed is None:
        return HeadStep(head, embedding)
    key = (packed.weights, head.fc.weight._version, embedding.weight._version)
    make = partial(PackedEagleHead, head, packed.weights, embedding)
    return _one_copy(head, PACKED_ATTRIBUTE, embedding.weight, key, make)


def reduced_head(head: EagleHead, target: PreTrainedModel, ids: torch.Tensor) -> ReducedHead:
    """The target's LM head over the draft vocabulary ``ids`` (engine/proposers/draft_vocab.py),
    made once per head, target weights and vocabulary (a server builds an engine per request), as
    :func:`head_forward`; one copy at a time."""
    packed, weight = packed_forward(target), target.get_output_embeddings().weight
    key = (packed.weights if packed is not None else "hf", weight._version, tuple(ids.tolist()))
    return _one_copy(head, REDUCED_ATTRIBUTE, weight, key, partial(ReducedHead, target, ids))


def causal_mask(T: int, past: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Additive ``[1, 1, T, past+T]``: new position i sees the ``past`` cached ones and new ones ≤ i."""
    allowed = torch.arange(past + T)[None, :] <= past + torch.arange(T)[:, None]
    return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)[None, None]


@dataclass
class LoadedEagle:
    """A head loaded from its directory, with the fingerprint of the target it was trained for."""

    head: EagleHead
    target: dict[str, Any]
    path: Path
    ranking: torch.Tensor | None = None  # every token id, most frequent first (draft_vocab.py)
    vocab_default: int = 0  # the draft vocabulary's default size (0: the full vocabulary)


def is_eagle_dir(path: str | Path) -> bool:
    """Whether ``path`` holds an EAGLE head (its config.json names :data:`ARCHITECTURE`)."""
    config = Path(path) / "config.json"
    try:
        data = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and (MARKER in data or ARCHITECTURE in (data.get("architectures") or []))


def save_eagle(head: EagleHead, target: PreTrainedModel, out_dir: str | Path) -> Path:
    """Write the head's weights (bf16) and its config, nothing of the target.

    config.json is the head layer's Llama config, as vLLM's ``eagle`` proposer reads it
    (``architectures: ["LlamaForCausalLM"]``, which vLLM maps to ``EagleLlamaForCausalLM``), plus
    :data:`MARKER` (the format's version) and :data:`TARGET_KEY` (the target's fingerprint)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = {name: t.detach().to(torch.bfloat16).contiguous() for name, t in head.state_dict().items()}
    save_file(weights, str(out / WEIGHTS), metadata={"format": "pt"})
    config = {k: v for k, v in head.config.to_dict().items() if not k.startswith("_")}
    config.update(
        architectures=["LlamaForCausalLM"],
        model_type="llama",
        num_hidden_layers=1,
        tie_word_embeddings=False,
        dtype="bfloat16",
    )
    config.update({MARKER: FORMAT_VERSION, TARGET_KEY: target_fingerprint(target)})
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return out


def load_eagle(path: str | Path) -> LoadedEagle:
    """Load a head written by :func:`save_eagle` (float32, eval); clear errors for anything else."""
    p = Path(path)
    if not p.is_dir():
        raise RelaxSpecError(f"model directory not found: {p}")
    if not is_eagle_dir(p):
        raise RelaxSpecError(f"{p} is not a relaxspec EAGLE head (its config.json lacks {MARKER})")
    data = _head_config(p)
    try:
        target = dict(data.pop(TARGET_KEY))
        layer = {k: v for k, v in data.items() if k not in (MARKER, "architectures", "dtype", "model_type")}
        head = EagleHead(LlamaConfig(**layer))
        head.load_state_dict({k: v.float() for k, v in load_file(str(p / WEIGHTS)).items()})
    except Exception as err:
        raise RelaxSpecError(f"cannot load the EAGLE head from {p}: {type(err).__name__}: {err}") from None
    ranking, default = load_ranking(p, int(target.get("vocab_size", 0))) or (None, 0)
    return LoadedEagle(head.eval(), target, p, ranking, default)


class EagleProposer:
    """Draft a chain of ``k`` tokens with an EAGLE head on ``target``'s hidden states (EAGLE §3).

    ``recorded``: the fingerprint of the target the head was trained for (checked here).

    Drafting a chain of K after the committed ``x_0 .. x_{n−1}``: the head's cache holds the pairs
    ``(f_t, x_{t+1})`` it has seen with the target's *real* features; one forward feeds the pairs it
    lacks, up to ``t = n − 2``, whose output gives ``q_1`` (the law of ``d_1``); each further step
    feeds ``(f̂, d_i)`` — its own predicted feature, as EAGLE does — for ``q_{i+1}``. The target's
    features come from the verifier's forward (:meth:`~relaxspec.engine.kv.CachedLM.record_hidden`:
    every cached position's hidden state, rolled back with its cache). Pairs made of predicted
    features never survive a cycle: the next draft recomputes them from the real features. Before the
    target has scored the committed tokens (the first cycle of a generation, or tokens committed
    unverified) there is nothing to draft from, and the proposal is empty (the engine runs an AR step:
    the prompt's prefill then yields a token too, where a prefill of all but the last token to draft
    from would yield none).

    Each ``d_i`` is drawn from the processed head law ``q_i`` (argmax when greedy), so every rule
    composes with it as with a draft model. ``vocab``: the sorted token ids ``int64[n]`` of a
    reduced draft vocabulary (EAGLE-3; engine/proposers/draft_vocab.py), None for the full one.
    """

    name = "eagle"

    def __init__(
        self,
        head: EagleHead,
        target: PreTrainedModel,
        recorded: dict[str, Any] | None = None,
        stop_below: float = 0.0,
        vocab: torch.Tensor | None = None,
    ) -> None:
        if recorded is not None:
            check_fits(recorded, target)
        if head.config.hidden_size != target.get_input_embeddings().weight.shape[1]:
            raise RelaxSpecError("the EAGLE head's hidden size differs from the target's")
        self.head, self.target = head, target
        self.forward = head_forward(head, target)  # packed where the target's forwards are
        self.cache = new_cache(head)
        self.real = 0  # leading head positions computed from the target's real features
        self.features: CachedLM | None = None  # the verifier's model, recording hidden states
        self.calls = 0
        self.stop_below = stop_below  # the chain's cut (engine/proposers/base.py draft_chain)
        self.reduced = None if vocab is None else reduced_head(head, target, vocab)

    def bind_verifier(self, verifier: Any) -> None:
        """Draft from ``verifier``'s recorded hidden states (the engine calls this)."""
        lm = verifier.lm
        if type(lm) is not CachedLM:
            raise RelaxSpecError(
                "the EAGLE proposer needs the verifier's hidden states, which the batched server's "
                "shared cache does not keep; run it in the single-request engine"
            )
        if lm.model is not self.target:
            raise RelaxSpecError("the EAGLE proposer drafts for the model that verifies: pass that target")
        lm.record_hidden()
        self.features = lm

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.cache = new_cache(self.head)
        self.real = 0

    @torch.inference_mode()
    def _step(self, features: torch.Tensor, tokens: torch.Tensor, start: int) -> torch.Tensor:
        """Feed pairs ``(features[1, T, H], tokens[1, T])`` at positions ``start ..``; ``[1, T, H]``."""
        T = tokens.shape[1]
        mask = None if T == 1 else causal_mask(T, self.cache.get_seq_length())  # one new token sees all
        out = self.forward(features, tokens, start, mask, self.cache, causal=True)
        self.calls += 1
        return out

    def _empty(self, device: torch.device) -> Proposal:
        vocab = int(self.target.get_output_embeddings().weight.shape[0])
        return Proposal(
            tokens=torch.empty((1, 0), dtype=torch.long, device=device),
            probs=torch.empty((1, 0, vocab), device=device),
            confidence=torch.empty((1, 0), device=device),
        )

    def propose(
        self, ids: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """``d_1..d_k`` after ``ids[1, n]``, ``q_i`` the processed head laws; empty before the
        target has scored ``x_0 .. x_{n−2}``."""
        if self.features is None:
            raise RelaxSpecError("the EAGLE proposer runs inside an Engine (it reads the verifier's states)")
        n = ids.shape[1]
        if n < 2 or self.features.length < n - 1:
            return self._empty(ids.device)
        real = min(self.real, n - 2)  # keep at least one pair to feed: its output is q_1
        self.cache.crop(real)
        features = self.features.hidden_states[:, real : n - 1]  # f_real .. f_{n-2}
        hidden = self._step(features, ids[:, real + 1 : n], real)[:, -1:]  # f̂_{n-1}
        self.real = n - 1

        def feed(token: torch.Tensor, i: int) -> torch.Tensor:  # (f̂, d_i) at position n − 2 + i
            nonlocal hidden
            hidden = self._step(hidden, token[:, None], n - 2 + i)
            return self._logits(hidden)

        return draft_chain(self._logits(hidden), feed, k, params, generator, self.stop_below)

    def _logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The target's LM head on the head's feature ``[1, 1, H]`` -> ``[1, V]`` (over the draft
        vocabulary where there is one: ``-inf`` elsewhere)."""
        if self.reduced is not None:
            return self.reduced(hidden)[:, 0]
        return drafter_logits(self.target, hidden, "EAGLE head")[:, 0]

    def rollback(self, length: int) -> None:
        """Pair t reads ``x_{t+1}``: pairs beyond the kept committed tokens are dropped."""
        self.real = min(self.real, max(0, length - 1))

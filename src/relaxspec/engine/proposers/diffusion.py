"""Diffusion drafter: a masked-diffusion LM that drafts a whole block in S denoising steps.

DESIGN §4 (Diffusion proposer); VS paper §3 (speculative diffusion decoding, SDD).

The drafter is a Llama stack (Hugging Face ``LlamaForCausalLM`` weights, loadable with
``from_pretrained``) run with a custom 4D additive attention mask over ``[context | block]``:

- context tokens attend causally, so the context KV is cached exactly like an AR model's
  (:class:`~relaxspec.engine.kv.CachedLM`: prefilled once, rolled back to the committed length);
- the γ block tokens (``<|mask|>`` or already revealed) attend to the whole context and
  bidirectionally to every block token.

Logit shift (as in Dream/DiffuCoder, adapted from AR weights): block token ``d_1`` is predicted
from the hidden state of the last context token — exactly the AR next-token distribution — and
``d_j`` (j ≥ 2) from the hidden state of block slot ``j − 1``. So an AR checkpoint is a sensible
initialisation, and with γ = 1 the drafter *is* an AR model.

Decoding a block (:class:`DiffusionProposer`): start from γ masks; at each of S steps predict every
still-masked position, then reveal the ``ceil(remaining / steps_left)`` positions chosen by the
``reveal`` order (most confident first, or left to right). The **raw confidence** of a token is its
probability at the step it was revealed; per-position features (hidden state at reveal,
confidence, entropy, margin, position, reveal step, block length) go into ``Proposal.features`` for
the learned survival signals (:mod:`relaxspec.engine.survival`).

Sampling-mode exactness (DESIGN §4). An exact (or closed-form relaxed) rule needs ``q_i``, the law
``d_i`` was actually drawn from, to depend only on the draft prefix ``d_<i``:

- ``reveal="left_to_right"``: ``d_i`` is drawn at its reveal step from ``q_i``, which conditions
  only on tokens to its left revealed at earlier steps — a valid autoregressive factorisation, so
  ``Exact`` is lossless and every sampling rule's emitted law (DESIGN §3) holds. With ``S = 1`` all
  positions are one-step marginals given the context (also exact).
- ``reveal="confidence"`` with ``S > 1``: the reveal order depends on the sampled tokens and
  ``q_i`` may condition on tokens to its *right*; it is **exact only under greedy verification**
  (temperature 0, where the verifier ignores ``q``). Requesting sampling with this combination is
  an error.
- ``reveal="auto"`` (default): confidence order for greedy requests, left to right for sampling.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from transformers import PreTrainedModel

from relaxspec.core.sampling import SamplingParams, check_finite, processed_probs, sample
from relaxspec.engine.kv import CachedLM, cache_argument
from relaxspec.engine.packed import packed_forward
from relaxspec.engine.proposers.base import Proposal
from relaxspec.errors import RelaxSpecError
from relaxspec.models import LoadedModel, load_model

REVEAL_ORDERS = ("auto", "confidence", "left_to_right")

# Keys stored in the drafter's config.json (written by ``relaxspec train diffusion``).
CFG_FORMAT = "diffusion_format"  # marks a model as a relaxspec block-diffusion drafter
FORMAT = "relaxspec-block-diffusion-v1"
CFG_BLOCK = "diffusion_block_length"  # γ used in training
CFG_MASK = "diffusion_mask_token_id"
CFG_GAMMA = "diffusion_gamma"  # bundled operating point (from the sweep), optional
CFG_STEPS = "diffusion_steps"

NOT_A_BLOCK = -1  # block id of a clean (context) token in :func:`attention_bias`


# ---------------------------------------------------------------------------------------------
# Attention mask
# ---------------------------------------------------------------------------------------------


def attention_bias(
    q_pos: torch.Tensor,
    q_visible: torch.Tensor,
    q_block: torch.Tensor,
    k_pos: torch.Tensor,
    k_block: torch.Tensor,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Additive block-diffusion mask ``[1, 1, Q, KV]``: 0 where attention is allowed, -inf-ish not.

    Query q may attend key k iff
    ``(k is clean and k_pos ≤ q_visible[q])`` or ``(q and k are in the same noisy block)``.

    q_pos, q_visible, q_block: LongTensor[Q] — position id, last clean position the query may see
        (its own position for a clean token, the position before its block for a block token),
        block id (:data:`NOT_A_BLOCK` for a clean token);
    k_pos, k_block: LongTensor[KV] — position id and block id of each key.

    Both the training layout (:func:`relaxspec.train.diffusion.training_layout`) and the cached
    inference forward (:func:`inference_bias`) are built from this one definition.
    """
    del q_pos  # visibility is fully described by q_visible; kept in the signature for clarity
    clean_k = (k_block == NOT_A_BLOCK)[None, :]
    sees_clean = clean_k & (k_pos[None, :] <= q_visible[:, None])
    same_block = (q_block[:, None] >= 0) & (q_block[:, None] == k_block[None, :])
    allowed = sees_clean | same_block
    bias = torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min)
    return bias[None, None]


def inference_bias(cached: int, n_committed: int, gamma: int, dtype: torch.dtype) -> torch.Tensor:
    """Mask of one drafting forward: ``[1, 1, Q, cached + Q]`` with ``Q = n_committed − cached + γ``.

    The cache holds positions ``0 .. cached−1``; the forward feeds the committed tokens
    ``cached .. n_committed−1`` (causal) and the γ block slots ``n_committed ..`` (one block).
    """
    n_new = n_committed - cached
    pos = torch.arange(cached, n_committed + gamma)
    block = torch.cat([torch.full((n_new,), NOT_A_BLOCK), torch.zeros(gamma, dtype=torch.long)])
    visible = torch.where(block == NOT_A_BLOCK, pos, n_committed - 1)
    k_pos = torch.arange(0, n_committed + gamma)
    k_block = torch.cat([torch.full((n_committed,), NOT_A_BLOCK), torch.zeros(gamma, dtype=torch.long)])
    return attention_bias(pos, visible, block, k_pos, k_block, dtype)


# ---------------------------------------------------------------------------------------------
# The drafter model and its cache
# ---------------------------------------------------------------------------------------------


def is_diffusion_drafter(model: PreTrainedModel) -> bool:
    return getattr(model.config, CFG_FORMAT, None) == FORMAT


def check_drafter(model: PreTrainedModel, mask_token_id: int) -> None:
    """The drafter must have an LM head and a mask token inside its vocabulary."""
    vocab = model.get_output_embeddings().weight.shape[0]
    if not (isinstance(mask_token_id, int) and 0 <= mask_token_id < vocab):
        raise RelaxSpecError(f"mask token id {mask_token_id!r} is outside the drafter's vocabulary ({vocab})")


class DiffusionLM(CachedLM):
    """:class:`CachedLM` plus forwards with an explicit 4D mask and position ids.

    The cache holds the KV of committed (clean, causal) tokens only; block slots are fed on top
    and cropped away again before the cycle ends, so no mask-block KV survives a cycle.
    """

    @torch.inference_mode()
    def forward_block(self, tokens: torch.Tensor, n_committed: int, gamma: int) -> torch.Tensor:
        """Feed ``tokens[1, Q]`` = (uncached committed tokens, γ block slots); return hidden states.

        Returns the final (normed) hidden states ``FloatTensor[1, Q, H]`` — the LM head's inputs.
        The cache grows by Q; the caller crops the block slots with :meth:`rollback`.
        """
        cached, n_fed = self.length, tokens.shape[1]
        if n_committed + gamma > self.context_length:
            raise RelaxSpecError(
                f"a block of {gamma} after {n_committed} tokens exceeds the {self.name}'s context "
                f"window of {self.context_length}"
            )
        assert n_fed == n_committed - cached + gamma, "fed tokens must be (uncached committed, block)"
        packed = packed_forward(self.model)
        dtype = torch.float32 if packed is not None else next(self.model.parameters()).dtype
        bias = inference_bias(cached, n_committed, gamma, dtype).to(self.device)
        positions = torch.arange(cached, n_committed + gamma, device=self.device)[None]
        if packed is not None:
            hidden = packed.hidden(tokens, self.cache, attention_mask=bias, position_ids=positions)
        else:
            decoder = self.model.get_decoder()
            hidden = decoder(
                input_ids=tokens.to(self.device),
                attention_mask=bias,
                position_ids=positions,
                use_cache=True,
                **cache_argument(decoder, self.cache),
            ).last_hidden_state
        self.calls += 1
        self.length += n_fed
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head on hidden states ``[..., H]`` -> float32 logits ``[..., V]`` (finite-checked)."""
        packed = packed_forward(self.model)
        with torch.inference_mode():
            head = packed.logits if packed is not None else self.model.get_output_embeddings()
            logits = head(hidden).float()
        check_finite(logits, f"the {self.name}")
        return logits


# ---------------------------------------------------------------------------------------------
# Denoising (pure helpers)
# ---------------------------------------------------------------------------------------------


def reveal_count(remaining: int, steps_left: int) -> int:
    """Positions to reveal at this step: ``ceil(remaining / steps_left)`` (all at the last step)."""
    return math.ceil(remaining / steps_left)


def choose_reveal(masked: torch.Tensor, confidence: torch.Tensor, n: int, order: str) -> torch.Tensor:
    """Indices ``LongTensor[n]`` of still-masked positions to reveal now.

    masked: BoolTensor[γ] (True = still masked); confidence: FloatTensor[γ], the candidate tokens'
    probabilities; order: ``"confidence"`` (highest first, ties to the lowest position) or
    ``"left_to_right"`` (the leftmost masked positions).
    """
    if order == "left_to_right":
        return masked.nonzero().flatten()[:n]
    score = torch.where(masked, confidence.float(), torch.full_like(confidence.float(), -1.0))
    return torch.sort(score, descending=True, stable=True).indices[:n]


def _entropy(q: torch.Tensor) -> torch.Tensor:
    return torch.special.entr(q).sum(dim=-1)


def _margin(q: torch.Tensor) -> torch.Tensor:
    top2 = q.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


# ---------------------------------------------------------------------------------------------
# The proposer
# ---------------------------------------------------------------------------------------------


class DiffusionProposer:
    """Draft a γ-token block in S denoising steps from ``[context, γ masks]`` (DESIGN §4).

    gamma: block length γ ≥ 1 (default: the drafter's bundled operating point, else its training
    block length); steps: denoising steps S, 1 ≤ S ≤ γ; reveal: ``"auto"``, ``"confidence"`` or
    ``"left_to_right"`` (see the module docstring for exactness).

    One :meth:`propose` costs S drafter forwards (the first also prefills the committed tokens the
    cache has not seen). ``Proposal.probs[0, i]`` is the processed law ``q_i`` at the step ``d_i``
    was revealed; ``Proposal.confidence[0, i] = q_i(d_i)`` (raw confidence).
    """

    name = "diffusion"

    def __init__(
        self,
        model: PreTrainedModel,
        gamma: int | None = None,
        steps: int | None = None,
        reveal: str = "auto",
        mask_token_id: int | None = None,
    ) -> None:
        cfg = model.config
        if gamma is None:
            gamma = getattr(cfg, CFG_GAMMA, None) or getattr(cfg, CFG_BLOCK, None)
        if steps is None:
            steps = getattr(cfg, CFG_STEPS, None) or (max(1, gamma // 4) if isinstance(gamma, int) else None)
        if not isinstance(gamma, int) or isinstance(gamma, bool) or gamma < 1:
            raise RelaxSpecError(f"gamma (diffusion block length) must be an integer >= 1, got {gamma!r}")
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= gamma:
            raise RelaxSpecError(
                f"steps (denoising steps) must be an integer in [1, gamma={gamma}], got {steps!r}"
            )
        if reveal not in REVEAL_ORDERS:
            raise RelaxSpecError(f"reveal must be one of {', '.join(REVEAL_ORDERS)}, got {reveal!r}")
        mask_token_id = mask_token_id if mask_token_id is not None else getattr(cfg, CFG_MASK, 2)
        check_drafter(model, mask_token_id)
        self.lm = DiffusionLM(model, name="diffusion drafter")
        self.gamma, self.steps, self.reveal, self.mask_token_id = gamma, steps, reveal, mask_token_id

    @property
    def calls(self) -> int:
        return self.lm.calls

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.lm.reset()

    def rollback(self, length: int) -> None:
        self.lm.rollback(length)

    def reveal_order(self, params: SamplingParams) -> str:
        """The reveal order used for a request; errors on the inexact sampling combination."""
        if self.reveal == "auto":
            return "confidence" if params.greedy else "left_to_right"
        if self.reveal == "confidence" and not params.greedy and self.steps > 1:
            raise RelaxSpecError(
                "reveal='confidence' with steps > 1 draws tokens whose law depends on tokens to their "
                "right, so sampling-mode verification (temperature > 0) would not be exact; use "
                "reveal='left_to_right' (or 'auto'), steps=1, or temperature 0"
            )
        return self.reveal

    def propose(
        self, ids: torch.Tensor, k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> Proposal:
        """Draft a block after ``ids[1, n]``; return its first ``k`` tokens (``k ≤ γ``).

        The block has γ slots (fewer only if the context window ends first, never fewer than k).
        """
        order = self.reveal_order(params)
        n = ids.shape[1]
        gamma = min(self.gamma, self.lm.context_length - n)
        if not 1 <= k <= gamma:
            raise RelaxSpecError(f"cannot draft {k} tokens with a block of {gamma} (gamma={self.gamma})")
        steps = min(self.steps, gamma)
        if self.lm.length >= n:
            self.lm.rollback(n - 1)  # re-feed the last committed token: its hidden state predicts d_1
        block = torch.full((1, gamma), self.mask_token_id, dtype=torch.long)
        masked = torch.ones(gamma, dtype=torch.bool)
        H = self.lm.model.config.hidden_size
        tokens = torch.zeros(gamma, dtype=torch.long)
        conf, ent, margin = torch.zeros(gamma), torch.zeros(gamma), torch.zeros(gamma)
        step_of = torch.zeros(gamma, dtype=torch.long)
        hidden_at = torch.zeros(gamma, H)
        probs_at = None if params.greedy else torch.zeros(gamma, self.lm.model.config.vocab_size)
        first_hidden = None  # hidden state of the last committed token (predicts d_1), step 0 only
        for s in range(steps):
            fed = torch.cat([ids[:, self.lm.length :], block], dim=1) if s == 0 else block
            hidden = self.lm.forward_block(fed, n, gamma)[0]  # [Q, H], model dtype
            if s == 0:
                first_hidden = hidden[-gamma - 1]
            predictors = torch.cat([first_hidden[None], hidden[-gamma:-1]], dim=0)  # [γ, H]
            self.lm.rollback(n)  # the block slots' KV never survives a step
            q = processed_probs(self.lm.logits(predictors), params)  # [γ, V]
            cand = sample(q, generator, params.greedy)  # [γ]
            cand_conf = q.gather(-1, cand[:, None]).squeeze(-1)
            chosen = choose_reveal(masked, cand_conf, reveal_count(int(masked.sum()), steps - s), order)
            tokens[chosen], conf[chosen], step_of[chosen] = cand[chosen], cand_conf[chosen], s
            ent[chosen], margin[chosen] = _entropy(q[chosen]), _margin(q[chosen])
            hidden_at[chosen] = predictors[chosen].float()
            if probs_at is not None:
                probs_at[chosen] = q[chosen]
            masked[chosen] = False
            block[0, chosen] = cand[chosen]
        assert not masked.any()
        position = torch.arange(1, gamma + 1, dtype=torch.float32)
        features = {
            "hidden": hidden_at[None, :k],
            "confidence": conf[None, :k],
            "entropy": ent[None, :k],
            "margin": margin[None, :k],
            "position": position[None, :k],
            "reveal_step": step_of[None, :k].float(),
            "steps": torch.full((1, k), float(steps)),
            "block_length": torch.full((1, k), float(gamma)),
        }
        return Proposal(
            tokens=tokens[None, :k],
            probs=None if probs_at is None else probs_at[None, :k],
            confidence=conf[None, :k],
            features=features,
        )


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------


def load_diffusion(path: str | Path) -> LoadedModel:
    """Load a drafter written by ``relaxspec train diffusion`` (clear error for anything else)."""
    loaded = load_model(path)
    if not is_diffusion_drafter(loaded.model):
        raise RelaxSpecError(
            f"{path} is not a relaxspec diffusion drafter (its config.json lacks "
            f"{CFG_FORMAT}={FORMAT!r}); train one with `relaxspec train diffusion`"
        )
    check_drafter(loaded.model, int(getattr(loaded.model.config, CFG_MASK, 2)))
    return loaded

"""Diffusion drafter: a masked-diffusion LM that drafts a whole block in S denoising steps.

docs/design.md §4 (Diffusion proposer); VS paper §3 (speculative diffusion decoding, SDD).

The drafter is a Llama stack (Hugging Face ``LlamaForCausalLM`` weights, loadable with
``from_pretrained``) run with a custom 4D additive attention mask over ``[context | block]``
(:func:`attention_bias`): context tokens attend causally, so the context KV is cached exactly like
an AR model's (:class:`DiffusionLM`); the γ block tokens attend to the whole context and
bidirectionally to every block token. Logit shift (as in Dream/DiffuCoder): block token ``d_1`` is
predicted from the last context token's hidden state — the AR next-token law — and ``d_j`` from
block slot ``j − 1``'s, so an AR checkpoint is a sensible initialisation and with γ = 1 the
drafter *is* an AR model.

:class:`DiffusionProposer` decodes one block (its docstring: the reveal orders, the features for
the learned signals, and when sampling is exact); :class:`DiffusionBatch` drafts many rows together.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from relaxspec.core.sampling import SamplingParams, processed_probs, sample
from relaxspec.engine.kv import CachedLM
from relaxspec.engine.proposers.base import Proposal
from relaxspec.engine.proposers.rows import DraftRows, RowRequest, drafter_hidden, drafter_logits
from relaxspec.errors import RelaxSpecError, check_int
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
        allowed = inference_bias(cached, n_committed, gamma, torch.float32) == 0
        positions = torch.arange(cached, n_committed + gamma)[None]
        hidden = drafter_hidden(self.model, self.cache, tokens, allowed, positions)
        self.calls += 1
        self.length += n_fed
        return hidden

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM head on hidden states ``[..., H]`` -> float32 logits ``[..., V]`` (finite-checked)."""
        return drafter_logits(self.model, hidden, self.name)


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


def reveal_order_for(reveal: str, steps: int, params: SamplingParams) -> str:
    """The reveal order a request uses; errors on the inexact sampling combination (module doc)."""
    if reveal == "auto":
        return "confidence" if params.greedy else "left_to_right"
    if reveal == "confidence" and not params.greedy and steps > 1:
        raise RelaxSpecError(
            "reveal='confidence' with steps > 1 draws tokens whose law depends on tokens to their "
            "right, so sampling-mode verification (temperature > 0) would not be exact; use "
            "reveal='left_to_right' (or 'auto'), steps=1, or temperature 0"
        )
    return reveal


class BlockDenoiser:
    """One request's block being denoised: γ slots, which are revealed, and with what.

    Each of the S steps hands :meth:`reveal` the drafter's predictors ``[γ, H]`` (the hidden state
    that predicts each slot: the last committed token's for slot 1, slot j − 1's for slot j) and
    their logits ``[γ, V]``; the step samples a candidate for every still-masked slot and reveals
    ``ceil(remaining / steps_left)`` of them in ``order``. :attr:`block` is what the next step feeds.
    """

    def __init__(
        self,
        gamma: int,
        steps: int,
        order: str,
        mask_token_id: int,
        params: SamplingParams,
        generator: torch.Generator | None,
        hidden_size: int,
        vocab: int,
    ) -> None:
        self.gamma, self.steps, self.order = gamma, steps, order
        self.params, self.generator = params, generator
        self.block = torch.full((gamma,), mask_token_id, dtype=torch.long)  # fed at the next step
        self.masked = torch.ones(gamma, dtype=torch.bool)
        self.tokens = torch.zeros(gamma, dtype=torch.long)
        self.conf, self.ent, self.margin = torch.zeros(gamma), torch.zeros(gamma), torch.zeros(gamma)
        self.step_of = torch.zeros(gamma, dtype=torch.long)
        self.hidden_at = torch.zeros(gamma, hidden_size)
        self.probs_at = None if params.greedy else torch.zeros(gamma, vocab)

    def reveal(self, s: int, predictors: torch.Tensor, logits: torch.Tensor) -> None:
        """Denoising step ``s``: sample candidates from ``logits[γ, V]``, reveal some of them."""
        q = processed_probs(logits, self.params)  # [γ, V]
        cand = sample(q, self.generator, self.params.greedy)  # [γ]
        cand_conf = q.gather(-1, cand[:, None]).squeeze(-1)
        n = reveal_count(int(self.masked.sum()), self.steps - s)
        chosen = choose_reveal(self.masked, cand_conf, n, self.order)
        self.tokens[chosen], self.conf[chosen], self.step_of[chosen] = cand[chosen], cand_conf[chosen], s
        self.ent[chosen], self.margin[chosen] = _entropy(q[chosen]), _margin(q[chosen])
        self.hidden_at[chosen] = predictors[chosen].float()
        if self.probs_at is not None:
            self.probs_at[chosen] = q[chosen]
        self.masked[chosen] = False
        self.block[chosen] = cand[chosen]

    def proposal(self, k: int) -> Proposal:
        """The block's first ``k`` tokens, their laws ``q`` (sampling) and features."""
        assert not self.masked.any()
        position = torch.arange(1, self.gamma + 1, dtype=torch.float32)
        features = {
            "hidden": self.hidden_at[None, :k],
            "confidence": self.conf[None, :k],
            "entropy": self.ent[None, :k],
            "margin": self.margin[None, :k],
            "position": position[None, :k],
            "reveal_step": self.step_of[None, :k].float(),
            "steps": torch.full((1, k), float(self.steps)),
            "block_length": torch.full((1, k), float(self.gamma)),
        }
        return Proposal(
            tokens=self.tokens[None, :k],
            probs=None if self.probs_at is None else self.probs_at[None, :k],
            confidence=self.conf[None, :k],
            features=features,
        )


# ---------------------------------------------------------------------------------------------
# The proposer
# ---------------------------------------------------------------------------------------------


class DiffusionSettings:
    """A drafter model with validated γ, S, reveal order and mask token (defaults from its config).

    gamma: block length γ ≥ 1 (default: the drafter's bundled operating point, else its training
    block length); steps: denoising steps S, 1 ≤ S ≤ γ; reveal: ``"auto"``, ``"confidence"`` or
    ``"left_to_right"`` (exactness below).
    """

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
        check_int("gamma", gamma, 1, what="diffusion block length")
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= gamma:
            raise RelaxSpecError(
                f"steps (denoising steps) must be an integer in [1, gamma={gamma}], got {steps!r}"
            )
        if reveal not in REVEAL_ORDERS:
            raise RelaxSpecError(f"reveal must be one of {', '.join(REVEAL_ORDERS)}, got {reveal!r}")
        mask_token_id = mask_token_id if mask_token_id is not None else getattr(cfg, CFG_MASK, 2)
        check_drafter(model, mask_token_id)
        self.model = model
        self.gamma, self.steps, self.reveal, self.mask_token_id = gamma, steps, reveal, mask_token_id

    def reveal_order(self, params: SamplingParams) -> str:
        """The reveal order used for a request; errors on the inexact sampling combination."""
        return reveal_order_for(self.reveal, self.steps, params)


class DiffusionProposer(DiffusionSettings):
    """Draft a γ-token block in S denoising steps from ``[context, γ masks]`` (docs/design.md §4).

    gamma: block length γ ≥ 1 (default: the drafter's bundled operating point, else its training
    block length); steps: denoising steps S, 1 ≤ S ≤ γ; reveal: ``"auto"``, ``"confidence"`` or
    ``"left_to_right"`` (exactness below).

    One :meth:`propose` costs S drafter forwards (the first also prefills the committed tokens the
    cache has not seen). ``Proposal.probs[0, i]`` is the processed law ``q_i`` at the step ``d_i``
    was revealed; ``Proposal.confidence[0, i] = q_i(d_i)`` (raw confidence).

    Decoding a block: start from γ masks; at each of S steps predict every still-masked position,
    then reveal the ``ceil(remaining / steps_left)`` positions chosen by the ``reveal`` order (most
    confident first, or left to right). The **raw confidence** of a token is its probability at the
    step it was revealed; per-position features (hidden state at reveal, confidence, entropy,
    margin, position, reveal step, block length) go into ``Proposal.features`` for the learned
    survival signals (:mod:`relaxspec.engine.survival`).

    Sampling-mode exactness (docs/design.md §4). An exact (or closed-form relaxed) rule needs
    ``q_i``, the law ``d_i`` was actually drawn from, to depend only on the draft prefix ``d_<i``:

    - ``reveal="left_to_right"``: ``d_i`` is drawn at its reveal step from ``q_i``, which
      conditions only on tokens to its left revealed at earlier steps — a valid autoregressive
      factorisation, so ``Exact`` is lossless and every sampling rule's emitted law
      (docs/design.md §3) holds. With ``S = 1`` all positions are one-step marginals given the
      context (also exact).
    - ``reveal="confidence"`` with ``S > 1``: the reveal order depends on the sampled tokens and
      ``q_i`` may condition on tokens to its *right*; it is **exact only under greedy
      verification** (temperature 0, where the verifier ignores ``q``). Requesting sampling with
      this combination is an error.
    - ``reveal="auto"`` (default): confidence order for greedy requests, left to right for sampling.
    """

    name = "diffusion"

    def __init__(self, model: PreTrainedModel, *args: Any, **settings: Any) -> None:
        """``model`` and the :class:`DiffusionSettings` (γ, S, reveal, mask token)."""
        super().__init__(model, *args, **settings)
        self.lm = DiffusionLM(model, name="diffusion drafter")

    @property
    def calls(self) -> int:
        return self.lm.calls

    def start(self, prompt_ids: torch.Tensor) -> None:
        self.lm.reset()

    def rollback(self, length: int) -> None:
        self.lm.rollback(length)

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
        config = self.lm.model.config
        block = BlockDenoiser(
            gamma, steps, order, self.mask_token_id, params, generator, config.hidden_size, config.vocab_size
        )
        first_hidden = None  # hidden state of the last committed token (predicts d_1), step 0 only
        for s in range(steps):
            fed = block.block[None]
            if s == 0:
                fed = torch.cat([ids[:, self.lm.length :], fed], dim=1)
            hidden = self.lm.forward_block(fed, n, gamma)[0]  # [Q, H], model dtype
            if s == 0:
                first_hidden = hidden[-gamma - 1]
            predictors = torch.cat([first_hidden[None], hidden[-gamma:-1]], dim=0)  # [γ, H]
            self.lm.rollback(n)  # the block slots' KV never survives a step
            block.reveal(s, predictors, self.lm.logits(predictors))
        return block.proposal(k)


# ---------------------------------------------------------------------------------------------
# Many requests at once
# ---------------------------------------------------------------------------------------------


class DiffusionBatch(DiffusionSettings, DraftRows):
    """The diffusion drafter for many requests at once: S batched forwards draft every block.

    Each request is a row of :class:`~relaxspec.engine.proposers.rows.DraftRows`; step 0 feeds
    every drafted row's uncached committed tokens and its γ block slots (bidirectional inside the
    block), steps 1 .. S − 1 the γ slots alone; the block slots are cropped after each step, as in
    :meth:`DiffusionProposer.propose`, whose per-row decoding (:class:`BlockDenoiser`) it shares:
    a row's draft equals the one a :class:`DiffusionProposer` makes for it alone (up to
    floating-point summation order). :meth:`remove` frees a finished request's row.
    """

    def __init__(self, model: PreTrainedModel, *args: Any, **settings: Any) -> None:
        """``model`` and the :class:`DiffusionSettings` (γ, S, reveal, mask token)."""
        DiffusionSettings.__init__(self, model, *args, **settings)
        DraftRows.__init__(self, model, causal_block=False)

    @torch.inference_mode()
    def propose(self, requests: list[RowRequest]) -> list[Proposal]:
        """One proposal per request, in order (each request's key at most once).

        Costs one prefill per joining row, then S batched forwards for all of them.
        """
        # γ shrinks only where the context window ends first: rows drafted together share it
        gammas = [min(self.gamma, self.context_length - r.ids.shape[1]) for r in requests]
        for r, gamma in zip(requests, gammas, strict=True):
            if not 1 <= r.k <= gamma:
                raise RelaxSpecError(
                    f"cannot draft {r.k} tokens with a block of {gamma} (gamma={self.gamma})"
                )
        orders = [self.reveal_order(r.params) for r in requests]  # fails before any state changes
        return self.in_groups(
            requests,
            gammas,
            lambda idx, gamma: self._propose_rows(
                [requests[i] for i in idx], [orders[i] for i in idx], gamma
            ),
        )

    def _propose_rows(self, requests: list[RowRequest], orders: list[str], gamma: int) -> list[Proposal]:
        """Draft a γ-slot block for each of ``requests`` together (their reveal ``orders``)."""
        steps = min(self.steps, gamma)
        joined = [self.join(r) for r in requests]  # (row, last token's hidden state if it joined now)
        rows = [row for row, _ in joined]
        size, vocab = self.model.config.hidden_size, self.model.config.vocab_size
        blocks = [
            BlockDenoiser(gamma, steps, order, self.mask_token_id, r.params, r.generator, size, vocab)
            for r, order in zip(requests, orders, strict=True)
        ]
        first: torch.Tensor | None = None  # [R, H]: hidden state of each row's last committed token
        for s in range(steps):
            fresh = (
                [r.ids[0, row.length :] for r, row in zip(requests, rows, strict=True)] if s == 0 else None
            )
            hidden, offset = self.forward(
                rows, fresh, [b.block for b in blocks], [r.ids.shape[1] for r in requests]
            )
            if fresh is not None:
                first = self.first_hidden(joined, fresh, hidden)
            assert first is not None
            predictors = self.predictors(first, hidden, offset, gamma)  # [R, γ, H]
            logits = drafter_logits(self.model, predictors, "diffusion drafter")  # [R, γ, V]
            for i, block in enumerate(blocks):
                block.reveal(s, predictors[i], logits[i])
        return [block.proposal(r.k) for block, r in zip(blocks, requests, strict=True)]


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

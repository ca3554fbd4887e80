"""The batched verification step (docs/design.md §2; NSD §3 Alg. 1).

Draft token ``d_i`` is accepted iff ``u_i < h_i(d_i)`` with ``u_i ~ U(0, 1)``; the first rejection
ends the block and the recovered token is drawn from ``norm((p_i − q_i·h_i)⁺)``; if all K drafts
pass, a bonus token is drawn from ``p_{K+1}``. Greedy-mode rules use ``h ∈ {0, 1}`` and
recover/bonus with ``argmax p``; ``Gate`` (ProVe) is a deterministic prefix gate emitting no next
token. :func:`verify` checks its inputs (the public boundary); :func:`verify_unchecked` is what the
engine calls. Shapes: ``B`` batch rows, ``K`` draft positions, ``V`` vocabulary size.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from relaxspec.core.checks import check_distribution, check_finite_nonneg
from relaxspec.core.rules import AcceptanceRule, Exact, Gate, Rule, residual_distribution
from relaxspec.errors import require

# ``Verdict.next_token`` where the rule emits no token (Gate): vLLM's PLACEHOLDER_TOKEN_ID.
NO_TOKEN = -1


@dataclass(frozen=True, eq=False)
class Verdict:
    """Result of :func:`verify`.

    accepted: [B] long, accepted prefix length in 0..K.
    next_token: [B] long, recovered token if ``accepted < K``, bonus token if ``accepted == K``,
        :data:`NO_TOKEN` where the rule emits none (Gate).
    accept_mask: [B, K] bool, per-position decisions before the prefix cut (positions after the
        first rejection were decided with their own uniforms but are not committed).
    exact_accepted: [B] long, the prefix length the strict rule gives on the same draws — Exact
        under the same uniforms for sampling rules, argmax match for greedy rules and Gate — so
        ``accepted − exact_accepted`` counts tokens accepted by the relaxation.

    Unpacks like a pair: ``accepted, next_token = verify(...)``.
    """

    accepted: Tensor
    next_token: Tensor
    accept_mask: Tensor | None = None
    exact_accepted: Tensor | None = None

    def __iter__(self) -> Iterator[Tensor]:
        yield self.accepted
        yield self.next_token

    def emitted(self, draft_tokens: Tensor, row: int = 0) -> list[int]:
        """The tokens row ``row`` commits: its accepted draft prefix, then the next token unless
        it is :data:`NO_TOKEN` (the one place the placeholder is stripped)."""
        accepted, next_token = int(self.accepted[row]), int(self.next_token[row])
        tokens = draft_tokens[row, :accepted].tolist()
        return tokens if next_token == NO_TOKEN else [*tokens, next_token]


def _prefix_length(mask: Tensor) -> Tensor:
    """Length of the leading run of True per row. mask: [B, K] bool -> [B] long."""
    return mask.long().cumprod(dim=-1).sum(dim=-1)


def _check_rule_and_shapes(rule: Rule, draft_tokens: Tensor, target_probs: Tensor) -> None:
    require(
        isinstance(rule, AcceptanceRule | Gate),
        f"rule must be an acceptance rule (Exact, Nucleus, TopK, Typical, Lenience, TopKDelta, "
        f"Threshold, FLy, Greedy, Gate), "
        f"got {type(rule).__name__}",
    )
    require(
        isinstance(draft_tokens, Tensor)
        and draft_tokens.dim() == 2
        and not draft_tokens.is_floating_point()
        and not draft_tokens.is_complex()
        and draft_tokens.dtype != torch.bool,
        "draft_tokens must be an integer tensor of shape [B, K]",
    )
    require(
        isinstance(target_probs, Tensor) and target_probs.is_floating_point() and target_probs.dim() == 3,
        "target_probs must be a floating-point tensor of shape [B, K+1, V]",
    )
    B, K = draft_tokens.shape
    require(
        tuple(target_probs.shape[:2]) == (B, K + 1) and target_probs.shape[2] >= 1,
        f"target_probs must have shape [B, K+1, V] = [{B}, {K + 1}, V] to match draft_tokens of "
        f"shape [{B}, {K}], got {list(target_probs.shape)}",
    )
    require(
        draft_tokens.device == target_probs.device,
        f"draft_tokens is on {draft_tokens.device} but target_probs is on {target_probs.device}",
    )


def _check_draft_probs(
    rule: Rule, draft_probs: Tensor | None, B: int, K: int, V: int, device: torch.device
) -> Tensor | None:
    """Validate ``draft_probs`` for ``rule``; return it as float32 (or None)."""
    if draft_probs is None:
        require(
            not rule.needs_draft_probs,
            f"{rule!r} needs draft_probs (the proposal distribution the drafts were sampled from)",
        )
        return None
    require(
        isinstance(draft_probs, Tensor) and draft_probs.is_floating_point(),
        "draft_probs must be a floating-point tensor of shape [B, K, V] (or [B, K] for Gate)",
    )
    require(
        draft_probs.device == device,
        f"draft_probs is on {draft_probs.device} but target_probs is on {device}",
    )
    full, tok_only = (B, K, V), (B, K)
    shape = tuple(draft_probs.shape)
    if rule.needs_full_draft_probs:
        require(
            shape == full,
            f"{rule!r} needs draft_probs of shape [B, K, V] = {list(full)} (the full proposal "
            f"distribution, for recovery sampling), got {list(shape)}",
        )
    else:
        require(
            shape in (full, tok_only),
            f"draft_probs must have shape [B, K, V] = {list(full)} or [B, K] = {list(tok_only)}, "
            f"got {list(shape)}",
        )
    if shape == full:
        return check_distribution(draft_probs, "draft_probs")
    q = draft_probs.float()
    check_finite_nonneg(q, "draft_probs")
    require(bool((q <= 1).all()), "draft_probs contains probabilities greater than 1")
    return q


def check_verify_inputs(
    rule: Rule,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """Validate :func:`verify` arguments at the public boundary (one clear error each); return
    (tokens long, q float32 or None, p float32) as :func:`verify_unchecked` expects them."""
    _check_rule_and_shapes(rule, draft_tokens, target_probs)
    (B, K), V, device = draft_tokens.shape, target_probs.shape[2], target_probs.device
    tokens = draft_tokens.long()
    if tokens.numel():
        require(
            bool(((tokens >= 0) & (tokens < V)).all()),
            f"draft_tokens must be token ids in [0, {V}) (vocabulary size of target_probs)",
        )
    p = check_distribution(target_probs, "target_probs")
    q = _check_draft_probs(rule, draft_probs, B, K, V, device)
    if generator is not None:
        require(isinstance(generator, torch.Generator), "generator must be a torch.Generator or None")
        require(
            generator.device.type == device.type,
            f"generator is on {generator.device} but the probabilities are on {device}",
        )
    return tokens, q, p


def _gather_last(x: Tensor, tokens: Tensor) -> Tensor:
    """x: [B, K, V], tokens: [B, K] -> x at the tokens, [B, K]."""
    return x.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _argmax_match(tokens: Tensor, p: Tensor) -> Tensor:
    """tokens: [B, K], p: [B, K+1, V] -> [B, K] bool, ``d_i == argmax p_i``."""
    return tokens == p[:, : tokens.shape[1]].argmax(dim=-1)


def _verify_gate(rule: Gate, tokens: Tensor, q: Tensor, p: Tensor) -> Verdict:
    """ProVe gate (docs/design.md §2): prefix of ``q(d_i)·p(d_i) ≥ θ`` with position 1 always passing."""
    K = tokens.shape[1]
    q_tok = q if q.dim() == 2 else _gather_last(q, tokens)
    p_tok = _gather_last(p[:, :K], tokens)
    mask = q_tok * p_tok >= float(rule.theta)
    mask[:, :1] = True
    accepted = _prefix_length(mask)
    return Verdict(
        accepted=accepted,
        next_token=torch.full_like(accepted, NO_TOKEN),
        accept_mask=mask,
        exact_accepted=_prefix_length(_argmax_match(tokens, p)),
    )


def _sample_next(
    rule: AcceptanceRule,
    p: Tensor,
    q: Tensor,
    accepted: Tensor,
    generator: torch.Generator | None,
) -> Tensor:
    """Recovered token at the first rejection, bonus token from ``p_{K+1}`` if none.

    p: [B, K+1, V]; q: [B, K, V]; accepted: [B] -> [B] long.
    """
    B, K = q.shape[:2]
    dist = p[:, K]
    if K > 0:
        rows = torch.arange(B, device=p.device)
        j = accepted.clamp(max=K - 1)
        p_row, q_row = p[rows, j], q[rows, j]
        set_row = rule.accept_set(p_row)  # [B, V] or None
        recovered = residual_distribution(p_row, q_row, rule.h(p_row, q_row, set_row))
        dist = torch.where((accepted == K).unsqueeze(-1), dist, recovered)
    return torch.multinomial(dist, 1, generator=generator).squeeze(-1)


def verify(
    rule: Rule,
    draft_tokens: Tensor,
    draft_probs: Tensor | None,
    target_probs: Tensor,
    generator: torch.Generator | None = None,
) -> Verdict:
    """Verify a batch of draft blocks with ``rule`` (docs/design.md §2; NSD §3 Alg. 1).

    draft_tokens: [B, K] int, the drafts ``d_1..d_K``.
    draft_probs: [B, K, V] proposal laws ``q_i`` the drafts were drawn from; ``[B, K]`` (``q_i(d_i)``
        only) is enough for Gate; None for greedy-mode rules, which ignore it.
    target_probs: [B, K+1, V] target laws ``p_1..p_{K+1}``.
    generator: optional ``torch.Generator`` for the uniforms (float64) and the recovery/bonus
        draws; the same generator state gives the same Verdict. Greedy rules and Gate are
        deterministic and draw nothing.

    Returns a :class:`Verdict`. Probabilities are handled in float32. Raises ``RelaxSpecError``
    on bad input: this is the public boundary; the engine, whose inputs come from its own
    processing, calls :func:`verify_unchecked`.
    """
    tokens, q, p = check_verify_inputs(rule, draft_tokens, draft_probs, target_probs, generator)
    return verify_unchecked(rule, tokens, q, p, generator)


def verify_unchecked(
    rule: Rule, tokens: Tensor, q: Tensor | None, p: Tensor, generator: torch.Generator | None = None
) -> Verdict:
    """:func:`verify` on inputs known to be valid: ``tokens[B, K]`` long, ``q`` float32
    ``[B, K, V]`` (``[B, K]`` for Gate) or None, ``p`` float32 ``[B, K+1, V]`` probabilities."""
    assert tokens.dtype == torch.long and p.dtype == torch.float32 and p.shape[1] == tokens.shape[1] + 1
    if isinstance(rule, Gate):
        assert q is not None
        return _verify_gate(rule, tokens, q, p)
    assert isinstance(rule, AcceptanceRule)

    B, K = tokens.shape
    p_draft = p[:, :K]
    if rule.is_greedy:
        return verify_greedy(rule, tokens, p.argmax(dim=-1), lambda at: p_draft[at])
    # Sampling mode: the accept set is the relaxed set, read at the drafts here and over the
    # vocabulary only at each row's rejection (in _sample_next).
    relaxed = rule.relaxed_at(p_draft.flatten(0, 1), tokens.flatten()) if rule.relaxes else None
    in_set_tok = None if relaxed is None else relaxed.view(B, K)
    p_tok = _gather_last(p_draft, tokens)
    assert q is not None and q.shape == p_draft.shape
    q_tok = _gather_last(q, tokens)
    u = torch.rand((B, K), dtype=torch.float64, generator=generator, device=p.device)
    accept_mask = rule.defer(u < rule.h(p_tok, q_tok, in_set_tok).double(), p_draft, p_tok)
    exact_mask = u < Exact().h(p_tok, q_tok, None).double()
    accepted = _prefix_length(accept_mask)
    next_token = _sample_next(rule, p, q, accepted, generator)
    return Verdict(
        accepted=accepted,
        next_token=next_token,
        accept_mask=accept_mask,
        exact_accepted=_prefix_length(exact_mask),
    )


def verify_greedy(
    rule: AcceptanceRule, tokens: Tensor, top: Tensor, laws: Callable[[Tensor], Tensor]
) -> Verdict:
    """:func:`verify_unchecked` for a greedy-mode rule, from the target's argmax, reading target
    laws only where the rule's decision needs them.

    tokens: [B, K] long drafts; top: [B, K+1] long, ``argmax p_1..p_{K+1}`` (ties: lowest id);
    laws: maps a [B, K] bool mask to the float32 laws ``p_i`` at the masked positions, [M, V] in
    row-major order; called at most once — with the positions where ``d_i ≠ argmax p_i`` (every
    position for a rule whose :meth:`~AcceptanceRule.defer` reads the block), never for a rule
    without a relaxed set. Why this is the same verdict: a greedy-mode rule's accept set is its
    relaxed set plus ``argmax p`` (:meth:`~AcceptanceRule.accept_set`), so a draft equal to the
    argmax is accepted whatever the set holds.
    """
    B, K = tokens.shape
    match = tokens == top[:, :K]  # [B, K]: the strict (argmax) decisions
    if rule.reads_block:
        every = laws(torch.ones_like(match))  # [B·K, V]
        p_draft = every.view(B, K, every.shape[-1])
        relaxed = rule.relaxed_at(p_draft.flatten(0, 1), tokens.flatten())
        native = match if relaxed is None else match | relaxed.view(B, K)
        accept_mask = rule.defer(native, p_draft, _gather_last(p_draft, tokens))
    else:
        accept_mask, miss = match.clone(), ~match
        if rule.relaxes and bool(miss.any()):
            relaxed = rule.relaxed_at(laws(miss), tokens[miss])
            if relaxed is not None:
                accept_mask[miss] = relaxed
    accepted = _prefix_length(accept_mask)
    return Verdict(
        accepted=accepted,
        next_token=top.gather(-1, accepted.unsqueeze(-1)).squeeze(-1),
        accept_mask=accept_mask,
        exact_accepted=_prefix_length(match),
    )

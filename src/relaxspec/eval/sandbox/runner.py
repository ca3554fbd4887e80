"""One sandboxed execution: the processes, their pipes, the deadline and the verdict.

A run has up to three processes: the untrusted program (``harness.py`` around it), started in the
namespaces by ``launcher.py`` or directly in guard-only mode; and, for a HumanEval problem, the
trusted checker (``checker.py``), a separate process outside the sandbox. Their sources are read
with :mod:`importlib.resources` and run with ``python -I -S -B -c``: the sandboxed interpreter
cannot import this package (its root holds only the system directories and the interpreter).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path

NAMESPACES = "namespaces"
GUARD_ONLY = "guard-only"
SANDBOX_UID = 65534  # inside the namespace; also the outside uid when we are root ("nobody")
MAX_CREATED = 64  # files / directories a program may create
GUARD_ONLY_FILES = 16  # guard-only: files it may create, each at most disk_mb / 16 (RLIMIT_FSIZE)
SETUP_TIMEOUT = 15.0  # seconds for the launcher to build the namespaces
MAX_REPLY = (16 << 20) + 2  # bytes of one reply line from the program (wire.MAX_LINE + tag + \n)


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run."""

    timeout: float = 10.0  # wall-clock seconds
    memory_mb: int = 1024  # address space (of the program; the checker gets the same)
    file_mb: int = 16  # largest file the program (or its stdout / stderr) may write
    disk_mb: int = 32  # total bytes it may write to its /tmp (namespaces: tmpfs size)
    processes: int = 1  # RLIMIT_NPROC (process creation is also refused by the audit hook)
    open_files: int = 64


@dataclass(frozen=True)
class ExecResult:
    """``status`` is ``passed``, ``failed``, ``timed out`` or ``error`` (the sandbox could not be
    set up, or the tests are broken: no verdict); ``detail`` says why.

    For a HumanEval problem ``passed`` is the trusted checker's verdict (``check(candidate)``
    returned, every answer plain data); for a plain program it means the top level ran to its
    end and the process exited with status 0. ``isolation`` is ``namespaces`` (a security
    boundary) or ``guard-only`` (see the package docstring): only a ``namespaces`` result is
    :attr:`trusted`.
    """

    status: str
    detail: str = ""
    isolation: str = GUARD_ONLY

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    @property
    def trusted(self) -> bool:
        return self.isolation == NAMESPACES


def _source(name: str) -> str:
    return resources.files(__package__).joinpath(name).read_text(encoding="utf-8")


@cache
def harness_source() -> str:
    """The sandboxed program's preamble: ``wire.py``, ``harness.py``, then ``_harness(codec)``."""
    return _source("wire.py") + "\n" + _source("harness.py") + "\n_harness(codec)\n"


@cache
def checker_source() -> str:
    """The trusted checker: ``wire.py``, ``checker.py``, then ``_checker(codec)``."""
    return _source("wire.py") + "\n" + _source("checker.py") + "\n_checker(codec)\n"


@cache
def launcher_source() -> str:
    return _source("launcher.py")


def _python() -> str:
    """The base interpreter (not the virtualenv's): the sandbox needs the standard library only."""
    return getattr(sys, "_base_executable", None) or sys.executable


def _rlimits(limits: Limits) -> list[tuple[str, int]]:
    return [
        ("RLIMIT_AS", limits.memory_mb << 20),
        ("RLIMIT_CPU", math.ceil(limits.timeout) + 1),
        ("RLIMIT_FSIZE", limits.file_mb << 20),
        ("RLIMIT_NOFILE", limits.open_files),
        ("RLIMIT_CORE", 0),
        ("RLIMIT_NPROC", limits.processes),
    ]


def _set_limits(limits: Limits) -> None:
    """``preexec_fn`` of a guard-only run: resource limits, set after fork and before exec."""
    for name, value in _rlimits(limits):
        # Root is exempt from RLIMIT_NPROC; some systems refuse lowering it: the hook still refuses
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(getattr(resource, name), (value, value))


def _tail(text: str, chars: int = 300) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[-1] if lines else "")[-chars:]


def _close(*fds: int | None) -> None:
    for fd in fds:
        if fd is not None and fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)


class _Run:
    """One sandboxed execution: working directory, the program's pipes, and the checker.

    ``call`` carries calls from the checker to the program, ``reply`` its answers back (or, for a
    plain program, ``done`` to this process once its top level ran to its end).
    """

    def __init__(self, spec: dict, limits: Limits, tests: dict | None = None) -> None:
        self.limits, self.tests = limits, tests
        self.dir = Path(tempfile.mkdtemp(prefix="relaxspec-sandbox-"))
        self.dir.chmod(0o711)  # the sandbox uid must reach its mount point; nothing here is secret
        (self.dir / "spec.json").write_text(json.dumps(spec, ensure_ascii=True), encoding="ascii")
        self.call_r, self.call_w = os.pipe()
        self.reply_r, self.reply_w = os.pipe()
        self.verdict_r = self.verdict_w = -1
        self.checker: subprocess.Popen | None = None

    def worker_fds(self) -> tuple[int, int]:
        return self.call_r, self.reply_w

    def harness_argv(self, python: str, max_created: int = MAX_CREATED) -> list[str]:
        args = {"call_fd": self.call_r, "reply_fd": self.reply_w, "max_created": max_created}
        return [python, "-I", "-S", "-B", "-c", harness_source(), json.dumps(args)]

    def started(self) -> None:
        """The program runs: drop our copies of its ends; start the checker (HumanEval)."""
        _close(self.call_r, self.reply_w)
        self.call_r = self.reply_w = -1
        if self.tests is None:
            _close(self.call_w)
            self.call_w = -1
            return
        self.verdict_r, self.verdict_w = os.pipe()
        args = {
            "call_fd": self.call_w,
            "reply_fd": self.reply_r,
            "verdict_fd": self.verdict_w,
            "max_line": MAX_REPLY,
        }
        memory = self.limits.memory_mb << 20
        # what the tests print stays private: the program's uid (guard-only) cannot read it
        private = os.open(self.dir / "checker.err", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with open(private, "wb") as err:
            self.checker = subprocess.Popen(
                [_python(), "-I", "-S", "-B", "-c", checker_source(), json.dumps(args)],
                cwd=self.dir,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=err,
                pass_fds=(self.call_w, self.reply_r, self.verdict_w),
                start_new_session=True,
                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (memory, memory)),
            )
        _close(self.call_w, self.reply_r, self.verdict_w)
        self.call_w = self.reply_r = self.verdict_w = -1
        try:  # the checker reads all of it before it writes anything
            self.checker.stdin.write(json.dumps(self.tests, ensure_ascii=True).encode("ascii"))
            self.checker.stdin.close()
        except OSError:
            pass  # it died: no verdict, reported below

    def wait_checker(self, deadline: float) -> bool:
        """Wait for the checker's verdict until ``deadline``; False when it did not come in time."""
        try:
            self.checker.wait(timeout=max(deadline - time.monotonic(), 0.0))
            return True
        except subprocess.TimeoutExpired:
            return False

    def close(self) -> None:
        if self.checker is not None:
            with contextlib.suppress(OSError):
                os.killpg(self.checker.pid, signal.SIGKILL)
            self.checker.wait()
        _close(self.call_r, self.call_w, self.reply_r, self.reply_w, self.verdict_r, self.verdict_w)
        shutil.rmtree(self.dir, ignore_errors=True)

    def _read_all(self, fd: int, limit: int) -> bytes:
        os.set_blocking(fd, False)
        data = b""
        with contextlib.suppress(BlockingIOError, OSError):
            while len(data) <= limit:
                chunk = os.read(fd, 4096)
                if not chunk:
                    break
                data += chunk
        return data

    def stderr(self) -> str:
        return _tail((self.dir / "stderr").read_text(encoding="utf-8", errors="replace"))

    def verdict(self, code: int | None, isolation: str) -> ExecResult:
        """A plain program's verdict from its exit status and the ``done`` it wrote (or not)."""
        if code is None:
            return ExecResult("timed out", f"no exit within {self.limits.timeout:g} s", isolation)
        done = self._read_all(self.reply_r, 64) == b"done\n"
        if code == 0 and done:
            return ExecResult("passed", "", isolation)
        if code < 0:
            return ExecResult("failed", f"killed by signal {-code} {self.stderr()}".strip(), isolation)
        if code == 0:
            return ExecResult("failed", "the program exited before its end", isolation)
        return ExecResult("failed", self.stderr() or f"exit status {code}", isolation)

    def checked(self, finished: bool, isolation: str) -> ExecResult:
        """A HumanEval verdict: the checker's, or ``timed out`` when it did not finish."""
        if not finished:
            return ExecResult("timed out", f"no verdict within {self.limits.timeout:g} s", isolation)
        try:
            answer = json.loads(self._read_all(self.verdict_r, 1 << 16))
            status, detail = answer["status"], answer["detail"]
        except (ValueError, KeyError, TypeError):
            err = (self.dir / "checker.err").read_text(encoding="utf-8", errors="replace")
            return ExecResult("error", f"sandbox: the checker gave no verdict: {_tail(err)}", isolation)
        if status == "failed" and not detail:  # the program stopped answering: say why
            detail = self.stderr() or "the program ended before answering every call"
        return ExecResult(status, detail, isolation)


class _SetupError(Exception):
    def __init__(self, line: str | None) -> None:
        text = "timed out" if line is None else line.removeprefix("error ")
        super().__init__(text)


def run_guard_only(run: _Run, as_nobody: bool) -> ExecResult:
    limits = run.limits
    # no tmpfs to cap the total: at most GUARD_ONLY_FILES new files, each under disk_mb / that
    file_mb = min(limits.file_mb, max(1, limits.disk_mb // GUARD_ONLY_FILES))
    guard_limits = replace(limits, file_mb=file_mb)
    box = run.dir / "box"
    box.mkdir()
    user = {}
    if as_nobody:
        os.chown(box, SANDBOX_UID, SANDBOX_UID)
        user = {"user": SANDBOX_UID, "group": SANDBOX_UID, "extra_groups": []}
    env = {"PATH": "/usr/bin:/bin", "HOME": str(box), "TMPDIR": str(box), "LANG": "C.UTF-8"}
    with (
        open(run.dir / "spec.json", "rb") as spec,
        open(run.dir / "stdout", "wb") as out,
        open(run.dir / "stderr", "wb") as err,
    ):
        proc = subprocess.Popen(
            run.harness_argv(_python(), GUARD_ONLY_FILES),
            cwd=box,
            env=env,
            stdin=spec,
            stdout=out,
            stderr=err,
            pass_fds=run.worker_fds(),
            start_new_session=True,
            preexec_fn=lambda: _set_limits(guard_limits),
            **user,
        )
    deadline = time.monotonic() + limits.timeout
    try:
        run.started()
        if run.tests is not None:
            return run.checked(run.wait_checker(deadline), GUARD_ONLY)
        try:
            code: int | None = proc.wait(timeout=limits.timeout)
        except subprocess.TimeoutExpired:
            code = None
        return run.verdict(code, GUARD_ONLY)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

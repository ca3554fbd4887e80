"""Run the program in fresh Linux namespaces (``isolation == "namespaces"``), through ``launcher.py``."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from relaxspec.eval.sandbox.runner import (
    MAX_CREATED,
    NAMESPACES,
    SANDBOX_UID,
    SETUP_TIMEOUT,
    ExecResult,
    _close,
    _python,
    _rlimits,
    _Run,
    _SetupError,
    _tail,
    launcher_source,
)


def _binds() -> list[str]:
    """Host paths the sandbox sees (read-only): system directories and the interpreter's prefix."""
    paths = ["/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc"]
    for prefix in {sys.base_prefix, sys.base_exec_prefix, str(Path(_python()).resolve().parent.parent)}:
        if not any(prefix == p or prefix.startswith(p + "/") for p in paths):
            paths.append(prefix)
    return [p for p in paths if os.path.lexists(p)]


class _Lines:
    """Lines from the launcher's control pipe, with deadlines."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf, self.eof = fd, b"", False

    def next(self, deadline: float) -> str | None:
        """The next line; ``""`` at end of file; ``None`` when the deadline passed first."""
        while b"\n" not in self.buf:
            if self.eof:
                return ""
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.fd], [], [], left)[0]:
                return None
            chunk = os.read(self.fd, 4096)
            self.eof = not chunk
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode("utf-8", "replace")


def _write_id_maps(pid: int) -> None:
    root = os.geteuid() == 0
    uid, gid = (SANDBOX_UID, SANDBOX_UID) if root else (os.geteuid(), os.getegid())
    with open(f"/proc/{pid}/uid_map", "w") as f:
        f.write(f"{SANDBOX_UID} {uid} 1\n")
    with open(f"/proc/{pid}/setgroups", "w") as f:
        f.write("deny")
    with open(f"/proc/{pid}/gid_map", "w") as f:
        f.write(f"{SANDBOX_UID} {gid} 1\n")


def _kill_pidfd(pidfd: int | None, grace: float = 5.0) -> None:
    """SIGKILL the namespace's PID 1 (the kernel then kills every process in it) and wait."""
    if pidfd is None:
        return
    with contextlib.suppress(OSError):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    select.select([pidfd], [], [], grace)  # readable once PID 1 (hence the namespace) is gone


def _launcher_args(run: _Run, ctl_w: int, go_r: int) -> dict:
    limits, python = run.limits, _python()
    newroot = run.dir / "root"
    newroot.mkdir()
    return {
        "ctl": ctl_w,
        "go": go_r,
        "pass_fds": list(run.worker_fds()),
        "root": str(newroot),
        "binds": _binds(),
        "uid": SANDBOX_UID,
        "gid": SANDBOX_UID,
        "disk_kb": max(limits.disk_mb, 1) << 10,
        "inodes": 4 * MAX_CREATED,
        "rlimits": _rlimits(limits),
        "python": python,
        "argv": run.harness_argv(python),
        "env": {"PATH": "/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8"},
        "watchdog": limits.timeout + SETUP_TIMEOUT,
    }


def _handshake(run: _Run, proc: subprocess.Popen, lines: _Lines, go_w: int) -> int:
    """Id maps, ``go``, the PID 1's pidfd, ``ack``: the program starts. Returns the pidfd."""
    setup_deadline = time.monotonic() + SETUP_TIMEOUT
    line = lines.next(setup_deadline)
    if line != "unshared":
        raise _SetupError(line)
    _write_id_maps(proc.pid)
    os.write(go_w, b"go\n")
    line = lines.next(setup_deadline)
    if not line or not line.startswith("pid "):
        raise _SetupError(line)
    pidfd = os.pidfd_open(int(line.split()[1]))
    os.write(go_w, b"ack\n")
    return pidfd


def run_namespaces(run: _Run) -> ExecResult:
    ctl_r, ctl_w = os.pipe()
    go_r, go_w = os.pipe()
    pidfd = None
    lines = _Lines(ctl_r)
    try:
        args = _launcher_args(run, ctl_w, go_r)
        with (
            open(run.dir / "spec.json", "rb") as spec,
            open(run.dir / "stdout", "wb") as out,
            open(run.dir / "stderr", "wb") as err,
        ):
            proc = subprocess.Popen(
                [args["python"], "-I", "-S", "-B", "-c", launcher_source(), json.dumps(args)],
                cwd="/",
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                stdin=spec,
                stdout=out,
                stderr=err,
                pass_fds=(ctl_w, go_r, *run.worker_fds()),
                start_new_session=True,
            )
        _close(ctl_w, go_r)
        ctl_w = go_r = -1
        try:
            pidfd = _handshake(run, proc, lines, go_w)
            deadline = time.monotonic() + run.limits.timeout
            run.started()
            if run.tests is not None:
                return run.checked(run.wait_checker(deadline), NAMESPACES)
            line = lines.next(deadline)
            if line is not None and not line.startswith("exit "):
                raise _SetupError(line)
            return run.verdict(None if line is None else int(line.split()[1]), NAMESPACES)
        finally:
            _kill_pidfd(pidfd)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    except (_SetupError, OSError, subprocess.SubprocessError) as err:  # e.g. id maps refused
        stderr = (run.dir / "stderr").read_text(encoding="utf-8", errors="replace")
        detail = str(err) if str(err) not in ("", "None") else _tail(stderr) or "launcher died"
        return ExecResult("error", f"sandbox setup failed: {detail}", NAMESPACES)
    finally:
        _close(ctl_r, ctl_w, go_r, go_w, pidfd)

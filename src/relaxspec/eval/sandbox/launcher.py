"""The namespace launcher: trusted, runs outside the sandbox and builds it.

Standard library only, no relaxspec import: it runs as ``python -I -S -B -c SOURCE ARGS``
(:func:`relaxspec.eval.sandbox.runner.launcher_source`). It unshares the user, mount, PID,
network, IPC and UTS namespaces, lets the parent write the id maps, then forks PID 1 of the new
PID namespace, which builds the filesystem (read-only binds of the system directories and the
interpreter, a ``noexec`` tmpfs at ``/tmp``), drops to the sandbox uid, sets the resource limits,
``no_new_privs`` and the parent-death signal, and execs the harness.

Control protocol on the ``ctl`` pipe (one line each): ``unshared``; after the parent's ``go``:
``pid N`` (the parent opens a pidfd, answers ``ack``); at the end ``exit CODE``; ``error WHY`` at
any failure.
"""

import contextlib
import ctypes
import json
import os
import resource
import signal
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 1 << 14, 1 << 18, 1 << 21
NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = (
    0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000
)  # fmt: skip
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, MNT_DETACH = 1, 38, 2


class Launcher:
    """One launch: the arguments, libc, and the control pipe."""

    def __init__(self, args):
        self.args = args
        self.ctl, self.go = args["ctl"], args["go"]
        self.libc = libc = ctypes.CDLL(None, use_errno=True)
        libc.mount.argtypes = [ctypes.c_char_p] * 3 + [ctypes.c_ulong, ctypes.c_char_p]
        libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
        libc.prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4

    def say(self, text):
        os.write(self.ctl, (text + "\n").encode())

    def die(self, text):
        try:
            self.say("error " + text.replace("\n", " "))
        finally:
            os._exit(111)

    def check(self, rc, what):
        if rc != 0:
            self.die(what + ": " + os.strerror(ctypes.get_errno()))

    def mount(self, src, target, fstype, flags, data=None):
        def enc(s):
            return None if s is None else s.encode()

        rc = self.libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data))
        self.check(rc, "mount " + target)

    def read_only(self, point, device=False):
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        st = os.statvfs(point).f_flag
        if not device or st & os.ST_NODEV:
            flags |= MS_NODEV
        if st & os.ST_NOEXEC:
            flags |= MS_NOEXEC
        for have, want in (
            (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME), (os.ST_RELATIME, MS_RELATIME)
        ):  # fmt: skip
            if st & have:
                flags |= want
        self.mount(None, point, None, flags)

    def build_root(self):
        """PID 1's filesystem: binds, /dev nodes, the tmpfs; then pivot_root into it."""
        a, root = self.args, self.args["root"]
        sources = []
        for path in a["binds"]:
            if os.path.islink(path):
                sources.append((path, os.readlink(path), None))
            elif os.path.isdir(path):
                sources.append((path, None, os.open(path, os.O_PATH | os.O_CLOEXEC)))
        os.setresgid(a["gid"], a["gid"], a["gid"])
        os.setresuid(a["uid"], a["uid"], a["uid"])  # keeps the namespace's capabilities until exec
        self.mount(None, "/", None, MS_REC | MS_PRIVATE)
        self.mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=1024,mode=0755")
        for path, link, fd in sources:
            target = root + path
            os.makedirs(os.path.dirname(target), exist_ok=True)
            if link is not None:
                os.symlink(link, target)
            else:
                os.makedirs(target, exist_ok=True)
                self.mount(f"/proc/self/fd/{fd}", target, None, MS_BIND | MS_REC)
                os.close(fd)
        os.mkdir(root + "/dev")
        for name in ("null", "zero", "full", "random", "urandom"):
            open(root + "/dev/" + name, "w").close()
            self.mount("/dev/" + name, root + "/dev/" + name, None, MS_BIND)
        for name, target in (
            ("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
            ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2"),
        ):  # fmt: skip
            os.symlink(target, root + "/dev/" + name)
        os.mkdir(root + "/tmp")
        tmp = f"size={a['disk_kb']}k,nr_inodes={a['inodes']},mode=0700"
        self.mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, tmp)
        for point in mount_points(root):
            if point not in (root, root + "/tmp"):
                self.read_only(point, device=point.startswith(root + "/dev/"))
        try:  # no nested user namespace (it would bring capabilities back)
            with open("/proc/sys/user/max_user_namespaces", "w") as f:
                f.write("0")
        except OSError as err:
            self.die(f"max_user_namespaces: {err}")
        os.chdir(root)
        number = PIVOT_ROOT.get(os.uname().machine)
        if number is not None:
            self.check(self.libc.syscall(number, b".", b"."), "pivot_root")
            self.check(self.libc.umount2(b".", MNT_DETACH), "umount old root")
        else:
            os.chroot(".")
        os.chdir("/")
        self.read_only("/")
        os.chdir("/tmp")

    def child(self):
        """PID 1 of the new namespaces: build the root, limit, exec the harness."""
        os.close(self.go)
        os.set_inheritable(self.ctl, False)
        self.build_root()
        a = self.args
        for name, value in a["rlimits"]:
            resource.setrlimit(getattr(resource, name), (value, value))
        self.check(self.libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        self.check(self.libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "pdeathsig")
        os.execve(a["python"], a["argv"], a["env"])

    def run(self):
        if os.geteuid() == 0:
            os.setgroups([])
        self.check(self.libc.unshare(NEWUSER | NEWNS | NEWPID | NEWNET | NEWIPC | NEWUTS), "unshare")
        self.say("unshared")
        if readline(self.go) != "go":
            os._exit(112)
        pid = os.fork()
        if pid == 0:
            try:
                self.child()
            except BaseException as err:
                self.die(f"setup: {type(err).__name__}: {err}")
            os._exit(113)
        for fd in self.args["pass_fds"]:
            os.close(fd)
        self.say(f"pid {pid}")
        if readline(self.go) != "ack":
            os.kill(pid, signal.SIGKILL)

        def expire(*_):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)  # watchdog, should the parent be gone

        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, self.args["watchdog"])
        _, status = os.waitpid(pid, 0)
        self.say(f"exit {os.waitstatus_to_exitcode(status)}")
        os._exit(0)


def readline(fd):
    line = b""
    while not line.endswith(b"\n"):
        c = os.read(fd, 1)
        if not c:
            return ""
        line += c
    return line.decode().strip()


def mount_points(prefix):
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4]
            for code in ("\\040", "\\011", "\\012", "\\134"):
                point = point.replace(code, chr(int(code[1:], 8)))
            if point == prefix or point.startswith(prefix + "/"):
                out.append(point)
    return out


def main():
    Launcher(json.loads(sys.argv[1])).run()


if __name__ == "__main__":
    main()

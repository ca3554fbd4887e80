"""The sandboxed side: runs the untrusted program, then answers the trusted checker's calls.

Standard library only, no relaxspec import: the sandboxed interpreter runs ``wire.py``'s source,
this file's, and ``_harness(codec)`` (``python -I -S -B -c SOURCE ARGS``, see
:func:`relaxspec.eval.sandbox.runner.harness_source`), as the first code before the program.

It holds no secret and no test: the verdict of a HumanEval run is reached in the checker process
(``checker.py``), outside this interpreter, from the plain data this side sends back. What it
must still protect is the in-interpreter guard (the only guard in ``guard-only`` mode):

- :func:`_strip` removes, before the program runs, what CPython 3.11 does not audit and that
  acts outside the process (``os.pidfd_open``, ``os.mknod``, ...), and everything that hands a
  program a frame or runs its code asynchronously: signal handlers (a handler receives the
  interrupted frame, whose ``f_back`` leads to ours), timers, ``faulthandler``;
- :func:`_install_guard` builds the audit hook and returns: the hook and its state live only in
  closure cells of functions that nothing the program can reach refers to (the interpreter's hook
  list cannot be read, frames and ``gc`` are refused). The loader wrapper it installs on ``_imp``
  is reachable, so its state lives in a suspended generator whose frame only ``gi_frame`` reaches,
  which the hook refuses. The hook makes no global lookups (``tests/test_sandbox.py`` checks the
  bytecode), so monkeypatching builtins or modules cannot change it.
"""


def _strip(guarded):
    """Remove what the audit hook cannot see, and every way to get a frame or a signal handler."""
    import _signal
    import faulthandler
    import gc
    import os
    import posix
    import signal
    import sys

    unaudited = (  # os functions CPython 3.11 raises no audit event for, that act outside
        "pidfd_open", "mknod", "mkfifo", "chroot", "setns", "unshare", "setpriority",
        "sched_setaffinity", "sched_setscheduler", "sched_setparam",
    )  # fmt: skip
    signals = (  # handlers (handed the interrupted frame), timers, and signals to oneself
        "signal", "setitimer", "alarm", "set_wakeup_fd", "siginterrupt", "pthread_sigmask",
        "pthread_kill", "raise_signal", "sigwait", "sigwaitinfo", "sigtimedwait",
        "pidfd_send_signal",
    )  # fmt: skip
    faults = (
        "enable", "register", "dump_traceback_later", "_sigsegv", "_sigabrt", "_sigfpe",
        "_read_null", "_fatal_error", "_fatal_error_c_thread", "_stack_overflow",
    )  # fmt: skip
    if guarded:
        for module, names in (
            (posix, unaudited), (os, unaudited), (_signal, signals), (signal, signals),
            (faulthandler, faults), (gc, ("set_debug",)),
        ):  # fmt: skip
            for name in names:
                if name in module.__dict__:
                    delattr(module, name)
    sys.pycache_prefix = "/nonexistent/relaxspec-sandbox"  # no .pyc: marshal is refused


def _install_guard(root, max_created):
    """Add the audit hook (refusals: see the package docstring) and wrap ``_imp``'s loaders.

    Returns nothing: after it returns, no object the program can reach refers to the hook.
    """
    import _imp
    import os
    import posix
    import stat
    import sys
    import types

    _type, _str, _bytes, _int, _split, _join = type, str, bytes, int, str.split, str.join
    _isinstance, _getattr, _decode = isinstance, getattr, bytes.decode
    _FunctionType, _SimpleNamespace = types.FunctionType, types.SimpleNamespace
    _fspath, _stat, _S_ISDIR, _OSError = posix.fspath, posix.stat, stat.S_ISDIR, OSError
    _WRITE = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    _CREATE = os.O_CREAT
    _DIRFLAGS = getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_PATH", 0)
    _root, _root_slash = root, root + "/"
    _preloaded = frozenset(sys.modules)
    _budget = [0]
    _max_created = max_created
    _path_types, _path_fns, _PurePath = (), (), None
    try:
        import pathlib

        _path_types = (pathlib.PosixPath, pathlib.PurePosixPath)
        _path_fns = (pathlib.PurePath.__fspath__, pathlib.PurePath.__str__)
        _PurePath = pathlib.PurePath
    except Exception:
        pass
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
    ))  # fmt: skip
    _DENIED_PREFIXES = (
        "ctypes.", "socket.", "sqlite3.", "syslog.", "msvcrt.", "winreg.", "_winapi.",
        "urllib.", "http.", "ftplib.", "imaplib.", "nntplib.", "poplib.", "smtplib.",
        "telnetlib.",
    )  # fmt: skip
    _DENIED_MODULES = frozenset((
        "_posixsubprocess", "subprocess", "multiprocessing", "_multiprocessing", "_ctypes",
        "ctypes", "_sqlite3", "sqlite3", "_xxsubinterpreters", "_xxinterpchannels",
        "_testcapi", "_testinternalcapi", "_testbuffer", "_testmultiphase",
        "_testimportmultiple", "_testclinic", "_xxtestfuzz", "_ctypes_test", "_tkinter",
        "tkinter", "pty", "_imp", "posix", "_signal", "gc", "_thread", "builtins", "sys",
        "faulthandler",
    ))  # fmt: skip
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
        pure = _PurePath is not None and _PurePath.__fspath__ is _path_fns[0]
        if (t is _path_types[0] or t is _path_types[1]) and pure and _PurePath.__str__ is _path_fns[1]:
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
        elif event == "object.__setattr__" or event == "object.__delattr__":  # noqa: SIM102
            if _type(args[0]) is _FunctionType and args[1] in _SET_ATTRS:
                _deny("changing a function's " + _str(args[1]))

    # --- no second copy of an already loaded (or denied) built-in / extension module ----------
    _created = set()

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

    _BaseException = BaseException

    def _loader(create_builtin, create_dynamic):
        # a generator: the real loaders and _module_spec live in its frame alone
        reply = None
        while True:
            which, args = yield reply
            try:
                checked = (_module_spec(args[0]), *args[1:])
                reply = (True, (create_builtin if which else create_dynamic)(*checked))
            except _BaseException as exc:
                reply = (False, exc)

    gate = _loader(_imp.create_builtin, _imp.create_dynamic)
    next(gate)
    _imp.create_builtin, _imp.create_dynamic = _gated(gate.send)
    sys.addaudithook(_hook)


def _gated(send):
    """``_imp``'s two loaders as calls into the generator ``send`` belongs to."""

    def create_builtin(mspec):
        ok, value = send((True, (mspec,)))
        if ok:
            return value
        raise value

    def create_dynamic(mspec, file=None):
        ok, value = send((False, (mspec,) if file is None else (mspec, file)))
        if ok:
            return value
        raise value

    return create_builtin, create_dynamic


def _harness(codec):
    """Read the spec, guard, run the program, then answer calls (or report that it ran to its end)."""
    import builtins
    import json
    import os
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
    null = os.open("/dev/null", os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    call_fd, reply_fd = args["call_fd"], args["reply_fd"]
    encode, decode = codec()
    _write, _read, _exit, _stderr_fd = os.write, os.read, os._exit, 2
    _BaseException, _OSError, _str, _type = BaseException, OSError, str, type
    _dict_get, _find, _encode_text = dict.get, bytes.find, str.encode

    def say(fd, text):
        data = _encode_text(text, "utf-8", "replace")
        try:
            while data:
                data = data[_write(fd, data) :]
        except _OSError:
            pass

    def fail(exc):
        # no full traceback: it needs frames, which stay refused; line numbers come from the
        # traceback objects alone
        try:
            lines, tb = [], exc.__traceback__
            while tb is not None:
                lines.append(_str(tb.tb_lineno))
                tb = tb.tb_next
            where = "(traceback line numbers, outermost first: " + ", ".join(lines[1:]) + ")\n"
            say(_stderr_fd, where + "".join(traceback.format_exception_only(exc)) + "\n")
        except _BaseException:
            say(_stderr_fd, "the program raised an exception that cannot be printed\n")
        _exit(1)

    def raised(exc):
        # the reply for a call that raised: the exception's class name and (bounded) message
        try:
            message = _str(exc)[:2000]
            message = message if _type(message) is _str else ""
        except _BaseException:
            message = ""
        return "E" + encode([_type(exc).__name__, message]) + "\n"

    buffer = [b""]

    def next_call():
        while True:
            cut = _find(buffer[0], b"\n")
            if cut >= 0:
                line, buffer[0] = buffer[0][:cut], buffer[0][cut + 1 :]
                return line.decode("ascii")
            chunk = _read(call_fd, 1 << 16)
            if not chunk:
                return None
            buffer[0] += chunk

    entry = spec.get("entry_point")
    guarded = not spec.get("unguarded")  # tests only: shows the namespaces hold on their own
    _strip(guarded)
    if guarded:
        _install_guard(os.getcwd(), args["max_created"])

    # the program: its own __main__ module; the harness's globals are emptied
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
    del spec, chunks, chunk, args
    try:
        exec(compile(program, "program.py", "exec"), namespace)
        candidate = None if entry is None else _dict_get(namespace, entry)
        if entry is not None and candidate is None:
            raise NameError("the program does not define " + entry)
    except _BaseException as exc:
        fail(exc)
    for stream in (stdout, stderr):  # no contextlib: the program may have patched it
        try:  # noqa: SIM105
            stream.flush()
        except _BaseException:
            pass
    if entry is None:
        say(reply_fd, "done\n")  # the top level ran to its end
        _exit(0)
    while True:  # one line per call: encode((args, kwargs)) -> "R" + encode(value) or "E" + ...
        line = next_call()
        if line is None:
            _exit(0)
        try:
            call_args, call_kwargs = decode(line)
            reply = "R" + encode(candidate(*call_args, **call_kwargs)) + "\n"
        except _BaseException as exc:
            reply = raised(exc)
        say(reply_fd, reply)

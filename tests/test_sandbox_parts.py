"""The sandbox's parts on their own: the wire codec, the checker's tests setup, the programs'
sources, and the checker's proxy against a sandboxed program (exceptions, bad replies)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relaxspec.eval import sandbox
from relaxspec.eval.sandbox import check_completion, checker, runner, wire

encode, decode = wire.codec()

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**40), max_value=10**40)
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary(max_size=16)
    | st.complex_numbers(allow_nan=False)
)
hashable = st.recursive(
    scalars, lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3), max_leaves=6
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.sets(hashable, max_size=3)
        | st.dictionaries(hashable, inner, max_size=3)
    ),
    max_leaves=20,
)


def same(a, b) -> bool:
    """Equal, and of exactly the same types all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b and (not isinstance(a, float) or math.copysign(1, a) == math.copysign(1, b))


@settings(max_examples=200, deadline=None)
@given(values)
def test_plain_data_round_trips_with_its_exact_types(value):
    line = encode(value)
    assert "\n" not in line and line.isascii()
    assert same(decode(line), value)


def test_special_floats_big_ints_and_surrogates_survive():
    for value in (math.nan, math.inf, -0.0, 10**5000, -(10**5000), "\ud800", b"\x00\xff", (1, [2.5])):
        assert same(decode(encode(value)), value), value


class Yes:
    def __eq__(self, other):
        return True


class Int(int):
    def __eq__(self, other):
        return True


@pytest.mark.parametrize("value", [Yes(), Int(1), [1, Yes()], {"k": Int(2)}, print, range(3), type])
def test_anything_but_plain_data_is_refused(value):
    with pytest.raises(TypeError, match="not plain"):
        encode(value)


def test_too_deep_or_cyclic_values_are_refused():
    deep: list = []
    for _ in range(wire.MAX_DEPTH + 5):
        deep = [deep]
    with pytest.raises(ValueError, match="too large or too deep"):
        encode(deep)
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="too large or too deep"):
        encode(cyclic)


MALFORMED = ["", "[", "1", "1.5", '["i"]', '["i", 5]', '["x", 1]', '["d", [1]]', '["s", ["l"]]', "[]"]
MALFORMED += ["{}", '"a" "b"', "[" * 100000 + "]" * 100000, '"' + "a" * (wire.MAX_LINE + 1) + '"']


@pytest.mark.parametrize("line", MALFORMED)
def test_malformed_lines_are_refused(line):
    with pytest.raises((TypeError, ValueError)):
        decode(line)


def test_tests_setup_keeps_the_helpers_and_drops_the_unfinished_function():
    prompt = "import math\n\ndef helper(x):\n    return x\n\n@decorate\ndef f(x):\n"
    assert checker.tests_setup(prompt, "f") == "import math\n\ndef helper(x):\n    return x\n\n"
    assert checker.tests_setup("def f(x):\n", "f") == ""
    assert checker.tests_setup("def fx(y):\n    pass\n", "f") == "def fx(y):\n    pass\n"  # not f


def test_the_programs_are_modules_that_compile():
    for source in (runner.harness_source(), runner.checker_source(), runner.launcher_source()):
        compile(source, "program", "exec")
    assert "nonce" not in runner.harness_source()


def test_the_tests_see_the_candidates_exceptions_and_nothing_else():
    problem = {
        "prompt": "def f(x):\n",
        "test": (
            "def check(candidate):\n    assert candidate(1) == 1\n"
            "    try:\n        candidate(-1)\n"
            "    except ValueError as e:\n        assert 'negative' in str(e)\n"
            "    else:\n        raise AssertionError('no ValueError')\n"
        ),
        "entry_point": "f",
    }
    body = "    if x < 0:\n        raise ValueError('negative')\n    return x\n"
    assert check_completion(problem, body).passed
    # an exception the tests do not expect fails; so does one no test can catch
    assert not check_completion(problem, "    raise KeyError(x)\n").passed
    stop = check_completion(problem, "    if x < 0:\n        raise SystemExit(0)\n    return x\n")
    assert stop.status == "failed" and "SystemExit" in stop.detail


def test_a_program_that_stops_answering_fails_with_its_reason():
    problem = {
        "prompt": "def f(x):\n",
        "test": "def check(candidate):\n    assert candidate(1) == 1\n",
        "entry_point": "f",
    }
    crashed = check_completion(problem, "    return x\nraise RuntimeError('boom')\n")
    assert crashed.status == "failed" and "boom" in crashed.detail
    missing = check_completion(problem, "    return x\ndel f\n")
    assert missing.status == "failed" and "does not define f" in missing.detail
    gone = check_completion(problem, "    import os\n    os._exit(0)\n")
    assert gone.status == "failed" and gone.detail


def test_broken_tests_are_an_error_not_a_score():
    from relaxspec.errors import RelaxSpecError

    problem = {
        "prompt": "def f(x):\n",
        "test": "def check(candidate):\n    assert candidate(print)\n",
        "entry_point": "f",
    }
    with pytest.raises(RelaxSpecError, match="not plain"):
        check_completion(problem, "    return x\n")
    with pytest.raises(RelaxSpecError, match="could not be set up"):
        check_completion({**problem, "test": "def check(candidate)\n"}, "    return x\n")
    assert sandbox.isolation() in (sandbox.NAMESPACES, sandbox.GUARD_ONLY)

"""The typed method vocabulary (issue 30): :class:`relaxspec.params.Param` checks, the frozen
:class:`Params`, and every table that reads the presets (CLI flags, vLLM rows and rules) derived
from them, so that they cannot diverge."""

from __future__ import annotations

import copy
import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relaxspec import cli
from relaxspec.core.named_rules import RULES
from relaxspec.errors import RelaxSpecError, check_choice, check_int, check_real
from relaxspec.integrations.vllm import rules, runners
from relaxspec.integrations.vllm import serve as vllm_serve
from relaxspec.methods import METHODS, get_method, resolve_params
from relaxspec.params import DEFAULT_K, MAX_DRAFT_TOKENS, Param, Params, resolve

K = Param("k", int, 4, "draft length", lo=1, hi=64)
TAU = Param("tau", float, 0.5, "threshold", lo=0, hi=1)
FLAG = Param("on", bool, False, "a switch")
MODE = Param("mode", str, "a", "a mode", choices=("a", "b"))
TABLE = {p.name: p for p in (K, TAU, FLAG, MODE)}


def one_line_error(call, *args) -> str:
    with pytest.raises(RelaxSpecError) as err:
        call(*args)
    text = str(err.value)
    assert "\n" not in text
    return text


@pytest.mark.parametrize(
    "name, value, message",
    [
        ("k", True, "k (draft length) must be an integer in [1, 64], got True"),  # a bool is no int
        ("k", 2.0, "k (draft length) must be an integer in [1, 64], got 2.0"),
        ("k", "4", "must be an integer"),
        ("k", 0, "in [1, 64], got 0"),
        ("k", 65, "in [1, 64], got 65"),
        ("tau", False, "tau must be a number in [0, 1], got False"),
        ("tau", 1.5, "tau must be a number in [0, 1], got 1.5"),
        ("tau", "0.5", "tau must be a number"),
        ("on", 1, "on must be true or false, got 1"),
        ("mode", "c", "mode must be one of a, b, got 'c'"),
        ("mode", 1, "mode must be one of a, b"),
    ],
)
def test_a_bad_value_is_one_clear_error(name, value, message):
    assert message in one_line_error(resolve, "method 'x'", TABLE, {name: value})


def test_unknown_names_and_non_scalars_are_one_clear_error():
    text = one_line_error(resolve, "method 'x'", TABLE, {"kk": 1, "bad name": 2, "c": 3, "d": 4})
    assert text == "method 'x' has no parameter kk, 'bad name', c and 1 more (parameters: k, tau, on, mode)"
    assert "must be a number" in one_line_error(resolve, "method 'x'", TABLE, {"tau": [0.5]})
    assert "must be a number" in one_line_error(resolve, "method 'x'", TABLE, {"k": 2**40})


def test_resolved_params_are_typed_frozen_and_complete():
    p = resolve("method 'x'", TABLE, {"k": 8, "on": True})
    assert p == {"k": 8, "tau": 0.5, "on": True, "mode": "a"} and (p.k, p.on) == (8, True)
    for change in (lambda: p.__setitem__("k", 2), lambda: setattr(p, "k", 2), lambda: p.update(k=2)):
        with pytest.raises(TypeError):
            change()
    with pytest.raises(AttributeError):
        _ = p.nothing
    assert isinstance(resolve_params("nsd", {}), Params)
    for copied in (pickle.loads(pickle.dumps(p)), copy.deepcopy(p), copy.copy(p)):
        assert copied == p and isinstance(copied, Params)
    assert json.loads(json.dumps(p)) == p


@given(st.integers(-(2**31) + 1, 2**31 - 1) | st.booleans() | st.floats(allow_nan=True) | st.text(max_size=3))
def test_check_int_accepts_exactly_the_integers_in_range(value):
    ok = isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_DRAFT_TOKENS
    if ok:
        assert check_int("k", value, 1, MAX_DRAFT_TOKENS) == value
    else:
        with pytest.raises(RelaxSpecError, match="k must be an integer in"):
            check_int("k", value, 1, MAX_DRAFT_TOKENS)


def test_check_real_and_check_choice():
    assert check_real("x", 1, 0, 1) == 1
    for bad in (True, float("nan"), float("inf"), "1", None, 1.01):
        with pytest.raises(RelaxSpecError, match="x must be"):
            check_real("x", bad, 0, 1)
    assert check_choice("c", "b", ("a", "b")) == "b"
    with pytest.raises(RelaxSpecError, match="c must be one of a, b, got 'z'"):
        check_choice("c", "z", ("a", "b"))


def test_vllm_coercion_reads_numeric_strings_and_refuses_bools():
    accept_k = RULES["topk"].params["accept_k"]
    assert accept_k.coerce("3") == 3 and accept_k.coerce(3.0) == 3
    for bad, message in ((True, "must be a number"), ("x", "must be a number"), (float("inf"), "finite")):
        with pytest.raises(RelaxSpecError, match=message):
            accept_k.coerce(bad)


# --- One vocabulary: the tables that read the presets cannot diverge from them --------------------


def test_one_k_default_for_both_engines():
    assert get_method("sd").defaults["k"] == DEFAULT_K
    for name in runners.RULE_METHODS:
        assert resolve_params(name, {})["k"] == runners.resolve(name, {})["k"] == DEFAULT_K, name
    assert runners.resolve("vllm-sd", {})["k"] == DEFAULT_K
    assert vllm_serve.ServerSettings().k == DEFAULT_K


def test_vllm_rows_are_the_presets_rows():
    for name, spec in METHODS.items():
        if spec.vllm is None:
            assert name in runners.SKIPPING_METHODS
            with pytest.raises(RelaxSpecError, match="without the verifier"):
                runners.resolve(name, {})
            continue
        want = {n: v for n, v in spec.defaults.items() if n not in spec.vllm.drops}
        assert runners.row_defaults(name) == want == dict(runners.resolve(name, {})), name
    # a value goes through the same check on both engines
    for name, bad in (
        ("nsd", {"k": MAX_DRAFT_TOKENS + 1}),
        ("topk", {"accept_k": True}),
        ("sdd", {"gamma": 0}),
    ):
        engine = one_line_error(resolve_params, name, bad)
        assert one_line_error(runners.resolve, name, bad) == engine


def test_vllm_rules_are_the_presets_rules():
    assert tuple(RULES) == rules.RULE_NAMES
    for name, spec in METHODS.items():
        if spec.rule is not None and spec.rule.params:
            choice = rules.RuleChoice(spec.rule.name)
            assert choice.params == {n: spec.defaults[n] for n in spec.rule.params}, name
    assert set(rules.PARAM_KEYS) == {n for r in RULES.values() for n in r.params}
    for name in runners.RULE_METHODS:  # each vLLM rule row asks for its preset's rule
        plan = runners.engine_plan(name, runners.resolve(name, {}))
        assert plan.choice.rule(False) == get_method(name).rule.pair(resolve_params(name, {}))[0]


def test_cli_method_flags_are_the_presets_params():
    for name, (kind, _) in cli.METHOD_FLAGS.items():
        owners = [spec.params[name] for spec in METHODS.values() if name in spec.params]
        assert owners and {p.kind for p in owners} == {kind}, name

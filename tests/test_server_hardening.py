"""Issue 17, the server under attack: limits, isolation and authentication (DESIGN §7).

- method parameters have upper bounds (shared by the CLI, the benchmark and the server), and no
  value of any type makes validation raise anything but a RelaxSpecError;
- request bodies are capped (413) while the event loop keeps answering;
- malformed input that used to be a 500 is a 400 with a JSON error that leaks no internals;
- an API key guards the endpoints (401), ``/health`` excepted;
- one request with adversarial parameters cannot slow a normal one down by more than 2×;
- a forward that fails for one row of a batch fails only that row's request;
- a cancelled request leaves within one engine cycle.
"""

from __future__ import annotations

import math

import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.methods import (
    MAX_COUNT,
    MAX_DRAFT_TOKENS,
    MAX_DRAFT_WORK,
    method_names,
    resolve_params,
)

# --- method parameter bounds --------------------------------------------------------------------

NASTY_VALUES = [
    None, True, -1, 0, 2**31, 2**70, 10**4000, -(2**70), 1.5, -0.5, math.nan, math.inf, 1e308, "x",
    "\ud800", "a" * 10_000, "", [], [1], {}, {"a": 1}, b"x", object(),
]  # fmt: skip


@pytest.mark.parametrize("method", method_names())
def test_no_parameter_value_escapes_validation(method):
    """Every parameter of every preset, set to every nasty value: accepted, or a RelaxSpecError
    (never a TypeError / OverflowError / ... that the server would turn into a 500)."""
    from relaxspec.methods import get_method

    for name in get_method(method).params:
        for value in NASTY_VALUES:
            try:
                resolve_params(method, {name: value})
            except RelaxSpecError as err:
                assert len(str(err)) < 600
                str(err).encode("utf-8")  # the message itself is always encodable
    with pytest.raises(RelaxSpecError, match="no parameter"):
        resolve_params(method, {"\ud800": 1, "x" * 10_000: 2, "a": 3, "b": 4, "c": 5})


@pytest.mark.parametrize(
    "method,params,match",
    [
        ("sd", {"k": MAX_DRAFT_TOKENS + 1}, "k "),
        ("nsd", {"k": 10**6}, "k "),
        ("topk", {"accept_k": MAX_COUNT + 1}, "accept_k"),
        ("sdd", {"gamma": 300, "steps": 300}, "gamma"),
        ("sdd", {"gamma": 64, "steps": 65}, "steps"),
        ("sdd", {"steps": 300}, "steps"),
        ("sdd", {"gamma": 64, "steps": 64}, "drafter positions per cycle"),
        ("sdd", {"accept": "topk", "accept_k": 2**30}, "accept_k"),
        ("sdd-skip", {"s_max": MAX_COUNT + 1}, "s_max"),
        ("sdd-skip", {"k_min": 100}, "k_min"),
        ("sdd-skip", {"signal_tau": "high"}, "signal_tau"),
        ("sdd-periodic", {"period": 2**30}, "period"),
        ("sdd-periodic", {"skip_k": 65}, "skip_k"),
        ("prove-lossless", {"block_size": 65}, "block_size"),
        ("mars", {"block_size": 2**40}, "block_size"),
    ],
)
def test_parameter_upper_bounds(method, params, match):
    with pytest.raises(RelaxSpecError, match=match):
        resolve_params(method, params)


def test_bounds_leave_the_documented_operating_points():
    resolve_params("nsd", {"k": MAX_DRAFT_TOKENS})
    resolve_params("sdd", {"gamma": 32, "steps": 32})  # the diffusion sweep's largest point
    resolve_params("sdd", {"gamma": MAX_DRAFT_TOKENS, "steps": MAX_DRAFT_WORK // MAX_DRAFT_TOKENS})
    resolve_params("sdd-skip", {"gamma": 32, "k_min": 6, "s_max": 64})
    resolve_params("prove-lossless", {"block_size": 32})

"""A method's parameters, typed (docs/design.md §4, §7): :class:`Param` declares one, :func:`resolve`
turns a user's ``name -> value`` overrides into a frozen :class:`Params` once, at the boundary.

Every entry point that takes method parameters — the CLI's flags and ``--set``, the server's
``relaxspec.params``, vLLM's ``extra_args`` / ``vllm_xargs``, the bench grid — reads the same
declarations (:mod:`relaxspec.methods`), so a name, a default or a bound is written once.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, NoReturn

from relaxspec.errors import RelaxSpecError, check_bool, check_choice, check_int, check_real, is_int, show

MAX_STRING = 64  # characters of a string parameter (reveal, accept, signal)
MAX_INT = 1 << 31  # any integer parameter, before its own bound
KINDS = (int, float, bool, str)


@dataclass(frozen=True)
class Param:
    """One parameter: its name, type, default, bounds (``lo``/``hi``) or ``choices``, and help.

    ``kind`` is ``int``, ``float`` (any finite number), ``bool`` or ``str``; ``optional`` lets the
    value be None, which means "decided later" (NSD's θ per regime, the drafter's γ). A ``float``
    without bounds leaves its domain to the rule object that reads it (``Nucleus`` checks θ).
    """

    name: str
    kind: type
    default: Any
    help: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] = ()
    optional: bool = False

    def check(self, value: Any) -> Any:
        """``value`` if it fits this parameter; else one clear :class:`RelaxSpecError`."""
        if value is None and self.optional:
            return None
        unbounded = self.lo is None and self.hi is None
        if self.kind in (int, float) and unbounded:
            return value  # the rule object that reads it checks its domain (Nucleus: θ)
        if self.kind is int:
            return check_int(self.name, value, int(self.lo or 0), _int(self.hi), self.help)
        if self.kind is float:
            return check_real(self.name, value, self.lo, self.hi)
        if self.kind is bool:
            return check_bool(self.name, value)
        if self.choices:
            return check_choice(self.name, value, self.choices)
        if not isinstance(value, str):
            raise RelaxSpecError(f"{self.name} must be a string, got {show(value)}")
        return value

    def coerce(self, value: Any) -> Any:
        """A value as vLLM's ``vllm_xargs`` carry it (a number, or a numeric string; ``3.0`` for an
        integer 3), typed, then :meth:`check`-ed."""
        if self.kind not in (int, float):
            return self.check(value)
        if isinstance(value, str):
            try:
                is_float = any(c in value for c in ".eE") or value.lower() in ("nan", "inf")
                value = float(value) if is_float else int(value)
            except ValueError:
                raise RelaxSpecError(f"{self.name} must be a number, got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RelaxSpecError(f"{self.name} must be a number, got {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise RelaxSpecError(f"{self.name} must be a finite number, got {value!r}")
        if self.kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        return self.check(value)


def _int(x: float | None) -> int | None:
    return None if x is None else int(x)


def declare(*params: Param) -> Mapping[str, Param]:
    """A read-only ``name -> Param`` table in declaration order (names must be unique)."""
    table = {p.name: p for p in params}
    assert len(table) == len(params), [p.name for p in params]
    return MappingProxyType(table)


def defaults(params: Mapping[str, Param]) -> dict[str, Any]:
    return {name: p.default for name, p in params.items()}


class Params(dict):
    """Resolved parameters: a read-only ``dict`` (JSON-serialisable, ``**``-spreadable) with
    attribute access (``p.theta``). Built by :func:`resolve`; never changed afterwards."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def _frozen(self, *args: Any, **kw: Any) -> NoReturn:
        raise TypeError("resolved parameters are read-only: resolve new ones instead")

    __setitem__ = __delitem__ = __setattr__ = __delattr__ = _frozen  # type: ignore[assignment]
    clear = pop = popitem = setdefault = update = __ior__ = _frozen  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:  # pickle and copy rebuild it whole, never item by item
        return (Params, (dict(self),))

    def replace(self, **changes: Any) -> Params:
        """A copy with some values changed (not validated: for values a builder derived)."""
        return Params({**self, **changes})


def check_scalar(owner: str, name: Any, value: Any) -> None:
    """A parameter value is a JSON scalar of sane size: a bool, None, an integer below 2^31, a finite
    float or a short string (what the CLI's ``--set`` and the server's JSON can carry)."""
    ok = (
        value is None
        or isinstance(value, bool)
        or (is_int(value) and abs(value) < MAX_INT)
        or (isinstance(value, float) and math.isfinite(value))
        or (isinstance(value, str) and len(value) <= MAX_STRING and value.isprintable())
    )
    if not ok:
        raise RelaxSpecError(
            f"{owner}: parameter {show(name)} must be a number (integers below 2^31, floats "
            f"finite), a string of at most {MAX_STRING} printable characters, true/false or null; "
            f"got {show(value)}"
        )


def check_names(owner: str, names: Iterable[Any], known: Iterable[str]) -> None:
    """Every name is a known parameter; else one message naming (at most three of) the others."""
    allowed = list(known)
    unknown = [name for name in names if name not in allowed]
    if unknown:
        listed = ", ".join(show(n) if not str(n).isidentifier() else str(n) for n in unknown[:3])
        more = f" and {len(unknown) - 3} more" if len(unknown) > 3 else ""
        raise RelaxSpecError(
            f"{owner} has no parameter {listed}{more} (parameters: {', '.join(allowed) or 'none'})"
        )


def resolve(owner: str, params: Mapping[str, Param], given: Mapping[str, Any]) -> Params:
    """``given`` over the defaults of ``params``, each value checked by its :class:`Param`.

    ``owner`` names the method in messages (``"method 'nsd'"``). Unknown names, values that are not
    JSON scalars, wrong types and values out of range raise :class:`RelaxSpecError`.
    """
    check_names(owner, given, params)
    for name, value in given.items():
        check_scalar(owner, name, value)
    return Params({name: p.check(given.get(name, p.default)) for name, p in params.items()})


# --- The parameters several presets share (methods/ composes them, with its own defaults where
# they differ; the CLI's method flags are these). Pure data: importing this module stays cheap. ---

# Upper bounds of the method parameters (docs/design.md §7). They bound the work of one decoding
# cycle, so that one request can neither stall a batch for long nor hold its slot after a cancel:
MAX_DRAFT_TOKENS = 64  # k, gamma, block_size, k_min, skip_k: tokens drafted (and verified) per cycle
MAX_DRAFT_WORK = 1024  # gamma x steps: drafter token positions computed per cycle (sdd*)
MAX_COUNT = 1 << 20  # counters and ranks: accept_k, period, s_max

# The draft length K of every draft-model method, on our engine and inside vLLM alike: the
# θ x K grid on the bundled models (docs/results.md, nsd-greedy) is fastest at K = 4.
DEFAULT_K = 4
# The block size where none is given (docs/results.md: B = 8 is fastest on a CPU).
DEFAULT_BLOCK_SIZE = 8

K = Param("k", int, DEFAULT_K, "draft length", lo=1, hi=MAX_DRAFT_TOKENS)
THETA = Param(
    "theta", float, None, "nucleus threshold θ (None: the regime's default) / gate θ", optional=True
)
ACCEPT_K = Param("accept_k", int, 2, "accept drafts among the target's top accept_k", lo=1, hi=MAX_COUNT)
EPSILON = Param("epsilon", float, 0.09, "typical acceptance ε")
DELTA = Param("delta", float, 0.3, "typical acceptance δ; topk-delta δ")
ELL = Param("ell", float, 0.5, "lenience ℓ")
BLOCK_SIZE = Param(
    "block_size",
    int,
    None,
    f"tokens per block proposal; None: {DEFAULT_BLOCK_SIZE}, at most the trained size",
    lo=1,
    hi=MAX_DRAFT_TOKENS,
    optional=True,
)
TAU = Param("tau", float, 0.9, "confidence threshold τ (mars, sdd-skip)", lo=0, hi=1)
# Parameters with a flag of their own on every command that builds engines (others: --set).
METHOD_FLAGS = (K, THETA, ACCEPT_K, EPSILON, DELTA, ELL, BLOCK_SIZE, TAU)

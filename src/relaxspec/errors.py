"""The one exception type every public entry point raises on bad input (docs/design.md §7)."""

from __future__ import annotations

import math
from collections.abc import Iterable


class RelaxSpecError(ValueError):
    """Bad input or an unusable resource, with a message meant for the user.

    Subclasses ``ValueError`` so that callers who only know the standard library can still
    catch it. The CLI prints ``str(err)`` on one line and exits with status 2; the server maps
    it to a 4xx JSON error.
    """


def require(condition: bool, message: str) -> None:
    """Raise :class:`RelaxSpecError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise RelaxSpecError(message)


class Cancelled(Exception):
    """A generation was cancelled (e.g. its client disconnected); not bad input, so not a
    :class:`RelaxSpecError`. :meth:`relaxspec.engine.Engine.generate` raises it at the start of the
    first cycle after its ``cancel`` event is set."""


# --- Checks of one user-given value (every entry point: methods, vLLM rows, servers, the CLI) -----


def show(value: object) -> str:
    """A short, always-printable ``repr`` of a user-given value for an error message."""
    if isinstance(value, int) and abs(value) >= 10**30:
        return "a very large integer"
    text = ascii(value)  # never unencodable text (lone surrogates) in a message
    return text if len(text) <= 40 else text[:37] + "..."


def is_int(value: object) -> bool:
    """An integer that is not a bool (JSON ``true`` is not the number 1)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A finite int or float that is not a bool."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _label(name: str, what: str | None) -> str:
    return f"{name} ({what})" if what else name


def check_int(name: str, value: object, lo: int = 1, hi: int | None = None, what: str | None = None) -> int:
    """``value`` if it is an integer (not a bool) in ``[lo, hi]``; else :class:`RelaxSpecError`."""
    if is_int(value) and lo <= value and (hi is None or value <= hi):  # type: ignore[operator]
        return value  # type: ignore[return-value]
    bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
    raise RelaxSpecError(f"{_label(name, what)} must be an integer {bound}, got {show(value)}")


def check_real(
    name: str, value: object, lo: float | None = None, hi: float | None = None, what: str | None = None
) -> float:
    """``value`` if it is a finite number (not a bool) in ``[lo, hi]`` (None: unbounded)."""
    if is_real(value) and (lo is None or lo <= value) and (hi is None or value <= hi):  # type: ignore[operator]
        return value  # type: ignore[return-value]
    if lo is None and hi is None:
        bound = "a finite number"
    elif hi is None:
        bound = f"a number >= {lo}"
    elif lo is None:
        bound = f"a number <= {hi}"
    else:
        bound = f"a number in [{lo}, {hi}]"
    raise RelaxSpecError(f"{_label(name, what)} must be {bound}, got {show(value)}")


def check_choice(name: str, value: object, choices: Iterable[str], what: str | None = None) -> str:
    """``value`` if it is one of ``choices`` (strings)."""
    options = tuple(choices)
    if isinstance(value, str) and value in options:
        return value
    raise RelaxSpecError(f"{_label(name, what)} must be one of {', '.join(options)}, got {show(value)}")


def check_bool(name: str, value: object) -> bool:
    """``value`` if it is ``True`` or ``False`` (not 0 / 1)."""
    if isinstance(value, bool):
        return value
    raise RelaxSpecError(f"{name} must be true or false, got {show(value)}")

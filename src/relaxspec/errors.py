"""The one exception type every public entry point raises on bad input (docs/design.md §7)."""

from __future__ import annotations


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

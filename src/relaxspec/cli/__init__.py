"""The ``relaxspec`` command line: generate, theory, bench, data, train, eval, serve, loadtest.

Every command validates its input through the library (one :class:`RelaxSpecError` per problem),
prints ``error: <message>`` on one line and exits with status 2 on bad input. The commands live in
groups by concern: :mod:`.run` (generate), :mod:`.theory`, :mod:`.data`, :mod:`.train`,
:mod:`.bench` (bench, tournament, report, reproduce, eval, latency) and :mod:`.serving` (serve,
loadtest), over the shared options of :mod:`.common`. Importing this package registers them all on
:data:`app` in that order.
"""

from __future__ import annotations

import sys

# The command groups register their commands on `app` when imported, in this order (--help's).
# isort: off
from relaxspec.cli import run  # noqa: F401
from relaxspec.cli import theory  # noqa: F401
from relaxspec.cli import data  # noqa: F401
from relaxspec.cli import train  # noqa: F401
from relaxspec.cli import bench  # noqa: F401
from relaxspec.cli import serving  # noqa: F401

# isort: on
from relaxspec.cli.common import (
    METHOD_FLAGS,
    MODEL_HELP,
    MethodOptions,
    app,
    parse_mixture,
    parse_value,
    with_method_options,
)
from relaxspec.errors import RelaxSpecError

# The names tests and docs use from before the split into groups.
_parse_value = parse_value
_parse_mixture = parse_mixture

__all__ = ["METHOD_FLAGS", "MODEL_HELP", "MethodOptions", "app", "main", "with_method_options"]


def main() -> None:
    try:
        app()
    except RelaxSpecError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None

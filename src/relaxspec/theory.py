"""Public face of the theory identities (docs/design.md §3): the implementation is
:mod:`relaxspec.core.theory`."""

from relaxspec.core.theory import *  # noqa: F403
from relaxspec.core.theory import __all__  # noqa: F401

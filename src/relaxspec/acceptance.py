"""Public face of the acceptance rules (DESIGN §2; names fixed): the implementation is
:mod:`relaxspec.core.acceptance`."""

from relaxspec.core.acceptance import *  # noqa: F403
from relaxspec.core.acceptance import __all__  # noqa: F401

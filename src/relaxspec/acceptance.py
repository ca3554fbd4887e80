"""Public face of the acceptance rules (docs/design.md §2; names fixed): the implementation is
:mod:`relaxspec.core.acceptance`, and :mod:`relaxspec.core.peer_rules` for the other engines'
relaxed rules (``TopKDelta``, ``Threshold``, ``FLy``)."""

from relaxspec.core import acceptance as _acceptance
from relaxspec.core import peer_rules as _peer_rules
from relaxspec.core.acceptance import *  # noqa: F403
from relaxspec.core.peer_rules import *  # noqa: F403

__all__ = [*_acceptance.__all__, *_peer_rules.__all__]

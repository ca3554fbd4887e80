"""Proposers: draft models, block proposers (MARS), diffusion drafters (docs/design.md §4)."""

from relaxspec.engine.proposers.base import Proposal, Proposer
from relaxspec.engine.proposers.draft_model import DraftModel

__all__ = ["DraftModel", "Proposal", "Proposer"]

"""Proposers: draft models, block proposers (MARS), diffusion drafters (DESIGN §4)."""

from relaxspec.proposers.base import Proposal, Proposer
from relaxspec.proposers.draft_model import DraftModel

__all__ = ["DraftModel", "Proposal", "Proposer"]

"""Proposers: draft models, EAGLE heads, block proposers (MARS), diffusion drafters (docs/design.md §4)."""

from relaxspec.engine.proposers.base import Proposal, Proposer
from relaxspec.engine.proposers.draft_model import DraftModel
from relaxspec.engine.proposers.eagle import EagleProposer, load_eagle

__all__ = ["DraftModel", "EagleProposer", "Proposal", "Proposer", "load_eagle"]

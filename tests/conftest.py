"""Shared fixtures: tiny random models that build in milliseconds."""

from __future__ import annotations

import pytest
import torch

from relaxspec.models import LoadedModel
from relaxspec.testing import perturbed_copy, tiny_llama, tiny_tokenizer

# Tiny models are dominated by per-op overhead; a second thread only adds contention on 2 cores.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def tokenizer():
    return tiny_tokenizer(8)


@pytest.fixture(scope="session")
def target(tokenizer) -> LoadedModel:
    return LoadedModel(tiny_llama(len(tokenizer), seed=0, layers=2, logit_scale=4.0), tokenizer, None)


@pytest.fixture(scope="session")
def draft(tokenizer, target) -> LoadedModel:
    return LoadedModel(perturbed_copy(target.model), tokenizer, None)


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    from relaxspec.testing import save_tiny_pair

    return save_tiny_pair(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="session")
def unrelated_draft(tokenizer) -> LoadedModel:
    """A draft that disagrees with the target most of the time (many rejections)."""
    return LoadedModel(tiny_llama(len(tokenizer), seed=1, layers=1, logit_scale=4.0), tokenizer, None)


@pytest.fixture(scope="session")
def block(tokenizer) -> LoadedModel:
    """A tiny MARS block proposer (trained block size 6), trained ~2 s on a counting language."""
    from relaxspec.testing import tiny_block_proposer

    return LoadedModel(tiny_block_proposer(tokenizer, block_size=6), tokenizer, None)

"""Shared fixtures: tiny random models that build in milliseconds."""

from __future__ import annotations

import subprocess
import sys

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


@pytest.fixture
def cli(monkeypatch, capsys):
    """``cli(*args)`` runs ``relaxspec ARGS`` in this process through the CLI's ``main`` (what the
    installed command runs) and returns what :func:`relaxspec.testing.run_cli` returns (exit status,
    stdout, stderr), without starting an interpreter per call. An exception that is not one of
    the CLI's one-line errors propagates and fails the test (a subprocess would print a traceback)."""
    from relaxspec.cli import main

    def run(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()  # what the test printed before
        monkeypatch.setattr(sys, "argv", ["relaxspec", *args])
        try:
            main()
            code = 0
        except SystemExit as exit_:
            code = exit_.code if isinstance(exit_.code, int) else int(exit_.code is not None)
        out = capsys.readouterr()
        return subprocess.CompletedProcess(["relaxspec", *args], code, out.out, out.err)

    return run

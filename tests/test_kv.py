"""The position-indexed KV cache: rollback moves a length, no stale K/V is ever attended to,
growth keeps what was written, and non-Llama layouts fall back to transformers' DynamicCache."""

from __future__ import annotations

import contextlib

import pytest
import torch

from relaxspec.engine import kv
from relaxspec.engine.kv import CachedLM, PositionLayer, new_cache
from relaxspec.testing import tiny_llama


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return tiny_llama(vocab_size=32, context=128).eval()


def full_logits(model, ids: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(input_ids=torch.tensor([ids])).logits.float()[0]


def test_llama_gets_the_position_cache(model):
    lm = CachedLM(model)
    assert lm.cache_kind == "position"
    assert all(isinstance(layer, PositionLayer) for layer in lm.cache.layers)


@pytest.mark.parametrize("capacity", [2, 256])  # 2: every step grows the buffers
def test_rollback_then_new_tokens_match_a_fresh_forward(model, monkeypatch, capacity):
    monkeypatch.setattr(kv, "INITIAL_CAPACITY", capacity)
    prompt, rejected, accepted = [1, 5, 7, 2, 9], [3, 3, 4, 11, 12, 13], [8, 6, 10]
    lm = CachedLM(model)
    lm.forward(torch.tensor([prompt]))
    lm.forward(torch.tensor([rejected]))  # speculative tokens, then rejected
    lm.rollback(len(prompt))
    assert lm.length == len(prompt) and lm.cache.get_seq_length() == len(prompt)
    got = lm.forward(torch.tensor([accepted]))[0]
    want = full_logits(model, prompt + accepted)[len(prompt) :]
    # A stale slot (rejected K/V still attended, or a wrong mask length) would change these.
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # And decoding on, one token at a time, after a second rollback of one token.
    lm.rollback(len(prompt) + 2)
    step = lm.forward(torch.tensor([[accepted[2]]]))[0, -1]
    torch.testing.assert_close(step, want[-1], atol=1e-4, rtol=1e-4)


def test_rollback_does_not_copy_the_buffers(model):
    lm = CachedLM(model)
    lm.forward(torch.tensor([[1, 2, 3, 4, 5, 6]]))
    buffers = [layer._keys.data_ptr() for layer in lm.cache.layers]
    lm.rollback(2)
    lm.forward(torch.tensor([[7]]))
    assert [layer._keys.data_ptr() for layer in lm.cache.layers] == buffers
    assert all(layer.keys.shape[2] == 3 for layer in lm.cache.layers)


def test_other_cache_layouts_fall_back_to_dynamic(model, monkeypatch):
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicSlidingWindowLayer

    class Sliding(DynamicCache):
        def __init__(self, config=None):
            super().__init__(config=config)
            self.layers = [DynamicSlidingWindowLayer(sliding_window=4) for _ in self.layers]

    monkeypatch.setattr(kv, "DynamicCache", Sliding)
    cache = new_cache(model)
    assert kv.cache_kind(cache) == "dynamic"


def test_crop_and_assign_follow_transformers_contract(model):
    layer = PositionLayer(max_length=64)
    k = torch.randn(2, 1, 5, 4)
    layer.update(k, k + 1)
    layer.crop(-2)  # negative: drop that many
    assert layer.get_seq_length() == 3
    layer.crop(10)  # positive: keep at most that many
    assert layer.get_seq_length() == 3
    layer.crop(1)
    assert layer.get_seq_length() == 1 and torch.equal(layer.keys, k[:, :, :1])
    replacement = torch.randn(1, 1, 7, 4)
    layer.assign(replacement, -replacement)
    assert torch.equal(layer.keys, replacement) and torch.equal(layer.values, -replacement)
    layer.update(k[:1, :, :2], k[:1, :, :2])
    assert layer.get_seq_length() == 9 and torch.equal(layer.keys[:, :, :7], replacement)


def test_rows_join_and_leave_a_position_layer_like_concatenation():
    """append_layer_row / select_layer_rows on position layers = pad + cat / index on tensors."""
    from relaxspec.engine.kv import append_layer_row, select_layer_rows

    gen = torch.Generator().manual_seed(0)
    base_k, base_v = torch.randn(2, 3, 7, 4, generator=gen), torch.randn(2, 3, 7, 4, generator=gen)
    new_k, new_v = torch.randn(1, 3, 5, 4, generator=gen), torch.randn(1, 3, 5, 4, generator=gen)
    layer = PositionLayer(max_length=64)
    layer.update(base_k, base_v)
    append_layer_row(layer, new_k, new_v)
    want_k = torch.cat([base_k, torch.nn.functional.pad(new_k, (0, 0, 2, 0))])
    want_v = torch.cat([base_v, torch.nn.functional.pad(new_v, (0, 0, 2, 0))])
    assert torch.equal(layer.keys, want_k) and torch.equal(layer.values, want_v)
    # the next step writes every row at the end, as before
    step_k, step_v = torch.randn(3, 3, 1, 4, generator=gen), torch.randn(3, 3, 1, 4, generator=gen)
    keys, values = layer.update(step_k, step_v)
    assert torch.equal(keys, torch.cat([want_k, step_k], dim=2))
    assert torch.equal(values, torch.cat([want_v, step_v], dim=2))
    select_layer_rows(layer, torch.tensor([2, 0]))
    assert torch.equal(layer.keys, torch.cat([want_k, step_k], dim=2)[[2, 0]])
    assert layer.get_seq_length() == 8


@pytest.mark.parametrize("inference", [True, False])
@pytest.mark.parametrize("position", [True, False])
def test_a_leaving_row_is_replaced_by_the_last_and_its_storage_reused(position, inference):
    """remove_layer_row(b) = the rows in order 0..B-2 with the last at b, on position layers and
    transformers' own; a position layer then takes joining rows into freed or spare storage
    without reallocating (also in inference mode, where views do not know their base), and grows
    keeping every row once its spare rows are used up."""
    from transformers.cache_utils import DynamicLayer

    from relaxspec.engine.kv import append_layer_row, remove_layer_row

    mode = torch.inference_mode() if inference else contextlib.nullcontext()
    with mode:
        gen = torch.Generator().manual_seed(1)
        k, v = torch.randn(4, 2, 6, 3, generator=gen), torch.randn(4, 2, 6, 3, generator=gen)
        layer = PositionLayer(max_length=64) if position else DynamicLayer()
        layer.update(k, v)
        remove_layer_row(layer, 1)
        assert torch.equal(layer.keys, k[[0, 3, 2]]) and torch.equal(layer.values, v[[0, 3, 2]])
        remove_layer_row(layer, 2)  # the last row: nothing moves
        assert torch.equal(layer.keys, k[[0, 3]])
        if not position:
            return
        storage = layer._keys.untyped_storage().data_ptr()
        new_k, new_v = torch.randn(1, 2, 4, 3, generator=gen), torch.randn(1, 2, 4, 3, generator=gen)
        append_layer_row(layer, new_k, new_v)
        assert layer._keys.untyped_storage().data_ptr() == storage  # the freed row, no new buffer
        want = torch.cat([k[[0, 3]], torch.nn.functional.pad(new_k, (0, 0, 2, 0))])
        assert torch.equal(layer.keys, want)
        step = torch.randn(3, 2, 1, 3, generator=gen)
        keys, _ = layer.update(step, step)
        assert torch.equal(keys, torch.cat([want, step], dim=2))
        joined = torch.nn.functional.pad(new_k, (0, 0, 3, 0))
        for rows in (4, 5, 6):  # 4 rows were allocated with 2 to spare: rows 4-6 reuse storage
            append_layer_row(layer, new_k, new_v)
            assert layer._keys.untyped_storage().data_ptr() == storage and layer.keys.shape[0] == rows
        append_layer_row(layer, new_k, new_v)  # no spare row left: grows, keeping every row
        assert layer._keys.untyped_storage().data_ptr() != storage and layer.keys.shape[0] == 7
        assert torch.equal(layer.keys[:3], torch.cat([want, step], dim=2))
        assert all(torch.equal(layer.keys[b : b + 1], joined) for b in range(3, 7))
        with pytest.raises(IndexError):
            remove_layer_row(layer, 7)

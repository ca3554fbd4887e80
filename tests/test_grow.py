"""Depth up-scaling (train/grow.py): the grown model computes the source's function."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from relaxspec.errors import RelaxSpecError
from relaxspec.train.grow import RESIDUAL_WRITERS, grow_state_dict, layer_sources


def tiny_llama(layers: int, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config).eval()


@given(st.integers(1, 12).flatmap(lambda n: st.tuples(st.just(n), st.integers(n, 2 * n))))
def test_every_source_layer_kept_in_order_with_at_most_one_copy_each(sizes):
    n_source, n_grown = sizes
    plan = layer_sources(n_source, n_grown)
    assert len(plan) == n_grown
    assert [layer for layer, copy in plan if not copy] == list(range(n_source))
    copies = [layer for layer, copy in plan if copy]
    assert len(copies) == n_grown - n_source == len(set(copies))
    assert [layer for layer, _ in plan] == sorted(layer for layer, _ in plan)  # a copy follows its layer


def test_spaced_copies_for_the_target():
    copied = [layer for layer, copy in layer_sources(10, 14) if copy]
    assert copied == [1, 3, 5, 7]


@pytest.mark.parametrize("n_grown", [3, 4, 5, 6])
def test_grown_model_computes_the_source_function(n_grown):
    source = tiny_llama(3)
    with torch.no_grad():  # give the weights scale, so a wrong copy would show
        for p in source.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    grown = tiny_llama(n_grown, seed=1)
    grown.load_state_dict(grow_state_dict(source.state_dict(), 3, n_grown))
    ids = torch.randint(0, 64, (2, 11))
    with torch.no_grad():
        torch.testing.assert_close(grown(ids).logits, source(ids).logits, atol=1e-5, rtol=1e-5)
    state = grown.state_dict()
    for j, (_, copy) in enumerate(layer_sources(3, n_grown)):
        for part in RESIDUAL_WRITERS:
            assert bool(state[f"model.layers.{j}.{part}"].abs().sum() == 0) == copy


def test_copies_are_independent_tensors():
    grown = grow_state_dict(tiny_llama(2).state_dict(), 2, 4)
    a, b = grown["model.layers.0.self_attn.q_proj.weight"], grown["model.layers.1.self_attn.q_proj.weight"]
    assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()


def test_bad_growth_is_refused():
    for n_source, n_grown in [(3, 2), (2, 5), (0, 1)]:
        with pytest.raises(RelaxSpecError, match="cannot grow"):
            layer_sources(n_source, n_grown)
    state = tiny_llama(2).state_dict()
    with pytest.raises(RelaxSpecError, match=r"not 0\.\.2"):
        grow_state_dict(state, 3, 4)

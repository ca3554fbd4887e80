"""The C++ layer loop (engine/native.py, engine/csrc/layers.cpp): the Python loop's numbers, bit for
bit, on every weight format, cache shape and caller; the Python loop where it cannot be built."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

from relaxspec.engine import native, packed
from relaxspec.engine.kv import CachedLM, model_logits, new_cache
from relaxspec.engine.proposers.eagle import (
    EagleHead,
    EagleProposer,
    PackedEagleHead,
    causal_mask,
    head_config,
)
from relaxspec.testing import tiny_llama

KERNELS = ["packed", "packed-bf16", "packed-int8"]


@pytest.fixture(scope="module", autouse=True)
def built():
    """The loop must build here (CI has a compiler and ninja): a failed build fails these tests."""
    module = native.layers_module()
    assert module is not None, native.build_error()
    return module


def _gqa(context: int = 128) -> LlamaForCausalLM:
    torch.manual_seed(3)
    config = LlamaConfig(
        vocab_size=40, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=context, tie_word_embeddings=True, pad_token_id=1,
    )  # fmt: skip
    return LlamaForCausalLM(config).eval()


def _qwen2_bias() -> Qwen2ForCausalLM:
    torch.manual_seed(4)
    config = Qwen2Config(
        vocab_size=40, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=128, pad_token_id=1,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # biases matter in the products
        for layer in model.model.layers:
            layer.self_attn.q_proj.bias.normal_(0, 0.5)
            layer.self_attn.k_proj.bias.normal_(0, 0.5)
    return model


def _both(model: torch.nn.Module, run) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``run(model)`` through the Python loop and through the C++ loop's ATen operators."""
    with native.python_layers():
        python = run(model)
    with native.unfused():
        return python, run(model)


def _assert_identical(python: list[torch.Tensor], cpp: list[torch.Tensor]) -> None:
    assert len(python) == len(cpp)
    for a, b in zip(python, cpp, strict=True):
        assert a.shape == b.shape and torch.equal(a, b), (a - b).abs().max()


def _sequence(model: torch.nn.Module, length: int = 30, pieces=((0, 17), (17, 18), (18, 27), (27, 30))):
    ids = torch.randint(3, 40, (1, length), generator=torch.Generator().manual_seed(0))

    def run(m):
        cache = new_cache(m)
        out = [model_logits(m, ids[:, lo:hi], cache) for lo, hi in pieces]  # prefill, decode, verify
        assert cache.get_seq_length() == length
        return out

    return run


@pytest.mark.parametrize("kernels", KERNELS)
@pytest.mark.parametrize(
    "build", [tiny_llama, _gqa, _qwen2_bias], ids=["llama", "llama-gqa-tied", "qwen2-bias"]
)
def test_the_cpp_loop_computes_the_python_loops_numbers(build, kernels):
    model = build(40) if build is tiny_llama else build()
    packed.attach(model, kernels)
    _assert_identical(*_both(model, _sequence(model)))


def test_the_cpp_loop_grows_the_cache_and_rolls_back_like_the_python_loop():
    """Past the buffers' first capacity (256), and after a rejected verify is rolled back."""
    model = _gqa(context=400)
    packed.attach(model, "packed-bf16")
    ids = torch.randint(3, 40, (1, 300), generator=torch.Generator().manual_seed(1))

    def run(m):
        lm = CachedLM(m)
        out = [lm.forward(ids[:, :250]), lm.forward(ids[:, 250:262])]  # grows at 256
        lm.rollback(252)
        out.append(lm.forward(ids[:, 252:300]))
        return out

    _assert_identical(*_both(model, run))


@pytest.mark.parametrize("kernels", ["packed", "packed-int8"])
def test_the_cpp_loop_runs_batched_rows_with_holes(kernels):
    """The batched server's forward: padding columns in the cache, per-row positions."""
    model = _gqa()
    packed.attach(model, kernels)
    gen = torch.Generator().manual_seed(5)
    past_valid = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1], [0, 1, 0, 1, 1, 0]], dtype=torch.bool)
    new_valid = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 0]], dtype=torch.bool)
    past_ids = torch.randint(3, 40, (3, 6), generator=gen)
    new_ids = torch.randint(3, 40, (3, 3), generator=gen)
    past_pos = (past_valid.cumsum(1) - 1).clamp(min=0)
    new_pos = past_valid.sum(1, keepdim=True) + torch.arange(3)

    def run(m):
        cache = new_cache(m)
        first = model_logits(m, past_ids, cache, attention_mask=past_valid.long(), position_ids=past_pos)
        mask = torch.cat([past_valid, new_valid], dim=1).long()
        return [first, model_logits(m, new_ids, cache, attention_mask=mask, position_ids=new_pos)]

    _assert_identical(*_both(model, run))


@pytest.mark.parametrize("kernels", KERNELS)
def test_the_eagle_head_steps_identically_on_both_loops(kernels):
    """The packed EAGLE head's catch-up (masked) and single-token steps."""
    target = tiny_llama(40, seed=0, logit_scale=4.0)
    packed.attach(target, kernels)
    torch.manual_seed(2)
    head = EagleHead(head_config(target)).eval()
    step = EagleProposer(head, target).forward
    assert isinstance(step, PackedEagleHead)
    features, tokens = torch.randn(1, 9, 32), torch.randint(0, 40, (1, 9))

    def run(_):
        cache, out = new_cache(head), []
        with torch.inference_mode():
            for start, end in [(0, 3), (3, 5), (5, 6), (6, 9)]:
                mask = None if end - start == 1 else causal_mask(end - start, start)
                out.append(step(features[:, start:end], tokens[:, start:end], start, mask, cache))
        return out

    _assert_identical(*_both(target, run))


def test_a_cache_without_position_buffers_takes_the_python_loop(monkeypatch):
    """transformers' own cache layers (sliding windows, hybrids keep them) have no ``reserve``."""
    model = tiny_llama(40)
    packed.attach(model, "packed")
    ids = torch.randint(3, 40, (1, 12), generator=torch.Generator().manual_seed(3))
    calls = []
    monkeypatch.setattr(packed.PackedLayers, "layer", _counting(packed.PackedLayers.layer, calls))
    got = model_logits(model, ids, DynamicCache(config=model.config))
    assert len(calls) == model.config.num_hidden_layers
    calls.clear()
    want = model_logits(model, ids, new_cache(model))
    assert not calls  # the position cache took the C++ loop
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def _counting(method, calls: list):
    def wrapper(*args, **kwargs):
        calls.append(1)
        return method(*args, **kwargs)

    return wrapper


def test_a_failed_build_warns_once_and_the_python_loop_runs(monkeypatch):
    def broken():
        raise RuntimeError("Error building extension 'relaxspec_layers'\nc++: not found")

    monkeypatch.setattr(native, "_built", {"module": None, "error": None})
    monkeypatch.setattr(native, "_build", broken)
    model = copy.deepcopy(tiny_llama(40))
    packed.attach(model, "packed")
    with pytest.warns(UserWarning, match="could not be built.*c\\+\\+: not found"):
        first = _sequence(model)(model)
    assert native.build_error() == "RuntimeError: c++: not found"
    assert native.layers_module() is None  # tried once: no second build, no second warning
    with native.python_layers():
        _assert_identical(_sequence(model)(model), first)


@pytest.fixture
def own_kernels():
    kernel = native.own_kernels()
    if kernel is None:
        pytest.skip("this CPU has no AVX-512 BF16: products run on oneDNN")
    return kernel


@pytest.mark.parametrize("bias", [False, True])
def test_the_few_row_product_is_the_bf16_product_and_each_row_stands_alone(own_kernels, bias):
    """x·Wᵀ (+ b) on bf16 inputs and weights, fp32 sums rounded to bf16 as oneDNN's product; a row's
    result does not depend on the rows beside it (1 to 16 rows), and more rows go to oneDNN."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(98, 48, bias=bias)
    product = packed.PackedLinear([linear], torch.bfloat16)
    assert product.vnni is not None and own_kernels.small_rows() == 16
    x = torch.randn(4, 4, 98)
    got = product(x)
    w = linear.weight.detach().bfloat16().double()
    want = x.bfloat16().double() @ w.T + (linear.bias.detach().bfloat16().double() if bias else 0)
    assert got.dtype == torch.float32 and got.shape == (4, 4, 48)
    torch.testing.assert_close(got.double(), want.bfloat16().double(), atol=1e-6, rtol=2**-7)
    rows = x.reshape(16, 98)
    for m in range(16):
        assert torch.equal(product(rows[m : m + 1])[0], got.reshape(16, 48)[m])
    assert torch.equal(product(rows[3:8]), got.reshape(16, 48)[3:8])
    seventeen = torch.randn(17, 98)
    with native.torch_kernels():
        assert native.own_kernels() is None
        onednn = product(seventeen)
    assert torch.equal(product(seventeen), onednn)  # 17 rows: oneDNN's product


def test_the_own_kernels_refuses_what_it_cannot_take(own_kernels):
    vnni = packed.vnni_layout(torch.randn(48, 96).bfloat16())
    with pytest.raises(RuntimeError, match="few-row kernel does not take"):
        own_kernels.small_product(torch.randn(17, 96), vnni, None, None)
    with pytest.raises(RuntimeError, match="few-row kernel does not take"):
        own_kernels.small_product(torch.randn(2, 94), vnni, None, None)
    assert packed.PackedLinear([torch.nn.Linear(95, 48)], torch.bfloat16).vnni is None  # odd inputs
    assert packed.PackedLinear([torch.nn.Linear(96, 40)], torch.bfloat16).vnni is None  # 40 % 16
    assert packed.PackedLinear([torch.nn.Linear(96, 48)], torch.float32).vnni is None  # fp32


@pytest.mark.parametrize("kernels", ["packed-bf16"])
def test_both_products_give_the_same_greedy_text(own_kernels, target, kernels):
    """The few-row kernel changes bf16 rounding only: on the tiny target, greedy AR's text is the
    same with oneDNN's products."""
    from relaxspec.core.sampling import SamplingParams
    from relaxspec.methods import build_engine
    from relaxspec.models import LoadedModel

    model = copy.deepcopy(target.model)
    packed.attach(model, kernels)
    engine = build_engine("ar", LoadedModel(model, target.tokenizer, None))
    params = SamplingParams(temperature=0.0, max_new_tokens=30)
    for prompt in ("w1 w2", "w3 w3 w0", "w5"):
        few = engine.generate(prompt, params).tokens
        with native.torch_kernels():
            assert engine.generate(prompt, params).tokens == few


@pytest.mark.parametrize("heads, kv_heads, length", [(4, 4, 1), (4, 2, 37), (6, 6, 300)])
def test_the_decode_attention_is_torchs_attention(own_kernels, heads, kv_heads, length):
    """One new token over the cache's live prefix (a strided view of its buffer), grouped-query
    heads included: torch's scaled_dot_product_attention up to float32 summation order; a mask or
    more than one new token goes to torch's."""
    gen = torch.Generator().manual_seed(length)
    q = torch.randn(2, heads, 1, 64, generator=gen)
    buffers = torch.randn(2, 2, kv_heads, 320, 64, generator=gen) * 3
    keys, values = buffers[0][:, :, :length], buffers[1][:, :, :length]
    gqa = kv_heads != heads
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, values, enable_gqa=gqa)
    got = own_kernels.attend(q, keys, values, None, gqa)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    mask = torch.ones(1, 1, 1, length, dtype=torch.bool)
    masked = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=gqa)
    assert torch.equal(own_kernels.attend(q, keys, values, mask, gqa), masked)


def test_torch_kernels_are_the_path_before_the_own_kernels():
    """Within torch_kernels both loops compute what the Python loop did before the module's own
    kernels (oneDNN's products, torch's attention), bit for bit."""
    model = _gqa()
    packed.attach(model, "packed-bf16")
    with native.torch_kernels():
        _assert_identical(*_both(model, _sequence(model)))


def _assert_rounding_close(aten: list[torch.Tensor], fused: list[torch.Tensor]) -> None:
    """Float32 rounding carried through bf16 products: within 2 % of the largest logit, same argmax."""
    for a, b in zip(aten, fused, strict=True):
        torch.testing.assert_close(b, a, atol=0.02 * a.abs().max().item(), rtol=0)
        assert torch.equal(a.argmax(-1), b.argmax(-1))


@pytest.mark.parametrize("kernels", ["packed-bf16", "packed-int8"])
@pytest.mark.parametrize("build", [tiny_llama, _gqa], ids=["llama", "llama-gqa-tied"])
def test_a_fused_forward_of_one_sequence_computes_the_layers_to_rounding(own_kernels, build, kernels):
    """A few tokens of one sequence run fused (plain loops between the products; a prefill of 17
    tokens, a decode step, verifies of 9 and 3 — the few-row kernel and oneDNN's or int8's product
    both), on bf16 and int8 weights: the ATen path's logits up to float32 rounding, the same argmax.
    Biases and fp32 weights keep the ATen path."""
    model = build(40) if build is tiny_llama else build()
    packed.attach(model, kernels)
    steps = own_kernels.fused_steps()
    fused = _sequence(model)(model)
    assert own_kernels.fused_steps() == steps + 4  # every piece of the sequence
    with native.unfused():
        aten = _sequence(model)(model)
    assert own_kernels.fused_steps() == steps + 4
    _assert_rounding_close(aten, fused)
    for other, weights in ((_qwen2_bias(), "packed-bf16"), (tiny_llama(40), "packed")):
        packed.attach(other, weights)
        steps = own_kernels.fused_steps()
        _sequence(other)(other)
        assert own_kernels.fused_steps() == steps


@pytest.mark.parametrize("bias", [False, True])
def test_the_few_row_int8_product_is_int8packs_product(own_kernels, bias):
    """Weight-only int8 on the few-row kernel: the weights converted to bf16 exactly, the per-output
    scale applied to the fp32 sums, rounded to bf16 (then the bias): what ``_weight_int8pack_mm``
    computes, to the last bf16 bit but for rounding ties; rows independent; more than 16 rows in
    chunks of 16 (inputs a multiple of 32: torch's int8 kernel crashed on 98 inputs here)."""
    torch.manual_seed(1)
    linear = torch.nn.Linear(96, 48, bias=bias)
    product = packed.Int8Linear([linear])
    assert product.vnni is not None and product.vnni.dtype == torch.int8
    x = torch.randn(16, 96)
    got = product(x)
    with native.torch_kernels():
        want = product(x)  # _weight_int8pack_mm
    torch.testing.assert_close(got, want, atol=1e-6, rtol=2**-7)
    for m in range(16):
        assert torch.equal(product(x[m : m + 1])[0], got[m])
    forty = torch.randn(40, 96)  # 16 + 16 + 8 rows through the kernel
    with native.torch_kernels():
        want = product(forty)
    torch.testing.assert_close(product(forty), want, atol=1e-6, rtol=2**-7)
    assert torch.equal(product(forty)[16:32], product(forty[16:32]))
    assert packed.Int8Linear([torch.nn.Linear(96, 40)]).vnni is None  # 40 % 16


def test_a_long_prompt_keeps_atens_operators_and_the_sequence_stays_right(own_kernels):
    """Up to 256 new tokens fuse (a 200-token prompt, a 59-token piece across the buffers' growth at
    256 positions); past 256 the forward takes ATen's operators (torch's attention), and the step
    after it fuses again on the cache it wrote."""
    model = _gqa(context=700)
    packed.attach(model, "packed-bf16")
    pieces = ((0, 200), (200, 201), (201, 260), (260, 261), (261, 561), (561, 562))
    steps = own_kernels.fused_steps()
    fused = _sequence(model, 562, pieces)(model)
    assert own_kernels.fused_steps() == steps + 5  # all but the 300-token piece
    with native.unfused():
        aten = _sequence(model, 562, pieces)(model)
    _assert_rounding_close(aten, fused)


@pytest.mark.parametrize("T", [2, 4, 5, 13])
def test_a_fused_verify_equals_its_tokens_fed_one_by_one_to_rounding(own_kernels, T):
    """Causality of the fused rows: T tokens in one forward give the logits of the same tokens fed
    one decode step at a time (each row sees only the cache and the rows before it)."""
    model = _gqa()
    packed.attach(model, "packed-bf16")
    together = _sequence(model, 20 + T, ((0, 20), (20, 20 + T)))(model)[1]
    alone = _sequence(model, 20 + T, ((0, 20), *((i, i + 1) for i in range(20, 20 + T))))(model)[1:]
    _assert_rounding_close([together], [torch.cat(alone, dim=1)])


def test_the_eagle_heads_catch_up_step_fuses_under_its_causal_mask(own_kernels):
    """The packed EAGLE head's multi-token step (causal mask, ``causal=True``) and one-token steps
    fuse; an explicit mask without ``causal`` keeps ATen's operators."""
    target = tiny_llama(40, seed=0, logit_scale=4.0)
    packed.attach(target, "packed-bf16")
    torch.manual_seed(2)
    head = EagleHead(head_config(target)).eval()
    step = EagleProposer(head, target).forward
    features, tokens = torch.randn(1, 6, 32), torch.randint(0, 40, (1, 6))

    def run(causal: bool) -> list[torch.Tensor]:
        cache, out = new_cache(head), []
        with torch.inference_mode():
            for start, end in [(0, 3), (3, 4), (4, 6)]:
                mask = None if end - start == 1 else causal_mask(end - start, start)
                out.append(step(features[:, start:end], tokens[:, start:end], start, mask, cache, causal))
        return out

    steps = own_kernels.fused_steps()
    fused = run(True)
    assert own_kernels.fused_steps() == steps + 3
    aten = run(False)
    assert own_kernels.fused_steps() == steps + 4  # only the one-token step
    for a, b in zip(aten, fused, strict=True):
        torch.testing.assert_close(b, a, atol=0.02 * a.abs().max().item(), rtol=0)


def test_the_rotary_table_gives_the_rotary_modules_numbers():
    """cos / sin by position from the table (grown by doubling past its first size) equal the model's
    rotary module at the same positions; positions the table has no row for (negative) take the
    module itself."""
    model = _gqa(context=64)
    packed.attach(model, "packed-bf16")
    forward = packed.packed_forward(model)
    positions = torch.tensor([[0, 5, 63, 64, 200], [3, 3, 1, 0, 130]])
    cos, sin = forward.rotary_at(positions)
    want_cos, want_sin = model.model.rotary_emb(torch.zeros(1, 1, 1), positions)
    assert torch.equal(cos, want_cos[:, None].float()) and torch.equal(sin, want_sin[:, None].float())
    rows_cos, rows_sin = forward.rotary_rows(198, 3)  # [1, 1, 3, D]
    span_cos, span_sin = model.model.rotary_emb(torch.zeros(1, 1, 1), torch.arange(198, 201)[None])
    assert torch.equal(rows_cos[0, 0], span_cos[0].float())
    assert torch.equal(rows_sin[0, 0], span_sin[0].float())
    negative = torch.tensor([[-1, 0, 2]])
    cos, sin = forward.rotary_at(negative)
    want_cos, want_sin = model.model.rotary_emb(torch.zeros(1, 1, 1), negative)
    assert torch.equal(cos, want_cos[:, None].float()) and torch.equal(sin, want_sin[:, None].float())

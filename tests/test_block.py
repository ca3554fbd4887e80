"""MARS block proposer: training objective (mask, logit shift, B = 1 = AR), proposer, caches, export."""

from __future__ import annotations

import json

import pytest
import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine import Engine
from relaxspec.engine.proposers.block import BlockProposer
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ModelSet, build_engine
from relaxspec.models import load_model
from relaxspec.testing import counting_windows, tiny_llama, tiny_tokenizer
from relaxspec.train.ar import causal_lm_loss
from relaxspec.train.block import (
    block_attention_mask,
    block_inputs,
    block_logits,
    block_loss,
    block_metrics,
    make_noisy,
    train_block,
    write_model_card,
)

MASK = 2


def brute_force_allowed(L: int, B: int) -> torch.Tensor:
    """The attention rule of the issue, written out one (query, key) pair at a time."""
    allowed = torch.zeros(2 * L, 2 * L, dtype=torch.bool)
    for q in range(2 * L):
        for k in range(2 * L):
            q_noisy, k_noisy = q < L, k < L
            qi, ki = q % L, k % L
            if not q_noisy:  # clean: causal over clean only
                allowed[q, k] = not k_noisy and ki <= qi
            elif k_noisy:  # noisy -> noisy: own block, up to itself
                allowed[q, k] = ki // B == qi // B and ki <= qi
            else:  # noisy -> clean: strictly earlier blocks
                allowed[q, k] = ki // B < qi // B
    return allowed


@pytest.mark.parametrize("L,B", [(6, 2), (7, 3), (5, 1), (4, 8)])
def test_block_attention_mask_structure(L, B):
    mask = block_attention_mask(L, B)
    assert mask.shape == (2 * L, 2 * L) and mask.dtype == torch.float32
    assert set(mask.unique().tolist()) <= {0.0, float("-inf")}
    assert torch.equal(mask == 0, brute_force_allowed(L, B))
    assert (mask.diagonal() == 0).all()  # no empty softmax row


def test_make_noisy_keeps_the_first_token_of_each_block():
    ids = torch.arange(10, 20).reshape(1, 10)
    noisy = make_noisy(ids, 4, MASK)
    assert noisy.tolist() == [[10, 2, 2, 2, 14, 2, 2, 2, 18, 2]]
    assert torch.equal(make_noisy(ids, 1, MASK), ids)
    inputs = block_inputs(ids.repeat(3, 1), 4, MASK)
    assert inputs["input_ids"].shape == (3, 20)
    assert inputs["position_ids"][0].tolist() == list(range(10)) * 2
    assert inputs["attention_mask"].shape == (3, 1, 20, 20)


@pytest.mark.parametrize("L,B", [(12, 4), (11, 5)])
def test_training_layout_equals_decoding_layout(L, B):
    """The 4D mask reaches SDPA unchanged and the logits are shifted by one.

    Clean outputs equal a plain causal forward; the noisy outputs of block b equal what the
    proposer computes at decoding time from ``[x_0 .. x_{bB}, B−1 placeholders]``.
    """
    model = tiny_llama(12, seed=3, logit_scale=4.0)
    x = torch.randint(3, 12, (2, L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        noisy, clean = block_logits(model, x, B, MASK)
        assert (clean - model(input_ids=x).logits).abs().max() < 1e-4
        for start in range(0, L, B):
            width = min(B, L - start)
            decode_in = torch.cat([x[:, : start + 1], torch.full((2, width - 1), MASK)], dim=1)
            expected = model(input_ids=decode_in).logits[:, start:]
            assert (noisy[:, start : start + width] - expected).abs().max() < 1e-4


def test_block_size_one_is_twice_the_causal_lm_loss():
    model = tiny_llama(12, seed=4)
    batch = {"input_ids": torch.randint(3, 12, (3, 16), generator=torch.Generator().manual_seed(1))}
    with torch.no_grad():
        assert block_loss(model, batch, 1, MASK) == pytest.approx(
            2 * causal_lm_loss(model, batch).item(), rel=1e-5
        )


def test_trained_tiny_proposer_predicts_blocks(block):
    """A proposer trained for seconds predicts deep block positions far better than chance."""
    windows = counting_windows(32, 24, seed=10**6)
    metrics = block_metrics(block.model, windows, 6, MASK)
    assert metrics["block_acc@6"] > 0.6  # chance is 1/8
    assert metrics["block_prefix"] > 3.0
    untrained = block_metrics(tiny_llama(12, seed=0, hidden_size=64, logit_scale=1.0), windows, 6, MASK)
    assert untrained["block_prefix"] < 1.0


def test_first_block_position_is_the_ar_distribution(block):
    proposer = BlockProposer.from_pretrained(block.model, block.tokenizer, 6)
    for prompt in ([0, 4, 6, 8], [0, 9, 3, 3, 7, 5]):
        ids = torch.tensor([prompt])
        proposer.start(ids)
        logits = proposer.block_logits(ids, 6)
        with torch.no_grad():
            ar = block.model(input_ids=ids).logits[0, -1]
            # placeholder j equals a full forward of [ids, j placeholders] (no cache)
            full = block.model(input_ids=torch.cat([ids, torch.full((1, 5), MASK)], 1)).logits[0, -6:]
        assert logits.shape == (1, 6, 12)
        assert (logits[0, 0] - ar).abs().max() < 1e-4
        assert (logits[0] - full).abs().max() < 1e-4
        assert proposer.lm.length == ids.shape[1]  # no placeholder KV kept


def test_greedy_proposals_follow_the_learned_pattern(block):
    proposer = BlockProposer.from_pretrained(block.model, block.tokenizer, 6)
    ids = torch.tensor([[0, 4, 6, 8, 10, 4, 6]])  # w1 w3 w5 w7 w1 w3: counting by 2 (mod 8)
    proposer.start(ids)
    proposal = proposer.propose(ids, 6, SamplingParams(temperature=0), None)
    pattern = [8, 10, 4, 6, 8, 10]  # w5 w7 w1 w3 w5 w7
    assert proposal.tokens[0, :4].tolist() == pattern[:4]
    assert proposal.probs.shape == (1, 6, 12)
    assert torch.allclose(proposal.confidence, proposal.probs.max(-1).values)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method,params", [("prove-lossless", {"fused": False}), ("mars", {"tau": 0.5})])
def test_cache_holds_only_committed_tokens(block, method, params, temperature):
    engine = build_engine(method, ModelSet(block=block), block_size=6, **params)
    lm = engine.proposer.lm
    lengths = []

    def check(record):
        # the proposer's cache right after proposing: the committed prefix, no placeholders
        assert lm.length <= record.position
        lengths.append(lm.length)

    prompt = "w2 w5 w0 w3"
    params_ = SamplingParams(temperature=temperature, max_new_tokens=40, seed=5, ignore_eos=True)
    result = engine.generate(prompt, params_, on_cycle=check)
    assert len(lengths) == result.stats.cycles
    ids = torch.cat([engine.encode(prompt), torch.tensor([result.tokens])], dim=1)
    assert lm.length <= ids.shape[1] - 1
    with torch.inference_mode():
        fresh = block.model(ids).logits[0, -1]
        cached = lm.forward(ids[:, lm.length :])[0, -1]
    assert (cached - fresh).abs().max() < 1e-4


def test_bad_input(block, tokenizer):
    with pytest.raises(RelaxSpecError, match="block_size must be an integer >= 1"):
        BlockProposer(block.model, 0)
    with pytest.raises(RelaxSpecError, match="larger than the block size the proposer was trained with"):
        BlockProposer(block.model, 7)
    with pytest.raises(RelaxSpecError, match="is not a block proposer"):
        BlockProposer(tiny_llama(12), 4)
    no_mask = tiny_tokenizer(8)
    no_mask.mask_token = None
    with pytest.raises(RelaxSpecError, match="no mask token"):
        BlockProposer.from_pretrained(block.model, no_mask, 4)
    with pytest.raises(RelaxSpecError, match="B >= 1"):
        block_attention_mask(4, 0)
    proposer = BlockProposer(block.model, 4)
    with pytest.raises(RelaxSpecError, match=r"1\.\.4 tokens"):
        proposer.block_logits(torch.tensor([[0, 3]]), 5)


def test_proposer_in_a_hand_built_engine(block):
    """The parts compose freely: a block proposer with the NSD rule and the target as verifier."""
    from relaxspec.acceptance import Nucleus

    engine = Engine(
        block.model, block.tokenizer, proposer=BlockProposer(block.model, 4), rule=Nucleus(0.9), k=4
    )
    r = engine.generate(
        "w1 w2 w3", SamplingParams(temperature=1.0, max_new_tokens=20, seed=0, ignore_eos=True)
    )
    # one block forward per verified cycle (a last single token of the budget is a plain AR step)
    assert r.stats.new_tokens == 20 and r.stats.verifier_calls - 1 <= r.stats.draft_calls <= r.stats.cycles


# ---------------------------------------------------------------------------------------------
# The command: tiny corpus + tiny base model, a few steps, export with a model card


@pytest.fixture
def base_dir(tmp_path, tokenizer):
    path = tmp_path / "base"
    tiny_llama(len(tokenizer), seed=0, hidden_size=32).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def test_train_block_exports_a_loadable_proposer(tiny_corpus, base_dir, tmp_path):
    overrides = {"steps": 3, "batch_size": 2, "seq_len": 16, "eval_every": 3, "warmup": 1}
    _, state = train_block(
        base_dir,
        tiny_corpus,
        tmp_path / "run",
        tmp_path / "block",
        block_size=4,
        overrides=overrides,
        progress=False,
        command="relaxspec train block --steps 3",
    )
    assert state.step == 3
    loaded = load_model(tmp_path / "block")
    assert loaded.model.config.mars_block_size == 4
    assert loaded.model.config.mars_mask_token_id == MASK
    record = json.loads((tmp_path / "block" / "training.json").read_text())
    assert record["block_size"] == 4 and record["steps_done"] == 3
    assert {"block_loss", "clean_loss", "block_acc@4", "block_prefix"} <= set(record["history"][-1])
    card = (tmp_path / "block" / "README.md").read_text()
    assert "relaxspec train block --steps 3" in card and "B = 4" in card and "block_prefix" in card
    assert "## Metrics" not in card
    write_model_card(tmp_path / "block", {"math_accuracy_ar": 0.5})
    assert "| math_accuracy_ar | 0.5 |" in (tmp_path / "block" / "README.md").read_text()
    write_model_card(tmp_path / "block")  # rewriting keeps the recorded metrics
    assert "| math_accuracy_ar | 0.5 |" in (tmp_path / "block" / "README.md").read_text()
    engine = build_engine("prove-lossless", ModelSet(block=loaded), block_size=4)
    assert engine.generate("w1 w2", SamplingParams(temperature=0, max_new_tokens=5, ignore_eos=True)).tokens


def test_train_block_bad_input(tiny_corpus, base_dir, tmp_path):
    with pytest.raises(RelaxSpecError, match="block_size must be an integer >= 1"):
        train_block(base_dir, tiny_corpus, tmp_path / "r", None, block_size=0, progress=False)
    with pytest.raises(RelaxSpecError, match="unknown training option"):
        train_block(base_dir, tiny_corpus, tmp_path / "r", None, overrides={"stepz": 1}, progress=False)
    with pytest.raises(RelaxSpecError, match="exceeds the training window"):
        train_block(
            base_dir,
            tiny_corpus,
            tmp_path / "r",
            None,
            block_size=32,
            overrides={"seq_len": 16},
            progress=False,
        )
    with pytest.raises(RelaxSpecError, match="model directory not found"):
        train_block(tmp_path / "nothing", tiny_corpus, tmp_path / "r", None, progress=False)
    with pytest.raises(RelaxSpecError, match=r"no training\.json"):
        write_model_card(base_dir)


def test_cli_train_block_and_card(tiny_corpus, base_dir, tmp_path):
    from typer.testing import CliRunner

    from relaxspec.cli import app

    runner = CliRunner()
    args = [
        "train",
        "block",
        "--base",
        str(base_dir),
        "--corpus",
        str(tiny_corpus),
        "--block-size",
        "2",
        "--run-dir",
        str(tmp_path / "run"),
        "--export",
        str(tmp_path / "out"),
        "--steps",
        "2",
        "--batch-size",
        "2",
        "--seq-len",
        "16",
        "--set",
        "warmup=1",
    ]
    r = runner.invoke(app, args)
    assert r.exit_code == 0, r.output
    assert load_model(tmp_path / "out").model.config.mars_block_size == 2
    (tmp_path / "m.json").write_text(json.dumps({"mean_ar_prefix": 3.25}))
    r = runner.invoke(
        app,
        [
            "train",
            "card",
            "--model",
            str(tmp_path / "out"),
            "--metrics",
            str(tmp_path / "m.json"),
            "--set",
            "speedup=1.5",
        ],
    )
    assert r.exit_code == 0, r.output
    card = (tmp_path / "out" / "README.md").read_text()
    assert "| mean_ar_prefix | 3.25 |" in card and "| speedup | 1.5 |" in card


def test_model_card_without_history(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "training.json").write_text("{}")
    assert "# block — MARS block proposer" in write_model_card(tmp_path).read_text()


def _block_model(seed: int = 3):
    from relaxspec.engine.proposers.block import BLOCK_SIZE_ATTR, MASK_ID_ATTR

    model = tiny_llama(12, seed=seed, logit_scale=4.0)
    setattr(model.config, BLOCK_SIZE_ATTR, 6)
    setattr(model.config, MASK_ID_ATTR, MASK)
    return model


@pytest.mark.parametrize("kernels", ["transformers", "packed"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_block_drafts_equal_each_requests_solo_drafts(kernels, temperature):
    """BlockBatch (one forward for every row) against a BlockProposer per request, over rounds
    with uneven commits, a re-draft at the same length, a row leaving, a long prompt joining, a
    row skipped and rows asking for different k: same tokens, laws q and confidences."""
    from relaxspec.core.sampling import SamplingParams
    from relaxspec.engine import packed
    from relaxspec.engine.proposers.block import BlockBatch
    from relaxspec.engine.proposers.rows import RowRequest

    model = _block_model()
    if kernels == "packed":
        fast = type(model)(model.config).eval()
        fast.load_state_dict(model.state_dict())
        assert packed.attach(fast, "packed") == "packed"
        model = fast
    gen = torch.Generator().manual_seed(11)
    ids = {key: torch.randint(3, 12, (1, n), generator=gen) for key, n in (("a", 5), ("b", 9), ("c", 1))}
    params = SamplingParams(temperature=temperature, seed=0)
    gens = {
        k: (torch.Generator().manual_seed(v), torch.Generator().manual_seed(v))
        for k, v in zip("abcd", range(4), strict=True)
    }
    batch, solos = BlockBatch(model, 6), {}
    for rnd in range(6):
        if rnd == 3:
            batch.remove("a")
            del ids["a"]
            ids["d"] = torch.randint(3, 12, (1, 30), generator=gen)
        keys = [k for k in ids if not (rnd == 4 and k == "b")]
        ks = {key: 6 if (rnd + i) % 2 else 3 for i, key in enumerate(keys)}
        got = batch.propose(
            [RowRequest(k, ids[k], ks[k], params, gens[k][0] if temperature else None) for k in keys]
        )
        for key, out in zip(keys, got, strict=True):
            solo = solos.setdefault(key, BlockProposer(model, 6))
            want = solo.propose(ids[key], ks[key], params, gens[key][1] if temperature else None)
            assert out.tokens.tolist() == want.tokens.tolist(), (rnd, key)
            torch.testing.assert_close(out.probs, want.probs, atol=1e-5, rtol=1e-4)
            torch.testing.assert_close(out.confidence, want.confidence, atol=1e-5, rtol=1e-4)
            assert batch.rows[key].length == ids[key].shape[1]  # committed tokens only
        for key in keys:
            if not (rnd == 2 and key == "c"):
                grow = int(torch.randint(1, 5, (1,), generator=gen))
                ids[key] = torch.cat([ids[key], torch.randint(3, 12, (1, grow), generator=gen)], 1)
    for key in list(ids):
        batch.remove(key)
    assert batch.rows == {} and batch.cache_bytes() == 0


def test_batched_block_drafts_refuse_bad_requests():
    from relaxspec.core.sampling import SamplingParams
    from relaxspec.engine.proposers.block import BlockBatch
    from relaxspec.engine.proposers.rows import RowRequest

    batch = BlockBatch(_block_model(), 4)
    ids, greedy = torch.tensor([[3, 4, 5]]), SamplingParams(temperature=0)
    with pytest.raises(RelaxSpecError, match="asked for 5"):
        batch.propose([RowRequest("a", ids, 5, greedy)])
    with pytest.raises(RelaxSpecError, match="at most once"):
        batch.propose([RowRequest("a", ids, 2, greedy), RowRequest("a", ids, 2, greedy)])
    with pytest.raises(RelaxSpecError, match="larger than the block size"):
        BlockBatch(_block_model(), 7)
    assert batch.rows == {}

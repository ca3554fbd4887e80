"""An EAGLE head's reduced draft vocabulary (EAGLE-3; issue 34): the ranking from training data, its
file, the reduced LM head, exactness of every rule over it, and the bad input around it."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch

from relaxspec.core.acceptance import Exact, Greedy
from relaxspec.core.sampling import SamplingParams
from relaxspec.data.tokens import TokenMixture
from relaxspec.engine import Engine
from relaxspec.engine.kv import CachedLM
from relaxspec.engine.packed import attach
from relaxspec.engine.proposers.draft_vocab import (
    VOCAB_FILE,
    ReducedHead,
    draft_vocabulary,
    load_ranking,
    save_ranking,
)
from relaxspec.engine.proposers.eagle import EagleHead, EagleProposer, head_config, load_eagle, save_eagle
from relaxspec.errors import RelaxSpecError
from relaxspec.integrations.vllm import runners as vllm_runners
from relaxspec.methods import ModelSet, build_engine, load_models
from relaxspec.models import LoadedModel
from relaxspec.testing import (
    law_chi2_pvalue,
    tiny_llama,
    tiny_tokenizer,
)
from relaxspec.train.draft_vocab import token_ranking
from relaxspec.train.eagle import train_eagle

PROMPTS = ["w0 w1", "w3", "w2 w5 w7 w1", "w4 w4", "w6 w0 w2", "w1 w2 w3", "w7", "w5 w3 w1 w6 w0"]
GREEDY = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)
V = 12  # tiny_tokenizer(8): EOS 0, pad, mask, w0 .. w7 (ids 3 .. 10), unknown


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(8)


@pytest.fixture(scope="module")
def target(tok) -> LoadedModel:
    return LoadedModel(tiny_llama(len(tok), seed=0, logit_scale=4.0), tok, None)


@pytest.fixture(scope="module")
def head(target) -> EagleHead:
    torch.manual_seed(0)
    return EagleHead(head_config(target.model)).eval()


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, target, head):
    root = tmp_path_factory.mktemp("eagle-vocab")
    target.model.save_pretrained(root / "target")
    target.tokenizer.save_pretrained(root / "target")
    save_eagle(head, target.model, root / "head")
    return root


def vocab(size: int) -> torch.Tensor:
    """A draft vocabulary of EOS and ``size − 1`` words from w1 on: sorted ids."""
    return torch.tensor([0, *range(4, 4 + size - 1)])


# --- the ranking ---------------------------------------------------------------------------------


def test_the_ranking_orders_tokens_by_mixture_weighted_frequency():
    streams = {"a": np.array([1, 1, 1, 2], dtype=np.uint16), "b": np.array([3, 3], dtype=np.uint16)}
    data = TokenMixture(streams, {"a": 1.0, "b": 3.0})
    # a: token 1 at 1/4 · 3/4, token 2 at 1/4 · 1/4; b: token 3 at 3/4 · 1: b's share outweighs a's
    assert token_ranking(data, 6).tolist() == [3, 1, 2, 0, 4, 5]  # unseen tokens last, by id
    assert token_ranking(data, 6, first=(5,)).tolist() == [5, 3, 1, 2, 0, 4]
    with pytest.raises(RelaxSpecError, match="beyond the target's 3"):
        token_ranking(data, 3)


def test_a_ranking_round_trips_and_a_bad_file_is_one_clear_error(tmp_path):
    ranking = torch.tensor([5, 3, 1, 2, 0, 4])
    save_ranking(tmp_path, ranking, 3)
    loaded, default = load_ranking(tmp_path, 6)
    assert torch.equal(loaded, ranking) and default == 3
    assert not list(tmp_path.glob("*.partial"))
    assert load_ranking(tmp_path / "missing", 6) is None
    with pytest.raises(RelaxSpecError, match="each of the target's 7 token ids once"):
        load_ranking(tmp_path, 7)  # a ranking for another vocabulary

    def write(token_ids: object, default: object = 3) -> None:
        (tmp_path / VOCAB_FILE).write_text(json.dumps({"default_size": default, "token_ids": token_ids}))

    for bad in ([5, 3, 3, 2, 0, 4], [5.0, 3, 1, 2, 0, 4], [[5, 3, 1, 2, 0, 4]]):
        write(bad)
        with pytest.raises(RelaxSpecError, match="once"):
            load_ranking(tmp_path, 6)
    write([5, 3, 1, 2, 0, 4], 9)
    with pytest.raises(RelaxSpecError, match=r"eagle_vocab must be an integer from 0 \(full\) to 6, got 9"):
        load_ranking(tmp_path, 6)
    write([5, 3, 1, 2, 0, 4], "3")
    with pytest.raises(RelaxSpecError, match="got '3'"):
        load_ranking(tmp_path, 6)
    (tmp_path / VOCAB_FILE).write_text("not json")
    with pytest.raises(RelaxSpecError, match="cannot read the draft vocabulary"):
        load_ranking(tmp_path, 6)
    with pytest.raises(RelaxSpecError, match="once"):
        save_ranking(tmp_path, torch.tensor([0, 0]), 1)


def test_the_draft_vocabulary_is_the_rankings_top_n_and_zero_means_full():
    ranking = torch.tensor([5, 3, 1, 2, 0, 4])
    assert draft_vocabulary(ranking, None, 0, "h") is None  # the head's default: full
    assert draft_vocabulary(ranking, None, 3, "h").tolist() == [1, 3, 5]
    assert draft_vocabulary(ranking, 2, 3, "h").tolist() == [3, 5]
    assert draft_vocabulary(ranking, 0, 3, "h") is None and draft_vocabulary(ranking, 6, 3, "h") is None
    with pytest.raises(RelaxSpecError, match=r"from 0 \(full\) to 6, got 7"):
        draft_vocabulary(ranking, 7, 3, "h")
    with pytest.raises(RelaxSpecError, match=r"no draft vocabulary ranking .* `relaxspec train eagle-vocab"):
        draft_vocabulary(None, 4, 0, "h")
    assert draft_vocabulary(None, None, 0, "h") is None and draft_vocabulary(None, 0, 0, "h") is None


# --- the reduced LM head and the proposer --------------------------------------------------------


@pytest.mark.parametrize("kernels,tol", [("hf", 1e-6), ("packed", 1e-5), ("packed-bf16", 0.05)])
def test_the_reduced_head_is_the_lm_heads_rows_and_minus_infinity_elsewhere(tok, kernels, tol):
    model = tiny_llama(len(tok), seed=0, logit_scale=4.0)
    attach(model, kernels)
    ids = vocab(5)
    hidden = torch.randn(2, 3, model.config.hidden_size)
    logits = ReducedHead(model, ids)(hidden)
    full = model.get_output_embeddings()(hidden).float()
    assert logits.shape == (2, 3, V)
    assert torch.allclose(logits[..., ids], full[..., ids], atol=tol, rtol=tol)
    off = torch.ones(V, dtype=torch.bool).index_fill_(0, ids, False)
    assert torch.isneginf(logits[..., off]).all()


def test_each_draft_lies_in_the_vocabulary_and_is_drawn_from_its_law(target, head):
    """q is zero off the draft vocabulary and is the law d was drawn from (chi-square), so the
    exact rule stays exact."""
    model, ids = target.model, vocab(4)
    prompt = target.tokenizer("w2 w3 w4", return_tensors="pt")["input_ids"]
    lm = CachedLM(model)
    lm.record_hidden()
    lm.forward(prompt[:, :-1])
    proposer = EagleProposer(head, model, vocab=ids)
    proposer.features = lm
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(V)
    off = torch.ones(V, dtype=torch.bool).index_fill_(0, ids, False)
    for _ in range(2000):
        proposal = proposer.propose(prompt, 2, SamplingParams(temperature=1.5), generator)
        assert set(proposal.tokens[0].tolist()) <= set(ids.tolist())
        assert (proposal.probs[0][:, off] == 0).all()
        counts[proposal.tokens[0, 0]] += 1
    q1 = proposal.probs[0, 0]
    assert law_chi2_pvalue(counts[ids], q1[ids]) > 1e-3


@pytest.mark.parametrize("kernels", ["hf", "packed"])
def test_greedy_sd_over_a_draft_vocabulary_is_token_identical_to_greedy_ar(tok, head, kernels):
    model = copy.deepcopy(tiny_llama(len(tok), seed=0, logit_scale=4.0))
    attach(model, kernels)
    target = LoadedModel(model, tok, None)
    proposer = EagleProposer(head, model, vocab=vocab(4))  # most of the target's choices are off it
    eagle = Engine(model, tok, proposer=proposer, rule=Exact(), greedy_rule=Greedy(), k=4)
    ar = Engine(target.model, tok)
    for prompt in PROMPTS:
        assert eagle.generate(prompt, GREEDY).tokens == ar.generate(prompt, GREEDY).tokens, prompt


@pytest.mark.parametrize("method", ["sd", "nsd", "topk", "typical", "threshold", "fly"])
def test_every_rule_composes_with_a_draft_vocabulary(target, head_dir, method, tmp_path):
    head = tmp_path / "head"
    save_eagle(load_eagle(head_dir / "head").head, target.model, head)
    save_ranking(head, torch.tensor([0, 4, 5, 6, 7, 8, 9, 10, 11, 2, 1, 3]), 4)
    models = ModelSet(target=target, draft=load_eagle(head))
    engine = build_engine(method, models, k=4)
    assert engine.proposer.reduced.ids.tolist() == [0, 4, 5, 6]  # the head's default size
    for temperature in (0.0, 1.0):
        params = SamplingParams(temperature=temperature, seed=1, max_new_tokens=20, ignore_eos=True)
        result = engine.generate("w1 w2", params)
        assert result.stats.new_tokens == 20 and result.stats.draft_calls > 0
    assert build_engine(method, models, k=4, eagle_vocab=0).proposer.reduced is None


# --- the command and bad input -------------------------------------------------------------------


def test_train_eagle_vocab_writes_a_ranking_the_engines_use(
    target, head, head_dir, tiny_corpus, cli, tmp_path
):
    save_eagle(head, target.model, tmp_path / "head")
    head, target = tmp_path / "head", head_dir / "target"
    result = cli("train", "eagle-vocab", "--head", str(head), "--target", str(target), "--corpus",
                 str(tiny_corpus), "--size", "5", "--mixture", "code=1,math=1")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "default size 5" in result.stdout and "code " in result.stdout
    ranking, default = load_ranking(head, V)
    assert default == 5 and ranking[0].item() == 0  # EOS first: a chain can always end
    models = load_models("sd", {"target": target, "draft": head}, kernels="hf")
    engine = build_engine("sd", models, k=3)
    assert engine.proposer.reduced.ids.tolist() == sorted(ranking[:5].tolist())
    assert len(engine.generate("w1 w2", GREEDY).tokens) == GREEDY.max_new_tokens
    assert build_engine("sd", models, k=3, eagle_vocab=8).proposer.reduced.ids.numel() == 8
    with pytest.raises(RelaxSpecError, match=r"from 0 \(full\) to 12, got 13"):
        build_engine("sd", models, k=3, eagle_vocab=13)
    result = cli("train", "eagle-vocab", "--head", str(head), "--target", str(target), "--corpus",
                 str(tiny_corpus), "--size", "99", "--mixture", "code=1")  # fmt: skip
    assert result.returncode == 2 and "from 0 (full) to 12, got 99" in result.stderr
    assert load_ranking(head, V)[1] == 5  # the failed run left the ranking as it was


def test_train_eagle_exports_a_ranking_with_the_asked_default_size(head_dir, tiny_corpus, tmp_path):
    common = {"steps": 1, "batch_size": 2, "seq_len": 16, "eval_every": 10, "warmup": 1}
    for size, out in ((0, tmp_path / "full"), (6, tmp_path / "six")):
        overrides = {**common, "draft_vocab": size} if size else common
        train_eagle(head_dir / "target", tiny_corpus, tmp_path / f"run{size}", out, overrides=overrides,
                    progress=False, mixture={"code": 1.0})  # fmt: skip
        ranking, default = load_ranking(out, V)
        assert default == size and ranking[0].item() == 0  # EOS first
        assert "Draft vocabulary" in (out / "README.md").read_text()
    with pytest.raises(RelaxSpecError, match=r"draft_vocab must be an integer in \[0, 12\], got 13"):
        train_eagle(head_dir / "target", tiny_corpus, tmp_path / "bad", None,
                    overrides={**common, "draft_vocab": 13}, progress=False)  # fmt: skip


def test_a_draft_vocabulary_needs_a_ranking_and_is_ours_alone(head_dir, target):
    models = load_models("sd", {"target": head_dir / "target", "draft": head_dir / "head"}, kernels="hf")
    assert build_engine("sd", models, k=3).proposer.reduced is None  # no ranking: the full vocabulary
    with pytest.raises(RelaxSpecError, match="has no draft vocabulary ranking"):
        build_engine("sd", models, k=3, eagle_vocab=4)
    draft = ModelSet(target=target, draft=LoadedModel(tiny_llama(V, seed=3), target.tokenizer, None))
    assert build_engine("sd", draft, k=3, eagle_vocab=4).proposer.name == "draft"  # a draft model ignores it
    with pytest.raises(RelaxSpecError, match="eagle_vocab"):
        build_engine("sd", models, k=3, eagle_vocab=-1)
    with pytest.raises(RelaxSpecError, match="no parameter eagle_vocab"):
        vllm_runners.resolve("sd", {"eagle_vocab": 4})  # vLLM's eagle proposer drafts over all tokens

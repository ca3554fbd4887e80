"""EAGLE-style heads (issue 34): the proposer on the target's hidden states, the head's training,
its directory format and the bad input around it."""

from __future__ import annotations

import copy
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from relaxspec.core.acceptance import Exact, Greedy
from relaxspec.core.sampling import SamplingParams
from relaxspec.engine import Engine
from relaxspec.engine.draft_length import GoodputDraftLength, StepCosts
from relaxspec.engine.kv import CachedLM, new_cache
from relaxspec.engine.packed import attach
from relaxspec.engine.proposers.eagle import (
    EagleHead,
    EagleProposer,
    LoadedEagle,
    causal_mask,
    head_config,
    is_eagle_dir,
    load_eagle,
    save_eagle,
    stored_fingerprint,
    target_fingerprint,
)
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ModelSet, build_engine, load_models, load_role
from relaxspec.models import LoadedModel
from relaxspec.testing import (
    chi_square_pvalue,
    exact_joint,
    law_chi2_pvalue,
    sample_continuations,
    tiny_llama,
    tiny_tokenizer,
)
from relaxspec.train.eagle import eagle_loss, eagle_metrics, head_outputs, train_eagle, unrolled_mask
from relaxspec.train.loop import TrainConfig, train

PROMPTS = ["w0 w1", "w3", "w2 w5 w7 w1", "w4 w4", "w6 w0 w2", "w1 w2 w3", "w7", "w5 w3 w1 w6 w0"]
GREEDY = SamplingParams(temperature=0, max_new_tokens=24, ignore_eos=True)


def target_windows(target: torch.nn.Module, n: int, length: int, seed: int) -> torch.Tensor:
    """``[n, length]`` sequences the target samples itself (T = 1) after EOS and a random word."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.cat([torch.zeros(n, 1, dtype=torch.long), torch.randint(3, 11, (n, 1), generator=gen)], dim=1)
    with torch.no_grad():
        while ids.shape[1] < length:
            probs = torch.softmax(target(ids).logits[:, -1].float(), dim=-1)
            ids = torch.cat([ids, torch.multinomial(probs, 1, generator=gen)], dim=1)
    return ids


def trained_head(target: torch.nn.Module, out_dir: Path, steps: int = 80) -> EagleHead:
    """A head trained a few seconds with the real objective on the target's own samples."""
    target.requires_grad_(False)
    data = target_windows(target, 16 * 8, 24, seed=0)
    torch.manual_seed(0)
    head = EagleHead(head_config(target))
    config = TrainConfig(
        out_dir=str(out_dir),
        steps=steps,
        batch_size=16,
        seq_len=24,
        lr=1e-2,
        warmup=3,
        weight_decay=0.0,
        eval_every=10**9,
        ckpt_every=10**9,
        mixed_precision="no",
    )
    head, _ = train(
        head,
        config,
        batch_fn=lambda step, micro: {"input_ids": data[16 * (step % 8) : 16 * (step % 8 + 1)]},
        loss_fn=lambda m, batch: eagle_loss(m, target, batch, {"noise": 0.1, "cls_weight": 0.1, "unroll": 1}),
        resume=False,
        progress=False,
    )
    return head.float().eval()


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer(8)


@pytest.fixture(scope="module")
def eagle_target(tok) -> LoadedModel:
    return LoadedModel(tiny_llama(len(tok), seed=0, logit_scale=4.0), tok, None)


@pytest.fixture(scope="module")
def head(eagle_target, tmp_path_factory) -> EagleHead:
    return trained_head(eagle_target.model, tmp_path_factory.mktemp("eagle-run"))


def eagle_engine(target: LoadedModel, head: EagleHead, k: int = 4) -> Engine:
    proposer = EagleProposer(head, target.model, target_fingerprint(target.model))
    return Engine(target.model, target.tokenizer, proposer=proposer, rule=Exact(), greedy_rule=Greedy(), k=k)


def test_training_makes_the_head_agree_with_the_target(eagle_target, head):
    windows = target_windows(eagle_target.model, 16, 24, seed=999)
    torch.manual_seed(0)
    untrained = eagle_metrics(EagleHead(head_config(eagle_target.model)), eagle_target.model, windows)
    trained = eagle_metrics(head, eagle_target.model, windows)
    assert trained["eagle_reg"] < untrained["eagle_reg"] and trained["eagle_cls"] < untrained["eagle_cls"]
    assert trained["eagle_acc@1"] > untrained["eagle_acc@1"] + 0.25


def test_the_unrolled_steps_see_what_a_drafted_chain_sees(eagle_target, head):
    """Training-time test: unroll step j's element t is the chain's j-th draft after the committed
    ``x_0 .. x_{t+1}`` — real pairs up to t in the cache, then the head's own features — fed the
    teacher's tokens, as the proposer computes it at decoding."""
    target = eagle_target.model
    ids = target_windows(target, 2, 12, seed=5)
    features = target.get_decoder()(input_ids=ids).last_hidden_state.float()
    with torch.no_grad():
        steps = head_outputs(head, target, ids, features, noise=0.0, unroll=3)
    assert [tuple(s.shape) for s in steps] == [(2, 11 - j, 32) for j in range(3)]
    embed = target.get_input_embeddings()
    for t in (0, 4, 8):
        cache = new_cache(head)
        with torch.no_grad():  # the committed pairs (f_0, x_1) .. (f_t, x_{t+1})
            hidden = head(features[:, : t + 1], embed(ids[:, 1 : t + 2]), torch.arange(t + 1)[None],
                          causal_mask(t + 1), cache)[:, -1:]  # fmt: skip
            for j in (2, 3):  # draft j: (f̂, x_{t+j}) at position t + j − 1
                hidden = head(hidden, embed(ids[:, t + j : t + j + 1]), torch.tensor([[t + j - 1]]),
                              causal_mask(1, t + j - 1), cache)  # fmt: skip
                torch.testing.assert_close(hidden[:, 0], steps[j - 1][:, t], atol=1e-5, rtol=1e-5)


def test_the_unrolled_mask_shows_the_prefix_and_the_chain():
    allowed = unrolled_mask(5, 3)[0, 0] == 0  # steps of 4, 3, 2 pairs; step 3 has 2 elements
    assert allowed.shape == (2, 4 + 3 + 2)
    # step 1 (4 real pairs) | step 2 (3) | step 3 (2)
    assert allowed[0].tolist() == [1, 0, 0, 0, 1, 0, 0, 1, 0]
    assert allowed[1].tolist() == [1, 1, 0, 0, 0, 1, 0, 0, 1]


@pytest.mark.parametrize("kernels", ["hf", "packed"])
def test_greedy_eagle_sd_is_token_identical_to_greedy_ar(tok, head, kernels):
    target = LoadedModel(copy.deepcopy(tiny_llama(len(tok), seed=0, logit_scale=4.0)), tok, None)
    attach(target.model, kernels)
    ar, eagle = Engine(target.model, tok), eagle_engine(target, head)
    accepted = 0
    for prompt in PROMPTS:
        expected = ar.generate(prompt, GREEDY)
        got = eagle.generate(prompt, GREEDY)
        assert got.tokens == expected.tokens, prompt
        accepted += got.stats.new_tokens - got.stats.verifier_calls
    assert accepted > len(PROMPTS) * 8  # the trained head's drafts are mostly accepted


@pytest.mark.parametrize("kernels,tol", [("packed", 1e-4), ("packed-bf16", 0.1)])
def test_the_packed_head_computes_the_heads_forward(tok, head, kernels, tol):
    """A target on packed kernels drafts with the head packed on the same weights (fc's embedding
    half folded into a per-token table, rotary from a table): the module's forward up to summation
    order (fp32) or bf16 rounding of the products, over the cache it fills and past the table's
    first size."""
    from relaxspec.engine.kv import new_cache
    from relaxspec.engine.proposers.eagle import HeadStep, PackedEagleHead, causal_mask

    target = copy.deepcopy(tiny_llama(len(tok), seed=0, logit_scale=4.0))
    attach(target, kernels)
    packed = EagleProposer(head, target).forward
    assert isinstance(packed, PackedEagleHead)
    packed.positions = 4  # the rotary table starts small and must grow
    embedding = target.get_input_embeddings()
    torch.manual_seed(0)
    features, tokens = torch.randn(1, 9, 32), torch.randint(0, len(tok), (1, 9))
    with torch.inference_mode():
        caches = new_cache(head), new_cache(head)
        for start, end in [(0, 3), (3, 5), (5, 6), (6, 9)]:  # a second call attends over the cache
            T = end - start
            mask = None if T == 1 else causal_mask(T, start)
            positions = torch.arange(start, end)[None]
            a = head(features[:, start:end], embedding(tokens[:, start:end]), positions, mask, caches[0])
            b = packed(features[:, start:end], tokens[:, start:end], start, mask, caches[1])
            torch.testing.assert_close(b, a, atol=tol, rtol=tol)
    assert packed.cos.shape[0] >= 9
    unpacked = EagleProposer(head, tiny_llama(len(tok), seed=0)).forward
    assert isinstance(unpacked, HeadStep) and unpacked.head is head  # transformers' forward


class Recording:
    """Wraps a proposer; keeps every ``(ids, proposal)`` it made."""

    def __init__(self, inner: EagleProposer) -> None:
        self.inner, self.seen = inner, []
        self.name = inner.name

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def propose(self, ids, k, params, generator):
        proposal = self.inner.propose(ids, k, params, generator)
        self.seen.append((ids.clone(), proposal))
        return proposal


def test_drafts_equal_a_fresh_proposer_on_the_committed_tokens(eagle_target, head):
    """The head's cache and the verifier's recorded states survive rollbacks exactly: every draft
    equals the one a fresh proposer makes from a fresh target prefill of the committed tokens."""
    target = eagle_target.model
    recording = Recording(EagleProposer(head, target))
    engine = Engine(
        target, eagle_target.tokenizer, proposer=recording, rule=Exact(), greedy_rule=Greedy(), k=3
    )
    params = SamplingParams(temperature=1.0, seed=3, max_new_tokens=30, ignore_eos=True)
    engine.generate("w2 w3", params)
    drafted = [(ids, p) for ids, p in recording.seen if p.k > 0]
    assert len(drafted) >= 5 and len(recording.seen) - len(drafted) == 1  # only the first cycle is AR
    last = drafted[-1][0]  # the verifier's states of its committed tokens: as one fresh forward
    with torch.no_grad():
        full = target.get_decoder()(input_ids=last).last_hidden_state
    n = last.shape[1] - 1
    assert torch.allclose(engine.verifier.lm.hidden_states[0, :n], full[0, :n], atol=1e-5)
    for ids, proposal in drafted:
        fresh_lm = CachedLM(target)
        fresh_lm.record_hidden()
        fresh_lm.forward(ids[:, :-1])
        fresh = EagleProposer(head, target)
        fresh.features = fresh_lm
        again = fresh.propose(ids, proposal.k, replace(params, temperature=0.0), None)
        q = fresh.propose(ids, 1, params, None).probs
        assert torch.allclose(q[0, 0], proposal.probs[0, 0], atol=1e-5)
        assert again.k == proposal.k


def test_each_draft_is_drawn_from_the_law_it_reports(eagle_target, head):
    """q is the law d was drawn from (what keeps the exact rule exact): draws of d_1 and d_2 after
    a fixed context match the reported q_1 and, given d_1, q_2 (chi-square)."""
    target = eagle_target.model
    ids = eagle_target.tokenizer("w2 w3 w4", return_tensors="pt")["input_ids"]
    lm = CachedLM(target)
    lm.record_hidden()
    lm.forward(ids[:, :-1])
    proposer = EagleProposer(head, target)
    proposer.features = lm
    params = SamplingParams(temperature=1.5)
    generator = torch.Generator().manual_seed(0)
    first = torch.zeros(len(eagle_target.tokenizer))
    second: dict[int, torch.Tensor] = {}
    laws: dict[int, torch.Tensor] = {}
    for _ in range(2000):
        proposal = proposer.propose(ids, 2, params, generator)
        d1, d2 = proposal.tokens[0].tolist()
        first[d1] += 1
        second.setdefault(d1, torch.zeros_like(first))[d2] += 1
        laws[d1] = proposal.probs[0, 1]
        q1 = proposal.probs[0, 0]
    assert law_chi2_pvalue(first, q1) > 1e-3
    d1 = max(second, key=lambda t: second[t].sum())
    assert law_chi2_pvalue(second[d1], laws[d1]) > 1e-3


@pytest.mark.slow  # thousands of generations (tests/test_exactness.py runs the same check for sd)
@pytest.mark.parametrize("vocab", [None, [0, 3, 4]], ids=["full-vocabulary", "draft-vocabulary"])
def test_exact_rule_keeps_the_target_law_with_eagle_drafts(vocab):
    """docs/design.md §2: with the head's q the exact rule emits the target's own joint law of the
    first three tokens (chi-square against the exact law, as tests/test_exactness.py) — also where
    q is zero off a draft vocabulary (EOS, w0, w1: half the tokens; engine/proposers/draft_vocab.py)."""
    small = tiny_tokenizer(2)  # V = 6: 216 triples
    target = LoadedModel(tiny_llama(len(small), seed=0, logit_scale=2.0), small, None)
    torch.manual_seed(1)
    head = EagleHead(head_config(target.model)).eval()
    with torch.no_grad():
        head.fc.weight.mul_(4.0)  # a head far from the target: many rejections and recoveries
    params = SamplingParams(temperature=0.8, top_p=0.95)
    ids = None if vocab is None else torch.tensor(vocab)
    proposer = EagleProposer(head, target.model, target_fingerprint(target.model), vocab=ids)
    engine = Engine(target.model, small, proposer=proposer, rule=Exact(), greedy_rule=Greedy(), k=2)
    samples = sample_continuations(engine, "w0 w1", 3000, params, 3)
    ids = small("w0 w1")["input_ids"]
    assert chi_square_pvalue(samples, exact_joint(target.model, ids, params, 3)) > 1e-3


@pytest.mark.parametrize(
    "method", ["sd", "nsd", "topk", "typical", "lenience", "topk-delta", "threshold", "fly"]
)
def test_every_rule_composes_with_the_eagle_proposer(eagle_target, head, tmp_path, method):
    save_eagle(head, eagle_target.model, tmp_path / "head")
    models = ModelSet(target=eagle_target, draft=load_eagle(tmp_path / "head"))
    engine = build_engine(method, models, k=4)
    assert isinstance(engine.proposer, EagleProposer)
    for temperature in (0.0, 1.0) if method != "lenience" else (1.0,):
        params = SamplingParams(temperature=temperature, seed=1, max_new_tokens=20, ignore_eos=True)
        result = engine.generate("w1 w2", params)
        assert result.stats.new_tokens == 20 and result.stats.draft_calls > 0


class ScriptedLength:
    """A draft-length policy that picks K from a fixed cycle (0 = an AR step)."""

    def __init__(self, script: list[int]) -> None:
        self.script, self.at = script, 0

    def choose(self, k: int) -> int:
        self.at += 1
        return min(k, self.script[self.at % len(self.script)])

    def observe(self, k: int, accepted: int) -> None: ...
    def observe_tokens(self, n: int) -> None: ...
    def observe_cycle(self, k: int, seconds: float) -> None: ...


def test_the_adaptive_draft_length_drives_the_eagle_proposer(eagle_target, head):
    """Per-cycle draft lengths, AR steps included, keep the verifier's states and the head's cache
    right: greedy output equals AR, with a scripted policy and with the real goodput policy."""
    ar = Engine(eagle_target.model, eagle_target.tokenizer)
    engine = eagle_engine(eagle_target, head, k=6)
    engine.draft_length = ScriptedLength([0, 3, 6, 1, 0, 0, 2, 5])
    lengths: list[int] = []
    for prompt in PROMPTS:
        got = engine.generate(
            prompt, GREEDY, on_cycle=lambda r: lengths.append(r.proposal.k if r.proposal else 0)
        )
        assert got.tokens == ar.generate(prompt, GREEDY).tokens, prompt
    assert {0, 1, 2, 3, 5, 6} <= set(lengths)
    engine.draft_length = GoodputDraftLength(
        StepCosts((1, 8), (0.01, 0.011)), StepCosts((1, 8), (0.001, 0.002)), k_max=6, settle_seconds=0.0
    )
    for prompt in PROMPTS[:4]:
        assert engine.generate(prompt, GREEDY).tokens == ar.generate(prompt, GREEDY).tokens, prompt


# --- the directory format, recognition and bad input -------------------------------------------


@pytest.fixture(scope="module")
def dirs(tmp_path_factory, eagle_target, head):
    root = tmp_path_factory.mktemp("eagle")
    eagle_target.model.save_pretrained(root / "target")
    eagle_target.tokenizer.save_pretrained(root / "target")
    save_eagle(head, eagle_target.model, root / "head")
    return root


def test_a_head_directory_is_recognised_wherever_a_draft_is_taken(dirs, eagle_target, head):
    assert is_eagle_dir(dirs / "head") and not is_eagle_dir(dirs / "target")
    config = json.loads((dirs / "head" / "config.json").read_text())
    # the head layer's Llama config, as vLLM's eagle proposer reads it, and the target's fingerprint
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert config["num_hidden_layers"] == 1 and config["relaxspec_target"]["vocab_size"] == 12
    names = set(load_file(str(dirs / "head" / "model.safetensors")))
    assert "fc.weight" in names and "fc.bias" not in names  # EAGLE-1's fc, as vLLM builds it
    assert {n.split(".")[0] for n in names} == {
        "fc",
        "layers",
    } and "layers.0.input_layernorm.weight" not in names
    assert {p.name for p in (dirs / "head").iterdir()} == {"config.json", "model.safetensors"}  # no target
    loaded = load_role("draft", dirs / "head")
    assert isinstance(loaded, LoadedEagle)
    for name, weight in head.state_dict().items():  # stored in bf16
        assert torch.allclose(loaded.head.state_dict()[name], weight.to(torch.bfloat16).float()), name
    models = load_models("nsd", {"target": dirs / "target", "draft": dirs / "head"}, kernels="hf")
    engine = build_engine("nsd", models, k=3)
    assert isinstance(engine.proposer, EagleProposer)
    with pytest.raises(RelaxSpecError, match="EAGLE head; pass a causal LM"):
        build_engine("prove", ModelSet(block=models.target, draft=models.draft))


def test_drafter_picks_the_draft_model_or_the_eagle_head_in_one_model_set(dirs, eagle_target):
    """``drafter=eagle`` drafts with the eagle role (``--eagle``), so one bench runs draft-model and
    EAGLE rows side by side; in vLLM the row's drafter is the eagle role's directory."""
    from relaxspec.engine.proposers.draft_model import DraftModel
    from relaxspec.integrations.vllm import runners

    paths = {"target": dirs / "target", "draft": dirs / "target", "eagle": dirs / "head"}
    models = load_models("nsd", paths, kernels="hf")
    assert isinstance(models.eagle, LoadedEagle)
    assert isinstance(build_engine("nsd", models, k=3).proposer, DraftModel)
    engine = build_engine("nsd", models, k=3, drafter="eagle")
    assert isinstance(engine.proposer, EagleProposer)
    ar = Engine(models.target.model, models.target.tokenizer)
    assert engine.generate("w1 w2", GREEDY).tokens == ar.generate("w1 w2", GREEDY).tokens
    with pytest.raises(RelaxSpecError, match="drafter"):
        build_engine("sd", models, drafter="medusa")
    with pytest.raises(RelaxSpecError, match="needs an eagle model"):
        build_engine("sd", ModelSet(target=models.target, draft=models.draft), drafter="eagle")
    with pytest.raises(RelaxSpecError, match="not a relaxspec EAGLE head"):
        load_models("sd", {**paths, "eagle": dirs / "target"}, kernels="hf")
    plan = runners.engine_plan("nsd", runners.resolve("nsd", {"drafter": "eagle"}))
    assert (plan.proposer, plan.proposer_role) == ("draft", "eagle")
    assert runners.engine_plan("sd", runners.resolve("sd", {})).proposer_role == "draft"
    with pytest.raises(RelaxSpecError, match=r"drafter=eagle .* takes proposer=draft"):
        runners.engine_plan("sd", runners.resolve("sd", {"drafter": "eagle", "proposer": "ngram"}))
    peer = runners.row_plan("vllm-eagle", runners.resolve("vllm-eagle", {"k": 3}), {})  # stock vLLM EAGLE
    assert peer.stock and (peer.proposer_role, peer.k) == ("eagle", 3)
    assert runners.serve_command("vllm-eagle")[-5:] == ["--method", "sd", "--stock", "--drafter", "eagle"]


def test_a_head_for_another_target_is_one_clear_error(dirs, tok, cli, tmp_path):
    head = load_eagle(dirs / "head")
    wider = tiny_llama(len(tok), seed=0, hidden_size=64)
    with pytest.raises(RelaxSpecError, match="hidden size is 32, this target's is 64"):
        EagleProposer(head.head, wider, head.target)
    other_vocab = tiny_llama(len(tok) + 4, seed=0)
    with pytest.raises(RelaxSpecError, match="vocabulary size is 12, this target's is 16"):
        EagleProposer(head.head, other_vocab, head.target)
    retrained = tiny_llama(len(tok), seed=7)  # same shapes, other weights
    with pytest.raises(
        RelaxSpecError, match=r"trained for another target: its target's input embedding \(hash\)"
    ):
        EagleProposer(head.head, retrained, head.target)
    retrained.save_pretrained(tmp_path / "other")
    tok.save_pretrained(tmp_path / "other")
    result = cli("generate", "--method", "sd", "--target", str(tmp_path / "other"),
                 "--draft", str(dirs / "head"), "--max-new-tokens", "4", "w1")  # fmt: skip
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "trained for another target" in lines[0]


def test_the_cli_generates_with_a_head_as_draft(dirs, cli):
    paths = ("--target", str(dirs / "target"), "--draft", str(dirs / "head"))
    result = cli("generate", "--method", "sd", *paths, "--temperature", "0", "--max-new-tokens", "8",
                 "--json", "w1 w2")  # fmt: skip
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert len(out["tokens"]) == 8 and out["stats"]["tau"] > 1


def test_the_server_pool_runs_eagle_requests_beside_the_batch(dirs):
    from relaxspec.serve.pool import ServingPool

    models = load_models("sd", {"target": dirs / "target", "draft": dirs / "head"}, kernels="hf")
    pool = ServingPool(models, default_method="sd", default_params={"k": 3}, batching=True)
    ar = Engine(models.target.model, models.target.tokenizer)
    for prompt in PROMPTS[:3]:
        result = pool.submit(prompt, GREEDY)
        assert result.tokens == ar.generate(prompt, GREEDY).tokens
        assert result.stats.draft_calls > 0


def test_vllm_drafts_with_its_eagle_proposer_from_a_head_directory(dirs, tok, tmp_path):
    """The same directory is vLLM's EAGLE-1 checkpoint: ``--draft HEAD`` on the vLLM engine and server
    asks for vLLM's ``eagle`` proposer, a causal LM for ``draft_model``, and a head trained for
    another target is refused before vLLM starts (vLLM itself would load it)."""
    from relaxspec.integrations.vllm.drafts import draft_speculative_config
    from relaxspec.integrations.vllm.rules import RuleChoice
    from relaxspec.integrations.vllm.serve import ServerSettings, vllm_args

    spec = draft_speculative_config(dirs / "head", dirs / "target", 4, "probabilistic")
    assert spec == {"method": "eagle", "model": str(dirs / "head"), "num_speculative_tokens": 4,
                    "draft_sample_method": "probabilistic"}  # fmt: skip
    assert draft_speculative_config(dirs / "target", dirs / "target", 2, "greedy")["method"] == "draft_model"
    argv, rule = vllm_args("nsd", {"theta": 0.9}, ServerSettings(target=dirs / "target", draft=dirs / "head"))
    assert json.loads(argv[argv.index("--speculative-config") + 1])["method"] == "eagle"
    assert rule == RuleChoice("nsd", {"theta": 0.9})
    other = tmp_path / "other"
    tiny_llama(len(tok), seed=7).save_pretrained(other)
    with pytest.raises(RelaxSpecError, match="trained for another target: its target's input embedding"):
        draft_speculative_config(dirs / "head", other, 4, "probabilistic")
    with pytest.raises(RelaxSpecError, match="trained for another target"):
        vllm_args("sd", {}, ServerSettings(target=other, draft=dirs / "head"))


def test_the_stored_fingerprint_is_the_loaded_models(dirs, eagle_target, tok, tmp_path):
    assert stored_fingerprint(dirs / "target") == target_fingerprint(eagle_target.model)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=len(tok), hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                         num_attention_heads=2, tie_word_embeddings=True)  # fmt: skip
    tied = LlamaForCausalLM(config)
    tied.save_pretrained(tmp_path / "tied")  # one tensor: the LM head is the embedding
    assert stored_fingerprint(tmp_path / "tied") == target_fingerprint(tied)


def test_corrupt_head_directories_fail_clearly(dirs, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text((dirs / "head" / "config.json").read_text())
    (broken / "model.safetensors").write_bytes(b"not a tensor file")
    with pytest.raises(RelaxSpecError, match="cannot load the EAGLE head"):
        load_eagle(broken)
    with pytest.raises(RelaxSpecError, match="not a relaxspec EAGLE head"):
        load_eagle(dirs / "target")
    old = tmp_path / "format-1"  # a head of the first format (fc([f ; e]) with a bias): retrain it
    old.mkdir()
    (old / "config.json").write_text(
        json.dumps({"architectures": ["RelaxSpecEagleHead"], "relaxspec_eagle": 1})
    )
    with pytest.raises(RelaxSpecError, match="format version 1, this relaxspec reads 2: retrain"):
        load_eagle(old)


# --- the command ---------------------------------------------------------------------------------


def test_train_eagle_resumes_identically_and_exports_a_usable_head(dirs, tiny_corpus, tmp_path):
    common = {"steps": 4, "batch_size": 2, "seq_len": 16, "eval_every": 2, "ckpt_every": 2, "warmup": 1}
    straight, s_state = train_eagle(dirs / "target", tiny_corpus, tmp_path / "a", tmp_path / "out-a",
                                    overrides=common, progress=False)  # fmt: skip
    # interrupted after its first step (time budget used up), then resumed by the same command
    _, cut = train_eagle(dirs / "target", tiny_corpus, tmp_path / "b", tmp_path / "out-b",
                         overrides={**common, "max_minutes": 0.0}, progress=False)  # fmt: skip
    assert cut.step == 1 and not (tmp_path / "out-b").exists()  # no export of an unfinished run
    resumed, r_state = train_eagle(dirs / "target", tiny_corpus, tmp_path / "b", tmp_path / "out-b",
                                   overrides=common, progress=False)  # fmt: skip
    assert r_state.step == 4 and r_state.tokens_seen == s_state.tokens_seen
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    record = json.loads((tmp_path / "out-a" / "training.json").read_text())
    heldout = {"eagle_reg", "eagle_cls", "eagle_acc@1"}  # on math windows, and as code_* on code ones
    assert record["steps_done"] == 4 and heldout | {f"code_{m}" for m in heldout} <= set(
        record["history"][-1]
    )
    card = (tmp_path / "out-a" / "README.md").read_text()
    assert "EAGLE-style drafter head" in card and "eagle_acc@1" in card
    models = load_models("sd", {"target": dirs / "target", "draft": tmp_path / "out-a"}, kernels="hf")
    engine = build_engine("sd", models, k=3)
    assert len(engine.generate("w1 w2", GREEDY).tokens) == GREEDY.max_new_tokens


def test_train_eagle_reads_where_the_target_was_taught(dirs, tiny_corpus, tmp_path):
    """Without --mixture a head trains on the mixture the target's training.json records; a record
    naming a source that is not a training source, or a weight that is not positive, is ignored."""
    import shutil

    from relaxspec.train.ar import MIXTURE
    from relaxspec.train.draft_vocab import recorded_mixture

    target = tmp_path / "target"
    shutil.copytree(dirs / "target", target)
    common = {"steps": 1, "batch_size": 2, "seq_len": 16}
    cases = [({"code": 0.25, "math": 0.75}, {"code": 0.25, "math": 0.75}), ({"math_eval": 1.0}, MIXTURE),
             ({"code": -1, "math": 1}, MIXTURE), ({"code": True}, MIXTURE), ([1, 2], MIXTURE)]  # fmt: skip
    for i, (recorded, used) in enumerate(cases):
        (target / "training.json").write_text(json.dumps({"mixture": recorded}))
        assert recorded_mixture(target) == (None if used is MIXTURE else used)
        train_eagle(target, tiny_corpus, tmp_path / f"r{i}", None, overrides=common, progress=False)
        assert json.loads((tmp_path / f"r{i}" / "run.json").read_text())["mixture"] == used
    (target / "training.json").write_text("not json")
    assert recorded_mixture(target) is None


def test_train_eagle_bad_input(dirs, tiny_corpus, tmp_path, tok):
    with pytest.raises(RelaxSpecError, match="noise must be a number"):
        train_eagle(
            dirs / "target", tiny_corpus, tmp_path / "r", None, overrides={"noise": -1}, progress=False
        )
    with pytest.raises(RelaxSpecError, match="unknown training option"):
        train_eagle(
            dirs / "target", tiny_corpus, tmp_path / "r", None, overrides={"stepz": 1}, progress=False
        )
    with pytest.raises(RelaxSpecError, match="model directory not found"):
        train_eagle(tmp_path / "nothing", tiny_corpus, tmp_path / "r", None, progress=False)
    common = {"steps": 1, "batch_size": 2, "seq_len": 16}
    train_eagle(dirs / "target", tiny_corpus, tmp_path / "r", None, overrides=common, progress=False)
    other = tmp_path / "other"
    tiny_llama(len(tok), seed=9).save_pretrained(other)
    tok.save_pretrained(other)
    with pytest.raises(RelaxSpecError, match="holds a run for another target"):
        train_eagle(other, tiny_corpus, tmp_path / "r", None, overrides=common, progress=False)
    for bad in (0, 9, 1.5, True):
        with pytest.raises(RelaxSpecError, match="unroll must be an integer in \\[1, 8\\]"):
            train_eagle(dirs / "target", tiny_corpus, tmp_path / "u", None,
                        overrides={**common, "unroll": bad}, progress=False)  # fmt: skip
    with pytest.raises(RelaxSpecError, match="unroll must be below seq_len"):
        train_eagle(dirs / "target", tiny_corpus, tmp_path / "u", None,
                    overrides={**common, "seq_len": 4, "unroll": 4}, progress=False)  # fmt: skip
    with pytest.raises(RelaxSpecError, match=r"--init head .* was trained for another target"):
        train_eagle(other, tiny_corpus, tmp_path / "o", None, overrides=common, progress=False,
                    init=dirs / "head")  # fmt: skip


def test_train_eagle_fine_tunes_a_head_with_an_unrolled_objective(dirs, tiny_corpus, tmp_path):
    """``--init`` starts from a trained head's weights; ``unroll = 3`` trains on the chain's steps."""
    before = load_eagle(dirs / "head").head
    common = {"steps": 2, "batch_size": 2, "seq_len": 16, "warmup": 1, "lr": 1e-4}
    head, _ = train_eagle(dirs / "target", tiny_corpus, tmp_path / "run", tmp_path / "out", progress=False,
                          overrides={**common, "unroll": 3}, init=dirs / "head")  # fmt: skip
    pairs = zip(before.parameters(), head.parameters(), strict=True)
    moved = [float((a - b).abs().max().detach()) for a, b in pairs]
    assert 0 < max(moved) < 0.01  # near the initial head: fine-tuned from it, not from scratch
    record = json.loads((tmp_path / "out" / "training.json").read_text())
    assert record["objective"]["unroll"] == 3 and record["init"] == str(dirs / "head")
    assert {"eagle_step2_acc", "eagle_step3_acc"} <= set(record["history"][-1])
    assert "Initialised from" in (tmp_path / "out" / "README.md").read_text()


def test_a_run_with_another_precision_in_the_same_process_is_not_refused():
    """Accelerate's process-wide state refused the fp32 head's run after a bf16 run in the same
    test session ("AcceleratorState has already been initialized"): the loop resets it."""
    from relaxspec.train.loop import _prepare

    for precision in ("bf16", "no", "bf16"):
        parts = _prepare(
            torch.nn.Linear(4, 4), TrainConfig(out_dir="unused", steps=1, mixed_precision=precision)
        )
        assert parts.accelerator.mixed_precision == precision

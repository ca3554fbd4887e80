"""`train diffusion` end to end on a small corpus: AR init, export + card, resume, SDD on the result."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.data.corpus import CorpusConfig, build_corpus
from relaxspec.engine.proposers.diffusion import CFG_BLOCK, CFG_FORMAT, FORMAT, load_diffusion
from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ModelSet, build_engine
from relaxspec.models import load_model
from relaxspec.train.ar import train_ar
from relaxspec.train.diffusion import DiffusionRecipe, train_diffusion
from relaxspec.train.tokenizer import train_tokenizer

COMMON = {
    "steps": 4,
    "batch_size": 4,
    "seq_len": 32,
    "lr": 1e-3,
    "warmup": 1,
    "eval_every": 2,
    "ckpt_every": 2,
}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("dtrain")
    build_corpus(root / "corpus", CorpusConfig(n_math_train=200, n_math_eval=40, max_code_files=20))
    train_tokenizer(root / "corpus", root / "tok", vocab_size=400, n_math=200)
    train_ar("tiny", root / "corpus", root / "tok", root / "run_ar", export_dir=root / "target",
             overrides={"steps": 2, "seq_len": 32, "batch_size": 2}, progress=False)  # fmt: skip
    return root


@pytest.mark.slow  # the setup fixture trains a target and a drafter
def test_train_from_target_exports_a_loadable_drafter(setup):
    root = setup
    recipe = DiffusionRecipe(gamma=4, init="target", layers=1, target=str(root / "target"))
    _, state = train_diffusion(
        recipe, root / "corpus", root / "tok", root / "run_d", root / "diffusion", dict(COMMON),
        progress=False, command="relaxspec train diffusion (test)",
    )  # fmt: skip
    assert state.step == 4 and {"math_eval_diff_loss", "code_eval_masked_acc"} <= set(state.history[-1])
    cfg = json.loads((root / "diffusion" / "config.json").read_text())
    assert cfg[CFG_FORMAT] == FORMAT and cfg[CFG_BLOCK] == 4 and cfg["num_hidden_layers"] == 1
    card = (root / "diffusion" / "README.md").read_text()
    assert "relaxspec train diffusion (test)" in card and "first 1 layers" in card and "Not run yet" in card
    drafter = load_diffusion(root / "diffusion")
    target = load_model(root / "target")
    engine = build_engine("sdd", ModelSet(target=target, diffusion=drafter), gamma=4, steps=2)
    ar = build_engine("ar", target)
    params = SamplingParams(temperature=0, max_new_tokens=12, ignore_eos=True)
    prompt = "Question: Ann has 3 apples.\nAnswer:"
    assert engine.generate(prompt, params).tokens == ar.generate(prompt, params).tokens


@pytest.mark.slow  # the setup fixture trains a target and a drafter
def test_resume_after_a_time_limit_is_identical(setup):
    root = setup
    recipe = DiffusionRecipe(gamma=4, init="scratch", scratch_preset="tiny")
    straight, _ = train_diffusion(recipe, root / "corpus", root / "tok", root / "r_a", None, dict(COMMON),
                                  progress=False)  # fmt: skip
    _, cut = train_diffusion(recipe, root / "corpus", root / "tok", root / "r_b", root / "partial",
                             {**COMMON, "max_minutes": 0.0}, progress=False, export_partial=True)  # fmt: skip
    assert cut.step == 1 and (root / "partial" / "config.json").is_file()
    assert "1 of 4" in (root / "partial" / "README.md").read_text()
    resumed, state = train_diffusion(recipe, root / "corpus", root / "tok", root / "r_b", None, dict(COMMON),
                                     progress=False)  # fmt: skip
    assert state.step == 4
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.slow  # the setup fixture trains a target and a drafter
def test_init_from_the_draft(setup):
    root = setup
    recipe = DiffusionRecipe(gamma=4, init="draft", draft=str(root / "target"))
    overrides = {**COMMON, "steps": 1}
    model, _ = train_diffusion(
        recipe, root / "corpus", root / "tok", root / "r_c", None, overrides, progress=False
    )
    assert getattr(model.config, CFG_FORMAT) == FORMAT


@pytest.mark.slow  # the setup fixture trains a target and a drafter
@pytest.mark.parametrize(
    "recipe,overrides,match",
    [
        (DiffusionRecipe(gamma=5), {}, "multiple of gamma"),
        (DiffusionRecipe(gamma=32), {}, "at least two blocks"),
        (DiffusionRecipe(gamma=0), {}, "gamma"),
        (DiffusionRecipe(init="bert"), {}, "init"),
        (DiffusionRecipe(eps=0.0), {}, "eps"),
        (DiffusionRecipe(layers=0), {}, "layers"),
        (DiffusionRecipe(gamma=4, init="target", layers=9), {}, "cannot take 9 layers"),
        (DiffusionRecipe(gamma=4), {"stepz": 1}, "unknown training option"),
    ],
)
def test_bad_input(setup, recipe, overrides, match):
    root = setup
    with pytest.raises(RelaxSpecError, match=match):
        recipe = dataclasses.replace(recipe, target=str(root / "target"))
        train_diffusion(recipe, root / "corpus", root / "tok", root / "bad", None, {**COMMON, **overrides},
                        progress=False)  # fmt: skip

"""The synthetic code and broadened math sets: datasets, scoring, corpus files and the training mix."""

from __future__ import annotations

import json

import pytest

from relaxspec.data import codegen
from relaxspec.data.corpus import CorpusConfig, build_corpus, read_jsonl
from relaxspec.data.mathgen import (
    EVAL_SEED_START,
    HELDOUT_MATH_FAMILIES,
    HELDOUT_PHRASINGS,
    TRAIN_MATH_FAMILIES,
    TRAIN_PHRASINGS,
    eval_family_seed_problems,
    heldout_family_problems,
)
from relaxspec.data.tokens import TRAIN_SOURCES, load_stream, training_data
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.datasets import DATASETS, SYNTHCODE_STOP, load_examples, math_examples, truncate

SMALL = CorpusConfig(n_math_train=300, n_math_eval=40, max_code_files=30, n_synth_eval=30)


# --- datasets -------------------------------------------------------------------------------------


def test_new_datasets_are_listed_and_old_ones_unchanged():
    assert {"math", "code", "humaneval"} <= set(DATASETS)
    assert {"synthcode", "synthcode-families", "math-broad", "math-families"} <= set(DATASETS)
    assert {"synthcode-combos", "math-phrasing"} <= set(DATASETS)
    assert [e.id for e in math_examples(3)] == [f"math-{EVAL_SEED_START + i}" for i in range(3)]
    with pytest.raises(RelaxSpecError, match="synthcode"):
        load_examples("gsm8k", 3)


@pytest.mark.parametrize(
    ("name", "families"),
    [("synthcode", codegen.TRAIN_FAMILIES), ("synthcode-families", codegen.HELDOUT_FAMILIES)],
)
def test_synthcode_datasets_load(name, families):
    examples = load_examples(name, 40)
    assert len(examples) == 40 and len({e.id for e in examples}) == 40
    for e in examples:
        assert e.metric == "pass@1" and e.stop == SYNTHCODE_STOP
        assert e.problem["prompt"] == e.prompt and e.prompt.endswith('"""')
        assert e.id.split("/")[1] in families
    assert load_examples(name, 5) == examples[:5]  # a prefix: larger n only adds prompts


@pytest.mark.parametrize(
    ("name", "families"), [("math-broad", TRAIN_MATH_FAMILIES), ("math-families", HELDOUT_MATH_FAMILIES)]
)
def test_math_family_datasets_load(name, families):
    examples = load_examples(name, 30)
    assert len(examples) == 30 and len({e.id for e in examples}) == 30
    for e in examples:
        assert e.metric == "exact_match" and e.prompt.endswith("\nAnswer:")
        assert e.id.split("-")[-2] in families


@pytest.mark.slow  # a sandboxed process per task
def test_synthcode_scoring_through_the_sandbox():
    """The HumanEval path: a canonical body passes (also with a runaway tail), a wrong one fails."""
    tasks = codegen.eval_tasks(3) + codegen.heldout_family_tasks(3)
    examples = load_examples("synthcode", 3) + load_examples("synthcode-families", 3)
    for task, ex in zip(tasks, examples, strict=True):
        assert ex.problem == task.problem
        assert ex.score(task.solution) == 1.0
        runaway = task.solution + "\n\n\ndef helper():\n    return 0\n\nassert helper() == 1\n"
        assert truncate(runaway, ex.stop).rstrip() == task.solution
        assert ex.score(runaway) == 1.0
        assert ex.score("\n    return None") == 0.0
        assert ex.score("\n    pass\nif True:\n    import os") == 0.0


def test_math_family_scoring():
    for problems, name in (
        (heldout_family_problems(5), "math-families"),
        (eval_family_seed_problems(5), "math-broad"),
    ):
        for p, ex in zip(problems, load_examples(name, 5), strict=True):
            assert ex.answer == p.answer and ex.prompt == p.prompt
            assert ex.score("\n" + p.solution + "\n\nQuestion: more") == 1.0
            assert ex.score(f"\nx: 1 + 1 = 2\n#### {p.answer + 1}") == 0.0


def test_composed_datasets_load():
    combos = load_examples("synthcode-combos", 30)
    assert len({e.id for e in combos}) == 30 and load_examples("synthcode-combos", 5) == combos[:5]
    for e in combos:
        assert (
            e.metric == "pass@1" and e.stop == SYNTHCODE_STOP and e.id.split("/")[1] in codegen.HELDOUT_COMBOS
        )
    for e in combos[:3]:  # scored through the sandbox like every synthcode task
        assert e.score(e.problem["canonical_solution"]) == 1.0 and e.score("\n    return None") == 0.0
    phrasing = load_examples("math-phrasing", 30)
    assert len({e.id for e in phrasing}) == 30
    for e in phrasing:
        assert e.metric == "exact_match" and e.id.split("-")[-2] in HELDOUT_PHRASINGS


# --- corpus and training mix ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    build_corpus(out, SMALL)
    return out


def test_corpus_writes_the_synthetic_splits(corpus, tmp_path):
    manifest = json.loads((corpus / "manifest.json").read_text())
    counts = manifest["counts"]
    assert counts["synthcode_train"] == counts["math_broad_train"] == 150  # n_math_train // 2
    assert counts["synthcode_eval"] == counts["synthcode_families_eval"] == counts["math_families_eval"] == 30
    assert manifest["synthcode"]["heldout_families"] == list(codegen.HELDOUT_FAMILIES)
    assert manifest["math_broad"]["heldout_families"] == list(HELDOUT_MATH_FAMILIES)
    assert counts["synthpipes_train"] == counts["math_styles_train"] == 150
    assert counts["synthpipes_eval"] == counts["math_phrasing_eval"] == 30
    assert manifest["synthpipes"]["heldout_combos"] == list(codegen.HELDOUT_COMBOS)
    assert manifest["math_styles"]["heldout_phrasings"] == list(HELDOUT_PHRASINGS)
    build_corpus(tmp_path, SMALL)  # deterministic
    for name in (
        "synthcode_train",
        "synthcode_eval",
        "math_broad_train",
        "math_families_eval",
        "synthpipes_train",
        "synthpipes_eval",
        "math_styles_train",
        "math_phrasing_eval",
    ):
        assert (corpus / f"{name}.jsonl").read_bytes() == (tmp_path / f"{name}.jsonl").read_bytes()


def test_heldout_prompts_never_reach_the_training_files(corpus):
    train_text = "\n".join(
        r["text"]
        for name in (
            "synthcode_train",
            "math_broad_train",
            "math_train",
            "synthpipes_train",
            "math_styles_train",
        )
        for r in read_jsonl(corpus / f"{name}.jsonl")
    )
    code_rows = read_jsonl(corpus / "synthcode_train.jsonl")
    math_rows = read_jsonl(corpus / "math_broad_train.jsonl")
    assert {r["family"] for r in code_rows} <= set(codegen.TRAIN_FAMILIES)
    assert {r["family"] for r in math_rows} <= set(TRAIN_MATH_FAMILIES)
    assert max(r["seed"] for r in code_rows + math_rows) < EVAL_SEED_START
    assert {r["family"] for r in read_jsonl(corpus / "synthpipes_train.jsonl")} <= set(codegen.TRAIN_COMBOS)
    assert {r["family"] for r in read_jsonl(corpus / "math_styles_train.jsonl")} <= set(TRAIN_PHRASINGS)
    held = [r["prompt"] for name in ("synthcode_eval", "synthcode_families_eval", "math_families_eval")
            for r in read_jsonl(corpus / f"{name}.jsonl")]  # fmt: skip
    held += [
        r["prompt"]
        for name in ("synthpipes_eval", "math_phrasing_eval")
        for r in read_jsonl(corpus / f"{name}.jsonl")
    ]
    held += [
        e.prompt
        for d in (
            "synthcode",
            "synthcode-families",
            "math-families",
            "math-broad",
            "synthcode-combos",
            "math-phrasing",
        )
        for e in load_examples(d, 50)
    ]
    assert held and not [p for p in held if p in train_text]
    # the evaluation sets are what the datasets load
    assert [r["prompt"] for r in read_jsonl(corpus / "synthcode_eval.jsonl")] == [
        e.prompt for e in load_examples("synthcode", 30)
    ]


def test_corpus_rejects_bad_sizes(tmp_path):
    with pytest.raises(RelaxSpecError, match="at least 1"):
        build_corpus(tmp_path, CorpusConfig(n_math_train=10, n_synthcode_train=0, max_code_files=5))


def test_training_mix_takes_the_synthetic_sources(corpus, tmp_path):
    from relaxspec.train.ar import train_ar
    from relaxspec.train.tokenizer import train_tokenizer

    tok_dir = tmp_path / "tok"
    tokenizer = train_tokenizer(corpus, tok_dir, vocab_size=400, n_math=300)
    assert set(TRAIN_SOURCES) == {
        *("math", "code", "synthcode", "math_broad", "synthpipes", "math_styles"),
        *("codevar", "mathvar", "mathquote", "mathorder"),
    }
    weights = {"math": 0.3, "code": 0.2, "synthcode": 0.3, "math_broad": 0.2}
    mixture, heldout = training_data(corpus, tokenizer, weights, seq_len=32, heldout_windows=2)
    assert set(heldout) == {
        "code_eval",
        "math_eval",
        "synthcode_eval",
        "synthcode_families_eval",
        "math_families_eval",
    }
    assert mixture.batch(0, 0, 8, 32).shape == (8, 32)
    composed = {"synthpipes": 0.5, "math_styles": 0.5}
    _, composed_heldout = training_data(corpus, tokenizer, composed, seq_len=32, heldout_windows=2)
    assert {"synthpipes_eval", "math_phrasing_eval"} <= set(composed_heldout)
    assert len(load_stream(corpus, "synthcode", tokenizer)) > 1000
    for bad in ("synthcode_eval", "math_families_eval", "math_eval", "synthpipes_eval", "math_phrasing_eval"):
        with pytest.raises(RelaxSpecError, match="cannot train on"):
            training_data(corpus, tokenizer, {"math": 1.0, bad: 0.5}, seq_len=32, heldout_windows=2)
    _, state = train_ar(
        "tiny", corpus, tok_dir, tmp_path / "run", None, {"steps": 2, "batch_size": 2, "seq_len": 32,
        "eval_every": 2}, progress=False, mixture=weights,
    )  # fmt: skip
    assert state.step == 2 and "synthcode_families_eval_loss" in state.history[-1]


def test_cli_mixture_accepts_the_new_sources():
    from relaxspec.cli import _parse_mixture

    assert _parse_mixture("math=0.3,synthcode=0.3,math_broad=0.2,code=0.2") == {
        "math": 0.3,
        "synthcode": 0.3,
        "math_broad": 0.2,
        "code": 0.2,
    }
    for bad in ("synthcode_eval=0.5", "math=a", "humaneval=1"):
        with pytest.raises(RelaxSpecError, match="--mixture expects"):
            _parse_mixture(bad)

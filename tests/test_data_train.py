"""Model family pipeline: corpus, math generator, tokenizer, training loop (resume), export, loading."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from relaxspec.data.corpus import CorpusConfig, build_corpus, read_jsonl
from relaxspec.data.mathgen import EVAL_SEED_START, MAX_VALUE, extract_answer, generate_problem
from relaxspec.errors import RelaxSpecError
from relaxspec.models import load_model
from relaxspec.train.ar import export_checkpoint, train_ar
from relaxspec.train.tokenizer import MASK, load_tokenizer, train_tokenizer

SMALL = CorpusConfig(n_math_train=300, n_math_eval=60, max_code_files=40)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    build_corpus(out, SMALL)
    return out


@pytest.fixture(scope="module")
def tokenizer_dir(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    train_tokenizer(corpus, out, vocab_size=400, n_math=300)
    return out


@pytest.mark.slow  # builds a corpus or trains a model
def test_corpus_is_deterministic_and_splits_are_disjoint(corpus, tmp_path):
    build_corpus(tmp_path, SMALL)
    for name in ("code_train", "code_eval", "math_train", "math_eval"):
        assert (corpus / f"{name}.jsonl").read_bytes() == (tmp_path / f"{name}.jsonl").read_bytes()
    code_train = {r["path"] for r in read_jsonl(corpus / "code_train.jsonl")}
    code_eval = {r["path"] for r in read_jsonl(corpus / "code_eval.jsonl")}
    assert code_train and not code_train & code_eval
    train_seeds = {r["seed"] for r in read_jsonl(corpus / "math_train.jsonl")}
    eval_rows = read_jsonl(corpus / "math_eval.jsonl")
    assert max(train_seeds) < EVAL_SEED_START <= min(r["seed"] for r in eval_rows)
    train_questions = {r["text"].split("\nAnswer:")[0] for r in read_jsonl(corpus / "math_train.jsonl")}
    assert not {r["prompt"].split("\nAnswer:")[0] for r in eval_rows} & train_questions
    manifest = json.loads((corpus / "manifest.json").read_text())
    assert manifest["python_version"] and manifest["counts"]["math_eval"] == len(eval_rows)


@pytest.mark.parametrize("seed", list(range(0, 4000, 37)))
def test_math_problem_arithmetic_is_right(seed):
    p = generate_problem(seed)
    lines = p.solution.splitlines()
    assert 2 <= p.steps == len(lines) - 1 <= 5
    for line in lines[:-1]:
        a, op, b, result = re.fullmatch(r".+: (\d+) ([-+*/]) (\d+) = (\d+)", line).groups()
        a, b, result = int(a), int(b), int(result)
        assert {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op] == result
        assert max(a, b, result) <= MAX_VALUE
    assert extract_answer(p.solution) == p.answer == int(lines[-2].rsplit("= ", 1)[1])
    assert p.prompt.startswith("Question: ") and p.prompt.endswith("\nAnswer:")
    assert generate_problem(seed) == p


def test_math_families_vary():
    firsts = {generate_problem(s).solution.splitlines()[0].split(":")[0].split()[0] for s in range(300)}
    assert len(firsts) > 20


def test_tokenizer_round_trips_text_and_special_tokens(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    text = (
        f"Question: Lena has 124 shells.\nAnswer:\nShells: 3 * 15 = 45\n#### 169{MASK}def f(x):\n\treturn x ✓"
    )
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.eos_token_id == tok.bos_token_id
    assert tok.decode(ids[1:]) == text
    assert tok.mask_token_id in ids and tok.pad_token_id is not None
    digits = [t for t in tok.convert_ids_to_tokens(ids) if any(c.isdigit() for c in t)]
    assert all(len(t.lstrip("Ġ")) == 1 for t in digits)  # digits are split one per token


@pytest.mark.slow  # builds a corpus or trains a model
def test_training_resumes_identically(corpus, tokenizer_dir, tmp_path):
    common = {"steps": 6, "eval_every": 3, "ckpt_every": 3, "batch_size": 4, "seq_len": 32, "lr": 1e-2}
    straight, s_state = train_ar(
        "tiny", corpus, tokenizer_dir, tmp_path / "a", overrides=common, progress=False
    )
    # interrupted after its first step (time budget used up), then resumed by the same command
    _, cut = train_ar(
        "tiny",
        corpus,
        tokenizer_dir,
        tmp_path / "b",
        overrides={**common, "max_minutes": 0.0},
        progress=False,
    )
    assert cut.step == 1
    resumed, r_state = train_ar(
        "tiny", corpus, tokenizer_dir, tmp_path / "b", overrides=common, progress=False
    )
    assert r_state.step == 6 and r_state.tokens_seen == s_state.tokens_seen
    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


@pytest.mark.slow  # builds a corpus or trains a model
def test_loss_goes_down(corpus, tokenizer_dir, tmp_path):
    _, state = train_ar(
        "tiny",
        corpus,
        tokenizer_dir,
        tmp_path / "r",
        overrides={"steps": 30, "eval_every": 15, "batch_size": 8, "seq_len": 64, "lr": 1e-2},
        progress=False,
    )
    first, last = state.history[0], state.history[-1]
    assert last["math_eval_loss"] < first["math_eval_loss"]


def test_export_loads_offline_with_auto_classes(corpus, tokenizer_dir, tmp_path, monkeypatch):
    overrides = {"steps": 2, "batch_size": 2, "seq_len": 32}
    train_ar(
        "tiny",
        corpus,
        tokenizer_dir,
        tmp_path / "run",
        export_dir=tmp_path / "model",
        overrides=overrides,
        progress=False,
    )
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "model", local_files_only=True)
    tok = AutoTokenizer.from_pretrained(tmp_path / "model", local_files_only=True)
    assert model.config.vocab_size == len(tok)
    assert next(model.parameters()).dtype == torch.bfloat16
    record = json.loads((tmp_path / "model" / "training.json").read_text())
    assert record["complete"] and record["tokens_seen"] == 2 * 2 * 32
    export_checkpoint(tmp_path / "run", "tiny", tokenizer_dir, tmp_path / "again")
    assert (tmp_path / "again" / "model.safetensors").is_file()


def test_ar_card_records_later_metrics(corpus, tokenizer_dir, tmp_path, cli):
    overrides = {"steps": 2, "batch_size": 2, "seq_len": 32}
    train_ar("tiny", corpus, tokenizer_dir, tmp_path / "run", tmp_path / "model", overrides, progress=False)
    card = (tmp_path / "model" / "README.md").read_text()
    assert "# tiny — Llama-style causal LM" in card and "| optimizer steps | 2 of 2 |" in card
    (tmp_path / "eval.json").write_text(json.dumps({"math_accuracy": 0.5}))
    r = cli(
        "train", "card", "--model", str(tmp_path / "model"), "--metrics", str(tmp_path / "eval.json"),
        "--set", "tau=3.5", "--measured-with", "relaxspec eval",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    card = (tmp_path / "model" / "README.md").read_text()
    assert "| math_accuracy | 0.5 |" in card and "| tau | 3.5 |" in card and "relaxspec eval" in card
    # a second call keeps earlier metrics
    assert cli("train", "card", "--model", str(tmp_path / "model"), "--set", "x=1").returncode == 0
    assert "| math_accuracy | 0.5 |" in (tmp_path / "model" / "README.md").read_text()
    bad = cli("train", "card", "--model", str(tmp_path / "model"), "--metrics", str(tmp_path / "no.json"))
    assert bad.returncode != 0 and "cannot read metrics" in bad.stderr


def test_bad_input(corpus, tokenizer_dir, tmp_path):
    with pytest.raises(RelaxSpecError, match="corpus file not found"):
        train_ar("tiny", tmp_path / "nocorpus", tokenizer_dir, tmp_path / "x", progress=False)
    with pytest.raises(RelaxSpecError, match="no tokenizer"):
        train_ar("tiny", corpus, tmp_path / "notok", tmp_path / "x", progress=False)
    with pytest.raises(RelaxSpecError, match="unknown model config"):
        train_ar("huge", corpus, tokenizer_dir, tmp_path / "x", progress=False)
    with pytest.raises(RelaxSpecError, match="unknown training option"):
        train_ar("tiny", corpus, tokenizer_dir, tmp_path / "x", overrides={"stepz": 3}, progress=False)
    with pytest.raises(RelaxSpecError, match="no corpus"):
        train_tokenizer(tmp_path / "nocorpus", tmp_path / "t")
    # a corrupt checkpoint: one clear message, nothing else touched
    run = tmp_path / "corrupt"
    train_ar(
        "tiny",
        corpus,
        tokenizer_dir,
        run,
        overrides={"steps": 2, "ckpt_every": 2, "batch_size": 2, "seq_len": 32},
        progress=False,
    )
    (run / "checkpoints" / "step-2" / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(RelaxSpecError, match="corrupt or incompatible checkpoint"):
        train_ar(
            "tiny",
            corpus,
            tokenizer_dir,
            run,
            overrides={"steps": 4, "batch_size": 2, "seq_len": 32},
            progress=False,
        )
    # a checkpoint from a model of another vocabulary (config that does not fit the tokenizer)
    other_tok = tmp_path / "tok300"
    train_tokenizer(corpus, other_tok, vocab_size=300, n_math=50)
    run2 = tmp_path / "vocab"
    train_ar(
        "tiny",
        corpus,
        tokenizer_dir,
        run2,
        overrides={"steps": 2, "batch_size": 2, "seq_len": 32},
        progress=False,
    )
    with pytest.raises(RelaxSpecError, match="corrupt or incompatible checkpoint"):
        train_ar(
            "tiny",
            corpus,
            other_tok,
            run2,
            overrides={"steps": 4, "batch_size": 2, "seq_len": 32},
            progress=False,
        )


def test_mixture_override_is_used_and_recorded(corpus, tokenizer_dir, tmp_path, cli):
    overrides = {"steps": 1, "batch_size": 2, "seq_len": 32}
    train_ar(
        "tiny", corpus, tokenizer_dir, tmp_path / "run", tmp_path / "model", overrides,
        progress=False, mixture={"math": 0.0, "code": 1.0},
    )  # fmt: skip
    record = json.loads((tmp_path / "model" / "training.json").read_text())
    assert record["mixture"] == {"math": 0.0, "code": 1.0}
    with pytest.raises(RelaxSpecError, match="mixing weights"):
        train_ar(
            "tiny", corpus, tokenizer_dir, tmp_path / "r2", None, overrides,
            progress=False, mixture={"math": 0.0, "code": 0.0},
        )  # fmt: skip
    bad = cli("train", "ar", "--config", "tiny", "--mixture", "math=a", "--corpus", str(corpus))
    assert bad.returncode != 0 and "--mixture expects" in bad.stderr


def test_init_starts_from_a_model_and_refuses_another_architecture(corpus, tokenizer_dir, tmp_path):
    overrides = {"steps": 2, "batch_size": 2, "seq_len": 32, "lr": 1e-12, "warmup": 0}

    def run(name: str, preset: str = "tiny", lr: float = 1e-12, **kwargs):
        settings = {**overrides, "lr": lr}
        run_dir = tmp_path / name
        return train_ar(preset, corpus, tokenizer_dir, run_dir, overrides=settings, progress=False, **kwargs)

    run("base", lr=0.05, export_dir=tmp_path / "m")  # moved away from the seed's initialisation
    tuned, _ = run("ft", init=tmp_path / "m")
    fresh, _ = run("fresh")
    exported = load_model(tmp_path / "m").model.state_dict()
    for name, weight in tuned.state_dict().items():  # lr ~ 0: the run starts (and stays) at the init
        torch.testing.assert_close(weight, exported[name].float(), atol=1e-2, rtol=0)
    assert any(not torch.allclose(w, tuned.state_dict()[n], atol=1e-2) for n, w in fresh.state_dict().items())
    with pytest.raises(RelaxSpecError, match="cannot init"):
        run("bad", preset="draft", init=tmp_path / "m")


@pytest.mark.slow  # builds a corpus or trains a model
def test_init_from_a_shallower_model_of_the_same_width_grows_it(corpus, tokenizer_dir, tmp_path, monkeypatch):
    from relaxspec.train import ar

    deeper = dataclasses.replace(ar.PRESETS["tiny"], num_hidden_layers=3)
    monkeypatch.setitem(ar.PRESETS, "tiny-deep", deeper)
    overrides = {"steps": 1, "batch_size": 2, "seq_len": 32, "lr": 1e-12, "warmup": 0}
    train_ar("tiny", corpus, tokenizer_dir, tmp_path / "a", tmp_path / "m", {**overrides, "lr": 0.05}, False)
    grown, _ = train_ar(
        "tiny-deep", corpus, tokenizer_dir, tmp_path / "b", None, overrides, False, init=tmp_path / "m"
    )
    assert grown.config.num_hidden_layers == 3
    source = load_model(tmp_path / "m").model.float().eval()
    ids = torch.randint(0, 300, (2, 12))
    with torch.no_grad():  # lr ~ 0: still the source's function
        torch.testing.assert_close(grown.float().eval()(ids).logits, source(ids).logits, atol=1e-3, rtol=0)

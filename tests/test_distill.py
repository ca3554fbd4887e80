"""Drafter distillation: prompt extraction, teacher rows (resumable), the KL loss, training, bad input."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from relaxspec.data.corpus import CorpusConfig, build_corpus, read_jsonl
from relaxspec.errors import RelaxSpecError
from relaxspec.models import load_model
from relaxspec.train.ar import train_ar
from relaxspec.train.distill import (
    DistillRecipe,
    TeacherDecoding,
    TeacherPrompts,
    build_distill_data,
    function_prompts,
    kl_to_teacher,
    load_rows,
    top1_agreement,
    train_distill,
)
from relaxspec.train.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """A tiny corpus, tokenizer, a trained teacher and a barely trained student."""
    root = tmp_path_factory.mktemp("distill")
    build_corpus(root / "corpus", CorpusConfig(n_math_train=300, n_math_eval=40, max_code_files=40))
    train_tokenizer(root / "corpus", root / "tok", vocab_size=400, n_math=300)
    common = {"batch_size": 8, "seq_len": 64, "eval_every": 100}
    train_ar(
        "tiny", root / "corpus", root / "tok", root / "t-run", root / "teacher",
        {**common, "steps": 40, "lr": 1e-2}, progress=False,
    )  # fmt: skip
    train_ar(
        "tiny", root / "corpus", root / "tok", root / "s-run", root / "student",
        {**common, "steps": 2, "seed": 1}, progress=False,
    )  # fmt: skip
    rows = build_distill_data(
        root / "teacher", root / "corpus", root / "rows.jsonl", TeacherPrompts(n_code=30, n_math=30),
        TeacherDecoding(max_new_tokens=12, max_prompt_tokens=150, batch_size=8), progress=False,
    )  # fmt: skip
    return root, rows


def test_function_prompts_are_dedented_signature_and_docstring():
    source = (
        "import os\n\n"
        "class A:\n"
        "    @property\n"
        "    def name(self, x):\n"
        '        """Say the name.\n\n        Twice."""\n'
        "        return x\n\n"
        "def undocumented():\n    return 1\n\n"
        "def top(a: int) -> int:\n"
        '    "Add one."\n'
        "    return a + 1\n"
    )
    prompts = function_prompts(source)
    assert sorted(prompts) == sorted(
        [
            'def name(self, x):\n    """Say the name.\n\n    Twice."""',
            'def top(a: int) -> int:\n    "Add one."',
        ]
    )
    assert function_prompts("def broken(:\n") == []


def test_kl_is_zero_on_equal_logits_positive_otherwise_and_masked():
    torch.manual_seed(0)
    teacher = torch.randn(2, 5, 11)
    mask = torch.ones(2, 5, dtype=torch.long)
    assert kl_to_teacher(teacher, teacher, mask).item() == pytest.approx(0.0, abs=1e-6)
    student = torch.randn(2, 5, 11)
    assert kl_to_teacher(student, teacher, mask).item() > 0
    # positions outside the mask do not count, whatever their logits
    noisy = student.clone()
    noisy[:, 3:] = 100 * torch.randn(2, 2, 11)
    mask[:, 3:] = 0
    assert kl_to_teacher(noisy, teacher, mask).item() == pytest.approx(
        kl_to_teacher(student[:, :3], teacher[:, :3], mask[:, :3]).item(), rel=1e-5
    )


@pytest.mark.slow  # the family fixture trains a teacher and a student
def test_rows_are_teacher_greedy_continuations_of_training_prompts(family):
    root, rows_path = family
    rows = read_jsonl(rows_path)
    assert {r["source"] for r in rows} == {"code", "math"}
    teacher = load_model(root / "teacher")
    for row in rows[:: len(rows) // 4]:
        prompt = row["ids"][: row["prompt_len"]]
        assert 0 < len(row["ids"]) - row["prompt_len"] <= 12
        expected = teacher.model.generate(
            torch.tensor([prompt]), max_new_tokens=len(row["ids"]) - len(prompt), do_sample=False,
            pad_token_id=teacher.tokenizer.pad_token_id,
        )  # fmt: skip
        assert expected[0].tolist() == row["ids"]
    # math prompts come from the training split and end where evaluation prompts end
    math_row = next(r for r in rows if r["source"] == "math")
    assert teacher.tokenizer.decode(math_row["ids"][: math_row["prompt_len"]]).endswith("Answer:")


@pytest.mark.slow  # the family fixture trains a teacher and a student
def test_interrupted_build_resumes_to_the_same_rows(family, tmp_path):
    root, rows_path = family
    lines = rows_path.read_text().splitlines(keepends=True)
    partial = tmp_path / "rows.jsonl"
    partial.write_text("".join(lines[:13]))  # a run killed after 13 rows
    build_distill_data(
        root / "teacher", root / "corpus", partial, TeacherPrompts(n_code=30, n_math=30),
        TeacherDecoding(max_new_tokens=12, max_prompt_tokens=150, batch_size=8), progress=False,
    )  # fmt: skip
    assert partial.read_text() == "".join(lines)


@pytest.mark.slow  # the family fixture trains a teacher and a student
def test_distillation_raises_agreement_with_the_teacher(family, tmp_path):
    root, rows_path = family
    teacher = load_model(root / "teacher").model
    student = load_model(root / "student").model
    pad = load_model(root / "student").tokenizer.pad_token_id
    train_rows, heldout = load_rows(rows_path, 64)
    before = top1_agreement(student, teacher, heldout + train_rows[:20], pad)
    model, state = train_distill(
        root / "student", root / "teacher", rows_path, root / "corpus", tmp_path / "run", tmp_path / "out",
        DistillRecipe(corpus_weight=0.25),
        {"steps": 40, "batch_size": 8, "seq_len": 64, "lr": 1e-2, "warmup": 2, "eval_every": 20},
        progress=False,
    )  # fmt: skip
    after = top1_agreement(model.float(), teacher, heldout + train_rows[:20], pad)
    assert after > before + 0.1, (before, after)
    assert state.history[-1]["agreement"] > 0
    record = json.loads((tmp_path / "out" / "training.json").read_text())
    assert record["distillation"]["teacher"].endswith("teacher") and record["complete"]
    assert load_model(tmp_path / "out").model.config.num_hidden_layers == 2


@pytest.mark.slow  # the family fixture trains a teacher and a student
def test_bad_input(family, tmp_path, cli):
    root, rows_path = family
    args = (root / "student", root / "teacher")
    with pytest.raises(RelaxSpecError, match="distillation rows not found"):
        train_distill(
            *args, tmp_path / "missing.jsonl", root / "corpus", tmp_path / "r", None, progress=False
        )
    bogus = tmp_path / "bogus.jsonl"
    bogus.write_text(json.dumps({"text": "x"}) + "\n")
    with pytest.raises(RelaxSpecError, match="not a distillation file"):
        train_distill(*args, bogus, root / "corpus", tmp_path / "r", None, progress=False)
    with pytest.raises(RelaxSpecError, match="corpus_weight"):
        train_distill(
            *args, rows_path, root / "corpus", tmp_path / "r", None, DistillRecipe(corpus_weight=1.5)
        )
    with pytest.raises(RelaxSpecError, match="not all 0"):
        build_distill_data(root / "teacher", root / "corpus", tmp_path / "x.jsonl", TeacherPrompts(0, 0))
    done = cli("train", "distill", "--student", str(tmp_path / "nope"), "--data", str(rows_path))
    assert done.returncode == 2 and "model directory not found" in done.stderr + done.stdout


def test_synthetic_code_prompts_come_from_training_tasks_only(tmp_path):
    """`--n-synthcode` prompts: half hand-written families, half pipelines, all from training
    seeds and combinations (never a held-out prompt of the evaluation sets)."""
    from relaxspec.data.codegen import eval_tasks, heldout_combo_tasks, heldout_family_tasks
    from relaxspec.train.distill import distill_prompts

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    prompts = distill_prompts(corpus, TeacherPrompts(0, 0, n_synthcode=40))
    assert len(prompts) == 40 and {p["source"] for p in prompts} == {"synthcode"}
    texts = {p["prompt"] for p in prompts}
    heldout = eval_tasks(200) + heldout_family_tasks(100) + heldout_combo_tasks(100)
    assert not texts & {t.prompt for t in heldout}
    assert all(p.startswith("def ") and p.rstrip().endswith('"""') for p in texts)


def test_styled_math_prompts_come_from_training_phrasings_only(tmp_path):
    """`--n-math-styles` prompts: training phrasing styles only (never a held-out phrasing family
    of `math-phrasing`), mixed with the other sources."""
    from relaxspec.data.mathgen import heldout_phrasing_problems
    from relaxspec.train.distill import distill_prompts

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    prompts = distill_prompts(corpus, TeacherPrompts(0, 0, n_synthcode=10, n_math_styles=60))
    assert len(prompts) == 70
    assert sum(p["source"] == "math_styles" for p in prompts) == 60
    styled = {p["prompt"] for p in prompts if p["source"] == "math_styles"}
    assert len(styled) == 60
    assert not styled & {p.prompt for p in heldout_phrasing_problems(400)}


def test_variant_family_prompts_come_from_training_splits_only(tmp_path):
    """`--n-codevar` / `--n-mathvar` prompts: variant-family training tasks and problems, never a
    prompt of the held-out seed, combination or phrasing splits."""
    from relaxspec.data.codevartasks import (
        heldout_combo_variant_tasks,
        heldout_phrasing_variant_tasks,
        heldout_seed_variant_tasks,
    )
    from relaxspec.data.mathvariants import heldout_phrasing_variant_problems, heldout_seed_variant_problems
    from relaxspec.train.distill import distill_prompts

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    prompts = distill_prompts(corpus, TeacherPrompts(0, 0, n_codevar=30, n_mathvar=20))
    assert sorted(p["source"] for p in prompts) == ["codevar"] * 30 + ["mathvar"] * 20
    code = {p["prompt"] for p in prompts if p["source"] == "codevar"}
    math = {p["prompt"] for p in prompts if p["source"] == "mathvar"}
    assert len(code) == 30 and len(math) == 20
    heldout_code = heldout_seed_variant_tasks(100) + heldout_combo_variant_tasks(100)
    heldout_code += heldout_phrasing_variant_tasks(100)
    assert not code & {t.prompt for t in heldout_code}
    heldout_math = heldout_seed_variant_problems(100) + heldout_phrasing_variant_problems(100)
    assert not math & {p.prompt for p in heldout_math}
    assert all(p.rstrip().endswith("Answer:") for p in math)


@pytest.mark.slow  # the family fixture trains a teacher and a student
def test_sampled_rows_reproduce_on_resume_and_leave_the_greedy_path(family, tmp_path):
    """A sampled build (temperature 1) is a pure function of its arguments: killed at a batch
    boundary and rerun, it writes the same rows; and its rows are not the greedy ones."""
    root, greedy_path = family
    want = TeacherPrompts(n_code=30, n_math=30)
    how = TeacherDecoding(max_new_tokens=12, max_prompt_tokens=150, batch_size=8, temperature=1.0)
    full = tmp_path / "full.jsonl"
    build_distill_data(root / "teacher", root / "corpus", full, want, how, progress=False)
    lines = full.read_text().splitlines(keepends=True)
    partial = tmp_path / "partial.jsonl"
    partial.write_text("".join(lines[:16]))  # killed after two batches
    build_distill_data(root / "teacher", root / "corpus", partial, want, how, progress=False)
    assert partial.read_text() == "".join(lines)
    greedy = greedy_path.read_text().splitlines(keepends=True)
    assert len(greedy) == len(lines) and sum(a != b for a, b in zip(greedy, lines, strict=True)) >= 5
    with pytest.raises(RelaxSpecError, match="temperature must be >= 0"):
        bad = dataclasses.replace(how, temperature=-1.0)
        build_distill_data(root / "teacher", root / "corpus", tmp_path / "x.jsonl", want, bad)

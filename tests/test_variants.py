"""Code and math with equivalent solution variants (issue 29): determinism, disjoint splits,
every variant correct, variants that really differ, the corpus files and the bench datasets."""

from __future__ import annotations

import json
import random
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from relaxspec.data import codegen, codevariants, codevartasks, mathquotes, mathvariants
from relaxspec.data.codegen import EVAL_SEED_START, HELDOUT_COMBOS, TRAIN_COMBOS
from relaxspec.data.corpus import read_jsonl, variant_rows
from relaxspec.data.mathgen import HELDOUT_PHRASINGS as MATH_HELDOUT_PHRASINGS
from relaxspec.data.mathgen import generate_styled_problem, is_heldout_question
from relaxspec.errors import RelaxSpecError
from relaxspec.eval.datasets import DATASETS, load_examples
from test_codegen import _mutants, _passes  # in-process test runner and wrong bodies
from test_codegen_pipelines import _differs, _probes

TOKENIZER = Path(__file__).resolve().parents[1] / "models" / "tokenizer"


@pytest.fixture(scope="module")
def code_sample():
    """(task, pipeline) pairs: training tasks and every held-out split."""
    pairs = [codevartasks.variant_task_and_pipeline(s) for s in range(300)]
    pairs += [codevartasks.variant_task_and_pipeline(EVAL_SEED_START + i, HELDOUT_COMBOS) for i in range(80)]
    pairs += [
        codevartasks.variant_task_and_pipeline(EVAL_SEED_START + i, heldout_phrasing=True) for i in range(80)
    ]
    return pairs


# --- code -----------------------------------------------------------------------------------------


def test_code_tasks_are_deterministic():
    assert codevartasks.train_variant_tasks(40) == codevartasks.train_variant_tasks(40)
    assert codevartasks.heldout_combo_variant_tasks(10) == codevartasks.heldout_combo_variant_tasks(10)
    _, pipe = codevartasks.variant_task_and_pipeline(7)
    assert codevariants.solutions(pipe, 3) == codevariants.solutions(pipe, 3)
    with pytest.raises(RelaxSpecError, match="unknown pipeline combinations"):
        codevartasks.generate_variant_task(0, ["pipe.list.nope.same.sum"])


def test_code_splits_are_disjoint():
    train = codevartasks.train_variant_tasks(3000)
    seeds = codevartasks.heldout_seed_variant_tasks(200)
    combos = codevartasks.heldout_combo_variant_tasks(200)
    phrasing = codevartasks.heldout_phrasing_variant_tasks(200)
    combo_of = lambda t: t.family.split("/")[0]  # noqa: E731
    style_of = lambda t: t.family.split("/")[1]  # noqa: E731
    assert all(t.seed < EVAL_SEED_START and not codegen.is_heldout_spec(t.spec) for t in train)
    assert {combo_of(t) for t in train} <= set(TRAIN_COMBOS)
    assert not {codevartasks.phrasing_of(style_of(t), combo_of(t)) for t in train} & set(
        codevariants.HELDOUT_PHRASINGS
    )
    assert all(codegen.is_heldout_spec(t.spec) for t in seeds)
    assert {combo_of(t) for t in combos} <= set(HELDOUT_COMBOS) and len({combo_of(t) for t in combos}) > 30
    assert {codevartasks.phrasing_of(style_of(t), combo_of(t)) for t in phrasing} <= set(
        codevariants.HELDOUT_PHRASINGS
    )
    assert {combo_of(t) for t in phrasing} <= set(TRAIN_COMBOS)
    train_prompts, train_specs = {t.prompt for t in train}, {t.spec for t in train}
    held = seeds + combos + phrasing
    assert not train_prompts & {t.prompt for t in held} and not train_specs & {t.spec for t in seeds}
    # every docstring style and annotation form is trained
    assert {style_of(t) for t in train} == set(codevariants.DOC_STYLES)
    assert any("from typing import" in t.prompt for t in train) and any("-> " in t.prompt for t in train)


def test_every_variant_passes_its_tests(code_sample):
    failures = [
        (task.task_id, body)
        for seed, (task, pipe) in enumerate(code_sample)
        for body in map(codevariants.indent, codevariants.solutions(pipe, seed))
        if not _passes(task, body)
    ]
    assert not failures, failures[:3]
    assert all(_passes(task, task.solution) for task, _ in code_sample)


def test_wrong_bodies_fail(code_sample):
    """A mutant (constant return, a literal + 1, a boundary flipped) that behaves differently from
    the reference body on some probe input fails the task's own tests."""
    probes = {"list": _probes("list"), "str": _probes("str")}
    survivors = [
        (t.task_id, m)
        for t, pipe in code_sample
        for m in _mutants(t)
        if m != t.solution and _passes(t, m) and _differs(t, m, probes[pipe.kind])
    ]
    assert not survivors, survivors[:3]


def test_variants_really_differ(code_sample):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER)
    for seed, (task, pipe) in enumerate(code_sample[:60]):
        bodies = codevariants.solutions(pipe, seed)
        token_seqs = {tuple(tok(task.prompt + codevariants.indent(b))["input_ids"]) for b in bodies}
        assert len(token_seqs) >= 6, task.task_id
        # not only names: the first lines differ in structure (loop, comprehension, builtin, helper)
        assert len({re.sub(r"\w+", "w", b[0]) for b in bodies}) >= 3, task.task_id
    # the solutions drawn for training really spread: strategies and loop names both vary
    train = codevartasks.train_variant_tasks(400)
    assert sum("for " in t.solution and "[" not in t.solution.split("for ")[0] for t in train) > 40
    first_words = Counter(t.solution.split()[0] for t in train)
    assert len(first_words) >= 8 and first_words.most_common(1)[0][1] < 0.5 * len(train)


# --- math -----------------------------------------------------------------------------------------

_EQ = re.compile(r"(\d+) ?([-+*/]) ?(\d+) ?= ?(\d+)")


def test_math_variants_are_correct_and_differ():
    problems = [generate_styled_problem(s) for s in range(300_000, 300_200)]
    for p in problems:
        steps = mathvariants.parse_steps(p.solution)
        assert len(steps) == p.steps
        variants = {mathvariants.vary_solution(p, random.Random(i)) for i in range(30)}
        if p.steps >= 2:
            assert len(variants) >= 8
        for v in variants:
            lines = v.splitlines()
            assert lines[-1] == f"#### {p.answer}"
            eqs = [m.groups() for m in map(_EQ.search, lines) if m]
            assert len(eqs) == p.steps
            for a, op, b, c in eqs:  # every equation is right
                assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b),
                        "/": int(a) // int(b)}[op] == int(c)  # fmt: skip
            # the same steps (reordered at most), the answer's step last
            assert sorted(eqs) == sorted((str(a), op, str(b), str(c)) for _, a, op, b, c in steps)
            assert int(eqs[-1][3]) == p.answer


def test_math_step_order_respects_dependencies():
    steps = [("A", 2, "*", 3, 6), ("B", 4, "*", 5, 20), ("C", 6, "+", 20, 26), ("D", 26, "-", 1, 25)]
    orders = {tuple(mathvariants.step_order(steps, random.Random(i))) for i in range(50)}
    assert orders == {(0, 1, 2, 3), (1, 0, 2, 3)}


def test_math_splits_are_disjoint_and_deterministic():
    train = mathvariants.train_variant_problems(2000)
    assert train[:50] == mathvariants.train_variant_problems(50)
    seeds = mathvariants.heldout_seed_variant_problems(100)
    phrasing = mathvariants.heldout_phrasing_variant_problems(100)
    assert not any(is_heldout_question(p.question) for p in train)
    assert all(is_heldout_question(p.question) for p in seeds)
    assert {p.family for p in phrasing} <= set(MATH_HELDOUT_PHRASINGS)
    assert not {p.family for p in train} & set(MATH_HELDOUT_PHRASINGS)
    assert not {p.prompt for p in train} & {p.prompt for p in seeds + phrasing}
    # the step styles all occur in training
    shapes = Counter(
        re.sub(r"\d+", "N", re.sub(r"[a-zA-Z' ]+", "w", p.solution.splitlines()[0])) for p in train
    )
    assert len(shapes) >= 5 and shapes.most_common(1)[0][1] < 0.5 * len(train)


# --- corpus and datasets --------------------------------------------------------------------------


def test_corpus_rows_and_datasets():
    rows = variant_rows(60, 60, 20)
    assert len(rows["codevar_train"]) == len(rows["mathvar_train"]) == len(rows["mathquote_train"]) == 60
    assert len(rows["mathorder_train"]) == 60
    held = ("codevar_eval", "codevar_combos_eval", "codevar_phrasing_eval", "mathvar_eval")
    assert all(len(rows[n]) == 20 and "prompt" in rows[n][0] for n in held)
    with pytest.raises(RelaxSpecError, match="at least 1"):
        variant_rows(0, 5, 5)
    names = ("codevar", "codevar-combos", "codevar-phrasing", "mathvar", "mathvar-phrasing")
    assert set(names) <= set(DATASETS)
    for name in names:
        examples = load_examples(name, 4)
        assert len(examples) == 4 and len({e.id for e in examples}) == 4
        assert examples[0].metric == ("pass@1" if name.startswith("codevar") else "exact_match")
    # the eval files hold the datasets' prompts
    assert [r["prompt"] for r in rows["codevar_combos_eval"]] == [
        e.prompt for e in load_examples("codevar-combos", 20)
    ]
    # scored in the sandbox like every synthetic code task: the reference body passes, a wrong one fails
    e = load_examples("codevar-phrasing", 1)[0]
    assert e.score(e.problem["canonical_solution"]) == 1.0
    assert e.score("\n    return None") == 0.0
    m = load_examples("mathvar", 1)[0]
    assert m.score(f"x\n#### {m.answer}") == 1.0


def test_corpus_reads_back(tmp_path):
    from relaxspec.data.corpus import _write_jsonl

    rows = variant_rows(5, 5, 3)
    _write_jsonl(tmp_path / "codevar_train.jsonl", rows["codevar_train"])
    assert read_jsonl(tmp_path / "codevar_train.jsonl") == rows["codevar_train"]


def test_regime_summary_reads_bench_rows(tmp_path, capsys):
    from relaxspec.eval.regime import main, regime_line

    row = {"label": "sd k=8", "method": "sd", "dataset": "codevar-combos", "temperature": 1.0,
           "quality": 0.8, "quality_metric": "pass@1", "quality_ci": {"low": 0.65, "high": 0.9, "n": 40},
           "tau": 2.62, "diagnostics": {"rejections": {"strict_rejected": 358, "rejected_in_nucleus": 0.0223,
                                                         "rejected_in_top10": 0.885}}}  # fmt: skip
    line = regime_line(row)
    assert "0.800 [0.650–0.900] n=40" in line and "in 0.95-nucleus 2.2%" in line and "top 10 88.5%" in line
    assert "nucleus" not in regime_line({**row, "method": "ar", "label": "ar", "diagnostics": None})
    nsd = {**row, "method": "nsd", "label": "nsd k=8 theta=0.8", "params": {"theta": 0.8}}
    assert "in 0.8-nucleus 2.2%" in regime_line(nsd)  # an nsd row is analysed at its own θ
    rej = {**row["diagnostics"]["rejections"], "rejected_in_nucleus_ci": {"low": 0.011, "high": 0.044}}
    assert "in 0.95-nucleus 2.2% [1.1%–4.4%]" in regime_line({**row, "diagnostics": {"rejections": rej}})
    (tmp_path / "results.json").write_text(json.dumps({"rows": [row]}))
    assert main([str(tmp_path)]) == 0 and "τ 2.62" in capsys.readouterr().out
    assert main([str(tmp_path / "missing")]) == 2 and "results.json missing" in capsys.readouterr().err


# --- math steps that quote their facts ------------------------------------------------------------


def test_quoted_solutions_walk_the_clauses_and_compute_correctly():
    problems = mathquotes.train_quote_problems(300)
    assert problems[:20] == mathquotes.train_quote_problems(20)  # deterministic
    assert not {p.prompt for p in problems} & {p.prompt for p in mathvariants.train_variant_problems(300)}
    assert not any(is_heldout_question(p.question) for p in problems)
    unused = 0
    for p in problems:
        lines = p.solution.splitlines()
        assert lines[-1] == f"#### {p.answer}"
        quotes = [line[2:] for line in lines if line.startswith("> ")]
        # every clause of the question quoted once, in order (all training phrasings can be traced)
        assert [q.removesuffix(" (not needed)") for q in quotes] == mathquotes.question_clauses(p.question)
        unused += sum(q.endswith(" (not needed)") for q in quotes)
        results: set[int] = set()
        quoted: list[int] = []
        eqs = 0
        for line in lines:
            if line.startswith("> "):
                quoted += [] if line.endswith("(not needed)") else mathquotes.clause_numbers(line[2:])
                continue
            m = _EQ.search(line)
            if not m:
                continue
            a, op, b, c = m.groups()
            assert {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b),
                    "/": int(a) // int(b)}[op] == int(c)  # fmt: skip
            # a number not computed by an earlier step comes from a clause quoted (as needed) above
            assert all(int(v) in quoted for v in (a, b) if int(v) not in results), (p.question, line)
            results.add(int(c))
            eqs, last = eqs + 1, int(c)
        assert eqs == p.steps and last == p.answer
    assert unused > 20  # distractor facts are quoted and marked


def test_ordered_solutions_are_the_quoted_walk_without_its_quotes():
    problems = mathquotes.train_ordered_problems(300)
    assert problems[:20] == mathquotes.train_ordered_problems(20)  # deterministic
    quoted = mathquotes.train_quote_problems(300)
    assert [p.prompt for p in problems] == [q.prompt for q in quoted]  # the same questions
    for p, q in zip(problems, quoted, strict=True):
        assert p.answer == q.answer and p.solution.endswith(f"#### {p.answer}")
        assert not any(line.startswith("> ") for line in p.solution.splitlines())
        # the same steps in the same order as the quoted walk (wordings are drawn separately)
        steps = [tuple(map(int, (m[0], m[2], m[3]))) for m in _EQ.findall(p.solution)]
        walk = [tuple(map(int, (m[0], m[2], m[3]))) for m in _EQ.findall(q.solution)]
        assert steps == walk and len(steps) == p.steps, p.question


def test_question_clauses_split_facts_and_read_spelled_numbers():
    q = "(1) Ann has twelve pens and Bo has 4 pens. (2) On Monday, the number of pens doubles. How many pens?"
    assert mathquotes.question_clauses(q) == [
        "Ann has twelve pens",
        "Bo has 4 pens",
        "On Monday, the number of pens doubles",
    ]
    assert mathquotes.clause_numbers("Ann has twelve 5-euro notes") == [12, 5]
    assert mathquotes.question_clauses("Use these facts: Cy reads 3 pages, then rests. How many?") == [
        "Cy reads 3 pages, then rests"  # a part without a number keeps its sentence whole
    ]
    p = generate_styled_problem(600_000)
    not_generator_lines = replace(p, solution="12 * 2 = 24\n#### 24")
    assert mathquotes.quote_plan(not_generator_lines, mathquotes.question_clauses(p.question)) is None
    untraceable = replace(p, question="Nobody says how many. How many are there?")
    assert mathquotes.quote_plan(untraceable, mathquotes.question_clauses(untraceable.question)) is None
    # the plain variant then, from the same draw
    assert mathquotes.quote_solution(untraceable, random.Random(1)) == mathvariants.vary_solution(
        p, random.Random(1)
    )

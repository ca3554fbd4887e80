"""The vLLM-backed server's front door and leftovers (issue 35, parts 2 and 5), without a model:
the guard middleware on a small app, the lifeline of forked and spawned children, the stats
directory's cleanup, and the CLI's serving flags with ``--engine vllm``. The same against a running
vLLM server: tests/test_vllm_server.py."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import psutil
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket, WebSocketDisconnect

from relaxspec.errors import RelaxSpecError
from relaxspec.integrations.vllm import guard
from relaxspec.integrations.vllm.serve import STATS_PREFIX, remove_stale_stats_dirs, temporary_stats_dir

KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}


async def echo(request: Request) -> JSONResponse:
    body = (await request.body()).decode()
    return JSONResponse({"body": body, "length": request.headers.get("content-length")})


async def socket(ws: WebSocket) -> None:
    await ws.accept()
    await ws.send_text("hello")
    await ws.close()


ROUTES = [
    Route("/health", lambda r: PlainTextResponse("ok")),
    Route("/v1/completions", echo, methods=["POST"]),
    Route("/v1/chat/completions", echo, methods=["POST"]),
    Route("/tokenize", echo, methods=["POST"]),
    Route("/metrics", lambda r: PlainTextResponse("m")),
    WebSocketRoute("/v1/realtime", socket),
]


def client(config: guard.GuardConfig) -> TestClient:
    guard.configure(config)
    app = Starlette(routes=ROUTES)
    app.add_middleware(guard.Guard)
    return TestClient(app)


def test_every_path_but_health_needs_the_key():
    c = client(guard.GuardConfig(api_key=KEY))
    for method, path in [("GET", "/metrics"), ("POST", "/tokenize"), ("POST", "/v1/completions"),
                         ("GET", "/a-route-vllm-adds-later"), ("DELETE", "/v1/completions")]:  # fmt: skip
        bare = c.request(method, path, json={})
        assert bare.status_code == 401, (method, path)
        assert bare.json()["error"]["code"] == "invalid_api_key"
        assert bare.headers["www-authenticate"].startswith("Bearer")
        for wrong in ("Bearer nope", f"Basic {KEY}", KEY, f"Bearer {KEY}x", "Bearer"):
            assert c.request(method, path, json={}, headers={"Authorization": wrong}).status_code == 401
        assert c.request(method, path, json={}, headers=AUTH).status_code != 401, (method, path)
    assert c.get("/health").status_code == 200
    assert c.get("/health/").status_code == 401  # only /health itself is open
    loose = {"authorization": f"bearer  {KEY} "}  # scheme in any case, spaces around the key
    assert c.post("/v1/completions", json={"x": 1}, headers=loose).status_code == 200
    # a CORS preflight carries no credentials and returns no data
    preflight = {"Origin": "http://x", "Access-Control-Request-Method": "POST"}
    assert c.options("/v1/completions", headers=preflight).status_code != 401
    assert c.options("/v1/completions").status_code == 401
    with pytest.raises(WebSocketDisconnect), c.websocket_connect("/v1/realtime") as ws:
        ws.receive_text()
    with c.websocket_connect("/v1/realtime", headers=AUTH) as ws:
        assert ws.receive_text() == "hello"


def test_no_key_configured_leaves_routes_open():
    c = client(guard.GuardConfig())
    assert c.get("/metrics").status_code == 200
    assert c.post("/v1/completions", json={"prompt": "x"}).json()["body"] == '{"prompt":"x"}'


def test_body_cap_declared_and_chunked():
    c = client(guard.GuardConfig(api_key=KEY, max_body_bytes=2048))
    ok = c.post("/tokenize", content=b"a" * 2048, headers=AUTH)
    assert ok.status_code == 200 and len(ok.json()["body"]) == 2048
    big = c.post("/tokenize", content=b"a" * 2049, headers=AUTH)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"

    def chunks():
        for _ in range(10):
            yield b"b" * 1000

    assert c.post("/tokenize", content=chunks(), headers=AUTH).status_code == 413  # no length declared
    assert c.post("/tokenize", content=b"a" * 5000).status_code == 401  # the key before the body


def test_chat_bodies_get_the_chat_formats_stop():
    c = client(guard.GuardConfig(chat_stop=("\nUser:",)))
    body = lambda path, payload: c.post(path, json=payload).json()["body"]  # noqa: E731
    assert body("/v1/chat/completions", {"m": 1}) == '{"m": 1, "stop": ["\\nUser:"]}'
    assert body("/v1/chat/completions", {"stop": "x"}) == '{"stop": ["x", "\\nUser:"]}'
    assert body("/v1/chat/completions", {"stop": ["\nUser:"]}) == '{"stop":["\\nUser:"]}'  # already there
    four = {"stop": ["a", "b", "c", "d"]}  # OpenAI's limit: left to vLLM as it is
    assert body("/v1/chat/completions", four) == '{"stop":["a","b","c","d"]}'
    assert body("/v1/chat/completions", {"stop": 3}) == '{"stop":3}'
    assert body("/v1/completions", {"prompt": "x"}) == '{"prompt":"x"}'  # completions: no template


def test_max_tokens_cap_and_default():
    c = client(guard.GuardConfig(max_tokens_cap=64, default_max_tokens=8))
    for field in guard.BUDGET_FIELDS:
        r = c.post("/v1/chat/completions", json={field: 65})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == f"{field}=65 exceeds this server's limit of 64"
        assert c.post("/v1/chat/completions", json={field: 64}).status_code == 200
    # completions without max_tokens get the default (and a matching Content-Length); chat does not
    got = c.post("/v1/completions", json={"prompt": "x"}).json()
    assert got["body"] == '{"prompt": "x", "max_tokens": 8}' and got["length"] == str(len(got["body"]))
    assert c.post("/v1/completions", json={"prompt": "x", "max_tokens": None}).json()["body"].endswith("8}")
    assert c.post("/v1/completions", json={"max_tokens": 3}).json()["body"] == '{"max_tokens":3}'
    assert c.post("/v1/chat/completions", json={"m": 1}).json()["body"] == '{"m":1}'
    # not JSON objects, bools: passed to vLLM as they are (it answers them)
    for raw in (b"[1, 2]", b"{not json", b'{"max_tokens": true}'):
        assert c.post("/v1/chat/completions", content=raw).json()["body"] == raw.decode()
    # a default above the cap is cut to the cap
    c = client(guard.GuardConfig(max_tokens_cap=4, default_max_tokens=16))
    assert c.post("/v1/completions", json={}).json()["body"] == '{"max_tokens": 4}'


def test_guard_config_is_validated_and_required():
    for kwargs, message in [
        ({"api_key": ""}, "printable ASCII"),
        ({"api_key": "k\n"}, "printable ASCII"),
        ({"max_body_bytes": 100}, "--max-body-bytes must be an integer >= 1024"),
        ({"max_tokens_cap": 0}, "--max-tokens-cap must be an integer >= 1"),
        ({"default_max_tokens": True}, "--default-max-tokens must be an integer >= 1"),
    ]:
        with pytest.raises(RelaxSpecError, match=message):
            guard.GuardConfig(**kwargs)
    guard._config = None
    with pytest.raises(RuntimeError, match="not configured"):
        guard.Guard(Starlette())


# ---------------------------------------------------------------------------------------------
# Lifeline: a child forked or spawned by a process that installed it dies with that process


LIFELINE = textwrap.dedent(
    """
    import multiprocessing, os, sys, threading, time
    from relaxspec.integrations.vllm import die_with_parent

    def sleeper():
        time.sleep(120)

    def spawned():
        die_with_parent()
        time.sleep(120)

    if __name__ == "__main__":
        die_with_parent()
        how = sys.argv[1]
        if how == "spawn":
            child = multiprocessing.get_context("spawn").Process(target=spawned)
            child.start()
            pid = child.pid
        else:
            pids = []

            def fork():
                pid = os.fork()
                if pid == 0:
                    sleeper()
                    os._exit(0)
                pids.append(pid)

            thread = threading.Thread(target=fork) if how == "thread" else None
            if thread:
                thread.start()
                thread.join()  # the forking thread is gone; the child must live on
            else:
                fork()
            pid = pids[0]
        print(pid, flush=True)
        time.sleep(120)
    """
)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_until(condition, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.2)
    return condition()


@pytest.mark.parametrize("how", ["fork", "thread", "spawn"])
def test_children_die_with_their_parent(tmp_path, how):
    script = tmp_path / "lifeline.py"
    script.write_text(LIFELINE)
    parent = subprocess.Popen([sys.executable, str(script), how], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        time.sleep(1.5)  # past the thread-based watch's first look
        assert not gone(child), "the child died while its parent lived"
        parent.kill()
        parent.wait()
        assert wait_until(lambda: gone(child), 15), f"the {how} child outlived its parent"
    finally:
        parent.kill()
        parent.wait()


# ---------------------------------------------------------------------------------------------
# The stats directory


@pytest.fixture
def tmp_tempdir(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_stats_dir_removed_on_return_and_exception(tmp_tempdir):
    with temporary_stats_dir() as where:
        assert Path(where).is_dir() and Path(where).name.startswith(f"{STATS_PREFIX}{os.getpid()}-")
    assert not Path(where).exists()
    with pytest.raises(KeyError), temporary_stats_dir() as where:
        raise KeyError("boom")
    assert not Path(where).exists()


STATS_HOLDER = textwrap.dedent(
    """
    import sys, tempfile, time
    tempfile.tempdir = sys.argv[1]
    from relaxspec.integrations.vllm.serve import temporary_stats_dir
    with temporary_stats_dir() as where:
        print(where, flush=True)
        time.sleep(120)
    """
)


@pytest.mark.slow  # spawns a server process per signal
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_stats_dir_removed_when_the_server_is_killed(tmp_tempdir, sig):
    holder = subprocess.Popen(
        [sys.executable, "-c", STATS_HOLDER, str(tmp_tempdir)], stdout=subprocess.PIPE, text=True
    )
    try:
        where = Path(holder.stdout.readline().strip())
        assert where.is_dir()
        holder.send_signal(sig)
        holder.wait()
        assert wait_until(lambda: not where.exists(), 15), f"{where} outlived {sig.name}"
    finally:
        holder.kill()
        holder.wait()


def test_stale_stats_dirs_of_dead_servers_are_removed(tmp_tempdir):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_tempdir / f"{STATS_PREFIX}{dead.pid}-abc"
    live = tmp_tempdir / f"{STATS_PREFIX}{os.getpid()}-def"
    other = tmp_tempdir / f"{STATS_PREFIX}xyz"  # not ours to judge
    for d in (stale, live, other):
        d.mkdir()
    (stale / "1.json").write_text("{}")
    remove_stale_stats_dirs()
    assert not stale.exists() and live.exists() and other.exists()


# ---------------------------------------------------------------------------------------------
# relaxspec serve --engine vllm: each serving flag honoured or refused


@pytest.fixture
def vllm_serve_calls(monkeypatch):
    from relaxspec.integrations.vllm import serve as serve_module

    calls = []
    monkeypatch.setattr(
        serve_module,
        "serve",
        lambda method, params, server, options: calls.append(dataclasses.asdict(options)),
    )
    return calls


def invoke(*args: str):
    from typer.testing import CliRunner

    from relaxspec.cli import app

    return CliRunner().invoke(app, ["serve", "--engine", "vllm", *args])


@pytest.mark.parametrize(
    "args,flag",
    [
        (["--max-queue", "4"], "--max-queue"),
        (["--adaptive-k"], "--adaptive-k"),
        (["--no-adaptive-k"], "--adaptive-k"),
        (["--no-batching"], "--batching"),
        (["--no-extra-models"], "--extra-models"),
    ],
)
def test_serve_vllm_refuses_our_engines_flags(vllm_serve_calls, args, flag):
    result = invoke(*args)
    assert isinstance(result.exception, RelaxSpecError), result.output
    assert str(result.exception) == f"{flag} is our engine's and has no equivalent in vLLM (--engine vllm)"
    assert not vllm_serve_calls


def test_serve_vllm_passes_the_serving_flags(vllm_serve_calls):
    want = {"api_key": KEY, "max_body_bytes": 4096, "max_tokens_cap": 64, "default_max_tokens": 8,
            "max_concurrency": 3, "log_level": "warning"}  # fmt: skip
    flags = [x for name, value in want.items() for x in ("--" + name.replace("_", "-"), str(value))]
    result = invoke(*flags)
    assert result.exit_code == 0, result.output
    assert {k: vllm_serve_calls[0][k] for k in want} == want
    # defaults: our body cap and completions default; vLLM's own number of sequences
    assert invoke().exit_code == 0
    assert vllm_serve_calls[1]["max_concurrency"] is None
    assert vllm_serve_calls[1]["max_body_bytes"] == 2 * 1024**2
    assert isinstance(invoke("--max-body-bytes", "10").exception, RelaxSpecError)


def test_serving_args_map_to_vllm_flags():
    import json

    from relaxspec.integrations.vllm.serve import serving_args

    argv = serving_args(max_concurrency=3, max_tokens_cap=64, log_level="trace")
    assert argv[:2] == ["--middleware", guard.MIDDLEWARE]
    assert argv[argv.index("--max-num-seqs") + 1] == "3"
    assert json.loads(argv[argv.index("--override-generation-config") + 1]) == {"max_new_tokens": 64}
    assert argv[argv.index("--uvicorn-log-level") + 1] == "trace"
    assert serving_args() == ["--middleware", guard.MIDDLEWARE]
    with pytest.raises(RelaxSpecError, match="--log-level must be one of"):
        serving_args(log_level="loud")
    with pytest.raises(RelaxSpecError, match="--max-concurrency must be an integer >= 1"):
        serving_args(max_concurrency=0)


def test_counters_file_round_trips_grows_and_sums_every_process(tmp_path, monkeypatch):
    """The sampler's /metrics counters (stats_file): each write is read back whole; a draft length
    past the capacity moves to a larger file; every process's file is summed; files that are not
    counters (a half-written temporary, junk) are skipped."""
    from relaxspec.integrations.vllm import stats_file

    where = str(tmp_path)
    mine = stats_file.stats_file(where, 4)
    mine.write(10, 25, ([10, 9, 8, 7], [6, 5, 4, 3], [1, 0, 0, 0]))
    want = {"rows": 10, "emitted": 25, "drafted_per_pos": [10, 9, 8, 7]}
    want |= {"accepted_per_pos": [6, 5, 4, 3], "relaxed_per_pos": [1, 0, 0, 0]}
    assert stats_file.read_stats(where) == want
    assert stats_file.stats_file(where, 4) is mine  # the same mapping: a step writes no file
    mine.write(12, 30, ([12, 11, 9, 8], [7, 5, 4, 3], [2, 0, 0, 0]))
    assert stats_file.read_stats(where)["accepted_per_pos"] == [7, 5, 4, 3]

    grown = stats_file.stats_file(where, 100)
    assert grown is not mine and grown.capacity >= 100 and grown.path == mine.path
    wide = list(range(1, 101))
    grown.write(13, 31, (wide, wide, [0] * 100))
    assert stats_file.read_stats(where)["drafted_per_pos"] == wide

    monkeypatch.setattr(os, "getpid", lambda: 999_999)  # a second sampler process
    stats_file.stats_file(where, 2).write(1, 3, ([1, 1], [1, 0], [0, 0]))
    (tmp_path / "junk.stats").write_bytes(b"not counters")
    (tmp_path / "5.stats.tmp").write_bytes(b"\0" * 8)
    total = stats_file.read_stats(where)
    assert total["rows"] == 14 and total["emitted"] == 34
    assert total["drafted_per_pos"] == [2, 3, *range(3, 101)]

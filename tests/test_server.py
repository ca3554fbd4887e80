"""The OpenAI-compatible server, exercised with the real ``openai`` client over loopback.

Completions, chat, streaming, per-request method overrides, OpenAI-style errors (and the server
serving on afterwards), overload (429), client disconnects, concurrency, metrics, and batch
equivalence: a request's output does not depend on what else is in flight.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest

from relaxspec.methods import ModelSet
from relaxspec.models import load_model
from relaxspec.serve.pool import ServingPool
from relaxspec.serve.server import BackgroundServer, ChatMessage, ChatTemplate, create_app

MODEL = "tiny"
CONTEXT = 128  # save_tiny_pair's context window


@pytest.fixture(scope="module")
def models(model_dirs) -> ModelSet:
    target, draft = model_dirs
    return ModelSet(target=load_model(target), draft=load_model(draft))


def _app(pool: ServingPool, models: ModelSet, **kwargs):
    return create_app(pool, MODEL, models.target.tokenizer, models.target.context_length, **kwargs)


@pytest.fixture(scope="module")
def server(models):
    """A server with the nsd default (k=4, θ=0.9) and room for many concurrent requests."""
    pool = ServingPool(models, "nsd", {"k": 4, "theta": 0.9}, max_concurrency=8, max_queue=32)
    with BackgroundServer(_app(pool, models, max_tokens_cap=100)) as url:
        yield url, pool


@pytest.fixture(scope="module")
def url(server) -> str:
    return server[0]


@pytest.fixture
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=60)


def complete(client: openai.OpenAI, prompt: str, **kwargs):
    kwargs.setdefault("max_tokens", 12)
    kwargs.setdefault("temperature", 0)
    return client.completions.create(model=MODEL, prompt=prompt, **kwargs)


def assert_serving(url: str) -> None:
    """The server still answers a good request."""
    r = httpx.post(f"{url}/v1/completions", json={"prompt": "w1", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] >= 1


# --- completions and chat -----------------------------------------------------------------------


def test_completion(client):
    out = complete(client, "w1 w2", max_tokens=10)
    assert out.object == "text_completion" and out.model == MODEL
    choice = out.choices[0]
    assert choice.text.strip().startswith("w")
    assert choice.finish_reason in ("length", "stop")
    assert 1 <= out.usage.completion_tokens <= 10
    assert out.usage.prompt_tokens == 3  # EOS + two words
    assert out.usage.total_tokens == out.usage.prompt_tokens + out.usage.completion_tokens
    stats = out.usage.model_extra["relaxspec"]
    assert stats["method"] == "nsd" and stats["tau"] >= 1 and stats["verifier_calls"] >= 1
    assert stats["finish_reason"] in ("length", "eos", "stop")


def test_completion_finish_reasons(client):
    full = complete(client, "w3 w1", max_tokens=8)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 8
    words = full.choices[0].text.split()
    stop = words[2]
    cut = complete(client, "w3 w1", max_tokens=8, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert stop not in cut.choices[0].text
    assert full.choices[0].text.startswith(cut.choices[0].text)


def test_ignore_eos_extension(client):
    for seed in range(4):
        out = complete(
            client, "w2", max_tokens=30, temperature=1.0, seed=seed, extra_body={"ignore_eos": True}
        )
        assert out.usage.completion_tokens == 30 and out.choices[0].finish_reason == "length"


def test_prompt_as_list_of_one_string_and_token_ids(client):
    a = complete(client, "w1 w2")
    b = client.completions.create(model=MODEL, prompt=["w1 w2"], max_tokens=12, temperature=0)
    c = client.completions.create(model=MODEL, prompt=[0, 4, 5], max_tokens=12, temperature=0)
    assert a.choices[0].text == b.choices[0].text == c.choices[0].text


def test_chat(client):
    out = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "w0"}, {"role": "user", "content": "w1 w2"}],
        max_tokens=10,
        temperature=0,
    )
    assert out.object == "chat.completion"
    msg = out.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str)
    assert out.usage.completion_tokens >= 1
    assert out.usage.model_extra["relaxspec"]["method"] == "nsd"


def test_chat_template():
    template = ChatTemplate()
    messages = [
        ChatMessage(role="system", content="Be brief."),
        ChatMessage(role="user", content="Hi"),
        ChatMessage(role="assistant", content="Hello."),
        ChatMessage(role="user", content=[{"type": "text", "text": "2+2?"}]),
    ]
    assert (
        template.render(messages) == "System: Be brief.\nUser: Hi\nAssistant: Hello.\nUser: 2+2?\nAssistant:"
    )
    assert template.stop == ("\nUser:",)


def test_models_and_health(url):
    models = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0).models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert {"ar", "sd", "nsd"} <= set(models.data[0].model_extra["relaxspec"]["methods"])
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["default_method"] == "nsd"


# --- streaming ------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["ar", "nsd"])
def test_streamed_completion_reassembles(client, method):
    extra = {"relaxspec": {"method": method}}
    plain = complete(client, "w5 w6 w7", max_tokens=20, extra_body=extra)
    chunks = list(
        complete(
            client,
            "w5 w6 w7",
            max_tokens=20,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=extra,
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == plain.choices[0].text
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == [plain.choices[0].finish_reason]
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert len([c for c in chunks if c.choices and c.choices[0].text]) >= 2  # really incremental


def test_streamed_chat_reassembles(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "w2"}], max_tokens=15, temperature=0)
    plain = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason


def test_stream_wire_format(url):
    body = {"prompt": "w1", "max_tokens": 5, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = [line for line in r.iter_lines() if line]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


# --- per-request method override --------------------------------------------------------------


def test_method_override_greedy_equals_ar(client):
    """Greedy SD is lossless, and NSD with a tiny θ (nucleus = the top token) is greedy AR too."""

    def run(method: str, **params):
        extra = {"relaxspec": {"method": method, "params": params}}
        return complete(client, "w4 w0", max_tokens=24, extra_body=extra)

    ar, sd, nsd = run("ar"), run("sd", k=3), run("nsd", theta=1e-6)
    assert ar.usage.model_extra["relaxspec"]["method"] == "ar"
    assert sd.usage.model_extra["relaxspec"]["method"] == "sd"
    assert ar.choices[0].text == sd.choices[0].text == nsd.choices[0].text
    assert ar.usage.model_extra["relaxspec"]["tau"] == 1.0
    assert (
        sd.usage.model_extra["relaxspec"]["verifier_calls"]
        < ar.usage.model_extra["relaxspec"]["verifier_calls"]
    )


def test_openai_client_sees_bad_request(client):
    with pytest.raises(openai.BadRequestError) as info:
        complete(client, "w1", extra_body={"relaxspec": {"method": "nope"}})
    assert info.value.status_code == 400
    assert "unknown method" in info.value.message
    assert info.value.body["param"] == "relaxspec.method"


# --- bad input --------------------------------------------------------------------------------

LONG_PROMPT = " ".join(["w1"] * (CONTEXT + 10))


@pytest.mark.parametrize(
    "path,body,status,param,message",
    [
        ("completions", b"{not json", 400, None, "not valid JSON"),
        ("completions", b"[1, 2]", 400, None, "JSON object"),
        ("completions", {"max_tokens": 4}, 400, "prompt", "missing required field 'prompt'"),
        ("completions", {"prompt": ""}, 400, "prompt", "empty"),
        ("completions", {"prompt": []}, 400, "prompt", "empty"),
        ("completions", {"prompt": ["w1", ""]}, 400, "prompt", "prompt 1 is empty"),
        ("completions", {"prompt": ["w1", "w2"], "stream": True}, 400, "stream", "one prompt"),
        ("completions", {"prompt": 5}, 400, "prompt", "invalid request"),
        ("completions", {"prompt": "w1", "temperature": "hot"}, 400, "temperature", "valid number"),
        ("completions", {"prompt": "w1", "temperature": -1}, 400, "temperature", "greater than"),
        ("completions", b'{"prompt": "w1", "temperature": NaN}', 400, "temperature", "finite"),
        ("completions", {"prompt": "w1", "seed": 2**70}, 400, "seed", "less than"),
        ("completions", {"prompt": "w1", "seed": -1}, 400, "seed", "greater than"),
        ("completions", b'{"prompt": "w1 \\ud800"}', 400, "prompt", "Unicode"),
        ("completions", {"prompt": "w1", "max_tokens": 2.5}, 400, "max_tokens", "integer"),
        ("completions", {"prompt": "w1", "max_tokens": 0}, 400, "max_tokens", "only allowed with echo"),
        ("completions", {"prompt": "w1", "max_tokens": -1}, 400, "max_tokens", "greater than"),
        ("completions", {"prompt": "w1", "top_p": 0}, 400, "top_p", "greater than"),
        ("completions", {"prompt": "w1", "stream": "yes"}, 400, "stream", "boolean"),
        ("completions", {"prompt": "w1", "stop": [""]}, 400, "stop", "non-empty"),
        ("completions", {"prompt": "w1", "n": 2}, 400, "n", "only n=1"),
        ("completions", {"prompt": "w1", "logprobs": 21}, 400, "logprobs", "[0, 20]"),
        ("completions", {"prompt": "w1", "max_tokens": 1000}, 400, "max_tokens", "at most"),
        ("completions", {"prompt": "w1", "max_tokens": 110}, 400, "max_tokens", "limit of 100"),
        ("completions", {"prompt": LONG_PROMPT}, 400, "prompt", "context window"),
        ("completions", {"prompt": [0, 999]}, 400, None, "token ids"),
        (
            "completions",
            {"prompt": "w1", "relaxspec": {"method": "nope"}},
            400,
            "relaxspec.method",
            "unknown",
        ),
        ("completions", {"prompt": "w1", "relaxspec": {"method": "mars"}}, 400, "relaxspec.method", "block"),
        (
            "completions",
            {"prompt": "w1", "relaxspec": {"params": {"nope": 1}}},
            400,
            "relaxspec.params",
            "nope",
        ),
        (
            "completions",
            {"prompt": "w1", "relaxspec": {"params": {"theta": 1.5}}},
            400,
            "relaxspec.params",
            "theta",
        ),
        ("completions", {"prompt": "w1", "relaxspec": {"params": {"k": "8"}}}, 400, "relaxspec.params", "k"),
        ("completions", {"prompt": "w1", "relaxspec": {"methd": "ar"}}, 400, "relaxspec.methd", "xtra"),
        ("completions", {"prompt": "w1", "model": "gpt-4"}, 404, "model", "not found"),
        ("chat", {"messages": []}, 400, "messages", "at least 1"),
        ("chat", {"messages": [{"role": "tool", "content": "w1"}]}, 400, "messages.0.role", "'user'"),
        ("chat", {"messages": [{"role": "user", "content": LONG_PROMPT}]}, 400, "messages", "context window"),
        ("chat", {"messages": [{"role": "user", "content": "w1"}], "max_tokens": 500}, 400, "max_tokens", ""),
        (
            "chat",
            {"messages": [{"role": "user", "content": "w1"}], "max_completion_tokens": 500},
            400,
            "max_completion_tokens",
            "too large",
        ),
        (
            "chat",
            b'{"messages": [{"role": "user", "content": "\\udfff"}]}',
            400,
            "messages.0.content",
            "Unicode",
        ),
    ],
)
def test_bad_input_is_a_4xx_json_error(url, path, body, status, param, message):
    kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
    endpoint = "chat/completions" if path == "chat" else "completions"
    r = httpx.post(f"{url}/v1/{endpoint}", headers={"content-type": "application/json"}, **kwargs)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert message in error["message"]
    assert_serving(url)


def test_bad_input_streaming_is_still_a_4xx(url):
    body = {"prompt": "w1", "stream": True, "relaxspec": {"method": "nope"}}
    with httpx.stream("POST", f"{url}/v1/completions", json=body) as r:
        assert r.status_code == 400
        assert json.loads(r.read())["error"]["param"] == "relaxspec.method"


def test_unknown_route_is_json(url):
    r = httpx.get(f"{url}/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


# --- concurrency and batch equivalence --------------------------------------------------------

PROMPTS = ["w1", "w2 w3", "w4 w5 w6", "w7 w0 w1 w2", "w3 w3", "w6 w5 w4 w3 w2", "w0", "w2 w7 w1"]
LENGTHS = [5, 9, 13, 17, 21, 25, 29, 33]


async def _gather(url: str, requests: list[dict]) -> list:
    client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
    async with client:
        return await asyncio.gather(*(client.completions.create(model=MODEL, **r) for r in requests))


@pytest.mark.parametrize("method", ["nsd", "ar"])
@pytest.mark.parametrize("sampling", [{"temperature": 0}, {"temperature": 1.0, "seed": 7}])
def test_batch_equivalence(url, client, method, sampling):
    """8 concurrent requests (different prompts and lengths) = the same 8 requests one at a time.

    Greedy: token-identical; sampling with a seed: identical to running alone with that seed.
    """
    requests = [
        {"prompt": p, "max_tokens": n, "extra_body": {"relaxspec": {"method": method}}, **sampling}
        for p, n in zip(PROMPTS, LENGTHS, strict=True)
    ]
    sequential = [client.completions.create(model=MODEL, **r) for r in requests]
    concurrent = asyncio.run(_gather(url, requests))
    for seq, con in zip(sequential, concurrent, strict=True):
        assert con.choices[0].text == seq.choices[0].text
        assert con.choices[0].finish_reason == seq.choices[0].finish_reason
        assert con.usage.completion_tokens == seq.usage.completion_tokens


def test_many_concurrent_requests_all_succeed(url):
    requests = [
        {"prompt": PROMPTS[i % 8], "max_tokens": 8, "temperature": 1.0, "seed": i, "stream": i % 2 == 0}
        for i in range(24)
    ]

    async def run() -> list[str | None]:
        client = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        async with client:

            async def one(r: dict) -> str | None:
                out = await client.completions.create(model=MODEL, **r)
                if r["stream"]:
                    chunks = [c async for c in out if c.choices]
                    return chunks[-1].choices[0].finish_reason
                return out.choices[0].finish_reason

            return await asyncio.gather(*(one(r) for r in requests))

    finish_reasons = asyncio.run(run())  # raises if any request failed
    assert len(finish_reasons) == 24 and set(finish_reasons) <= {"stop", "length"}


# --- metrics ----------------------------------------------------------------------------------


def test_metrics(url, client):
    complete(client, "w1 w2", max_tokens=6, extra_body={"relaxspec": {"method": "sd"}})
    httpx.post(f"{url}/v1/completions", json={"prompt": ""})
    text = httpx.get(f"{url}/metrics").text
    for name in (
        'relaxspec_http_requests_total{endpoint="completions",status="200"}',
        'relaxspec_http_requests_total{endpoint="completions",status="400"}',
        'relaxspec_completion_tokens_total{method="sd"}',
        'relaxspec_verifier_calls_total{method="sd"}',
        'relaxspec_draft_calls_total{method="sd"}',
        'relaxspec_tau{method="sd"}',
        "relaxspec_active_sequences 0.0",
        "relaxspec_queued_requests 0.0",
        'relaxspec_request_latency_seconds_bucket{le="+Inf",method="sd"}',
        'relaxspec_time_to_first_token_seconds_count{method="sd"}',
        'relaxspec_pool_requests_total{outcome="completed"}',
    ):
        assert name in text, name
    tau = next(line for line in text.splitlines() if line.startswith('relaxspec_tau{method="sd"}'))
    assert float(tau.split()[-1]) >= 1.0


# --- overload, disconnects, internal errors: a pool whose requests can be held or made to fail ---


class ControlledPool(ServingPool):
    """Generations wait at each chunk while ``gate`` is closed; a prompt containing "boom" crashes."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gate = threading.Event()
        self.gate.set()
        self.held = threading.Event()
        self.cancels: list[threading.Event] = []

    def submit(self, prompt, sampling, method=None, method_params=None, on_chunk=None, cancel=None):
        if isinstance(prompt, str) and "boom" in prompt:
            raise RuntimeError("simulated failure")
        self.cancels.append(cancel)

        def hook(text, ids):
            if on_chunk is not None:
                on_chunk(text, ids)
            self.held.set()
            assert self.gate.wait(timeout=30)

        return super().submit(prompt, sampling, method, method_params, hook, cancel)


@pytest.fixture(scope="module")
def controlled(models):
    pool = ControlledPool(models, "ar", max_concurrency=1, max_queue=0)
    with BackgroundServer(_app(pool, models, poll_interval=0.02)) as url:
        yield url, pool


@pytest.fixture
def held(controlled):
    """The controlled server with its gate closed for the test (always reopened afterwards)."""
    url, pool = controlled
    pool.gate.clear()
    pool.held.clear()
    yield url, pool
    pool.gate.set()
    deadline = time.monotonic() + 10
    while pool.active and time.monotonic() < deadline:
        time.sleep(0.01)


def _wait_for(condition, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.01)
    return False


def test_overload_is_429_with_retry_after(held):
    url, pool = held
    busy = threading.Thread(
        target=httpx.post,
        args=(f"{url}/v1/completions",),
        kwargs={"json": {"prompt": "w1", "max_tokens": 4}, "timeout": 60},
    )
    busy.start()
    assert pool.held.wait(10)
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.RateLimitError) as info:
        client.completions.create(model=MODEL, prompt="w2", max_tokens=4)
    assert info.value.status_code == 429
    assert info.value.response.headers["retry-after"] == "1"
    assert info.value.body["code"] == "server_overloaded"
    stream = httpx.post(f"{url}/v1/completions", json={"prompt": "w2", "stream": True})
    assert stream.status_code == 429  # also before a stream starts
    pool.gate.set()
    busy.join(30)
    assert pool.stats.rejected >= 2
    assert_serving(url)


def test_streaming_client_disconnect_cancels(held):
    url, pool = held
    cancelled_before, n = pool.stats.cancelled, len(pool.cancels)
    body = {"prompt": "w1", "max_tokens": 40, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=30) as r:
        assert r.status_code == 200  # the stream started (at the first committed chunk), then we leave
    assert _wait_for(lambda: pool.cancels[n].is_set()), "disconnect not noticed"
    pool.gate.set()
    assert _wait_for(lambda: pool.stats.cancelled == cancelled_before + 1)
    assert_serving(url)


def test_client_disconnect_cancels_a_waiting_request(held):
    url, pool = held
    cancelled_before, n = pool.stats.cancelled, len(pool.cancels)
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"prompt": "w1", "max_tokens": 40, "ignore_eos": True}).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(f"{head}Content-Length: {len(body)}\r\n\r\n".encode() + body)
        assert pool.held.wait(10)  # generating, and held at its first chunk
    assert _wait_for(lambda: pool.cancels[n].is_set()), "disconnect not noticed"
    pool.gate.set()
    assert _wait_for(lambda: pool.stats.cancelled == cancelled_before + 1)
    assert_serving(url)


def test_internal_error_is_500_for_that_request_only(controlled):
    url, _ = controlled
    for stream in (False, True):
        r = httpx.post(f"{url}/v1/completions", json={"prompt": "boom", "stream": stream})
        assert r.status_code == 500
        error = r.json()["error"]
        assert error["type"] == "server_error" and error["message"] == "internal error"
        assert "simulated" not in r.text and "RuntimeError" not in r.text  # no internals leak
        assert_serving(url)

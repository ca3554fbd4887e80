"""Issue 36: every request parameter of the own-engine server is honoured or refused with a 400
naming it, tiny temperatures and top-p are 400s (not 500s), and ``GET /v1/models/{id}`` works."""

from __future__ import annotations

import httpx
import openai
import pytest

from relaxspec.methods import ModelSet
from relaxspec.models import load_model
from relaxspec.serve.pool import ServingPool
from relaxspec.serve.server import BackgroundServer, create_app

MODEL = "tiny"


@pytest.fixture(scope="module")
def url(model_dirs):
    target, draft = model_dirs
    models = ModelSet(target=load_model(target), draft=load_model(draft))
    pool = ServingPool(models, "nsd", {"k": 4, "theta": 0.9}, max_concurrency=4, max_queue=16)
    app = create_app(pool, MODEL, models.target.tokenizer, models.target.context_length)
    with BackgroundServer(app) as base:
        yield base


def post(url: str, body: dict, endpoint: str = "completions") -> httpx.Response:
    if endpoint == "chat":
        body = {"messages": [{"role": "user", "content": "w1"}], **body}
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
    return httpx.post(f"{url}/v1/completions", json={"prompt": "w1 w2", **body}, timeout=60)


def assert_400(r: httpx.Response, param: str, needle: str) -> None:
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert needle in error["message"], error


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
@pytest.mark.parametrize(
    "field,value",
    [
        ("repetition_penalty", 1.2),
        ("response_format", {"type": "json_object"}),
        ("min_p", 0.1),
        ("min_tokens", 3),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -0.5),
        ("logit_bias", {"5": 10}),
        ("guided_json", {"type": "object"}),  # a field this server does not know at all
        ("max_tokenz", 4),  # a typo is refused too, never silently dropped
    ],
)
def test_unhonoured_parameter_is_a_400_naming_it(url, endpoint, field, value):
    r = post(url, {"max_tokens": 3, "temperature": 0, field: value}, endpoint)
    assert_400(r, field, field)


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_off_values_are_accepted(url, endpoint):
    """The "off" value of each refused feature is honoured (it asks for nothing)."""
    off = {
        "repetition_penalty": 1.0,
        "response_format": {"type": "text"},
        "min_p": 0,
        "min_tokens": 0,
        "presence_penalty": 0,
        "frequency_penalty": 0.0,
        "logit_bias": {},
        "user": "someone",
    }
    r = post(url, {"max_tokens": 3, "temperature": 0, **off}, endpoint)
    assert r.status_code == 200, r.text
    plain = post(url, {"max_tokens": 3, "temperature": 0}, endpoint)
    key = "text" if endpoint == "completions" else "message"
    assert r.json()["choices"][0][key] == plain.json()["choices"][0][key]


def test_vllm_bench_serve_payload_is_accepted(url):
    """`vllm bench serve --backend openai` sends repetition_penalty=1.0 and logprobs=null."""
    body = {"model": MODEL, "repetition_penalty": 1.0, "max_tokens": 4, "logprobs": None, "ignore_eos": True}
    r = post(url, {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert r.status_code == 200, r.text
    assert "data: [DONE]" in r.text


@pytest.mark.parametrize(
    "field,value", [("temperature", 1e-300), ("temperature", 1e-40), ("top_p", 1e-300), ("top_p", 1e-9)]
)
def test_tiny_sampling_values_are_a_400(url, field, value):
    r = post(url, {"max_tokens": 3, field: value})
    assert_400(r, field, field)
    assert post(url, {"max_tokens": 3, "temperature": 0}).status_code == 200  # still serving


def test_retrieve_model(url):
    r = httpx.get(f"{url}/v1/models/{MODEL}")
    assert r.status_code == 200, r.text
    assert r.json() == httpx.get(f"{url}/v1/models").json()["data"][0]
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    assert client.models.retrieve(MODEL).id == MODEL


@pytest.mark.parametrize("model_id", ["gpt-4", "org/tiny", "tiny2"])
def test_retrieve_unknown_model_is_a_404(url, model_id):
    r = httpx.get(f"{url}/v1/models/{model_id}")
    assert r.status_code == 404, r.text
    error = r.json()["error"]
    assert error == {
        "message": error["message"],
        "type": "invalid_request_error",
        "param": "model",
        "code": "model_not_found",
    }
    assert model_id in error["message"]

"""Issue 36: the OpenAI logprobs surface of the own-engine server (what lm-evaluation-harness
needs): ``logprobs`` / ``top_logprobs`` are the target's raw log-softmax at every emitted position
for AR and the speculative methods alike, ``echo`` with ``max_tokens: 0`` gives the prompt's
log-likelihood, several prompts per request come back as choices in prompt order, and bad values
are 400s naming the parameter."""

from __future__ import annotations

import json
import math

import httpx
import openai
import pytest
import torch

from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.logprobs import LogprobRecorder
from relaxspec.methods import ModelSet
from relaxspec.models import LoadedModel
from relaxspec.serve.pool import ServingPool
from relaxspec.serve.server import BackgroundServer, create_app

MODEL = "tiny"
PROMPTS = ["w1 w2 w3", "w4 w0", "w2 w2 w5 w6 w1"]


@pytest.fixture(scope="module")
def models(target, unrelated_draft, block):
    """A draft that the target rejects often: cycles end at every position of the block."""
    return ModelSet(target=target, draft=unrelated_draft, block=block)


@pytest.fixture(scope="module")
def url(models):
    pool = ServingPool(models, "nsd", {"k": 4, "theta": 0.9}, max_concurrency=4, max_queue=16)
    app = create_app(pool, MODEL, models.target.tokenizer, models.target.context_length)
    with BackgroundServer(app) as base:
        yield base


def post(url: str, body: dict, endpoint: str = "completions") -> httpx.Response:
    path = "chat/completions" if endpoint == "chat" else "completions"
    return httpx.post(f"{url}/v1/{path}", json=body, timeout=120)


def ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def ids_of(models: ModelSet, texts: list[str]) -> list[int]:
    """Token texts back to ids (the tiny word-level vocabulary's texts are distinct)."""
    tok = models.target.tokenizer
    by_text = {tok.decode([i]): i for i in range(len(tok))}
    return [by_text[t] for t in texts]


def direct_logprobs(target: LoadedModel, ids: list[int]) -> torch.Tensor:
    """``log_softmax`` of one plain forward over ``ids``: row i is the law of token i + 1."""
    with torch.no_grad():
        logits = target.model(torch.tensor([ids])).logits[0].double()
    return torch.log_softmax(logits, dim=-1)


def method(name: str, **params) -> dict:
    return {"relaxspec": {"method": name, "params": params}}


# (method, parameters, temperature, top_p, seed): the logprobs are the raw target's whatever the
# sampling parameters (vLLM's default), so a tempered, truncated request reports them too.
CASES = [
    ("ar", {}, 0.0, 1.0, None),
    ("sd", {"k": 4}, 1.0, 1.0, 7),
    ("sd", {"k": 4}, 0.7, 0.8, 5),
    ("nsd", {"k": 4, "theta": 0.9}, 0.0, 1.0, None),
    ("nsd", {"k": 4, "theta": 0.9}, 1.0, 1.0, 11),
]


@pytest.mark.parametrize("name,params,temperature,top_p,seed", CASES)
def test_logprobs_are_the_targets_log_softmax_at_each_emitted_token(
    url, models, name, params, temperature, top_p, seed
):
    body = {"prompt": PROMPTS[2], "max_tokens": 24, "logprobs": 3, "temperature": temperature, "seed": seed}
    body["top_p"] = top_p
    out = ok(post(url, {**body, "ignore_eos": True, **method(name, **params)}))
    choice, usage = out["choices"][0], out["usage"]
    lp = choice["logprobs"]
    n_new = usage["completion_tokens"]
    assert n_new == 24 and len(lp["tokens"]) == n_new
    if name != "ar":  # drafts accepted and rejected: cycles emitted chunks of several lengths
        stats = usage["relaxspec"]
        assert 0 < stats["accepted_tokens"] < stats["proposed_tokens"]
        assert stats["verifier_calls"] < n_new
    prompt_ids = models.target.tokenizer(PROMPTS[2])["input_ids"]
    emitted = ids_of(models, lp["tokens"])
    logp = direct_logprobs(models.target, prompt_ids + emitted)
    rows = logp[len(prompt_ids) - 1 : -1]  # the law of each emitted token
    expected = rows.gather(-1, torch.tensor(emitted)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(lp["token_logprobs"], dtype=torch.float64), expected, atol=1e-4)
    for row, top, token, own in zip(
        rows, lp["top_logprobs"], lp["tokens"], lp["token_logprobs"], strict=True
    ):
        values, best = row.topk(3)
        want = dict(zip(ids_of(models, list(top)), top.values(), strict=True))
        for i, v in zip(best.tolist(), values.tolist(), strict=True):
            assert math.isclose(want[i], v, abs_tol=1e-4)
        assert top[token] == own  # the chosen token is always listed
        assert len(top) in (3, 4)
    offsets = [0]
    for t in lp["tokens"][:-1]:
        offsets.append(offsets[-1] + len(t))
    assert lp["text_offset"] == offsets


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_echo_gives_the_prompt_log_likelihood(url, models, max_tokens):
    """lm-eval's loglikelihood request (echo, logprobs 1, max_tokens 1; or 0) on token ids."""
    prompt_ids = models.target.tokenizer(PROMPTS[0])["input_ids"]
    body = {"prompt": prompt_ids, "echo": True, "logprobs": 1, "max_tokens": max_tokens, "temperature": 0}
    out = ok(post(url, body))
    lp = out["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(prompt_ids) + max_tokens
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    logp = direct_logprobs(models.target, prompt_ids)
    want = sum(logp[i, prompt_ids[i + 1]].item() for i in range(len(prompt_ids) - 1))
    got = sum(lp["token_logprobs"][1 : len(prompt_ids)])
    assert math.isclose(got, want, abs_tol=1e-4)
    assert out["usage"]["completion_tokens"] == max_tokens
    assert out["usage"]["prompt_tokens"] == len(prompt_ids)
    text = out["choices"][0]["text"]
    assert text.startswith(models.target.tokenizer.decode(prompt_ids))
    if max_tokens == 0:
        assert text == models.target.tokenizer.decode(prompt_ids)
        assert out["choices"][0]["finish_reason"] == "length"


def test_echo_of_a_text_prompt_with_the_openai_client(url, models):
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    out = client.completions.create(
        model=MODEL,
        prompt=PROMPTS[1],
        max_tokens=3,
        echo=True,
        logprobs=2,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    choice = out.choices[0]
    assert choice.text.startswith(PROMPTS[1])
    n_prompt = out.usage.prompt_tokens
    assert len(choice.logprobs.tokens) == n_prompt + 3
    assert choice.logprobs.token_logprobs[0] is None
    assert all(v <= 0 for v in choice.logprobs.token_logprobs[1:])


def assert_same_logprobs(a: dict, b: dict) -> None:
    """Equal tokens and offsets, logprobs equal up to the rounding of batched forwards."""
    assert a["tokens"] == b["tokens"] and a["text_offset"] == b["text_offset"]
    assert a["token_logprobs"] == pytest.approx(b["token_logprobs"], abs=1e-5)
    for x, y in zip(a["top_logprobs"], b["top_logprobs"], strict=True):
        assert x == pytest.approx(y, abs=1e-5)


def test_several_prompts_come_back_in_order(url, models):
    """A list of texts and a list of token-id lists: choice i is what prompt i gives alone."""
    tok = models.target.tokenizer
    for prompts in (PROMPTS, [tok(p)["input_ids"] for p in PROMPTS]):
        body = {"prompt": prompts, "max_tokens": 6, "temperature": 0, "logprobs": 1}
        out = ok(post(url, body))
        assert [c["index"] for c in out["choices"]] == [0, 1, 2]
        alone = [ok(post(url, {**body, "prompt": p})) for p in prompts]
        for many, one in zip(out["choices"], alone, strict=True):
            assert many["text"] == one["choices"][0]["text"]
            assert_same_logprobs(many["logprobs"], one["choices"][0]["logprobs"])
        assert out["usage"]["prompt_tokens"] == sum(len(tok(p)["input_ids"]) for p in PROMPTS)
        assert out["usage"]["completion_tokens"] == sum(one["usage"]["completion_tokens"] for one in alone)


def test_several_prompts_with_echo_zero_tokens(url, models):
    """lm-eval's batched loglikelihood: each choice holds its own prompt's tokens."""
    tok = models.target.tokenizer
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    out = ok(post(url, {"prompt": prompts, "echo": True, "logprobs": 0, "max_tokens": 0}))
    for choice, ids in zip(out["choices"], prompts, strict=True):
        assert ids_of(models, choice["logprobs"]["tokens"]) == ids
        assert choice["logprobs"]["top_logprobs"][1] == {
            choice["logprobs"]["tokens"][1]: choice["logprobs"]["token_logprobs"][1]
        }


def events(r: httpx.Response) -> list[dict]:
    assert r.status_code == 200, r.text
    lines = [line[len("data: ") :] for line in r.text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("echo", [False, True])
def test_streamed_logprobs_match_the_whole_answer(url, echo):
    body = {"prompt": PROMPTS[2], "max_tokens": 12, "logprobs": 2, "temperature": 0, "echo": echo}
    whole = ok(post(url, body))["choices"][0]
    chunks = events(post(url, {**body, "stream": True}))
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["logprobs"]]
    merged = {key: [x for part in parts for x in part[key]] for key in parts[0]}
    assert merged == whole["logprobs"]
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["text"]


def test_chat_logprobs(url, models):
    body = {
        "messages": [{"role": "user", "content": "w1 w2"}],
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    out = ok(post(url, body, "chat"))
    content = out["choices"][0]["logprobs"]["content"]
    assert len(content) == out["usage"]["completion_tokens"] > 0
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert len(entry["top_logprobs"]) == 2
        assert entry["top_logprobs"][0]["logprob"] >= entry["top_logprobs"][1]["logprob"]
        assert entry["logprob"] <= entry["top_logprobs"][0]["logprob"] + 1e-9
        assert entry["bytes"] == list(entry["token"].encode())
    streamed = events(post(url, {**body, "stream": True}, "chat"))
    pieces = [c["choices"][0]["logprobs"]["content"] for c in streamed if c["choices"][0].get("logprobs")]
    assert [e for piece in pieces for e in piece] == content
    plain = ok(post(url, {**body, "logprobs": None, "top_logprobs": None}, "chat"))
    assert plain["choices"][0]["logprobs"] is None
    assert plain["choices"][0]["message"] == out["choices"][0]["message"]


def assert_400(r: httpx.Response, param: str) -> None:
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()


@pytest.mark.parametrize(
    "body,param",
    [
        ({"logprobs": 21}, "logprobs"),
        ({"logprobs": -1}, "logprobs"),
        ({"logprobs": True}, "logprobs"),
        ({"logprobs": 2.5}, "logprobs"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"max_tokens": -1}, "max_tokens"),
        ({"echo": "yes"}, "echo"),
        ({"prompt": ["w1", "w2"], "stream": True}, "stream"),
        ({"prompt": ["w1", ""]}, "prompt"),
        ({"prompt": ["w1"] * 65}, "prompt"),
        ({"logprobs": 1, **method("prove")}, "logprobs"),  # verified by the small draft model
        ({"logprobs": 1, **method("mars")}, "logprobs"),  # no verifier
        ({"echo": True, "max_tokens": 0, "logprobs": 0, **method("prove")}, "logprobs"),
    ],
)
def test_bad_completion_values_are_a_400_naming_them(url, body, param):
    assert_400(post(url, {"prompt": "w1 w2", "max_tokens": 2, **body}), param)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
        ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
        ({"top_logprobs": 2}, "top_logprobs"),
        ({"logprobs": 1}, "logprobs"),
    ],
)
def test_bad_chat_values_are_a_400_naming_them(url, body, param):
    messages = [{"role": "user", "content": "w1"}]
    assert_400(post(url, {"messages": messages, "max_tokens": 2, **body}, "chat"), param)


def test_echo_without_logprobs_works_for_any_method(url):
    out = ok(post(url, {"prompt": "w1 w2", "max_tokens": 2, "echo": True, **method("prove")}))
    assert out["choices"][0]["text"].startswith("w1 w2")
    assert out["choices"][0]["logprobs"] is None


@pytest.mark.parametrize("name", ["ar", "sd"])
def test_the_eos_that_ends_a_completion_has_its_logprob(url, models, name):
    """As in vLLM, the EOS token that ended the completion is among the logprobs (without text):
    lm-eval's loglikelihood drops the last token of a max_tokens=1 answer, assuming there is one."""
    tok = models.target.tokenizer
    eos_text = tok.decode([tok.eos_token_id])
    ended = 0
    for prompt in ["w2", "w6 w6", "w3 w2", "w1 w4"]:  # the tiny target ends the first three at once
        body = {"prompt": prompt, "max_tokens": 40, "temperature": 0, "logprobs": 1, **method(name)}
        out = ok(post(url, body))
        lp, stats = out["choices"][0]["logprobs"], out["usage"]["relaxspec"]
        if stats["finish_reason"] != "eos":
            assert len(lp["tokens"]) == out["usage"]["completion_tokens"]
            continue
        ended += 1
        assert len(lp["tokens"]) == out["usage"]["completion_tokens"] + 1
        assert lp["tokens"][-1] == eos_text
        ids = tok(prompt)["input_ids"] + ids_of(models, lp["tokens"])
        logp = direct_logprobs(models.target, ids)
        assert math.isclose(lp["token_logprobs"][-1], logp[-2, tok.eos_token_id].item(), abs_tol=1e-4)
        streamed = events(post(url, {**body, "stream": True}))
        parts = [c["choices"][0]["logprobs"] for c in streamed if c["choices"][0]["logprobs"]]
        assert [t for part in parts for t in part["tokens"]] == lp["tokens"]
    assert ended >= 2


@pytest.mark.parametrize("batching", [False, True])
def test_pool_records_prompt_and_emitted_logprobs(models, batching):
    """Through the pool alone, each request decoded by itself or in the shared batch: the prompt's
    logprobs (from its prefill) and the emitted tokens' (from the verifier forwards) are the
    target's, and the prompt-only recorder asks for no other forward than the generation's."""
    pool = ServingPool(models, "nsd", {"k": 4, "theta": 0.9}, batching=batching)
    ids = models.target.tokenizer(PROMPTS[2])["input_ids"]
    sampling = SamplingParams(temperature=1.0, seed=3, max_new_tokens=16, ignore_eos=True)
    recorder = LogprobRecorder(2, prompt=True)
    result = pool.submit(ids, sampling, logprobs=recorder)
    plain = pool.submit(ids, sampling)
    assert result.tokens == plain.tokens  # recording changes nothing
    assert result.stats.verifier_calls == plain.stats.verifier_calls
    assert recorder.generated.tokens == result.tokens
    logp = direct_logprobs(models.target, ids + result.tokens)
    want = logp[:-1].gather(-1, torch.tensor(ids[1:] + result.tokens)[:, None]).squeeze(-1)
    got = recorder.prompt_logprobs.logprobs[1:] + recorder.generated.logprobs
    assert recorder.prompt_logprobs.logprobs[0] is None
    assert torch.allclose(torch.tensor(got, dtype=torch.float64), want, atol=1e-4)
    top = logp[:-1].topk(2)
    tops = recorder.prompt_logprobs.top[1:] + recorder.generated.top
    assert [[i for i, _ in t] for t in tops] == top.indices.tolist()

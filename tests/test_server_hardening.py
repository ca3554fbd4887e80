"""Issue 17, the server under attack: limits, isolation and authentication (docs/design.md §7).

- method parameters have upper bounds (shared by the CLI, the benchmark and the server), and no
  value of any type makes validation raise anything but a RelaxSpecError;
- request bodies are capped (413) while the event loop keeps answering;
- malformed input that used to be a 500 is a 400 with a JSON error that leaks no internals;
- an API key guards the endpoints (401), ``/health`` excepted;
- one request with adversarial parameters cannot slow a normal one down by more than 2×;
- a forward that fails for one row of a batch fails only that row's request;
- a cancelled request leaves within one engine cycle.
"""

from __future__ import annotations

import json
import math
import statistics
import threading
import time

import httpx
import openai
import pytest

from relaxspec.errors import RelaxSpecError
from relaxspec.methods import ModelSet, method_names, resolve_params
from relaxspec.models import LoadedModel
from relaxspec.params import MAX_COUNT, MAX_DRAFT_TOKENS, MAX_DRAFT_WORK
from relaxspec.serve.pool import ServingPool
from relaxspec.serve.server import BackgroundServer, create_app
from relaxspec.testing import perturbed_copy
from relaxspec.train.diffusion import mark_drafter

# --- method parameter bounds --------------------------------------------------------------------

NASTY_VALUES = [
    None, True, -1, 0, 2**31, 2**70, 10**4000, -(2**70), 1.5, -0.5, math.nan, math.inf, 1e308, "x",
    "\ud800", "a" * 10_000, "", [], [1], {}, {"a": 1}, b"x", object(),
]  # fmt: skip


@pytest.mark.parametrize("method", method_names())
def test_no_parameter_value_escapes_validation(method):
    """Every parameter of every preset, set to every nasty value: accepted, or a RelaxSpecError
    (never a TypeError / OverflowError / ... that the server would turn into a 500)."""
    from relaxspec.methods import get_method

    for name in get_method(method).params:
        for value in NASTY_VALUES:
            try:
                resolve_params(method, {name: value})
            except RelaxSpecError as err:
                assert len(str(err)) < 600
                str(err).encode("utf-8")  # the message itself is always encodable
    with pytest.raises(RelaxSpecError, match="no parameter"):
        resolve_params(method, {"\ud800": 1, "x" * 10_000: 2, "a": 3, "b": 4, "c": 5})


@pytest.mark.parametrize(
    "method,params,match",
    [
        ("sd", {"k": MAX_DRAFT_TOKENS + 1}, "k "),
        ("nsd", {"k": 10**6}, "k "),
        ("topk", {"accept_k": MAX_COUNT + 1}, "accept_k"),
        ("sdd", {"gamma": 300, "steps": 300}, "gamma"),
        ("sdd", {"gamma": 64, "steps": 65}, "steps"),
        ("sdd", {"steps": 300}, "steps"),
        ("sdd", {"gamma": 64, "steps": 64}, "drafter positions per cycle"),
        ("sdd", {"accept": "topk", "accept_k": 2**30}, "accept_k"),
        ("sdd-skip", {"s_max": MAX_COUNT + 1}, "s_max"),
        ("sdd-skip", {"k_min": 100}, "k_min"),
        ("sdd-skip", {"signal_tau": "high"}, "signal_tau"),
        ("sdd-periodic", {"period": 2**30}, "period"),
        ("sdd-periodic", {"skip_k": 65}, "skip_k"),
        ("prove-lossless", {"block_size": 65}, "block_size"),
        ("mars", {"block_size": 2**40}, "block_size"),
    ],
)
def test_parameter_upper_bounds(method, params, match):
    with pytest.raises(RelaxSpecError, match=match):
        resolve_params(method, params)


def test_bounds_leave_the_documented_operating_points():
    resolve_params("nsd", {"k": MAX_DRAFT_TOKENS})
    resolve_params("sdd", {"gamma": 32, "steps": 32})  # the diffusion sweep's largest point
    resolve_params("sdd", {"gamma": MAX_DRAFT_TOKENS, "steps": MAX_DRAFT_WORK // MAX_DRAFT_TOKENS})
    resolve_params("sdd-skip", {"gamma": 32, "k_min": 6, "s_max": 64})
    resolve_params("prove-lossless", {"block_size": 32})


# --- a server with the tiny target, draft and diffusion drafter -------------------------------------

MODEL = "tiny"
API_KEY = "s3cret-key"


@pytest.fixture(scope="module")
def models(target, draft) -> ModelSet:
    diffusion = perturbed_copy(target.model, noise=0.2, seed=9)
    mark_drafter(diffusion, 8, 2)
    return ModelSet(target=target, draft=draft, diffusion=LoadedModel(diffusion, target.tokenizer, None))


def _app(pool: ServingPool, models: ModelSet, **kwargs):
    return create_app(pool, MODEL, models.target.tokenizer, models.target.context_length, **kwargs)


@pytest.fixture(scope="module")
def served(models):
    pool = ServingPool(models, "nsd", {"k": 4, "theta": 0.9}, max_concurrency=8, max_queue=16)
    app = _app(pool, models)
    with BackgroundServer(app) as url:
        yield url, pool, app


@pytest.fixture(scope="module")
def url(served) -> str:
    return served[0]


def post(url: str, body: dict | bytes, endpoint: str = "completions", **kwargs) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers = {"content-type": "application/json", **kwargs.pop("headers", {})}
    return httpx.post(f"{url}/v1/{endpoint}", content=content, headers=headers, timeout=60, **kwargs)


def assert_serving(url: str) -> None:
    r = post(url, {"prompt": "w1", "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200, r.text


class HealthProbe:
    """Times ``GET /health`` back to back in a thread while something else happens."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.latencies: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as client:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                try:
                    ok = client.get(f"{self.url}/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                self.latencies.append(time.perf_counter() - t0 if ok else math.inf)
                time.sleep(0.02)

    def __enter__(self) -> HealthProbe:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


# --- body size and the event loop ------------------------------------------------------------------

BIG = 20 * 1024 * 1024


def _big_body() -> bytes:
    return b'{"prompt": "' + b"w1 " * (BIG // 3) + b'"}'


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
def test_20_mib_body_is_413_while_health_answers(url, framing):
    body = _big_body()
    out: dict[str, httpx.Response] = {}

    def chunks():
        for i in range(0, len(body), 256 * 1024):
            yield body[i : i + 256 * 1024]
            time.sleep(0.001)

    def send() -> None:
        content = body if framing == "content-length" else chunks()
        out["r"] = httpx.post(
            f"{url}/v1/completions", content=content, headers={"content-type": "application/json"}, timeout=60
        )

    with HealthProbe(url) as probe:
        sender = threading.Thread(target=send)
        sender.start()
        sender.join(60)
        time.sleep(0.1)
    r = out["r"]
    assert r.status_code == 413, r.text
    assert r.json()["error"]["code"] == "request_too_large"
    assert len(probe.latencies) >= 3 and max(probe.latencies) < 1.0, probe.latencies
    assert_serving(url)


def test_tokenizing_a_big_prompt_does_not_block_the_event_loop(url):
    """Just under the 2 MiB cap: ~650k tokens, refused on a worker thread after counting a few
    context-sized slices of it (issue 35: no longer all of it, which took about a second)."""
    body = b'{"prompt": "' + b"w1 " * (1_900_000 // 3) + b'"}'
    statuses: list[int] = []

    def send() -> None:
        r = post(url, body)
        statuses.append(r.status_code)
        assert r.json()["error"]["code"] == "context_length_exceeded"

    with HealthProbe(url) as probe:
        senders = [threading.Thread(target=send) for _ in range(2)]
        for t in senders:
            t.start()
        for t in senders:
            t.join(120)
    assert statuses == [400, 400]  # longer than the context window
    assert probe.latencies and max(probe.latencies) < 1.0, probe.latencies


def test_max_body_bytes_is_configurable(models):
    pool = ServingPool(models, "ar", max_concurrency=1, max_queue=1)
    with BackgroundServer(_app(pool, models, max_body_bytes=4096)) as small:
        assert post(small, {"prompt": "w1 " * 2000, "max_tokens": 1}).status_code == 413
        assert post(small, {"prompt": "w1 " * 10, "max_tokens": 1}).status_code == 200
    with pytest.raises(RelaxSpecError, match="max_body_bytes"):
        _app(pool, models, max_body_bytes=10)


# --- what used to be a 500 --------------------------------------------------------------------------

LEAKS = ("Traceback", "Error:", "OverflowError", "RecursionError", "ValueError", "TypeError", "Exceeds the")
DEEP = b'{"prompt": "w1", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
SOMEWHAT_DEEP = b'{"prompt": "w1", "x": ' + b"[" * 40 + b"]" * 40 + b"}"


@pytest.mark.parametrize(
    "body,param,message",
    [
        ({"prompt": [2**70]}, "prompt", "less than or equal"),
        ({"prompt": [[0, 2**40]]}, "prompt", "less than or equal"),
        (b'{"prompt": "w1", "max_tokens": ' + b"9" * 5000 + b"}", None, "more than 64 digits"),
        ({"prompt": "w1", "max_tokens": 10**30}, "max_tokens", "less than or equal"),
        ({"prompt": "w1", "top_k": 10**30}, "top_k", "less than or equal"),
        (DEEP, None, "nested too deeply"),
        (SOMEWHAT_DEEP, None, "nested too deeply"),
        (b'{"prompt": "w1", "relaxspec": {"params": {"\\ud800": 1}}}', "relaxspec.params", "Unicode"),
        (b'{"prompt": "w1", "user": "\\udc00"}', "user", "Unicode"),
        (b'{"prompt": "w1", "relaxspec": {"params": {"theta": 1e400}}}', "relaxspec.params", "finite"),
        ({"prompt": "w1", "relaxspec": {"params": {"theta": [0.5]}}}, "relaxspec.params", "a number"),
        (
            {"prompt": "w1", "relaxspec": {"method": "sdd", "params": {"gamma": 300, "steps": 300}}},
            "relaxspec.params",
            "gamma",
        ),
        (
            {"prompt": "w1", "relaxspec": {"method": "sdd-skip", "params": {"signal_tau": "x"}}},
            "relaxspec.params",
            "signal_tau",
        ),
        ({"prompt": "w1", "stop": ["x" * 2000] * 1000}, "stop", "at most 16 stop strings"),
        ({"prompt": "w1", "stop": "x" * 257}, "stop", "at most 256 characters"),
        (b"\xff\xfe\x00{", None, "not valid JSON"),
    ],
)
def test_former_500s_are_400s_without_internals(url, body, param, message):
    r = post(url, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["param"] == param
    assert message in error["message"]
    assert not any(leak in r.text for leak in LEAKS), r.text
    assert_serving(url)


def test_metrics_count_what_the_client_got(url):
    """The non-encodable key used to be a plain-text 500 counted as a 400: both agree now."""

    def count(status: str) -> float:
        text = httpx.get(f"{url}/metrics").text
        prefix = f'relaxspec_http_requests_total{{endpoint="completions",status="{status}"}}'
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(prefix))

    before = count("400")
    r = post(url, b'{"prompt": "w1", "relaxspec": {"params": {"\\ud800": 1}}}')
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert count("400") == before + 1
    before = count("413")
    assert post(url, b"{" + b" " * (3 * 1024 * 1024) + b"}").status_code == 413
    assert count("413") == before + 1


def test_unexpected_errors_are_a_generic_json_500(models, monkeypatch):
    pool = ServingPool(models, "ar", max_concurrency=1, max_queue=1)
    app = _app(pool, models)

    def broken() -> dict:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(app.state.server, "models", broken)
    monkeypatch.setattr(app.state.server.pool, "resolve", lambda *a: (_ for _ in ()).throw(KeyError("k9")))
    with BackgroundServer(app) as base:
        for r in (httpx.get(f"{base}/v1/models"), post(base, {"prompt": "w1"})):
            assert r.status_code == 500
            assert r.json() == {
                "error": {"message": "internal error", "type": "server_error", "param": None,
                          "code": "internal_error"}
            }  # fmt: skip
            assert "secret" not in r.text and "k9" not in r.text


# --- authentication ---------------------------------------------------------------------------------


def test_api_key(models):
    pool = ServingPool(models, "ar", max_concurrency=2, max_queue=2)
    with BackgroundServer(_app(pool, models, api_key=API_KEY)) as base:
        body = {"prompt": "w1", "max_tokens": 2}
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": API_KEY},
                        {"authorization": f"Basic {API_KEY}"}):  # fmt: skip
            r = post(base, body, headers=headers)
            assert r.status_code == 401, headers
            assert r.json()["error"]["code"] == "invalid_api_key"
            assert r.headers["www-authenticate"].startswith("Bearer")
            assert httpx.get(f"{base}/v1/models", headers=headers).status_code == 401
            assert httpx.get(f"{base}/metrics", headers=headers).status_code == 401
        # no body is read before the key is checked: an unauthenticated 20 MiB body is a 401
        assert post(base, _big_body()).status_code == 401
        good = {"authorization": f"Bearer {API_KEY}"}
        assert post(base, body, headers=good).status_code == 200
        assert post(base, body, headers={"authorization": f"bearer  {API_KEY}"}).status_code == 200
        assert httpx.get(f"{base}/v1/models", headers=good).status_code == 200
        assert httpx.get(f"{base}/metrics", headers=good).status_code == 200
        assert httpx.get(f"{base}/health").status_code == 200  # open, for load balancers
        client = openai.OpenAI(base_url=f"{base}/v1", api_key=API_KEY, max_retries=0)
        # (sampled without a seed: the tiny model may stop at once, so no token count is asserted)
        completion = client.completions.create(model=MODEL, prompt="w1", max_tokens=2)
        assert completion.usage.prompt_tokens > 0
        assert completion.choices[0].finish_reason in ("stop", "length")
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=f"{base}/v1", api_key="nope", max_retries=0).models.list()
        text = httpx.get(f"{base}/metrics", headers=good).text
        assert 'relaxspec_http_requests_total{endpoint="completions",status="401"}' in text
    with pytest.raises(RelaxSpecError, match="API key"):
        _app(pool, models, api_key="")


# --- one request with adversarial parameters beside a normal one -------------------------------------

NORMAL = {"prompt": "w1 w2", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
# The heaviest request the bounds allow on this context: the largest diffusion draft per cycle
# (gamma x steps = 64 x 16), the most and longest stop strings, a long prompt, the whole context.
ADVERSARY = {
    "prompt": " ".join(["w3"] * 40),
    "max_tokens": 80,
    "temperature": 0,
    "ignore_eos": True,
    "stop": [(f"w{i} " * 100)[:256] for i in range(16)],
    "relaxspec": {"method": "sdd", "params": {"gamma": 64, "steps": 16}},
}


def _timed(client: httpx.Client, body: dict) -> tuple[float, dict]:
    t0 = time.perf_counter()
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return time.perf_counter() - t0, r.json()


class Adversary:
    """Sends ADVERSARY back to back from a thread until stopped."""

    def __init__(self, url: str, pool: ServingPool, body: dict = ADVERSARY) -> None:
        self.url, self.pool, self.body = url, pool, body
        self.done: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=300) as client:
            while not self._stop.is_set():
                self.done.append(_timed(client, self.body)[1])

    def __enter__(self) -> Adversary:
        jobs = self.pool.batcher.exclusive_jobs
        self._thread.start()
        assert _wait_for(lambda: self.pool.batcher.exclusive_jobs > jobs + 16), "the adversary never started"
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(300)


def _wait_for(condition, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.005)
    return False


def _adversary_ratio(client: httpx.Client, url: str, pool: ServingPool) -> tuple[float, list]:
    """Median latency of NORMAL beside the adversary over its median alone (before and after)."""
    alone = [_timed(client, NORMAL) for _ in range(5)]
    deferrals = pool.batcher.deferrals
    with Adversary(url, pool):
        beside = [_timed(client, NORMAL) for _ in range(5)]
    alone += [_timed(client, NORMAL) for _ in range(3)]
    assert pool.batcher.deferrals > deferrals  # the adversary was there, and held back
    ratio = statistics.median(t for t, _ in beside) / statistics.median(t for t, _ in alone)
    print(f"normal request alone {statistics.median(t for t, _ in alone):.3f}s, beside "
          f"{statistics.median(t for t, _ in beside):.3f}s: {ratio:.2f}x")  # fmt: skip
    return ratio, alone + beside


def test_adversarial_request_keeps_a_normal_one_within_2x(served):
    """Median latency of a normal request (nsd, 32 tokens) alone and beside a back-to-back stream of
    the heaviest request the bounds allow, same process. Before fair scheduling it was ~10x: lockstep
    batching made every step of the normal request wait for a whole 16-forward diffusion draft.

    The best of up to three attempts is judged: the normal request takes ~40 ms alone, so one CPU
    hiccup moves a median (CI once read 2.05x), while a regression slows every attempt."""
    url, pool, _ = served
    ratios, texts = [], set()
    with httpx.Client(base_url=url, timeout=120) as client:
        for _ in range(2):
            _timed(client, NORMAL)  # warm-up
        for _ in range(3):
            ratio, timed = _adversary_ratio(client, url, pool)
            ratios.append(ratio)
            texts |= {out["choices"][0]["text"] for _, out in timed}
            if ratio < 2.0:
                break
    assert min(ratios) < 2.0, ratios
    assert len(texts) == 1  # and the normal request's output did not change (greedy)


# --- one failing row of a batched forward ---------------------------------------------------------------

POISON_AT = 60  # a batched forward that reaches this position fails (a row-specific bug)


def test_a_forward_failing_for_one_row_fails_only_that_request(target, monkeypatch):
    """Layer 1 raises mid-forward (after layer 0 extended the shared KV cache) whenever a row
    reaches position 60: only the long request fails, 20 tokens after it joined; the others,
    batched with it (56 tokens each, never reaching position 60; until the long one joins them,
    their batched steps take 20 ms, so a slow start of its thread under load cannot let them
    finish first), complete with exactly their outputs alone."""
    import torch

    from relaxspec.core.sampling import SamplingParams

    models = ModelSet(target=target)
    prompts = ["w1", "w2 w3", "w4 w5 w6", " ".join(["w7"] * (POISON_AT - 21))]  # the last: 40 tokens
    params = SamplingParams(temperature=0, max_new_tokens=POISON_AT - 4, ignore_eos=True)
    alone_pool = ServingPool(models, "ar", batching=False)
    expected = [alone_pool.submit(p, params).tokens for p in prompts[:3]]

    layer = target.model.model.layers[1]
    original = layer.forward
    failures = []

    joined = threading.Event()

    def poisoned(*args, **kwargs):
        positions = kwargs.get("position_ids")
        if positions is not None and positions.shape[0] == 4:
            joined.set()
        elif positions is not None and positions.shape[0] == 3 and not joined.is_set():
            time.sleep(0.02)  # the three pace themselves until the long one is in their batch
        if positions is not None and int(positions.max()) >= POISON_AT:
            failures.append(int(positions.shape[0]))
            raise RuntimeError("poisoned row")
        return original(*args, **kwargs)

    monkeypatch.setattr(layer, "forward", poisoned)
    pool = ServingPool(models, "ar", batching=True, max_concurrency=8)
    results: list = [None] * 4

    def run(i: int) -> None:
        try:
            results[i] = pool.submit(prompts[i], params).tokens
        except Exception as err:
            results[i] = err

    threads = [threading.Thread(target=run, args=(i,)) for i in range(4)]
    for t in threads[:3]:
        t.start()
    assert _wait_for(lambda: pool.batcher.active == 3 and pool.batcher.steps >= 3)  # decoding
    threads[3].start()  # the long request joins the batch of the three
    for t in threads:
        t.join(120)
    assert isinstance(results[3], RuntimeError) and "poisoned" in str(results[3])
    assert results[:3] == expected
    assert max(failures) > 1  # it failed inside a batched forward of several rows ...
    assert pool.batcher.retried_rows >= 2  # ... whose rows were then re-run one by one
    assert pool.stats.failed == 1 and pool.stats.completed == 3
    assert torch.is_inference_mode_enabled() is False


# --- cancellation ---------------------------------------------------------------------------------------


def test_disconnect_frees_the_slot_within_a_cycle(served):
    """A streamed heavy request (long cycles, held back by fair scheduling beside a normal load) whose
    client leaves after the first chunk gives its slot back within about one engine cycle."""
    url, pool, _ = served
    with httpx.Client(base_url=url, timeout=120) as client:
        _, alone = _timed(client, ADVERSARY)
    usage = alone["usage"]["relaxspec"]
    cycle = usage["seconds"] / usage["cycles"]
    background = Adversary(url, pool, {**NORMAL, "max_tokens": 64})  # a normal load, back to back
    background._thread.start()
    try:
        cancelled = pool.stats.cancelled
        body = {**ADVERSARY, "stream": True}
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            next(r.iter_lines())  # the first chunk: decoding has started; now the client leaves
            left = time.perf_counter()
        assert _wait_for(lambda: pool.stats.cancelled == cancelled + 1, timeout=10)
        freed = time.perf_counter() - left
    finally:
        background._stop.set()
        background._thread.join(120)
    print(f"slot freed {freed:.3f}s after the disconnect; one cycle alone: {cycle:.3f}s, "
          f"the whole request alone: {usage['seconds']:.2f}s")  # fmt: skip
    assert freed < cycle + 0.25, (freed, cycle)
    assert _wait_for(lambda: pool.active == 0)
    assert_serving(url)


def test_cancel_takes_effect_within_one_forward_not_one_cycle(models, monkeypatch):
    """Each drafter forward takes 50 ms, so one sdd cycle (16 of them) takes 0.8 s: a cancel set
    mid-cycle stops the request at its next forward."""
    from relaxspec.core.sampling import SamplingParams
    from relaxspec.engine.proposers.diffusion import DiffusionLM
    from relaxspec.errors import Cancelled

    original = DiffusionLM.forward_block

    def slow(self, *args, **kwargs):
        time.sleep(0.05)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(DiffusionLM, "forward_block", slow)
    pool = ServingPool(models, "sdd", {"gamma": 64, "steps": 16})
    cancel, started, outcome = threading.Event(), threading.Event(), []

    def run() -> None:
        params = SamplingParams(temperature=0, max_new_tokens=60, ignore_eos=True)
        try:
            pool.submit("w1 w2", params, on_chunk=lambda text, ids: started.set(), cancel=cancel)
        except Cancelled as err:
            outcome.append(err)

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(30)  # one cycle done
    time.sleep(0.2)  # in the middle of the next one
    t0 = time.perf_counter()
    cancel.set()
    assert _wait_for(lambda: pool.active == 0, timeout=10)
    freed = time.perf_counter() - t0
    thread.join(30)
    assert outcome and pool.stats.cancelled == 1
    assert freed < 0.3, freed  # one forward (50 ms), not the rest of the 0.8 s cycle


# --- the command line: `serve --api-key/--max-body-bytes`, `loadtest --api-key` --------------------------


@pytest.mark.slow  # spawns a relaxspec server
def test_serve_and_loadtest_api_key(model_dirs, models, tmp_path):
    """A spawned `relaxspec serve` gets the key in its environment (RELAXSPEC_API_KEY) and requires
    it; `relaxspec loadtest --api-key` sends it; the JSON report never contains it."""
    import subprocess
    import sys

    from relaxspec.serve.loadtest import LoadtestConfig, SpawnedServer

    target, draft = model_dirs
    config = LoadtestConfig(
        concurrency=[1], api_key=API_KEY,
        spawn_args=["--target", str(target), "--draft", str(draft), "--max-body-bytes", "4096"],
    )  # fmt: skip
    server = SpawnedServer("ar", config, tmp_path)
    try:
        server.wait_ready(120)  # /health needs no key
        body = {"prompt": "w1", "max_tokens": 2}
        assert post(server.url, body).status_code == 401
        good = {"authorization": f"Bearer {API_KEY}"}
        assert post(server.url, body, headers=good).status_code == 200
        assert post(server.url, {"prompt": "w1 " * 2000}, headers=good).status_code == 413
    finally:
        server.stop()

    pool = ServingPool(models, "nsd", {"k": 4}, max_concurrency=2, max_queue=4)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "w1 w2"}\n')
    out = tmp_path / "lt.json"
    with BackgroundServer(_app(pool, models, api_key=API_KEY)) as base:
        args = [
            sys.executable, "-m", "relaxspec.cli", "loadtest", "--url", base, "--concurrency", "1",
            "--requests", "2", "--max-tokens", "3", "--dataset", str(prompts), "--warmup", "0",
            "--out", str(out),
        ]  # fmt: skip
        refused = subprocess.run(args, capture_output=True, text=True, timeout=180)
        assert refused.returncode == 2 and "401" in out.read_text()
        ok = subprocess.run([*args, "--api-key", API_KEY], capture_output=True, text=True, timeout=180)
        assert ok.returncode == 0, ok.stderr
    report = out.read_text()
    assert json.loads(report)["failed"] == 0 and API_KEY not in report

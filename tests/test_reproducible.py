"""Issue 36: with a seed (or at T = 0) a request's output does not depend on timing or on other
requests, with the adaptive draft length on (docs/server.md, "Reproducibility")."""

from __future__ import annotations

import threading

import pytest

from relaxspec.core.acceptance import Exact, Greedy, Nucleus, TopK
from relaxspec.core.sampling import SamplingParams
from relaxspec.engine.draft_length import needs_fixed_k
from relaxspec.methods import ModelSet, build_engine
from relaxspec.serve.pool import ServingPool

PROMPTS = [f"w{i % 7 + 1} w{(3 * i) % 5 + 2} w{i % 3 + 4}" for i in range(12)]


@pytest.mark.parametrize(
    "rule,params,fixed",
    [
        (Greedy(), SamplingParams(temperature=0), False),  # argmax sequence at every K
        (Greedy(), SamplingParams(temperature=0, seed=3), False),
        (Nucleus(0.9, greedy=True), SamplingParams(temperature=0), True),  # relaxed: drafts matter
        (TopK(2, greedy=True), SamplingParams(temperature=0, seed=1), True),
        (Exact(), SamplingParams(temperature=1.0, seed=7), True),  # the random stream depends on K
        (Nucleus(0.9), SamplingParams(temperature=1.0, seed=7), True),
        (Exact(), SamplingParams(temperature=1.0), False),  # unseeded sampling promises nothing
        (Nucleus(0.9), SamplingParams(temperature=0.7), False),
        (None, SamplingParams(temperature=0, seed=1), False),  # AR: no draft length at all
    ],
)
def test_needs_fixed_k(rule, params, fixed):
    assert needs_fixed_k(rule, params) is fixed


@pytest.fixture(scope="module")
def pool(target, draft):
    return ServingPool(
        ModelSet(target=target, draft=draft), "nsd", {"k": 4, "theta": 0.9},
        max_concurrency=4, max_queue=64, adaptive_k=True, batching=True,
    )  # fmt: skip


def test_pool_keeps_k_fixed_only_where_k_could_change_the_output(pool):
    def policy(method: str, **sampling) -> object:
        params = pool.resolve(method, None)[1]
        engine = build_engine(method, pool.models, **params)
        return pool.draft_length_policy(method, params, SamplingParams(**sampling), engine)

    assert policy("nsd", temperature=0) is None
    assert policy("nsd", temperature=1.0, seed=7) is None
    assert policy("sd", temperature=1.0, seed=7) is None
    assert policy("sd", temperature=0) is not None  # exact greedy: K-invariant, adapts
    assert policy("nsd", temperature=1.0) is not None  # unseeded sampling adapts
    assert policy("ar", temperature=0) is None


def run_all(pool: ServingPool, method: str, params: SamplingParams, concurrency: int) -> list[list[int]]:
    """Every prompt through the pool, ``concurrency`` at a time -> tokens per prompt (in order)."""
    out: dict[int, list[int]] = {}
    errors: list[BaseException] = []
    next_index = iter(range(len(PROMPTS)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                i = next(next_index, None)
            if i is None:
                return
            try:
                out[i] = pool.submit(PROMPTS[i], params, method=method).tokens
            except BaseException as err:  # reported below
                errors.append(err)

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors
    return [out[i] for i in range(len(PROMPTS))]


@pytest.mark.parametrize("method", ["ar", "sd", "nsd"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_seeded_outputs_reproduce_sequentially_and_concurrently(pool, method, temperature):
    params = SamplingParams(temperature=temperature, seed=7, max_new_tokens=16, ignore_eos=True)
    runs = [run_all(pool, method, params, concurrency) for concurrency in (1, 4, 1, 4)]
    assert all(run == runs[0] for run in runs[1:])
    if temperature > 0:  # the seed matters: a different one gives different text somewhere
        other = run_all(
            pool, method, SamplingParams(temperature=1.0, seed=8, max_new_tokens=16, ignore_eos=True), 4
        )
        assert other != runs[0]


# --- vLLM's batch-size schedule of K (integrations/vllm/hooks.py: schedule_fixed_k) -----------------


class VLLMParams:
    """The fields of vLLM's ``SamplingParams`` the hook reads."""

    def __init__(self, temperature: float, seed: int | None = None, extra_args: dict | None = None) -> None:
        self.temperature, self.seed, self.extra_args = temperature, seed, extra_args
        self.top_k, self.top_p = 0, 1.0


class VLLMRequest:
    def __init__(self, params: VLLMParams | None) -> None:
        self.sampling_params = params


class VLLMScheduler:
    """A scheduler with vLLM's dynamic-K lookup (K per batch size) and its request queues."""

    def __init__(self, running: list, waiting: list = ()) -> None:
        self.dynamic_sd_lookup = [4, 4, 4, 2, 2]
        self.running, self.waiting = list(running), list(waiting)


@pytest.fixture
def nsd_default(monkeypatch):
    from relaxspec.integrations.vllm import rejection
    from relaxspec.integrations.vllm.rules import RuleChoice

    monkeypatch.setattr(rejection, "_default", RuleChoice("nsd", {"theta": 0.8}))


@pytest.mark.parametrize(
    "params,fixed",
    [
        (VLLMParams(0.0, extra_args={"rule": "sd"}), False),  # exact greedy: K-invariant
        (VLLMParams(0.0), True),  # the server's nsd, greedy
        (VLLMParams(0.0, extra_args={"rule": "topk"}), True),
        (VLLMParams(1.0, seed=3, extra_args={"rule": "sd"}), True),  # the random stream follows K
        (VLLMParams(1.0, seed=3), True),
        (VLLMParams(1.0, extra_args={"rule": "sd"}), False),  # unseeded sampling promises nothing
        (VLLMParams(0.7), False),
        (None, False),  # a pooling request drafts nothing
    ],
)
def test_vllm_request_needs_fixed_k_like_our_engine(nsd_default, params, fixed):
    from relaxspec.integrations.vllm.hooks import params_need_fixed_k

    assert params_need_fixed_k(params) is fixed


def test_vllm_schedule_drafts_full_k_while_a_reproducible_request_is_in(nsd_default, monkeypatch):
    from relaxspec.integrations.vllm import hooks

    seen: list = []

    def schedule(self, throttle_prefills=False):
        assert throttle_prefills  # vLLM's arguments pass through
        seen.append(self.dynamic_sd_lookup)
        if len(seen) == 4:
            raise RuntimeError("a failed step")
        return "output"

    monkeypatch.setitem(hooks._originals, f"{hooks.SCHEDULER}.schedule", schedule)
    free = VLLMRequest(VLLMParams(1.0, extra_args={"rule": "sd"}))
    seeded = VLLMRequest(VLLMParams(1.0, seed=5))
    alone = VLLMScheduler([free])
    assert hooks.schedule_fixed_k(alone, True) == "output"
    assert seen[-1] == [4, 4, 4, 2, 2]  # nothing to keep fixed: vLLM's schedule
    waiting = VLLMScheduler([free], [seeded])
    assert hooks.schedule_fixed_k(waiting, throttle_prefills=True) == "output"
    assert seen[-1] is None  # the static K for this step
    assert waiting.dynamic_sd_lookup == [4, 4, 4, 2, 2]  # and the schedule back afterwards
    static = VLLMScheduler([seeded])
    static.dynamic_sd_lookup = None  # no schedule: vLLM's own path
    hooks.schedule_fixed_k(static, True)
    assert seen[-1] is None
    running = VLLMScheduler([seeded, free])
    with pytest.raises(RuntimeError):
        hooks.schedule_fixed_k(running, True)
    assert running.dynamic_sd_lookup == [4, 4, 4, 2, 2]  # restored on an error too


def test_vllm_hooks_patch_the_scheduler_where_it_reads_the_schedule():
    """The hook swaps an attribute of vLLM's scheduler: it must be the one ``schedule`` reads."""
    import inspect

    from relaxspec.integrations.vllm import hooks

    assert hooks.HOOKS[0].target == f"{hooks.SCHEDULER}.schedule"
    assert hooks.HOOKS[0].function is hooks.schedule_fixed_k
    pytest.importorskip("vllm", reason="vLLM is not installed")
    owner, name = hooks.HOOKS[0].owner_and_name()
    source = inspect.getsource(hooks._originals.get(hooks.HOOKS[0].target) or getattr(owner, name))
    assert "self.dynamic_sd_lookup[" in source  # K = lookup[batch size], in this very function


# --- scripts/reproducible.py's pieces (relaxspec.serve.reproduce) ----------------------------------


def test_repro_requests_carry_the_method_as_each_engine_takes_it():
    from relaxspec.serve.loadtest import Prompt
    from relaxspec.serve.reproduce import Job, ReproConfig, jobs, request_body

    ours, theirs = ReproConfig(), ReproConfig(engine="vllm")
    assert [j.regime for j in jobs(ours)[:20]] == ["greedy"] * 10 + ["seeded"] * 10
    prompt = Prompt("Question: 1+1?\nAnswer:", ("\nQuestion:",))
    greedy = request_body(Job("nsd", 2, "greedy"), prompt, ours)
    assert greedy["temperature"] == 0 and "seed" not in greedy and greedy["stop"] == ["\nQuestion:"]
    assert greedy["relaxspec"] == {"method": "nsd", "params": {"k": 4, "theta": 0.8}}
    seeded = request_body(Job("sd", 13, "seeded"), prompt, theirs)
    assert (seeded["temperature"], seeded["seed"]) == (1.0, 13)
    assert seeded["vllm_xargs"] == {"rule": "sd"} and "relaxspec" not in seeded
    assert "vllm_xargs" not in request_body(Job("ar", 0, "greedy"), prompt, theirs)  # its own server


def test_repro_summary_counts_distinct_outputs_and_failures():
    from relaxspec.serve.reproduce import ReproConfig, jobs, summarize

    config = ReproConfig(methods=["nsd"], prompts=4, runs=3)
    same = {j: f"text {j.index}" for j in jobs(config)}
    changed = {**same, jobs(config)[3]: "other"}  # a seeded request differs in one run
    failed = {**same, jobs(config)[0]: None}  # a greedy request failed in one run
    greedy, seeded = summarize(config, [same, changed, failed], ["HTTP 500: boom"])
    assert (greedy["distinct_max"], greedy["failed"], greedy["identical"]) == (2, 1, False)
    assert greedy["differing"] == {"0": ["text 0", "text 0", None]} and greedy["errors"] == ["HTTP 500: boom"]
    assert (seeded["distinct_max"], seeded["failed"], seeded["identical"]) == (2, 0, False)
    assert seeded["differing"] == {"3": ["text 3", "other", "text 3"]} and seeded["errors"] == []
    assert all(row["identical"] for row in summarize(config, [same, same]))


@pytest.mark.parametrize(
    "change,message",
    [
        ({"engine": "sglang"}, "--engine must be one of"),
        ({"methods": ["ar", "prove"]}, "--methods takes distinct names"),
        ({"methods": ["sd", "sd"]}, "--methods takes distinct names"),
        ({"prompts": 5}, "--prompts must be even"),
        ({"runs": 1}, "--runs must be an integer >= 2"),
        ({"concurrency": 1}, "--concurrency must be an integer >= 2"),
        ({"temperature": 0.0}, r"--temperature must be in \(0, 10\]"),
        ({"engine": "vllm", "k": 2}, "--k-schedule asks for more than --k = 2"),
        ({"vllm_dtype": "fp8"}, "--vllm-dtype must be one of"),
    ],
)
def test_repro_settings_are_validated(change, message):
    from relaxspec.errors import RelaxSpecError
    from relaxspec.serve.reproduce import ReproConfig, validate

    with pytest.raises(RelaxSpecError, match=message):
        validate(ReproConfig(**change))

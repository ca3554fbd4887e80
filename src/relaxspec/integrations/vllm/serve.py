"""``relaxspec serve --engine vllm``: vLLM's OpenAI-compatible server with the plugin (docs/design.md §8).

:func:`serve` starts vLLM's own API server (``vllm serve``'s code path) on the target model with
vLLM's draft-model proposer (or its model-free ``ngram`` / ``suffix`` proposers, :mod:`.lookup`),
after setting, for every vLLM process it starts, ``RELAXSPEC_VLLM_RULE`` (the server's default
rule; a request picks another with ``vllm_xargs``, validated in the front end) and
``RELAXSPEC_VLLM_STATS_DIR`` (where the sampler leaves its per-position counts, which this process
exports on ``/metrics`` beside vLLM's own). Our middleware (:mod:`.guard`) stands before every
route vLLM mounts.

Nothing outlives the server: vLLM's processes die with it (:func:`plugin.die_with_parent`) and the
stats directory is removed on return, exception or SIGTERM here, after a ``kill -9`` by a watchdog
process (:mod:`.stats_watchdog`), and, were that killed too, at the next start
(:func:`temporary_stats_dir`). Flag mapping and metric names: docs/vllm.md.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from relaxspec.data.chat import STOP
from relaxspec.errors import RelaxSpecError, check_int
from relaxspec.integrations import vllm as plugin
from relaxspec.integrations.vllm import guard, proposers
from relaxspec.integrations.vllm.drafts import draft_speculative_config
from relaxspec.integrations.vllm.lookup import check_prompt_lookup, lookup_speculative_config
from relaxspec.integrations.vllm.rejection import ENV_STATS_DIR
from relaxspec.integrations.vllm.rules import RuleChoice, canonical, default_env
from relaxspec.integrations.vllm.stats_file import read_stats
from relaxspec.methods import LOOKUP_PROPOSERS, check_drafter
from relaxspec.models import model_dir
from relaxspec.params import DEFAULT_K

STATS_PREFIX = "relaxspec-vllm-stats-"  # then the server's pid and a random suffix
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")  # uvicorn's


class StatsCollector:
    """A prometheus collector over :func:`read_stats` (registered in the API server's process)."""

    def __init__(self, where: str | Path, model_name: str) -> None:
        self.where = str(where)
        self.model_name = model_name

    def collect(self) -> Any:
        from prometheus_client.core import CounterMetricFamily

        stats = read_stats(self.where)
        labels = ["model_name", "position"]
        for name, key, doc in (
            ("relaxspec_drafts", "drafted_per_pos", "Draft tokens verified by relaxspec's rules."),
            ("relaxspec_accepted", "accepted_per_pos", "Draft tokens accepted by relaxspec's rules."),
            (
                "relaxspec_relaxed_accepted",
                "relaxed_per_pos",
                "Draft tokens accepted only thanks to the relaxed rule (the exact rule would have rejected "
                "them on the same draws), per position.",
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=labels)
            for i, v in enumerate(stats[key]):
                family.add_metric([self.model_name, str(i)], v)
            yield family
        for name, key, doc in (
            ("relaxspec_verify_rows", "rows", "Request rows verified (one per request per target forward)."),
            ("relaxspec_emitted_tokens", "emitted", "Tokens emitted by verification steps."),
        ):
            family = CounterMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self.model_name], stats[key])
            yield family


def parse_k_schedule(text: str) -> list[tuple[int, int, int]]:
    """``"1-4:4,5-16:2,17-256:0"`` -> vLLM's ``num_speculative_tokens_per_batch_size``
    (inclusive batch-size ranges and the draft length for each; 0 = no speculation)."""
    schedule = []
    for item in (part.strip() for part in text.split(",") if part.strip()):
        sizes, sep, k = item.partition(":")
        low, dash, high = sizes.partition("-")
        try:
            entry = (int(low), int(high if dash else low), int(k))
        except ValueError:
            entry = None
        if not sep or entry is None or entry[0] < 1 or entry[1] < entry[0] or entry[2] < 0:
            raise RelaxSpecError(f"--k-schedule expects FIRST-LAST:K items like 1-4:4,5-64:0, got {item!r}")
        schedule.append(entry)
    if not schedule or schedule[0][0] != 1:
        raise RelaxSpecError("--k-schedule must start at batch size 1, e.g. 1-4:4,5-64:0")
    for (_, end, _), (start, _, _) in itertools.pairwise(schedule):
        if start != end + 1:
            raise RelaxSpecError("--k-schedule ranges must be contiguous and increasing, e.g. 1-4:4,5-64:0")
    return schedule


@dataclass(frozen=True, kw_only=True)
class ServerSettings:
    """vLLM's server for a method: the models (``target``, ``draft``, and ``paths`` by role for our
    proposers' ``block`` / ``diffusion``; None: the bundled ones), the draft length ``k`` and its
    batch-size schedule (:func:`parse_k_schedule`; its largest K at most ``k``), ``stock`` (the
    plugin out), the address, name and size of the server, and vLLM's own flags (``extra``)."""

    target: str | Path | None = None
    draft: str | Path | None = None
    k: int = DEFAULT_K
    paths: Mapping[str, Any] = field(default_factory=dict)
    stock: bool = False
    k_schedule: Sequence[tuple[int, int, int]] | None = None
    host: str = "127.0.0.1"
    port: int = 8000
    served_model_name: str | None = None
    max_model_len: int | None = None
    tensor_parallel_size: int = 1
    extra: Sequence[str] = ()


@dataclass(frozen=True, kw_only=True)
class ServingOptions:
    """Our serving options: the guard's (:mod:`.guard`; ``api_key``, else ``$VLLM_API_KEY``),
    vLLM's (``max_concurrency``, ``log_level``: :func:`serving_args`) and where the samplers leave
    their counts (``stats_dir``; None: a temporary directory, :func:`temporary_stats_dir`)."""

    api_key: str | None = None
    max_body_bytes: int | None = None
    max_tokens_cap: int | None = None
    default_max_tokens: int | None = None
    max_concurrency: int | None = None
    log_level: str | None = None
    stats_dir: str | None = None


def vllm_args(
    method: str, params: dict[str, Any], server: ServerSettings | None = None
) -> tuple[list[str], RuleChoice | None]:
    """The ``vllm serve`` command line for a method on ``server``, and its default rule (None for ``ar``)."""
    from relaxspec.integrations.vllm import runners

    s = server or ServerSettings()
    if method in runners.PROPOSER_METHODS:  # our proposers inside vLLM (.proposers); paths by role
        if s.stock:
            raise RelaxSpecError(f"{method!r} needs the relaxspec plugin and takes no --stock")
        where = {"target": s.target, "draft": s.draft}
        where.update({r: v for r, v in s.paths.items() if v is not None})
        target_dir, spec_argv, choice = runners.proposer_spec_args(method, params, where, s.k_schedule)
        return _server_args(s, target_dir) + spec_argv + list(s.extra), choice
    name = "ar" if method == "ar" else canonical(method)
    proposer, drafter, window, params = drafter_options(params)
    rule = None if name == "ar" else RuleChoice(name, params)
    if name == "ar" and (params or proposer != "draft" or drafter != "draft" or any(window)):
        raise RelaxSpecError("method 'ar' takes no rule parameters")
    check_int("k", s.k, 1)
    target = model_dir("target", s.target, "serve --engine vllm")
    argv = _server_args(s, target)
    if rule is not None:
        if proposer in LOOKUP_PROPOSERS:  # vLLM's ngram / suffix: no draft model
            spec = lookup_speculative_config(proposer, s.k, *window)
        else:  # a causal LM (draft_model) or an EAGLE head (eagle)
            given = s.draft if drafter == "draft" else s.paths.get(drafter)
            draft = model_dir(drafter, given, "serve --engine vllm")
            spec = draft_speculative_config(draft, target, s.k, "greedy" if s.stock else "probabilistic")
        proposers.add_k_schedule(spec, s.k_schedule)
        argv += ["--speculative-config", json.dumps(spec)]
    return argv + list(s.extra), rule


def _server_args(s: ServerSettings, target_dir: Path) -> list[str]:
    """The command line every server shares: model, address, eager mode, name, parallelism."""
    argv = ["--model", str(target_dir), "--host", s.host, "--port", str(s.port), "--enforce-eager",
            "--served-model-name", s.served_model_name or "relaxspec",
            "--tensor-parallel-size", str(s.tensor_parallel_size)]  # fmt: skip
    if s.max_model_len:
        argv += ["--max-model-len", str(s.max_model_len)]
    return argv


def drafter_options(
    params: dict[str, Any],
) -> tuple[str, str, tuple[int | None, int | None], dict[str, Any]]:
    """A rule row's drafter options — ``proposer`` (``draft``, or vLLM's model-free ``ngram`` /
    ``suffix``), ``drafter`` (the model role that drafts: ``draft`` or ``eagle``) and the n-gram
    window (checked, :mod:`.lookup`) — and the rule's own parameters."""
    rest = dict(params)
    proposer = rest.pop("proposer", "draft")
    drafter = check_drafter(rest.pop("drafter", "draft"), proposer)
    lo, hi = rest.pop("prompt_lookup_min", None), rest.pop("prompt_lookup_max", None)
    if proposer not in ("draft", *LOOKUP_PROPOSERS):
        raise RelaxSpecError(
            f"serve --engine vllm takes proposer=draft, ngram or suffix, got {proposer!r} "
            "(proposer=block runs in generate and bench)"
        )
    return proposer, drafter, check_prompt_lookup(proposer, lo, hi), rest


@contextlib.contextmanager
def temporary_stats_dir() -> Iterator[str]:
    """A fresh directory for the samplers' counts, removed when this process ends, however it ends.

    Return, exception or SIGTERM (uvicorn returns): removed here. ``kill -9``: a watchdog process
    (:mod:`.stats_watchdog`) removes it once this process and the engine core it forked are gone.
    Both killed at once (``kill -9`` of the process group): the next start removes directories
    whose server pid (in the name) is dead (:func:`remove_stale_stats_dirs`).
    """
    remove_stale_stats_dirs()
    where = tempfile.mkdtemp(prefix=f"{STATS_PREFIX}{os.getpid()}-")
    program = str(Path(__file__).with_name("stats_watchdog.py"))
    watchdog = subprocess.Popen([sys.executable, "-I", program, where], stdin=subprocess.PIPE)
    try:
        yield where
    finally:
        shutil.rmtree(where, ignore_errors=True)
        if watchdog.stdin is not None:
            watchdog.stdin.close()


def remove_stale_stats_dirs() -> None:
    """Remove this user's stats directories whose server process is dead."""
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{STATS_PREFIX}*")):
        pid = os.path.basename(path)[len(STATS_PREFIX) :].partition("-")[0]
        with contextlib.suppress(OSError):
            if pid.isdigit() and os.stat(path).st_uid == os.getuid() and not _alive(int(pid)):
                shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serving_args(
    *, max_concurrency: int | None = None, max_tokens_cap: int | None = None, log_level: str | None = None
) -> list[str]:
    """vLLM's flags for our serving options (None: vLLM's default)."""
    argv = ["--middleware", guard.MIDDLEWARE]
    if max_concurrency is not None:
        check_int("--max-concurrency", max_concurrency, 1)
        argv += ["--max-num-seqs", str(max_concurrency)]
    if max_tokens_cap is not None:  # vLLM clamps every generation to it (the guard refuses more)
        argv += ["--override-generation-config", json.dumps({"max_new_tokens": max_tokens_cap})]
    if log_level is not None:
        if log_level not in LOG_LEVELS:
            raise RelaxSpecError(f"--log-level must be one of {', '.join(LOG_LEVELS)}, got {log_level!r}")
        argv += ["--uvicorn-log-level", log_level]
    return argv


def serve(
    method: str = "nsd",
    params: dict[str, Any] | None = None,
    server: ServerSettings | None = None,
    options: ServingOptions | None = None,
) -> None:
    """Run vLLM's OpenAI server with the plugin (blocks until the server stops).

    ``server``: the method's models, k and address (:func:`vllm_args`); ``options``: the guard's
    key and caps, enforced by :mod:`.guard` on every route, and vLLM's concurrency and log level
    (:func:`serving_args`). With vLLM's ``--headless`` in ``server.extra`` (a further node of
    multi-node data parallel: engines, no API server) the node serves only its relaxspec counters,
    Prometheus text without a key, on ``server.host:server.port`` (docs/vllm.md, "Past one machine").
    """
    server, o = server or ServerSettings(), options or ServingOptions()
    plugin.require_vllm()
    # Ours is the one key check, on every route; vLLM's would only repeat it on /v1 (and its
    # children need not hold the key).
    from_env = os.environ.pop("VLLM_API_KEY", None)
    api_key = o.api_key or from_env or None
    door = guard.GuardConfig(
        api_key, o.max_body_bytes, o.max_tokens_cap, o.default_max_tokens, chat_stop=STOP
    )
    limits = serving_args(
        max_concurrency=o.max_concurrency, max_tokens_cap=o.max_tokens_cap, log_level=o.log_level
    )
    if o.log_level is not None:  # before vLLM's logger is set up, and for every process it starts
        os.environ["VLLM_LOGGING_LEVEL"] = "DEBUG" if o.log_level == "trace" else o.log_level.upper()
    plugin.check_version()
    argv, rule = vllm_args(method, dict(params or {}), replace(server, extra=(*limits, *server.extra)))
    guard.configure(door)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    plugin.die_with_parent()  # what this process forks dies with it (what it spawns: register())
    plugin.start_coordinator_with_lifeline()  # and the data-parallel coordinator, which loads no plugin
    with contextlib.ExitStack() as stack:
        if server.stock:
            from relaxspec.integrations.vllm.offline import other_plugins

            # our plugin without its hooks: only the lifeline in the processes vLLM spawns
            os.environ["VLLM_PLUGINS"] = ",".join([*other_plugins(), plugin.PLUGIN_NAME])
            os.environ[plugin.ENV_DISABLE] = "1"
        else:
            if rule is not None:
                os.environ.update(default_env(rule))  # type: ignore[arg-type]
            where = o.stats_dir or stack.enter_context(temporary_stats_dir())
            os.environ[ENV_STATS_DIR] = where
            plugin.register()
            from prometheus_client import REGISTRY

            REGISTRY.register(StatsCollector(where, server.served_model_name or "relaxspec"))
            if "--headless" in server.extra:  # no API server on this node: its counts on --port
                from prometheus_client import start_http_server

                start_http_server(server.port, addr=server.host)
        _run_vllm_server(argv, method)


def _run_vllm_server(argv: list[str], method: str) -> None:
    """Parse ``argv`` with ``vllm serve``'s parser and run its API server (blocks)."""
    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from relaxspec.integrations.vllm import runners

    parser = make_arg_parser(FlexibleArgumentParser(description="relaxspec serve --engine vllm"))
    args = parser.parse_args(argv)
    if runners.needs_mars_overrides(method):  # the block proposer's placeholder id (.proposers)
        from relaxspec.integrations.vllm.proposers import mars_hf_overrides

        args.hf_overrides = mars_hf_overrides
    validate_parsed_serve_args(args)
    if args.headless:  # engines only, no API server (a further node of multi-node data parallel)
        from vllm.entrypoints.cli.serve import run_headless

        args.api_server_count = 0
        run_headless(args)
        return
    uvloop.run(run_server(args))


def _row_params() -> dict[str, Any]:
    """``name -> Param`` of every parameter a vLLM row takes but ``k`` (first declaration wins)."""
    from relaxspec.integrations.vllm import runners

    found: dict[str, Any] = {}
    for name in runners.VLLM_METHODS:
        own, extras = runners.row_params(name)
        for param in (*own.values(), *extras.values()):
            if param.name != "k" and param.kind is not bool:
                found.setdefault(param.name, param)
    return found


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m relaxspec.integrations.vllm.serve --method nsd --theta 0.9 --port 8000 ...``"""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="nsd")
    ap.add_argument("--k", type=int, default=DEFAULT_K)
    ap.add_argument("--target")
    ap.add_argument("--draft")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--api-key")
    ap.add_argument("--served-model-name")
    ap.add_argument("--max-model-len", type=int)
    ap.add_argument("--tensor-parallel-size", type=int, default=1)
    ap.add_argument("--stock", action="store_true", help="vLLM without the plugin")
    ap.add_argument("--k-schedule", help="draft length per batch size, e.g. 1-4:4,5-16:2,17-256:0")
    # the serving options `relaxspec serve` shares with our engine (see serve())
    for flag in ("--max-body-bytes", "--max-tokens-cap", "--default-max-tokens", "--max-concurrency"):
        ap.add_argument(flag, type=int)
    ap.add_argument("--log-level", choices=LOG_LEVELS)
    # every parameter of a vLLM row (relaxspec.methods' presets), k aside
    row_params = _row_params()
    for param in row_params.values():
        ap.add_argument("--" + param.name.replace("_", "-"), type=param.kind)
    ap.add_argument("--block", type=str)
    ap.add_argument("--diffusion", type=str)
    ap.add_argument("--eagle", type=str)
    ns, extra = ap.parse_known_args(argv)
    params = {n: getattr(ns, n) for n in row_params if getattr(ns, n) is not None}
    server = ServerSettings(
        target=ns.target,
        draft=ns.draft,
        k=ns.k,
        paths={"block": ns.block, "diffusion": ns.diffusion, "eagle": ns.eagle},
        stock=ns.stock,
        k_schedule=parse_k_schedule(ns.k_schedule) if ns.k_schedule else None,
        host=ns.host,
        port=ns.port,
        served_model_name=ns.served_model_name,
        max_model_len=ns.max_model_len,
        tensor_parallel_size=ns.tensor_parallel_size,
        extra=tuple(extra),
    )
    options = ServingOptions(
        api_key=ns.api_key,
        max_body_bytes=ns.max_body_bytes,
        max_tokens_cap=ns.max_tokens_cap,
        default_max_tokens=ns.default_max_tokens,
        max_concurrency=ns.max_concurrency,
        log_level=ns.log_level,
    )
    serve(ns.method, params, server, options)


if __name__ == "__main__":
    main()

"""``relaxspec serve --engine vllm``: vLLM's OpenAI-compatible server with the plugin (DESIGN §8).

:func:`serve` starts vLLM's own API server (``vllm serve``'s code path) on the target model with
vLLM's draft-model proposer, after setting, for every vLLM process it starts:

- ``RELAXSPEC_VLLM_RULE``: the server's default rule (``--method nsd --theta 0.95``); a request
  picks another with ``vllm_xargs`` (``{"rule": "topk", "accept_k": 3}``), validated in the
  front end: a bad rule or value is a 400 and the server keeps serving;
- ``RELAXSPEC_VLLM_STATS_DIR``: where the sampler leaves its per-position counts, which this
  process exports on ``/metrics`` beside vLLM's own spec-decode metrics:
  ``relaxspec_drafts_total{position}``, ``relaxspec_accepted_total{position}``,
  ``relaxspec_relaxed_accepted_total{position}`` (accepted only thanks to the relaxation),
  ``relaxspec_verify_rows_total``, ``relaxspec_emitted_tokens_total``.

``--api-key`` is vLLM's (``Authorization: Bearer <key>`` on the ``/v1`` routes).
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from relaxspec.errors import RelaxSpecError
from relaxspec.integrations import vllm as plugin
from relaxspec.integrations.vllm import proposers
from relaxspec.integrations.vllm.rejection import ENV_STATS_DIR
from relaxspec.integrations.vllm.rules import ENV_RULE, RuleChoice, canonical
from relaxspec.models import model_dir


def read_stats(where: str | Path) -> dict[str, Any]:
    """Sum of the counts every sampler process left in ``where``."""
    total: dict[str, Any] = {"rows": 0, "emitted": 0}
    total.update({key: [] for key in ("drafted_per_pos", "accepted_per_pos", "relaxed_per_pos")})
    for path in glob.glob(os.path.join(str(where), "*.json")):
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, json.JSONDecodeError):
            continue
        total["rows"] += int(data.get("rows", 0))
        total["emitted"] += int(data.get("emitted", 0))
        for key in ("drafted_per_pos", "accepted_per_pos", "relaxed_per_pos"):
            values = data.get(key, [])
            acc = total[key]
            acc.extend([0] * (len(values) - len(acc)))
            for i, v in enumerate(values):
                acc[i] += int(v)
    return total


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


def vllm_args(
    method: str,
    params: dict[str, Any],
    *,
    target: str | Path | None = None,
    draft: str | Path | None = None,
    k: int = 4,
    host: str = "127.0.0.1",
    port: int = 8000,
    api_key: str | None = None,
    served_model_name: str | None = None,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    stock: bool = False,
    k_schedule: Sequence[tuple[int, int, int]] | None = None,
    extra: Sequence[str] = (),
    paths: dict[str, Any] | None = None,
) -> tuple[list[str], RuleChoice | None]:
    """The ``vllm serve`` command line for our settings, and the default rule (None for ``ar``).

    ``k_schedule``: vLLM's batch-size-dependent draft length (:func:`parse_k_schedule`); the
    largest K in it must not exceed ``k``.
    """
    from relaxspec.integrations.vllm import runners

    def server(target_dir: Path) -> list[str]:
        """The command line every server shares: model, address, eager mode, name, parallelism."""
        argv = ["--model", str(target_dir), "--host", host, "--port", str(port), "--enforce-eager",
                "--served-model-name", served_model_name or "relaxspec",
                "--tensor-parallel-size", str(tensor_parallel_size)]  # fmt: skip
        if max_model_len:
            argv += ["--max-model-len", str(max_model_len)]
        if api_key:
            argv += ["--api-key", api_key]
        return argv

    if method in runners.PROPOSER_METHODS:  # our proposers inside vLLM (.proposers); paths by role
        if stock:
            raise RelaxSpecError(f"{method!r} needs the relaxspec plugin and takes no --stock")
        where = {"target": target, "draft": draft}
        where.update({r: v for r, v in (paths or {}).items() if v is not None})
        target_dir, spec_argv, choice = runners.proposer_spec_args(method, params, where, k_schedule)
        return server(target_dir) + spec_argv + list(extra), choice
    name = "ar" if method == "ar" else canonical(method)
    rule = None if name == "ar" else RuleChoice(name, params)
    if name == "ar" and params:
        raise RelaxSpecError("method 'ar' takes no rule parameters")
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RelaxSpecError(f"k must be an integer >= 1, got {k!r}")
    argv = server(model_dir("target", target, "serve --engine vllm"))
    if rule is not None:
        spec = {
            "method": "draft_model",
            "model": str(model_dir("draft", draft, "serve --engine vllm")),
            "num_speculative_tokens": k,
            "draft_sample_method": "greedy" if stock else "probabilistic",
        }
        proposers.add_k_schedule(spec, k_schedule)
        argv += ["--speculative-config", json.dumps(spec)]
    return argv + list(extra), rule


def serve(
    method: str = "nsd",
    params: dict[str, Any] | None = None,
    *,
    stock: bool = False,
    stats_dir: str | None = None,
    **kwargs: Any,
) -> None:
    """Run vLLM's OpenAI server with the plugin (blocks until the server stops)."""
    plugin.require_vllm()
    plugin.check_version()
    argv, rule = vllm_args(method, dict(params or {}), stock=stock, **kwargs)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if stock:
        from relaxspec.integrations.vllm.offline import other_plugins

        os.environ["VLLM_PLUGINS"] = ",".join(other_plugins()) or "none"
        os.environ[plugin.ENV_DISABLE] = "1"
    else:
        if rule is not None:
            os.environ[ENV_RULE] = rule.to_json()
        stats_dir = stats_dir or tempfile.mkdtemp(prefix="relaxspec-vllm-stats-")
        os.environ[ENV_STATS_DIR] = stats_dir
        plugin.register()
        from prometheus_client import REGISTRY

        REGISTRY.register(StatsCollector(stats_dir, kwargs.get("served_model_name") or "relaxspec"))

    import uvloop
    from vllm.entrypoints.launchers.api_server.entry import run_server
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser(description="relaxspec serve --engine vllm"))
    args = parser.parse_args(argv)
    from relaxspec.integrations.vllm import runners

    if runners.needs_mars_overrides(method):  # the block proposer's placeholder id (.proposers)
        from relaxspec.integrations.vllm.proposers import mars_hf_overrides

        args.hf_overrides = mars_hf_overrides
    validate_parsed_serve_args(args)
    uvloop.run(run_server(args))


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m relaxspec.integrations.vllm.serve --method nsd --theta 0.9 --port 8000 ...``"""
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", default="nsd")
    ap.add_argument("--theta", type=float)
    ap.add_argument("--accept-k", type=int)
    ap.add_argument("--epsilon", type=float)
    ap.add_argument("--delta", type=float)
    ap.add_argument("--ell", type=float)
    ap.add_argument("--k", type=int, default=4)
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
    # prove-lossless / prove / sdd: our proposers inside vLLM (relaxspec.integrations.vllm.proposers)
    for flag, typ in (("--block-size", int), ("--gamma", int), ("--steps", int), ("--reveal", str),
                      ("--accept", str), ("--seam", str), ("--min-confidence", float),
                      ("--block", str), ("--diffusion", str)):  # fmt: skip
        ap.add_argument(flag, type=typ)
    ns, extra = ap.parse_known_args(argv)
    params = {
        k: v
        for k, v in {
            "theta": ns.theta,
            "accept_k": ns.accept_k,
            "epsilon": ns.epsilon,
            "delta": ns.delta,
            "ell": ns.ell,
            "block_size": ns.block_size,
            "gamma": ns.gamma,
            "steps": ns.steps,
            "reveal": ns.reveal,
            "accept": ns.accept,
            "seam": ns.seam,
            "min_confidence": ns.min_confidence,
        }.items()
        if v is not None
    }
    serve(
        ns.method,
        params,
        stock=ns.stock,
        target=ns.target,
        draft=ns.draft,
        k=ns.k,
        host=ns.host,
        port=ns.port,
        api_key=ns.api_key,
        served_model_name=ns.served_model_name,
        max_model_len=ns.max_model_len,
        tensor_parallel_size=ns.tensor_parallel_size,
        k_schedule=parse_k_schedule(ns.k_schedule) if ns.k_schedule else None,
        extra=extra,
        paths={"block": ns.block, "diffusion": ns.diffusion},
    )


if __name__ == "__main__":
    main()

"""Issue 36: do seeded and greedy requests give the same output every time, through the servers?

For each engine, spawns its server(s) on free loopback ports (the bundled models; our engine with
--adaptive-k, vLLM's with a batch-size schedule of K), sends PROMPTS requests per method (half
greedy, half at T = 1 with a seed each) RUNS times — the first half of the runs sequential, the
rest from CONCURRENCY concurrent clients in a shuffled order — and compares each request's texts
across the runs (relaxspec.serve.reproduce). Prints a table, writes JSON (with the texts of any
request that differed), exits 1 if any request's outputs differ or fail, 2 on a bad argument or a
server that does not start. The servers are stopped on every exit path; their logs stay beside
the JSON (OUT-logs/).

    RELAXSPEC_THREADS=1 PYTHONPATH=src python scripts/reproducible.py --engine relaxspec,vllm \
        --out results/reproducible.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from pathlib import Path

from relaxspec.errors import RelaxSpecError
from relaxspec.serve.reproduce import ENGINES, ReproConfig, check_engine, format_table, validate


def parse(argv: list[str] | None) -> tuple[list[ReproConfig], Path]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", default="relaxspec,vllm", help=f"comma list of {', '.join(ENGINES)}")
    ap.add_argument("--methods", default="ar,sd,nsd")
    ap.add_argument("--dataset", default="math", help="a bundled set (math, codevar-combos, ...) or .jsonl")
    ap.add_argument("--prompts", type=int, default=20, help="requests per method: half greedy, half seeded")
    ap.add_argument("--runs", type=int, default=4, help="passes over them; the first half sequential")
    ap.add_argument("--concurrency", type=int, default=4, help="clients in the concurrent runs")
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--temperature", type=float, default=1.0, help="of the seeded requests")
    ap.add_argument("--seed", type=int, default=0, help="seeded request i gets seed SEED + i")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--theta", type=float, default=0.8, help="nsd's θ")
    ap.add_argument("--k-schedule", default=ReproConfig.k_schedule, help="--engine vllm's schedule of K")
    ap.add_argument("--vllm-dtype", default=None, help="vLLM servers: --dtype (e.g. float32)")
    ap.add_argument("--startup-timeout", type=float, default=900.0, help="seconds per server start")
    ap.add_argument("--out", type=Path, default=Path("results/reproducible.json"))
    ns = ap.parse_args(argv)
    engines = [e.strip() for e in ns.engine.split(",") if e.strip()]
    if not engines or len(set(engines)) != len(engines):
        raise RelaxSpecError(f"--engine takes distinct names among {', '.join(ENGINES)}, got {ns.engine!r}")
    if ns.startup_timeout <= 0:
        raise RelaxSpecError(f"--startup-timeout must be > 0, got {ns.startup_timeout}")
    same = {f.name: getattr(ns, f.name) for f in dataclasses.fields(ReproConfig) if hasattr(ns, f.name)}
    same["methods"] = [m.strip() for m in ns.methods.split(",") if m.strip()]
    configs = [ReproConfig(**{**same, "engine": engine}) for engine in engines]
    for config in configs:
        validate(config)
    return configs, ns.out


def _stop_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the server stops


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    try:
        configs, out = parse(argv)
        rows = []
        for config in configs:
            logs = out.with_name(out.stem + "-logs")  # the servers' logs
            rows += check_engine(config, lambda text: print(text, file=sys.stderr, flush=True), logs)
    except RelaxSpecError as err:
        print(f"error: {str(err).splitlines()[0]}", file=sys.stderr)
        detail = str(err).splitlines()[1:]
        if detail:  # a server's log tail
            print("\n".join(detail), file=sys.stderr)
        return 2
    print(format_table(rows, configs[0].concurrency, configs[0].temperature))
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"config": [dataclasses.asdict(c) for c in configs], "rows": rows}
    out.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {out}", file=sys.stderr)
    return 0 if all(row["identical"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

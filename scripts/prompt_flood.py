"""Issue 35, finding 3: N clients (40 connections from one asyncio thread of another process) each
send a ~2 MB prompt to a server with the bundled models; a normal request beside them, RSS.

    PYTHONPATH=src python scripts/prompt_flood.py 40
"""

import statistics
import subprocess
import sys
import threading
import time

import httpx
import torch

from relaxspec.serve.pool import ServingPool
from relaxspec.serve.server import (
    BackgroundServer,
    create_app,
    load_serving_models,
    serving_tokenizer_and_context,
)


def rss_gb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1e6 for line in f if line.startswith("VmRSS"))


torch.set_num_threads(1)
n_clients = int(sys.argv[1]) if len(sys.argv) > 1 else 40
models = load_serving_models("nsd", {}, extra_roles=False)
tok, ctx = serving_tokenizer_and_context(models, "nsd")
pool = ServingPool(models, "nsd", {"k": 4}, max_concurrency=8, max_queue=64)
app = create_app(pool, "m", tok, ctx)
NORMAL = {"prompt": "Once upon a time", "max_tokens": 32, "temperature": 0, "ignore_eos": True}
peak = [rss_gb()]
stop = threading.Event()


def sample() -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], rss_gb())
        time.sleep(0.05)


with BackgroundServer(app) as url, httpx.Client(base_url=url, timeout=900) as c:

    def timed() -> float:
        t0 = time.perf_counter()
        assert c.post("/v1/completions", json=NORMAL).status_code == 200
        return time.perf_counter() - t0

    threading.Thread(target=sample, daemon=True).start()
    for _ in range(2):
        timed()
    alone = statistics.median(timed() for _ in range(5))
    host, port = url.removeprefix("http://").split(":")
    flood = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "relaxspec.serve.flood",
            host,
            port,
            str(n_clients),
            "the cat sat on the mat. ",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(0.5)
    beside = timed()
    statuses = flood.communicate()[0].strip()
    print(f"{n_clients} clients: normal alone {alone:.3f}s, beside the flood {beside:.3f}s "
          f"({beside / alone:.1f}x); statuses {statuses}")  # fmt: skip
    print(f"RSS peak {peak[0]:.2f} GB, right after {rss_gb():.2f} GB", flush=True)
    time.sleep(60)
    print(f"RSS 60 s later {rss_gb():.2f} GB")
    stop.set()

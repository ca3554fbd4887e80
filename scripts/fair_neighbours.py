"""Issue 35, finding 4: a normal request (nsd, 32 tokens) alone and beside back-to-back streams of
heavy requests with a 900-token prompt, over HTTP in one process (the bundled models; TINY=1: tiny
random models with a 1,024-token context).

    PYTHONPATH=src python scripts/fair_neighbours.py sdd 1,4
    PYTHONPATH=src python scripts/fair_neighbours.py nsd 1,4
"""

import os
import statistics
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

torch.set_num_threads(1)
kind = sys.argv[1] if len(sys.argv) > 1 else "sdd"
counts = [int(x) for x in (sys.argv[2] if len(sys.argv) > 2 else "1,4").split(",")]
if os.environ.get("TINY"):
    from relaxspec.methods import ModelSet
    from relaxspec.models import LoadedModel
    from relaxspec.testing import perturbed_copy, tiny_llama, tiny_tokenizer
    from relaxspec.train.diffusion import mark_drafter

    tok = tiny_tokenizer(8)
    target = tiny_llama(len(tok), seed=0, layers=2, logit_scale=4.0, context=1024)
    diffusion = perturbed_copy(target, noise=0.2, seed=9)
    mark_drafter(diffusion, 8, 2)
    models = ModelSet(
        target=LoadedModel(target, tok, None),
        draft=LoadedModel(perturbed_copy(target), tok, None),
        diffusion=LoadedModel(diffusion, tok, None),
    )
    ctx, words, normal_prompt = 1024, "w3 w4 w5 w1 " * 400, "w1 w2"
else:
    models = load_serving_models("nsd", {}, extra_roles=True)
    tok, ctx = serving_tokenizer_and_context(models, "nsd")
    words, normal_prompt = "the cat sat on the mat and then it ran far away " * 200, "Once upon a time"
pool = ServingPool(models, "nsd", {"k": 4}, max_concurrency=8, max_queue=16)
app = create_app(pool, "m", tok, ctx)
ids = tok(words)["input_ids"][:899]
long_prompt = tok.decode(ids[1:] if ids[0] == tok.bos_token_id else ids)
NORMAL = {"prompt": normal_prompt, "max_tokens": 32, "temperature": 0, "ignore_eos": True}
HEAVY = {"prompt": long_prompt, "max_tokens": 100, "temperature": 0, "ignore_eos": True}
if kind == "sdd":
    stops = [(f"w{i} " * 100)[:256] for i in range(16)]
    HEAVY |= {"stop": stops, "relaxspec": {"method": "sdd", "params": {"gamma": 64, "steps": 16}}}
else:
    HEAVY |= {"relaxspec": {"method": "nsd"}}


def timed(client: httpx.Client, body: dict) -> float:
    t0 = time.perf_counter()
    r = client.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return time.perf_counter() - t0


with BackgroundServer(app) as url, httpx.Client(base_url=url, timeout=600) as c:
    for _ in range(2):
        timed(c, NORMAL)
    alone = [timed(c, NORMAL) for _ in range(5)]
    for n in counts:
        stop = threading.Event()

        def loop(stop: threading.Event = stop) -> None:
            with httpx.Client(base_url=url, timeout=600) as cc:
                while not stop.is_set():
                    timed(cc, HEAVY)

        threads = [threading.Thread(target=loop, daemon=True) for _ in range(n)]
        for t in threads:
            t.start()
        time.sleep(1.0)
        beside = [timed(c, NORMAL) for _ in range(5)]
        stop.set()
        for t in threads:
            t.join()
        alone += [timed(c, NORMAL) for _ in range(3)]
        a, b = statistics.median(alone), statistics.median(beside)
        print(f"{kind} x{n}: alone {a:.3f}s beside {b:.3f}s ratio {b / a:.2f}", flush=True)

"""A stand-in for llama.cpp's ``llama-server`` in tests/test_llamacpp.py: the routes the llama.cpp
peer uses (/health, /tokenize, /completion), answered with the target's tokenizer.

``FAKE_LLAMA_TOKENIZER``: the tokenizer's directory; ``FAKE_LLAMA_LOG``: a file that receives the
command line and every /completion body (one JSON line each); ``FAKE_LLAMA_SHIFT``: add this to
every token id /tokenize returns (a GGUF that tokenizes differently).
"""

from __future__ import annotations

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from transformers import AutoTokenizer

TOKENIZER = AutoTokenizer.from_pretrained(os.environ["FAKE_LLAMA_TOKENIZER"])
LOG = os.environ["FAKE_LLAMA_LOG"]
SHIFT = int(os.environ.get("FAKE_LLAMA_SHIFT", "0"))
CONTINUATION = " 12\n#### 12"  # every completion, cut at its budget


def log(entry: object) -> None:
    with open(LOG, "a") as f:
        f.write(json.dumps(entry) + "\n")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args: object) -> None:
        pass

    def reply(self, body: object, status: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self.reply(
            {"status": "ok"} if self.path == "/health" else {"error": "no route"},
            200 if self.path == "/health" else 404,
        )

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/tokenize":
            ids = TOKENIZER(body["content"])["input_ids"]
            self.reply({"tokens": [i + SHIFT for i in ids]})
            return
        log({"completion": body})
        tokens = TOKENIZER(CONTINUATION, add_special_tokens=False)["input_ids"]
        # llama.cpp's tokens end with the EOS it stopped at, if it stopped before the budget
        tokens = (
            tokens[: body["n_predict"]]
            if len(tokens) >= body["n_predict"]
            else [*tokens, TOKENIZER.eos_token_id]
        )
        self.reply({
            "content": TOKENIZER.decode(tokens),
            "tokens": tokens,
            "timings": {"prompt_ms": 5.0, "predicted_ms": 10.0 * len(tokens), "predicted_n": len(tokens),
                        "draft_n": 8, "draft_n_accepted": 6},
        })  # fmt: skip


if __name__ == "__main__":
    log({"argv": sys.argv[1:]})
    port = int(sys.argv[sys.argv.index("--port") + 1])
    ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()

"""llama.cpp as a peer in the benchmark: its ``llama-server``, autoregressive and draft-model SD.

On a CPU, llama.cpp is what users run; ``relaxspec bench --peers llamacpp-ar,llamacpp-sd`` times it
on the same prompts, budget, stop strings and sampling as our rows, prompt by prompt in the same
run (docs/performance.md, "llama.cpp beside us"). ``scripts/llamacpp_peer.sh`` builds
``llama-server`` from the ``llama-cpp-python`` source distribution (no network beyond PyPI) and
converts the bundled target and draft to GGUF into one directory (:data:`DEFAULT_DIR`)::

    DIR/bin/llama-server
    DIR/gguf/{target,draft}-{bf16,q8_0}.gguf

A peer row starts one ``llama-server`` per (weights, k, threads) on first use — ``-m`` the target,
plus ``--spec-type draft-simple -md`` the draft with ``k`` drafts per step (``--spec-draft-n-min
0 --spec-draft-p-min 0``: always k, like our ``sd``) — and sends each prompt to ``/completion``
without prompt caching. A row's seconds are llama.cpp's own ``prompt_ms + predicted_ms`` (what
our rows time: prefill and decode, no HTTP). Greedy is ``temperature 0``; sampling sets every
llama.cpp sampler to what ours does (top-k 0 = off, top-p, no min-p, no penalties). The server
dies with this process (:func:`relaxspec.integrations.vllm.lifeline`) and :func:`close_all`
stops them at the bench's end.
"""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relaxspec.errors import RelaxSpecError, check_int
from relaxspec.integrations.vllm import lifeline

DEFAULT_DIR = Path("runs/llamacpp")  # where scripts/llamacpp_peer.sh puts the build and the GGUFs
WEIGHTS = ("bf16", "q8_0")
PEERS: dict[str, dict[str, Any]] = {  # name -> parameters with defaults (k = 0: no drafts)
    "llamacpp-ar": {"weights": "bf16", "threads": 1, "dir": str(DEFAULT_DIR)},
    "llamacpp-sd": {"k": 4, "weights": "bf16", "threads": 1, "dir": str(DEFAULT_DIR)},
}
SUMMARY = {
    "llamacpp-ar": "llama.cpp's llama-server, autoregressive (GGUF of the target)",
    "llamacpp-sd": "llama.cpp's llama-server, draft-model speculative decoding, k drafts per step",
}


def is_peer(name: str) -> bool:
    return name in PEERS


def resolve(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """Validated parameters of a llama.cpp peer (unknown name, parameter or value: clear error)."""
    unknown = sorted(set(params) - set(PEERS[name]))
    if unknown:
        allowed = ", ".join(PEERS[name])
        raise RelaxSpecError(f"peer {name!r} has no parameter {', '.join(unknown)} (parameters: {allowed})")
    p = {**PEERS[name], **params}
    if p["weights"] not in WEIGHTS:
        raise RelaxSpecError(f"weights of {name!r} must be one of {', '.join(WEIGHTS)}, got {p['weights']!r}")
    check_int(f"threads of {name!r}", p["threads"], 1)
    if "k" in p:
        check_int(f"k of {name!r}", p["k"], 1)
    return p


@dataclass(frozen=True)
class ServerSpec:
    """One ``llama-server``: the build directory, the weights, drafts per step (0: AR), threads."""

    dir: Path
    weights: str
    k: int
    threads: int

    def files(self) -> tuple[Path, Path, Path | None]:
        """The binary, the target's GGUF and the draft's (None for AR); clear error if missing."""
        binary = self.dir / "bin" / "llama-server"
        target = self.dir / "gguf" / f"target-{self.weights}.gguf"
        draft = self.dir / "gguf" / f"draft-{self.weights}.gguf" if self.k else None
        for path in (binary, target, draft):
            if path is not None and not path.exists():
                raise RelaxSpecError(
                    f"llama.cpp peer: {path} not found; build llama.cpp and convert the models with "
                    f"scripts/llamacpp_peer.sh (or set the peer's dir=)"
                )
        return binary, target, draft

    def command(self, port: int, context: int) -> list[str]:
        binary, target, draft = self.files()
        t = str(self.threads)
        argv = [str(binary), "-m", str(target), "--host", "127.0.0.1", "--port", str(port),
                "-c", str(context), "-np", "1", "-t", t, "-tb", t, "--no-webui", "--log-disable"]  # fmt: skip
        if draft is not None:
            argv += ["--spec-type", "draft-simple", "-md", str(draft), "--spec-draft-n-max", str(self.k),
                     "--spec-draft-n-min", "0", "--spec-draft-p-min", "0", "-td", t, "-tbd", t]  # fmt: skip
        return argv


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LlamaCppServer:
    """A running ``llama-server`` for :class:`ServerSpec` (started here, stopped by :meth:`close`)."""

    def __init__(self, spec: ServerSpec, context: int = 2048, timeout: float = 120.0) -> None:
        self.spec, self.port = spec, _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            spec.command(self.port, context),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            preexec_fn=lifeline(),  # dies with this process
        )
        deadline = time.monotonic() + timeout
        while not self._healthy():
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode(errors="replace")[-2000:]  # type: ignore[union-attr]
                raise RelaxSpecError(f"llama-server exited with {self.process.returncode}: {err.strip()}")
            if time.monotonic() > deadline:
                self.close()
                raise RelaxSpecError(f"llama-server did not answer /health within {timeout:.0f} s")
            time.sleep(0.1)

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def post(self, route: str, body: dict[str, Any], timeout: float = 600.0) -> dict[str, Any]:
        request = urllib.request.Request(
            f"{self.url}{route}", json.dumps(body).encode(), {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as err:
            raise RelaxSpecError(f"llama-server {route}: HTTP {err.code}: {err.read()[:500]!r}") from None

    def tokenize(self, text: str) -> list[int]:
        return self.post("/tokenize", {"content": text, "add_special": True})["tokens"]

    def complete(
        self, prompt: str, max_new_tokens: int, sampling: Any, seed: int, stop: tuple[str, ...]
    ) -> dict[str, Any]:
        """One generation: ``{"tokens", "text", "seconds", "stats"}`` as our runners return."""
        body: dict[str, Any] = {"prompt": prompt, "n_predict": max_new_tokens, "stop": list(stop),
                                "cache_prompt": False, "return_tokens": True, "seed": seed,
                                "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0}  # fmt: skip
        if sampling.greedy:
            body.update(temperature=0.0, top_k=1)
        else:
            body.update(temperature=sampling.temperature, top_k=sampling.top_k or 0, top_p=sampling.top_p)
        out = self.post("/completion", body)
        t = out["timings"]
        stats = {"draft_n": t.get("draft_n", 0), "draft_n_accepted": t.get("draft_n_accepted", 0)}
        seconds = (t["prompt_ms"] + t["predicted_ms"]) / 1000
        return {"tokens": list(out.get("tokens") or []), "text": out["content"], "seconds": seconds,
                "stats": None, "llamacpp": stats}  # fmt: skip

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


_SERVERS: dict[ServerSpec, LlamaCppServer] = {}


def server(spec: ServerSpec, context: int = 2048) -> LlamaCppServer:
    """The running server of ``spec`` (started on first use; one per spec for the process)."""
    if spec not in _SERVERS:
        _SERVERS[spec] = LlamaCppServer(spec, context)
    return _SERVERS[spec]


def close_all() -> None:
    while _SERVERS:
        _SERVERS.popitem()[1].close()


def spec_of(name: str, params: dict[str, Any]) -> ServerSpec:
    p = resolve(name, params)
    return ServerSpec(Path(p["dir"]), p["weights"], int(p.get("k", 0)), int(p["threads"]))

"""Removes the vLLM server's stats directory once the server is gone, however it went.

Run as ``python -I stats_watchdog.py DIR`` by :func:`relaxspec.integrations.vllm.serve.temporary_stats_dir`
with its stdin a pipe from the server: the read below returns when every process holding the
pipe's other end has exited (the server and the engine core it forked), ``kill -9`` included.
Standard library only (``-I`` ignores the environment, so it starts fast and alone).
"""

from __future__ import annotations

import shutil
import signal
import sys


def main(where: str) -> None:
    # Ctrl-C or a SIGTERM to the whole process group: outlive the server, then clean up.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.stdin.buffer.read()
    shutil.rmtree(where, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])

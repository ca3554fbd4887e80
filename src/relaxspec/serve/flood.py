"""A flood of 2 MB completion requests: ``python -m relaxspec.serve.flood HOST PORT N [UNIT]``.

N connections each POST a ~2 MB prompt (``UNIT`` repeated) to ``/v1/completions`` and read the
reply; prints a JSON count of the HTTP status codes. One thread of a separate process, so the
clients cost the server's CPU almost nothing (used by the prompt-flood test and script, issue 35).
"""

from __future__ import annotations

import asyncio
import collections
import json
import sys


async def _one(host: str, port: int, request: bytes) -> str:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(request)
    await writer.drain()
    status = (await reader.readline()).split()[1].decode()
    await reader.read()
    writer.close()
    return status


async def flood(host: str, port: int, n: int, unit: str = "w1 w2 w3 ") -> collections.Counter[str]:
    """Send ``n`` concurrent ~2 MB requests; the count of each status code."""
    body = json.dumps({"prompt": unit * (2_000_000 // len(unit)), "max_tokens": 4}).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode()
    return collections.Counter(await asyncio.gather(*(_one(host, port, head + body) for _ in range(n))))


if __name__ == "__main__":
    host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    unit = sys.argv[4] if len(sys.argv) > 4 else "w1 w2 w3 "
    print(json.dumps(asyncio.run(flood(host, port, n, unit))))

"""Serving an app in-process: uvicorn on a loopback port in a daemon thread (tests, notebooks,
scripts)."""

from __future__ import annotations

import threading
import time

from fastapi import FastAPI

from relaxspec.errors import RelaxSpecError


class BackgroundServer:
    """Run an app with uvicorn on a loopback port in a daemon thread (tests, notebooks).

    ``with BackgroundServer(app) as url: ...`` binds a free port (``port=0``) before starting, so
    ``url`` is usable as soon as the block starts; leaving the block shuts the server down.
    """

    def __init__(
        self, app: FastAPI, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning"
    ) -> None:
        import uvicorn

        self.host = host
        self.port = port
        self.server = uvicorn.Server(uvicorn.Config(app, log_level=log_level, lifespan="on"))
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> str:
        import socket

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = int(sock.getsockname()[1])
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, daemon=True, name="relaxspec-server"
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RelaxSpecError(f"the server did not start on {self.url}")
            time.sleep(0.01)
        return self.url

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

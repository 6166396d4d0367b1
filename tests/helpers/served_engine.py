"""Engines behind rapo-echo's OpenAI-compatible server in the test's own process (the protocol ``vllm
serve`` speaks), on free ports: what the TRL and verifiers tiers reach a served role or the policy by."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


@contextmanager
def serving() -> Iterator[Any]:
    """``serve(engine, name) -> base URL``; every server it started stops when the block ends."""
    import uvicorn

    from rapo_echo.serve import create_app

    servers: list[Any] = []

    def serve(engine: Any, name: str = "served") -> str:
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        server = uvicorn.Server(uvicorn.Config(create_app(engine, name), log_level="warning"))
        threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True).start()
        deadline = time.monotonic() + 60
        while not server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("the in-process server did not start in 60 s")
            time.sleep(0.05)
        servers.append(server)
        return f"http://127.0.0.1:{sock.getsockname()[1]}/v1"

    try:
        yield serve
    finally:
        for server in servers:
            server.should_exit = True

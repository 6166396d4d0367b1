"""A whole-request deadline for synchronous ``httpx`` requests.

httpx's timeouts bound each socket operation, so a server that trickles a byte now and then keeps a
request alive indefinitely. :class:`Deadline` bounds the whole request: every socket wait gets at most
the time left, and when the deadline passes a timer shuts the connection's socket down, which ends the
read in progress at once (one watchdog thread serves every pending deadline). The socket is learnt
from httpcore's ``trace`` extension when the connection is opened, so the client must open a connection
per request (no keep-alive); a pooled connection would be opened before the deadline existed.
"""

from __future__ import annotations

import heapq
import itertools
import socket
import threading
import time
from typing import Any

import httpx

_OPENED = ("connection.connect_tcp.complete", "connection.start_tls.complete")


class _Watchdog:
    """One daemon thread that expires every pending :class:`Deadline` at its time (a timer thread per
    request would double the threads a wide stage of requests starts)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Deadline]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def add(self, deadline: Deadline) -> None:
        with self._cond:
            heapq.heappush(self._heap, (deadline.end, next(self._order), deadline))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and self._heap[0][2].done:  # ended in time: drop
                    heapq.heappop(self._heap)
                if not self._heap:
                    self._cond.wait(60.0)
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, due = heapq.heappop(self._heap)
            due._expire()


_WATCHDOG = _Watchdog()


class Deadline:
    """Use as ``with Deadline(s) as d: client.request(..., timeout=d.timeout(), extensions=d.extensions())``;
    ``expired`` tells whether a failure came from the deadline."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.end = time.monotonic() + seconds
        self.expired = False
        self.done = False  # the request ended (the watchdog then forgets it)
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Deadline:
        _WATCHDOG.add(self)
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self.done = True

    def left(self) -> float:
        return max(0.001, self.end - time.monotonic())

    def timeout(self) -> httpx.Timeout:
        """Connect, write, read and pool timeouts of at most the time left."""
        return httpx.Timeout(self.left())

    def extensions(self) -> dict[str, Any]:
        return {"trace": self._trace}

    def _trace(self, name: str, info: dict[str, Any]) -> None:
        if name not in _OPENED:
            return
        stream = info.get("return_value")
        sock = stream.get_extra_info("socket") if stream is not None else None
        if isinstance(sock, socket.socket):
            with self._lock:
                self._sockets.append(sock)
                if self.expired:
                    _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.expired = True
            for sock in self._sockets:
                _shutdown(sock)


def _shutdown(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already closed
        pass

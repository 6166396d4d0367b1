"""How remote requests go out together: an engine's request limits (requests in flight, requests and tokens
per minute, a server's ``Retry-After``) and independent stages run at the same time.

Every request of a stage goes out at once (bounded only by :class:`RequestLimits`) and stages that do not
depend on each other run together (:func:`together`), on threads rather than asyncio: docs/models.md says
why. Only engines with ``concurrent_calls = True`` (``openai``) are called from several threads.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, TypeVar

T = TypeVar("T")


def calls_concurrently(*engines: Any) -> bool:
    """Whether every given engine (None ignored) may be called from several threads at once."""
    present = [e for e in engines if e is not None]
    return bool(present) and all(getattr(e, "concurrent_calls", False) is True for e in present)


def together(calls: Sequence[Callable[[], T]], *, concurrent: bool) -> list[T]:
    """The results of ``calls`` in order: run at the same time when ``concurrent`` (the first on the calling
    thread, so a local model's work stays there; the others on threads), else one after another. Every call
    runs to its end; then the first exception (in call order) is raised."""
    if not concurrent or len(calls) <= 1:
        return [c() for c in calls]
    with ThreadPoolExecutor(max_workers=len(calls) - 1, thread_name_prefix="together") as pool:
        futures = [pool.submit(c) for c in calls[1:]]
        first: list[T] = []
        error: BaseException | None = None
        try:
            first.append(calls[0]())
        except BaseException as exc:  # raised below, after the others have ended
            error = exc
        errors = [error, *(f.exception() for f in futures)]
    for exc in errors:
        if exc is not None:
            raise exc
    return [*first, *(f.result() for f in futures)]


class TokenBucket:
    """A rate limit: ``per_minute`` units refill continuously, at most one second's worth (or one unit) is
    held at once; :meth:`take` waits until ``amount`` is there and takes it. An amount larger than the bucket
    waits for a full bucket and leaves it in debt, so later takers wait for the rest. :meth:`give` returns
    (or, negative, charges) units once the true cost of a request is known."""

    def __init__(
        self,
        per_minute: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if per_minute <= 0:
            raise ValueError(f"a rate limit must be > 0 per minute, got {per_minute}")
        self.rate = per_minute / 60.0
        self.capacity = max(self.rate, 1.0)
        self.level = self.capacity
        self._clock, self._sleep = clock, sleep
        self._last = clock()
        self._lock = threading.Lock()

    def _refill(self) -> None:
        now = self._clock()
        self.level = min(self.capacity, self.level + (now - self._last) * self.rate)
        self._last = now

    def take(self, amount: float = 1.0) -> float:
        """Take ``amount`` units, waiting as long as the rate requires; returns the seconds waited."""
        waited = 0.0
        while True:
            with self._lock:
                self._refill()
                need = min(amount, self.capacity)
                if self.level >= need:
                    self.level -= amount
                    return waited
                wait = (need - self.level) / self.rate
            self._sleep(wait)
            waited += wait

    def give(self, amount: float) -> None:
        """Return ``amount`` units (negative: charge them), never above the bucket's capacity."""
        with self._lock:
            self._refill()
            self.level = min(self.capacity, self.level + amount)


class RequestLimits:
    """The limits every request of one engine shares, whichever thread or stage sends it: at most
    ``max_concurrency`` in flight, ``max_rpm`` requests and ``max_tpm`` tokens per minute (None: no limit),
    and no new request before a time a server asked for (``Retry-After`` of HTTP 429 / 503,
    :meth:`pause_until`). A retry's backoff is spent outside the slot, so it holds nothing."""

    def __init__(
        self,
        max_concurrency: int,
        max_rpm: float | None = None,
        max_tpm: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.max_concurrency = max_concurrency
        self.rpm = TokenBucket(max_rpm, clock=clock, sleep=sleep) if max_rpm else None
        self.tpm = TokenBucket(max_tpm, clock=clock, sleep=sleep) if max_tpm else None
        self._slots = threading.BoundedSemaphore(max_concurrency)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self._not_before = 0.0
        self.in_flight = 0
        self.most_in_flight = 0

    def pause_until(self, when: float) -> None:
        """Send no new request before ``when`` (this clock's time)."""
        with self._lock:
            self._not_before = max(self._not_before, when)

    def _wait_pause(self) -> None:
        while True:
            with self._lock:
                wait = self._not_before - self._clock()
            if wait <= 0:
                return
            self._sleep(wait)

    @contextmanager
    def slot(self, tokens: float = 0.0) -> Iterator[None]:
        """Hold one request's place: after any pause, the request and its ``tokens`` taken from the rate
        limits, then a free slot."""
        self._wait_pause()
        if self.rpm is not None:
            self.rpm.take(1.0)
        if self.tpm is not None and tokens > 0:
            self.tpm.take(tokens)
        with self._slots:
            with self._lock:
                self.in_flight += 1
                self.most_in_flight = max(self.most_in_flight, self.in_flight)
            try:
                yield
            finally:
                with self._lock:
                    self.in_flight -= 1

    def settle_tokens(self, estimated: float, used: float | None) -> None:
        """Correct the token limit once a response says how many tokens the request ``used``."""
        if self.tpm is not None and used is not None:
            self.tpm.give(estimated - used)

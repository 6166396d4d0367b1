"""A scripted engine that plays a served one for the stages-together tests: it says it may be called from
several threads (``concurrent_calls``) and makes its calls meet."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.types import Conversation, Generation, SamplingParams


class MeetingEngine(ScriptedEngine):
    """A :class:`ScriptedEngine` whose calls wait until ``want`` of them are inside at once (then all go
    on, and every later call passes at once). ``peak`` is the most calls that were inside together: it
    reaches ``want`` only if the caller made those calls at the same time; called one after another, the
    first waits ``timeout`` in vain and ``peak`` stays below ``want`` (the test fails, it does not hang).
    Nothing asserts a duration. Use ``fn`` / ``rules`` scripts (``replies`` are taken in call order)."""

    concurrent_calls = True

    def __init__(self, want: int, *args: Any, timeout: float = 30.0, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.want, self.timeout = want, timeout
        self._lock = threading.Lock()
        self.inside = self.peak = 0

    @contextmanager
    def _meet(self) -> Iterator[None]:
        with self._lock:
            self.inside += 1
            self.peak = max(self.peak, self.inside)
        end = time.monotonic() + self.timeout
        while self.peak < self.want and time.monotonic() < end:
            time.sleep(0.005)
        try:
            yield
        finally:
            with self._lock:
                self.inside -= 1

    def generate(self, prompts: Sequence[Conversation], params: SamplingParams) -> list[list[Generation]]:
        with self._meet():
            return super().generate(prompts, params)

    def choice_logprobs(
        self, prompts: Sequence[Conversation], options: Sequence[str]
    ) -> list[dict[str, float]]:
        with self._meet():
            return super().choice_logprobs(prompts, options)

"""Dialogues that advance together: every dialogue's next remote turn in flight at once and, with a served
simulator, the policy's next turn for the dialogues whose answers are back overlapping with the remote
calls of the others (docs/models.md; ``rollout.overlap_remote``).

A multi-turn rollout or benchmark alternates a *local* step (the policy's next reply: one batched
generation) and a *remote* step (the simulated user, and the critic where there is one). ``lockstep``
takes every live dialogue's local step in one batch, then its remote step in one batched call: used
whenever the remote roles run on local engines, and always reproducible. ``overlap`` (served remote roles,
:func:`~rapo_echo.engines.concurrency.calls_concurrently`) sends each dialogue's remote step on its own
thread as soon as its local step is done, and batches the next local step for the dialogues whose answers
are back (those within a short window of the first ride along); which dialogues share a batch then depends
on the server's timing, so sampled policy turns are not bit-reproducible.

Threads, not asyncio, for the reasons of :mod:`rapo_echo.engines.concurrency`; local steps and all the
callers' bookkeeping (``settle``, ``on_end``) run on the calling thread, so tokenizers and models are
never used from two threads.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

D = TypeVar("D")
WINDOW_SHARE = 0.25  # answers arriving within this share of the first one's wait ride along with it
MIN_WINDOW_S = 0.02


@dataclass
class TurnStats:
    """What a run of :func:`advance_together` did: local batches (policy generations) and remote steps."""

    local_batches: int = 0
    remote_steps: int = 0


@dataclass
class _Entry(Generic[D]):
    index: int
    dialogue: D


def advance_together(
    dialogues: Sequence[D],
    local: Callable[[list[D]], None],
    remote: Callable[[list[D]], None],
    *,
    done: Callable[[D], bool],
    settle: Callable[[D], None] | None = None,
    on_end: Callable[[list[D]], None] | None = None,
    overlap: bool = False,
) -> TurnStats:
    """Advance ``dialogues`` until each is ``done``: ``local(batch)`` takes the next local step of a batch
    (on this thread), ``remote(batch)`` the remote step (lockstep: the whole batch in one call on this
    thread; ``overlap``: one dialogue per call, each on its own thread), ``settle(d)`` the bookkeeping after
    a dialogue's remote step (this thread), ``on_end(batch)`` whatever the dialogues that ended in one
    collection need (this thread). Dialogues already done are left alone. An exception of a remote step
    (an endpoint that is down) stops everything and is raised once the steps in flight have ended."""
    stats = TurnStats()
    ready = [_Entry(i, d) for i, d in enumerate(dialogues) if not done(d)]
    if not overlap:
        while ready:
            batch = [e.dialogue for e in ready]
            local(batch)
            remote(batch)
            stats.local_batches += 1
            stats.remote_steps += 1
            ready = _collect(ready, done, settle, on_end)
        return stats
    pool = ThreadPoolExecutor(max_workers=max(len(ready), 1), thread_name_prefix="turns")
    pending: dict[Future[None], _Entry[D]] = {}
    try:
        while ready or pending:
            if ready:
                local([e.dialogue for e in ready])
                stats.local_batches += 1
                for e in ready:
                    pending[pool.submit(remote, [e.dialogue])] = e
                    stats.remote_steps += 1
            t0 = time.monotonic()
            first, _ = wait(pending, return_when=FIRST_COMPLETED)
            waited = time.monotonic() - t0
            rest = [f for f in pending if f not in first]
            if rest:
                wait(rest, timeout=max(MIN_WINDOW_S, WINDOW_SHARE * waited))
            finished = sorted((f for f in pending if f.done()), key=lambda f: pending[f].index)
            back = []
            for f in finished:
                entry = pending.pop(f)
                f.result()  # an endpoint that is down: raised here
                back.append(entry)
            ready = _collect(back, done, settle, on_end)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    return stats


def _collect(
    back: list[_Entry[D]],
    done: Callable[[D], bool],
    settle: Callable[[D], None] | None,
    on_end: Callable[[list[D]], None] | None,
) -> list[_Entry[D]]:
    """Settle the dialogues whose remote step came back; hand the ended ones to ``on_end``; the rest go on."""
    for e in back:
        if settle is not None:
            settle(e.dialogue)
    ended = [e.dialogue for e in back if done(e.dialogue)]
    if ended and on_end is not None:
        on_end(ended)
    return [e for e in back if not done(e.dialogue)]

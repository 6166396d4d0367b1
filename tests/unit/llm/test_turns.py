"""Dialogues that advance together (rapo_echo.llm.turns): lockstep batches; with overlap, every dialogue's
remote step in flight at once and the policy's next turn for a dialogue that is back taken while another
is still out (shown with events, not timing); bookkeeping on the calling thread; errors propagate."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import pytest

from rapo_echo.llm.turns import advance_together


@dataclass
class Talk:
    name: str
    turns: int
    said: list[str] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.said) >= 2 * self.turns


def test_lockstep_takes_every_live_dialogue_in_one_batch_per_step():
    talks = [Talk("a", 1), Talk("b", 3), Talk("c", 2), Talk("done", 0)]
    local_batches: list[list[str]] = []
    remote_batches: list[list[str]] = []
    ended: list[list[str]] = []

    def local(batch: list[Talk]) -> None:
        local_batches.append([t.name for t in batch])
        for t in batch:
            t.said.append("policy")

    def remote(batch: list[Talk]) -> None:
        remote_batches.append([t.name for t in batch])
        for t in batch:
            t.said.append("user")

    def on_end(batch: list[Talk]) -> None:
        ended.append([t.name for t in batch])

    stats = advance_together(talks, local, remote, done=lambda t: t.done, on_end=on_end)
    assert local_batches == remote_batches == [["a", "b", "c"], ["b", "c"], ["b"]]
    assert ended == [["a"], ["c"], ["b"]] and talks[3].said == []  # one done at the start is left alone
    assert (stats.local_batches, stats.remote_steps) == (3, 3)


def test_overlap_sends_every_remote_step_at_once_and_the_policy_takes_whoever_is_back():
    slow, fast = Talk("slow", 1), Talk("fast", 2)
    both_out = threading.Barrier(2, timeout=30)  # both remote steps in flight at the same time
    fast_went_on = threading.Event()  # the policy's second turn for "fast" has been taken
    local_batches: list[list[str]] = []
    main = threading.current_thread()
    settled_on: set[str] = set()

    def local(batch: list[Talk]) -> None:
        local_batches.append([t.name for t in batch])
        for t in batch:
            t.said.append("policy")
        if len(local_batches) == 2:
            fast_went_on.set()

    def remote(batch: list[Talk]) -> None:
        [t] = batch
        if len(t.said) == 1:  # first remote step of each dialogue
            both_out.wait()
        if t.name == "slow":  # "slow" is answered only after the policy has gone on with "fast"
            assert fast_went_on.wait(30)
        t.said.append("user")

    stats = advance_together(
        [slow, fast],
        local,
        remote,
        done=lambda t: t.done,
        settle=lambda t: settled_on.add(threading.current_thread().name),
        overlap=True,
    )
    assert local_batches == [["slow", "fast"], ["fast"]]  # "fast" went on alone while "slow" was out
    assert slow.done and fast.done and stats.remote_steps == 3
    assert settled_on == {main.name}  # bookkeeping stays on the calling thread


def test_overlap_batches_the_dialogues_that_are_back_together():
    talks = [Talk(str(i), 2) for i in range(6)]
    local_batches: list[int] = []

    def local(batch: list[Talk]) -> None:
        local_batches.append(len(batch))
        for t in batch:
            t.said.append("policy")

    def remote(batch: list[Talk]) -> None:
        batch[0].said.append("user")

    advance_together(talks, local, remote, done=lambda t: t.done, overlap=True)
    assert all(t.done for t in talks) and sum(local_batches) == 12 and local_batches[0] == 6


def test_a_remote_error_stops_the_dialogues_and_is_raised():
    def remote(batch: list[Talk]) -> None:
        if batch[0].name == "down":
            raise ConnectionError("simulator endpoint down")
        batch[0].said.append("user")

    def local(batch: list[Talk]) -> None:
        for t in batch:
            t.said.append("policy")

    talks = [Talk("down", 2), Talk("up", 2)]
    with pytest.raises(ConnectionError, match="endpoint down"):
        advance_together(talks, local, remote, done=lambda t: t.done, overlap=True)
    with pytest.raises(ConnectionError, match="endpoint down"):
        advance_together([Talk("down", 1)], lambda b: None, remote, done=lambda t: t.done)

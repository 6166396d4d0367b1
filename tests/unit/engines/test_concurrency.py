"""Request limits and stages run together (rapo_echo.engines.concurrency): token buckets against hand-worked
waits on a fake clock, the in-flight cap, a server's pause, and ``together`` (concurrent only when asked)."""

from __future__ import annotations

import threading

import pytest

from rapo_echo.engines.concurrency import RequestLimits, TokenBucket, calls_concurrently, together


class FakeClock:
    """A clock that only moves when something sleeps."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.slept.append(s)
        self.now += s


def test_token_bucket_hand_values():
    clock = FakeClock()
    rpm = TokenBucket(60, clock=clock, sleep=clock.sleep)  # 1 a second, holds 1
    assert rpm.take() == 0.0  # full at start
    assert rpm.take() == pytest.approx(1.0)  # empty: waits one second for the next
    clock.now += 0.25
    assert rpm.take() == pytest.approx(0.75)  # a quarter refilled meanwhile
    tpm = TokenBucket(600, clock=clock, sleep=clock.sleep)  # 10 a second, holds 10
    assert tpm.take(25) == 0.0  # larger than the bucket: taken from a full one, 15 in debt
    assert tpm.level == pytest.approx(-15)
    assert tpm.take(1) == pytest.approx(1.6)  # (1 + 15) / 10
    tpm.give(5)  # a response used 5 tokens fewer than charged
    assert tpm.level == pytest.approx(5)
    tpm.give(100)  # never above the capacity
    assert tpm.level == pytest.approx(10)
    with pytest.raises(ValueError, match="> 0"):
        TokenBucket(0)


def test_limits_pause_until_a_servers_retry_after():
    clock = FakeClock()
    limits = RequestLimits(4, clock=clock, sleep=clock.sleep)
    limits.pause_until(2.5)
    with limits.slot():
        assert clock.now == pytest.approx(2.5)  # no request left before the time the server asked for
    limits.pause_until(1.0)  # an earlier time never shortens a pause
    with limits.slot():
        assert clock.now == pytest.approx(2.5)
    with pytest.raises(ValueError, match="max_concurrency"):
        RequestLimits(0)


def test_limits_charge_requests_and_tokens_per_minute():
    clock = FakeClock()
    limits = RequestLimits(8, max_rpm=120, max_tpm=60, clock=clock, sleep=clock.sleep)
    with limits.slot(tokens=2):  # rpm: 2 a second (holds 2); tpm: 1 a second (holds 1): 1 token in debt
        pass
    with limits.slot(tokens=2):  # rpm has one left; tpm waits (1 - -1) / 1 = 2 s, then is 1 in debt again
        pass
    assert clock.slept == [pytest.approx(2.0)]
    assert limits.tpm is not None and limits.tpm.level == pytest.approx(-1)
    limits.settle_tokens(estimated=2, used=1)  # the response's usage gives 1 back
    assert limits.tpm.level == pytest.approx(0)
    limits.settle_tokens(estimated=2, used=None)  # no usage in the response: nothing changes
    assert limits.tpm.level == pytest.approx(0)


def test_limits_never_hold_more_than_max_concurrency():
    limits = RequestLimits(3)
    inside = threading.Barrier(3, timeout=30)

    def request() -> None:
        with limits.slot():
            inside.wait()  # three in flight at once: the cap is reached, never passed

    threads = [threading.Thread(target=request) for _ in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert limits.most_in_flight == 3 and limits.in_flight == 0


def test_together_runs_calls_at_once_only_when_asked():
    meet = threading.Barrier(2, timeout=30)
    # concurrent: both calls wait for each other (one after another they would break the barrier)
    assert together([lambda: meet.wait() * 0 + 1, lambda: meet.wait() * 0 + 2], concurrent=True) == [1, 2]
    order: list[int] = []
    assert together([lambda: order.append(1), lambda: order.append(2)], concurrent=False) == [None, None]
    assert order == [1, 2]
    # the first call stays on the calling thread (a local model's work), the others go to threads
    names = together([lambda: threading.current_thread().name] * 3, concurrent=True)
    assert names[0] == threading.current_thread().name and threading.current_thread().name not in names[1:]


def test_together_lets_every_call_end_then_raises_the_first_error():
    ended: list[str] = []

    def fails() -> None:
        raise RuntimeError("endpoint down")

    def works() -> str:
        ended.append("works")
        return "ok"

    with pytest.raises(RuntimeError, match="endpoint down"):
        together([fails, works], concurrent=True)
    assert ended == ["works"]


def test_calls_concurrently_needs_every_engine_to_say_so():
    class Served:
        concurrent_calls = True

    class Local:
        pass

    assert calls_concurrently(Served(), None) and calls_concurrently(Served(), Served())
    assert not calls_concurrently(Served(), Local()) and not calls_concurrently(None)

"""The progress display: nested bars with counts, remote calls done / in flight / failed from any thread,
engines reporting through the one sink, and nothing shown until it is enabled."""

from __future__ import annotations

import io
import threading
from contextlib import contextmanager

import pytest

from rapo_echo import progress
from rapo_echo.engines.openai_engine import EndpointError, OpenAIEngine
from rapo_echo.types import SamplingParams


@pytest.fixture
def shown():
    out = io.StringIO()
    progress.enable(True, file=out)
    yield out
    progress.enable(False)


def test_nothing_is_shown_until_enabled() -> None:
    assert not progress.enabled()
    with progress.task("steps", total=3) as bar:
        bar.update(1)
        bar.note(loss=1.0)
        progress.remote(done=1, in_flight=2, failed=0)
    assert bar.bar is None


def test_nested_bars_and_remote_counts(shown: io.StringIO) -> None:
    with progress.task("rapo", total=2, unit="step") as steps:
        with progress.task(progress.label("judge:openai", "requests"), total=5, unit="req") as calls:
            assert abs(calls.bar.pos) == 1 and steps.bar.pos == 0  # nested one line below
            progress.remote(done=3, in_flight=1, failed=1)
            assert calls.bar.n == 4 and calls.bar.total == 5
            assert calls.bar.postfix == "in flight=1, failed=1"
        steps.update(2)
    text = shown.getvalue()
    assert "judging (judge:openai)" in text and "rapo: 100%" in text and "2/2" in text


def test_labels_name_the_stage_of_a_role() -> None:
    assert progress.label("policy", "generate") == "generation (policy)"
    assert progress.label("simulator:hf", "generate") == "simulation (simulator:hf)"
    assert progress.label("judge:policy-base", "generate") == "judging (judge:policy-base)"
    assert progress.label("cli:hf", "generate") == "cli:hf: generate"


def test_openai_engine_reports_done_in_flight_and_failed(monkeypatch) -> None:
    seen: list[tuple[int, int, int, int | None]] = []
    monkeypatch.setattr(
        progress,
        "remote",
        lambda *, done, in_flight, failed=0, total=None: seen.append((done, in_flight, failed, total)),
    )
    engine = OpenAIEngine("http://127.0.0.1:9/v1", model="m", max_concurrency=3, name="judge:openai")
    both_in_flight = threading.Barrier(2, timeout=10)

    def call(x: int) -> int:
        if x < 2:
            both_in_flight.wait()  # two requests are in flight at once
        if x == 3:
            raise EndpointError("server gone")  # a request that failed for good costs its item
        if x == 4:
            raise ConnectionError("a bug, not the endpoint")  # propagates, counted as failed
        return x * 10

    assert engine._map(call, [0, 1, 2, 3], lambda exc: None) == [0, 10, 20, None]
    assert max(in_flight for _, in_flight, _, _ in seen) >= 2
    assert seen[-1][0] + seen[-1][2] == 4 and seen[-1][2] == 1 and seen[-1][1] == 0
    assert {total for *_, total in seen} == {4}
    with pytest.raises(ConnectionError):
        engine._map(call, [4], lambda exc: None)
    engine.close()
    assert seen[-1] == (0, 0, 1, 1)


def test_hf_engine_reports_replies_per_decoded_chunk(monkeypatch, smol_tokenizer) -> None:
    from rapo_echo.engines.hf import HFEngine
    from tests.conftest import make_tiny_model

    opened: list[tuple[str, int | None]] = []
    updates: list[int] = []

    class Bar(progress.Task):
        def update(self, n: int = 1) -> None:
            updates.append(n)

    @contextmanager
    def task(desc, total=None, unit="it", initial=0):
        opened.append((desc, total))
        yield Bar()

    monkeypatch.setattr(progress, "task", task)
    engine = HFEngine(make_tiny_model(smol_tokenizer), smol_tokenizer, name="policy", max_batch_size=4)
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8]]
    engine.generate_ids(prompts, SamplingParams(max_new_tokens=2, n=2, temperature=1.0, seed=0))
    assert opened == [("generation (policy)", 6)]
    assert updates == [4, 2]  # two prompts (4 replies) per chunk of max_batch_size 4, then the last


def test_third_party_chatter_is_quiet_unless_verbose(monkeypatch) -> None:
    import logging
    import warnings

    monkeypatch.setattr(logging.getLogger("httpx"), "level", logging.NOTSET)
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    with warnings.catch_warnings():
        progress.quiet_third_party(verbose=True)
        assert logging.getLogger("httpx").level == logging.NOTSET
        progress.quiet_third_party(verbose=False)
        assert logging.getLogger("httpx").level == logging.WARNING
        assert progress.os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
        with warnings.catch_warnings(record=True) as caught:
            warnings.warn_explicit("old API", FutureWarning, "x.py", 1, module="transformers.modeling_utils")
            warnings.warn_explicit("ours", UserWarning, "y.py", 1, module="rapo_echo.training.learner")
        assert [str(w.message) for w in caught] == ["ours"]

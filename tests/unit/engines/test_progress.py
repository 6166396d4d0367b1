"""The progress display: nested bars with counts, remote calls done / in flight / failed from any thread,
engines reporting through the one sink (the ``hf`` engine per reply as it finishes), bars that redraw
while a call runs, lines instead of bars where there is no terminal, and nothing shown until it is
enabled."""

from __future__ import annotations

import io
import threading
from contextlib import contextmanager

import pytest

from rapo_echo import progress
from rapo_echo.engines.openai_engine import EndpointError, OpenAIEngine
from rapo_echo.types import SamplingParams


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def shown():
    out = Terminal()
    progress.enable(True, file=out)
    yield out
    progress.enable(False)


@pytest.fixture
def logged():
    out = io.StringIO()  # not a terminal: a log file, a pipe
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
    assert progress.label("simulator+judge:hf", "generate") == "simulation or judging (simulator+judge:hf)"


def test_eval_names_each_engine_by_the_roles_it_plays() -> None:
    """``rapo-echo eval``'s bars said ``cli:hf: generate`` (issue 49, item 13): no role."""
    from rapo_echo.benchmarks.cli import build_roles

    served = {"policy": "http://127.0.0.1:9/v1", "simulator": "http://127.0.0.1:8/v1"}
    kw = {"model": "m"}  # a named model: no request to the (absent) servers
    roles = build_roles(("policy", "simulator", "judge"), {**served, "judge": served["simulator"]}, **kw)
    assert roles.policy.name == "policy:openai"
    assert roles.simulator is roles.judge and roles.judge.name == "simulator+judge:openai"
    specs = {"policy": served["policy"], "simulator": "x", "judge": "policy"}
    shared = build_roles(("policy", "judge"), specs, **kw)
    assert shared.judge is shared.policy and shared.policy.name == "policy+judge:openai"


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


@pytest.mark.parametrize("loop", ["dynamic", "static"])
def test_hf_engine_reports_each_reply_as_it_finishes(loop: str, monkeypatch, smol_tokenizer) -> None:
    from rapo_echo.engines.hf import HFEngine
    from tests.conftest import make_tiny_model

    opened: list[tuple[str, int | None]] = []
    updates: list[int] = []
    notes: list[str] = []

    class Bar(progress.Task):
        def update(self, n: int = 1) -> None:
            updates.append(n)

        def note(self, refresh: bool = True, **values) -> None:
            notes.append(values["token"])

    @contextmanager
    def task(desc, total=None, unit="it", initial=0):
        opened.append((desc, total))
        yield Bar()

    monkeypatch.setattr(progress, "task", task)
    engine = HFEngine(
        make_tiny_model(smol_tokenizer), smol_tokenizer, name="policy", max_batch_size=4, decode_loop=loop
    )
    engine.eos_ids = set(range(len(smol_tokenizer) // 2))  # about half the tokens end a reply
    prompts = [[1, 2, 3], [4, 5], [6, 7, 8]]
    gens = engine.generate_ids(prompts, SamplingParams(max_new_tokens=12, n=2, temperature=1.0, seed=0))
    assert opened == [("generation (policy)", 6)]
    lengths = sorted({len(g.token_ids) for row in gens for g in row})
    assert len(lengths) > 1  # the replies ended at different steps
    assert sum(updates) == 6
    if loop == "dynamic":  # counted as they end, every step
        assert len(updates) > 2 and notes[:2] == ["1/12", "2/12"]
    else:  # where the static loop reads how many have ended anyway: every 8 steps
        assert "8/12" in notes


def test_bars_redraw_while_nothing_moves(shown: Terminal) -> None:
    with progress.task("simulation (simulator:hf)", total=4, unit="reply"):
        before = len(shown.getvalue())
        progress.beat()
        assert len(shown.getvalue()) > before  # the elapsed time is drawn again


def test_without_a_terminal_lines_say_where_every_bar_stands(logged: io.StringIO) -> None:
    with progress.task("rapo", total=2, unit="step") as steps:
        with progress.task(progress.label("policy:hf", "generate"), total=32, unit="reply") as gen:
            gen.update(12)
            progress.beat(now=10**9)  # LINE_EVERY_S has passed
            progress.beat(now=10**9)  # and not again since
        steps.update(1)
    lines = logged.getvalue().splitlines()
    assert "\r" not in logged.getvalue()
    assert len(lines) == 3, lines  # the beat, the outer bar's move, its close
    assert lines[0].endswith("progress: rapo 0/2 step [0:00] | generation (policy:hf) 12/32 reply [0:00]")
    assert "progress: rapo 1/2 step [0:00]" in lines[1]


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


@pytest.mark.parametrize("verbose", [False, True])
def test_deepspeed_says_nothing_about_the_cpu_unless_verbose(verbose: bool) -> None:
    """DeepSpeed's logger sets its own level and handler when it loads; its 'Setting accelerator to CPU'
    followed every CPU run (issue 49, item 13)."""
    import os
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    code = (
        "from rapo_echo.progress import quiet_third_party\n"
        f"quiet_third_party(verbose={verbose})\n"
        "from deepspeed.accelerator import get_accelerator\n"
        "print(get_accelerator().device_name())\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    said = done.stdout + done.stderr
    if "cuda" in done.stdout:
        pytest.skip("a GPU answers: DeepSpeed has nothing to say about the CPU")
    assert ("Setting accelerator to CPU" in said) == verbose, said

"""The data commands' runner: resume after an interruption or a kill -9 without redoing finished contexts,
refuse changed settings or changed context content, and lose only the contexts a remote failure hits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rapo_echo.datagen.contexts import context_key
from rapo_echo.datagen.runner import data_config, run_pipeline
from rapo_echo.engines.openai_engine import EndpointError
from rapo_echo.errors import CapabilityError, ConfigError
from rapo_echo.types import Scenario

REPO = Path(__file__).resolve().parents[3]


def contexts(n: int) -> list[Scenario]:
    return [Scenario(f"c{i}", [{"role": "user", "content": f"message {i}"}]) for i in range(n)]


class Fake:
    """A pipeline that records which contexts each chunk held."""

    name = "fake"
    dataset_file = "rows.jsonl"

    def __init__(self, fail: set[str] | None = None, interrupt_at: int | None = None, error=EndpointError):
        self.chunks: list[list[str]] = []
        self.fail, self.interrupt_at, self.error = fail or set(), interrupt_at, error

    def run_chunk(self, chunk):
        self.chunks.append([c.id for c in chunk])
        if self.interrupt_at is not None and len(self.chunks) == self.interrupt_at:
            raise KeyboardInterrupt
        if self.fail & {c.id for c in chunk}:
            raise self.error("HTTP 500 from the server")
        return [{"said": c.messages[-1]["content"]} for c in chunk]

    def export(self, items):
        return [{"id": sc.id, "said": r["said"]} for sc, r in items], {"n": len(items)}


def config(**settings) -> dict:
    return data_config(
        "fake", {"judge": "default"}, "data.jsonl", "auto", {"x": 1, **settings}, {"prompts": "p"}
    )


def run(pipe, ctx, out, cfg=None, batch_size=2):
    return run_pipeline(pipe, ctx, out, cfg or config(), batch_size=batch_size, progress=False)


def test_interrupted_run_resumes_without_redoing(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        run(Fake(interrupt_at=2), contexts(5), out)
    lines = (out / "results.jsonl").read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines] == ["c0", "c1"]
    again = Fake()
    summary = run(again, contexts(5), out, batch_size=3)  # batch size may change on resume
    assert again.chunks == [["c2", "c3", "c4"]]
    rows = [json.loads(x) for x in (out / "rows.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["c0", "c1", "c2", "c3", "c4"]
    assert summary["complete"] and summary["n_done"] == 5
    third = Fake()
    run(third, contexts(5), out)
    assert third.chunks == []


def test_progress_is_written_as_lines_without_a_terminal(tmp_path: Path, capsys) -> None:
    """``data synthesize`` printed nothing after "2 to run" in a log: the bar showed only on a terminal
    (issue 49, item 5)."""
    run_pipeline(Fake(), contexts(5), tmp_path / "out", config(), batch_size=2, progress=True)
    lines = [x for x in capsys.readouterr().err.splitlines() if "progress:" in x]
    assert [x.split("progress: ")[1].split(" [")[0] for x in lines] == [
        "fake 2/5 context",
        "fake 4/5 context",
        "fake 5/5 context",
        "fake 5/5 context",  # and when it ends
    ]


def test_sigterm_says_what_was_saved_and_how_to_resume(tmp_path: Path) -> None:
    """SIGTERM ended a data command with exit 143 and no message (issue 49, item 5)."""
    from rapo_echo.stopping import Stopped

    class Terminated(Fake):
        def run_chunk(self, chunk):
            if len(self.chunks) == 1:
                os.kill(os.getpid(), signal.SIGTERM)  # as a job scheduler sends it
            return super().run_chunk(chunk)

    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Stopped) as stopped:
        run(Terminated(), contexts(5), out)
    assert stopped.value.exit_code == 143 and signal.getsignal(signal.SIGTERM) is before
    said = str(stopped.value)
    assert said.startswith("fake: stopped by SIGTERM: 2 of 5 contexts are saved in ")
    assert "run the same command again to resume" in said
    assert json.loads((out / "summary.json").read_text())["n_done"] == 2
    again = Fake()
    assert run(again, contexts(5), out)["complete"] and again.chunks == [["c2", "c3"], ["c4"]]


def test_a_run_that_writes_no_rows_says_so_with_the_switches(tmp_path: Path) -> None:
    """critique-rewrite exited 0 with 0 pairs, its summary reading not_empathy 1, no_pair 1 (issue 49,
    item 6): the command's last line says it wrote nothing, why, and what would change it."""
    from rapo_echo.datagen.critique_rewrite import CritiqueRewrite
    from rapo_echo.datagen.runner import empty_note

    class Nothing(Fake):
        name, dataset_file = "critique-rewrite", "pairs.jsonl"
        when_empty = staticmethod(CritiqueRewrite.when_empty)

        def export(self, items):
            return [], {"status": {"not_empathy": 1, "no_pair": 1}}

    summary = run(Nothing(), contexts(2), tmp_path / "out")
    note = empty_note(Nothing(), summary)
    head = "critique-rewrite: 0 rows written to pairs.jsonl from 2 contexts (not_empathy 1, no_pair 1)"
    assert note.startswith(head), note
    assert "--select all" in note and "--golden-min 1 --low-max 5 --rewrite-max 5 --min-gap 0" in note
    assert empty_note(Fake(), run(Fake(), contexts(2), tmp_path / "rows")) is None


def test_killed_process_resumes(tmp_path: Path) -> None:
    """kill -9 in the middle of the second chunk: the first chunk's records survive (fsynced), the lock
    dies with the process, and a rerun does only the rest."""
    out = tmp_path / "out"
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        sys.path.insert(0, {str(REPO)!r})
        from tests.unit.datagen.test_runner import Fake, contexts, run

        class Dies(Fake):
            def run_chunk(self, chunk):
                if len(self.chunks) == 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                return super().run_chunk(chunk)

        run(Dies(), contexts(6), {str(out)!r})
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert [json.loads(x)["id"] for x in (out / "results.jsonl").read_text().splitlines()] == ["c0", "c1"]
    again = Fake()
    assert run(again, contexts(6), out)["complete"]
    assert again.chunks == [["c2", "c3"], ["c4", "c5"]]


def test_changed_settings_or_models_are_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(Fake(), contexts(2), out)
    with pytest.raises(ConfigError, match=r"holds a data command with settings.x=1, this run has 2"):
        run(Fake(), contexts(2), out, config(x=2))
    other = data_config("fake", {"judge": "other"}, "data.jsonl", "auto", {"x": 1}, {"prompts": "p"})
    with pytest.raises(ConfigError, match=r"models.judge='default'"):
        run(Fake(), contexts(2), out, other)
    prompts = data_config("fake", {"judge": "default"}, "data.jsonl", "auto", {"x": 1}, {"prompts": "q"})
    with pytest.raises(ConfigError, match=r"protocol.prompts='p'"):
        run(Fake(), contexts(2), out, prompts)


def test_a_tuple_setting_resumes(tmp_path: Path) -> None:
    """config.json holds a tuple setting (synthesize's stages) as a list: the resume compares it as one."""
    out = tmp_path / "out"
    cfg = config(stages=("6:neutral", "10:mild"))
    run(Fake(), contexts(2), out, cfg)
    again = Fake()
    run(again, contexts(3), out, config(stages=("6:neutral", "10:mild")))
    assert again.chunks == [["c2"]]


def test_changed_context_content_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(Fake(), contexts(2), out)
    edited = contexts(2)
    edited[1].messages[0]["content"] = "something else"
    assert context_key(edited[1]) != context_key(contexts(2)[1])
    with pytest.raises(ConfigError, match=r"context 'c1' was processed from different content"):
        run(Fake(), edited, out)
    moved = contexts(2)
    moved[0].meta["file"] = "/elsewhere/data.jsonl"  # where it was read from is not its content
    run(Fake(), moved, out)


def test_more_contexts_later_runs_only_the_new_ones(tmp_path: Path) -> None:
    out = tmp_path / "out"
    run(Fake(), contexts(3), out)
    more = Fake()
    summary = run(more, contexts(5), out)
    assert more.chunks == [["c3", "c4"]] and summary["dataset"]["rows"] == 5
    fewer = run(Fake(), contexts(2), out)  # a smaller --limit: the dataset holds the asked contexts only
    assert fewer["dataset"]["rows"] == 2 and fewer["complete"]


def test_a_remote_failure_costs_only_its_context(tmp_path: Path) -> None:
    out = tmp_path / "out"
    pipe = Fake(fail={"c3"})
    summary = run(pipe, contexts(6), out, batch_size=4)
    # the failing chunk is split in halves until c3 is alone; c4, c5 are the second chunk
    assert pipe.chunks == [["c0", "c1", "c2", "c3"], ["c0", "c1"], ["c2", "c3"], ["c2"], ["c3"], ["c4", "c5"]]
    assert summary["n_failed"] == 1 and not summary["complete"] and "HTTP 500" in summary["failed"]["c3"]
    assert summary["dataset"]["rows"] == 5
    retry = Fake()
    assert run(retry, contexts(6), out)["complete"]
    assert retry.chunks == [["c3"]]


def test_a_missing_capability_stops_the_run(tmp_path: Path) -> None:
    with pytest.raises(CapabilityError):
        run(Fake(fail={"c0"}, error=CapabilityError), contexts(2), tmp_path / "out")


def test_a_folder_of_something_else_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "metrics.jsonl").write_text("{}\n")
    with pytest.raises(ConfigError, match=r"holds no data command \(config.json\)"):
        run(Fake(), contexts(1), out)
    assert os.listdir(out) == ["metrics.jsonl"]


def test_chunks_that_lose_every_context_stop_the_run(tmp_path: Path) -> None:
    # issue 46: with an endpoint that refuses everything (Retry-After: 86400) the data commands went on
    # through every context; now two chunks in a row that lost every context stop the run, resumably
    ctx = contexts(10)
    pipe = Fake(fail={c.id for c in ctx})
    summary = run(pipe, ctx, tmp_path / "out")
    assert summary["stopped"].startswith("2 chunks in a row lost every context")
    assert not summary["complete"] and summary["n_failed"] == 4  # c0-c3: the last six were never tried
    assert {c for chunk in pipe.chunks for c in chunk} == {"c0", "c1", "c2", "c3"}
    again = run(Fake(), ctx, tmp_path / "out")  # the endpoint is back: the same command finishes
    assert again["complete"] and again["stopped"] is None


def test_the_overall_timeout_stops_before_the_next_chunk(tmp_path: Path) -> None:
    pipe = Fake()
    summary = run_pipeline(
        pipe, contexts(6), tmp_path / "out", config(), batch_size=2, progress=False, timeout_s=0.0
    )
    assert summary["stopped"].startswith("timeout") and pipe.chunks == [] and summary["n_done"] == 0

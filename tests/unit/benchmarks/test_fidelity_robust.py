"""The fidelity benchmark's robustness (issue 39 item 4): non-finite and huge ratings are the usual error
naming file, conversation and field; a data file changed in place is refused on resume; a repeated
conversation is skipped, counted and warned about, not scored twice; the summary says what it is doing."""

from __future__ import annotations

import json
import logging
import re

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.fidelity import Fidelity
from rapo_echo.benchmarks.fidelity.points import SKIP_DUPLICATE, load_points
from rapo_echo.benchmarks.results import read_records
from rapo_echo.benchmarks.runner import run_eval
from rapo_echo.errors import ConfigError, DataError
from tests.unit.benchmarks.test_fidelity_bench import conversation, write


@pytest.mark.parametrize("value", ["Infinity", "-Infinity", "NaN", "1e400", "9" * 5001])
def test_non_finite_and_huge_ratings_name_file_conversation_and_field(tmp_path, value: str) -> None:
    bad = conversation()
    bad["dialog"][3]["annotation"]["feedback"] = "__X__"
    path = tmp_path / "conv.json"
    path.write_text(json.dumps([conversation(), bad]).replace('"__X__"', value), encoding="utf-8")
    with pytest.raises(DataError, match=re.escape("expected a rating from 1 to 5")) as err:
        load_points(str(path))
    message = str(err.value)
    assert "conv.json" in message and "list index 1" in message and "dialog[3].annotation.feedback" in message


def test_a_huge_survey_score_is_a_field_error_too(tmp_path) -> None:
    bad = conversation()
    bad["survey_score"]["seeker"]["initial_emotion_intensity"] = "__X__"
    path = tmp_path / "conv.json"
    path.write_text(json.dumps([bad]).replace('"__X__"', "1e400"), encoding="utf-8")
    with pytest.raises(DataError, match="initial_emotion_intensity: got inf"):
        load_points(str(path))


def run(tmp_path, data: str):
    bench = Fidelity(rewards=["question"], n_boot=20)
    roles = Roles(policy=None)  # type: ignore[arg-type]  # no policy is used
    return run_eval(bench, roles, EvalSettings(batch_size=4), tmp_path / "out", data=data)


def test_a_data_file_changed_in_place_is_refused_on_resume(tmp_path) -> None:
    data = write(tmp_path, [conversation(), conversation(ratings=("5", "1"))])
    first = run(tmp_path, data)
    assert first["metrics"]["n_points"] == 4
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert len(config["data_sha256"]) == 64
    run(tmp_path, data)  # the same content resumes (nothing to do)
    write(tmp_path, [conversation(ratings=("1", "5")), conversation(ratings=("5", "1"))])  # same path
    with pytest.raises(ConfigError, match="content has changed"):
        run(tmp_path, data)
    assert len(read_records(tmp_path / "out" / "results.jsonl")) == 4  # nothing mixed in


def test_a_folder_written_before_the_hash_still_resumes(tmp_path) -> None:
    data = write(tmp_path, [conversation(), conversation(ratings=("5", "1"))])
    run(tmp_path, data)
    config_path = tmp_path / "out" / "config.json"
    config = json.loads(config_path.read_text())
    del config["data_sha256"]
    config_path.write_text(json.dumps(config))
    assert run(tmp_path, data)["metrics"]["n_points"] == 4


def test_repeated_conversations_are_skipped_counted_and_warned(tmp_path, caplog) -> None:
    data = write(tmp_path, [conversation(), conversation(ratings=("5", "1")), conversation()])
    with caplog.at_level(logging.WARNING):
        points = load_points(data)
    assert [p.skip for p in points] == [None, None, None, None, SKIP_DUPLICATE]
    assert points[-1].duplicate_of == points[0].dialogue
    assert "1 conversation(s) repeat an earlier one" in caplog.text and "2 (= 0)" in caplog.text
    summary = run(tmp_path, data)
    m = summary["metrics"]
    assert m["n_points"] == 4 and m["n_dialogues"] == 2 and m[f"skipped: {SKIP_DUPLICATE}"] == 1


def test_the_summary_reports_its_progress(tmp_path, caplog) -> None:
    data = write(tmp_path, [conversation(), conversation(ratings=("5", "1"))])
    with caplog.at_level(logging.INFO, logger="rapo_echo.benchmarks.fidelity.bench"):
        run(tmp_path, data)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("fidelity: figures of")]
    assert len(lines) == 4 and "bootstrap resamples" in lines[0]  # reward:question and three baselines

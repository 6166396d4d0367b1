"""Issue 31 item 11: a first_talk of only whitespace falls back to a profile without one (the simulator
writes the opening; a warning says so) in SAGE and RLVER; train-judge refuses a system message in
mid-dialogue (it would be dropped without a word) and removes repeated examples before the split, so
none is both trained on and held out (the count is logged and reported)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from rapo_echo.data.sage_profiles import SageProfile, load_profiles
from rapo_echo.errors import DataError
from rapo_echo.judges.training_data import load_examples, split


@pytest.mark.parametrize("blank", ["   ", "\n\t ", ""])
def test_a_blank_first_talk_falls_back_to_the_simulators_opening(
    tmp_path: Path, blank: str, caplog: pytest.LogCaptureFixture
) -> None:
    row = {"id": "p1", "player": "a teacher", "scene": "lost a job", "first_talk": blank}
    assert SageProfile.from_mapping(row).first_talk is None
    f = tmp_path / "profiles.jsonl"
    f.write_text(json.dumps(row) + "\n")
    with caplog.at_level(logging.WARNING):
        (profile,) = load_profiles(f)
    assert profile.first_talk is None
    if blank:
        assert "p1: first_talk is only whitespace; the simulator writes the opening" in caplog.text
    from rapo_echo.data import load_scenarios

    (scenario,) = load_scenarios(str(f), "sage")
    assert scenario.messages == []  # RLVER's opening: written by the simulator, not a blank message


def test_a_system_message_in_mid_dialogue_is_refused(tmp_path: Path) -> None:
    row = {
        "task": "humanlike",
        "messages": [
            {"role": "user", "content": "hi"},
            {"role": "system", "content": "be terse"},
            {"role": "assistant", "content": "hello"},
        ],
        "reply": "ok",
        "label": "human",
    }
    f = tmp_path / "ex.jsonl"
    f.write_text(json.dumps(row) + "\n")
    with pytest.raises(DataError, match=r"ex\.jsonl:1: messages\[1\]: a system message in mid-dialogue"):
        load_examples([str(f)])
    row["messages"] = [{"role": "system", "content": "be terse"}, *row["messages"][::2]]  # at the start: fine
    f.write_text(json.dumps(row) + "\n")
    assert len(load_examples([str(f)])) == 1


def rows(n: int, copies: int) -> list[dict]:
    return [
        {"task": "humanlike", "reply": f"reply {i}", "label": "human" if i % 2 else "AI"}
        for i in range(n)
        for _ in range(copies)
    ]


def test_repeated_examples_are_removed_before_the_split(tmp_path: Path) -> None:
    from rapo_echo.judges.training_data import _key, dedupe

    f = tmp_path / "ex.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows(8, 3)))
    examples, removed = dedupe(load_examples([str(f)]))
    assert (len(examples), removed) == (8, 16)
    train, held = split(examples, 0.25, 0)
    assert not {_key(e) for e in train} & {_key(e) for e in held}
    held_only, removed_held = dedupe(examples[:2] + examples[:1], seen=examples[1:])
    assert (len(held_only), removed_held) == (1, 2)


def test_train_judge_reports_the_removed_repeats(tmp_path: Path, monkeypatch, caplog) -> None:
    from rapo_echo.judges.training import JudgeTrainingConfig, train_judge

    class Stop(Exception):
        pass

    def stop(*a: object, **k: object) -> None:
        raise Stop

    monkeypatch.setattr("rapo_echo.policy.Policy", stop)
    f = tmp_path / "ex.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows(8, 2)))
    with caplog.at_level(logging.WARNING), pytest.raises(Stop):
        train_judge(JudgeTrainingConfig(data=[str(f)], output=str(tmp_path / "judge"), reasoning=False))
    assert "train-judge: 8 repeated examples removed" in caplog.text

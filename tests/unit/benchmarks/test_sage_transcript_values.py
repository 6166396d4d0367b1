"""SAGE ``--transcripts`` values (issue 31 items 7 and 4): an ``emo_point`` that is not a finite number on
SAGE's 0-100 scale (NaN, infinite, 1e6, -500, a string, a boolean, missing) makes its dialogue invalid,
counted and named; the score is the mean over valid dialogues with the count beside it; the report never
shows nan or inf; result files of the same name in two folders are scored into two folders."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rapo_echo.benchmarks.report import fmt
from rapo_echo.benchmarks.sage.transcripts import score_transcripts


def line(ident: str, final: object, *, drop: bool = False) -> str:
    rec: dict = {
        "id": ident,
        "emo_state": "Emotion-B",
        "history": [
            {"role": "user", "content": "hi", "emotion-point": 40},
            {"role": "assistant", "content": "ok"},
        ],
    }
    if not drop:
        rec["emo_point"] = final
    return json.dumps(rec)  # NaN / Infinity as Python's json writes them


BAD = {
    "nan": (math.nan, "not finite"),
    "inf": (math.inf, "not finite"),
    "big": (1e6, "outside SAGE's 0-100 scale"),
    "neg": (-500, "outside SAGE's 0-100 scale"),
    "str": ("80", "is not a number"),
    "bool": (True, "is not a number"),
}


def test_values_off_the_scale_are_invalid_counted_and_named(tmp_path: Path, capsys) -> None:
    from rapo_echo.cli import main

    f = tmp_path / "m_result.jsonl"
    lines = [line("ok1", 60), line("ok2", 100), line("none", None, drop=True)]
    lines += [line(k, v) for k, (v, _) in BAD.items()]
    f.write_text("\n".join(lines) + "\n", encoding="utf-8")
    (s,) = score_transcripts(f, tmp_path / "out")
    assert (s["n_cases"], s["n_valid"], s["n_invalid"]) == (9, 2, 7)
    assert s["metrics"]["score"] == 80.0 and s["metrics"]["successes"] == 1
    assert s["invalid_cases"]["none"] == "emo_point is missing"
    for k, (_, why) in BAD.items():
        assert why in s["invalid_cases"][k]
    main(["eval", "--benchmark", "sage", "--transcripts", str(f), "--output", str(tmp_path / "cli")])
    out = capsys.readouterr().out
    assert "| m | 9 | 2 | 80.00 |" in out and "7 invalid, not scored: ok1" not in out
    assert "m: 7 invalid, not scored: none: emo_point is missing" in out


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_the_report_never_shows_nan_or_inf(value: float) -> None:
    assert fmt(value) == "–"


def test_same_file_names_in_two_folders_do_not_overwrite(tmp_path: Path) -> None:
    for sub, score in (("a", 20), ("b", 90)):
        (tmp_path / "in" / sub).mkdir(parents=True)
        (tmp_path / "in" / sub / "m_result.jsonl").write_text(line("d1", score) + "\n", encoding="utf-8")
    summaries = score_transcripts(tmp_path / "in", tmp_path / "out")
    root = tmp_path / "out"
    outputs = {Path(s["output"]).relative_to(root).as_posix(): s["metrics"]["score"] for s in summaries}
    assert outputs == {"a/m_result": 20.0, "b/m_result": 90.0}

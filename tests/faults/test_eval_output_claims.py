"""Eval folders written by ``--transcripts`` and ``--recompute`` (issue 31 item 4): the folder is locked,
and a non-empty folder that does not hold this same computation (a finished evaluation of another kind, a
training run) is refused with nothing in it changed; rerunning the same computation into its own folder
works."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapo_echo.benchmarks.epm.recompute import recompute
from rapo_echo.benchmarks.sage.transcripts import score_transcripts
from rapo_echo.errors import ConfigError
from rapo_echo.rundir import DirLock
from tests.unit.benchmarks.test_epm_bench import synthetic_results
from tests.unit.benchmarks.test_sage_transcript_values import line


def finished_esconv(folder: Path) -> dict[str, str]:
    folder.mkdir(parents=True)
    files = {
        "config.json": json.dumps({"benchmark": "esconv", "models": {"policy": "p"}}),
        "results.jsonl": "".join(json.dumps({"id": f"c{i}", "valid": True}) + "\n" for i in range(16)),
        "summary.json": json.dumps({"benchmark": "esconv", "n_cases": 16}),
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    return files


def contents(folder: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in folder.iterdir() if p.is_file() and not p.name.startswith(".")}


def sage_file(tmp_path: Path) -> Path:
    f = tmp_path / "m_result.jsonl"
    f.write_text(line("d1", 60) + "\n", encoding="utf-8")
    return f


def test_transcripts_and_recompute_refuse_a_finished_evaluation(tmp_path: Path) -> None:
    out = tmp_path / "esconv-eval"
    before = finished_esconv(out)
    with pytest.raises(ConfigError, match=r"esconv-eval holds an evaluation with benchmark='esconv'"):
        score_transcripts(sage_file(tmp_path), out)
    synthetic_results(tmp_path / "run")
    with pytest.raises(ConfigError, match=r"esconv-eval holds an evaluation with benchmark='esconv'"):
        recompute(tmp_path / "run", out)
    assert contents(out) == before


def test_a_folder_of_other_files_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "train-run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: grpo\n")
    synthetic_results(tmp_path / "epm")
    with pytest.raises(ConfigError, match=r"train-run is not empty \(config\.yaml\) and holds no evaluation"):
        recompute(tmp_path / "epm", run)
    with pytest.raises(ConfigError, match=r"train-run is not empty"):
        score_transcripts(sage_file(tmp_path), run)
    from rapo_echo.benchmarks.runner import check_output

    with pytest.raises(ConfigError, match=r"train-run is not empty"):
        check_output(run, {"benchmark": "esconv"})  # the live eval's check too
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml"]


def test_the_same_computation_reruns_into_its_own_folder(tmp_path: Path) -> None:
    synthetic_results(tmp_path / "epm")
    first = recompute(tmp_path / "epm", tmp_path / "out", {"min_turns": 2})
    assert recompute(tmp_path / "epm", tmp_path / "out", {"min_turns": 2})["metrics"] == first["metrics"]
    with pytest.raises(ConfigError, match=r"settings\.epm\.min_turns"):
        recompute(tmp_path / "epm", tmp_path / "out", {"min_turns": 3})
    f = sage_file(tmp_path)
    score_transcripts(f, tmp_path / "sage")
    assert score_transcripts(f, tmp_path / "sage")[0]["n_valid"] == 1


def test_a_folder_in_use_is_refused(tmp_path: Path) -> None:
    synthetic_results(tmp_path / "epm")
    with DirLock(tmp_path / "busy"):
        with pytest.raises(ConfigError, match=r"busy is in use by"):
            recompute(tmp_path / "epm", tmp_path / "busy")
        with pytest.raises(ConfigError, match=r"busy is in use by"):
            score_transcripts(sage_file(tmp_path), tmp_path / "busy")


def test_a_live_eval_refuses_a_folder_of_other_files_before_any_model_loads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from rapo_echo.cli import main

    def boom(*a: object, **k: object) -> None:
        raise AssertionError("a model was loaded before --output was checked")

    monkeypatch.setattr("rapo_echo.benchmarks.cli.build_roles", boom)
    run = tmp_path / "train-run"
    run.mkdir()
    (run / "config.yaml").write_text("algo: grpo\n")
    code = main(["eval", "--benchmark", "sage", "--policy", "default", "--limit", "1", "--output", str(run)])
    assert code == 2 and "train-run is not empty (config.yaml)" in capsys.readouterr().err

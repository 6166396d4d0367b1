"""A run config's fidelity check: run once before training through the CLI layer, cached by the
simulator's and judge's spec, recorded in the run directory and shown by the report."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from rapo_echo.benchmarks.fidelity.check import RUN_FILE, cache_folder, record_check, run_fidelity_check
from rapo_echo.benchmarks.fidelity.report import run_checks_table
from rapo_echo.config import EngineConfig
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import RunConfig
from tests.unit.benchmarks.test_fidelity_bench import conversation, write

SCRIPT = {"rules": [["valence_change", '{{"reply": "ok", "valence_change": 2}}']]}


def config(tmp_path, **check):
    data = write(tmp_path, [conversation(), conversation(ratings=("5", "1"))])
    return RunConfig(
        simulator=EngineConfig(engine="scripted", script=SCRIPT),
        fidelity={"data": data, "rewards": ["question"], "cache": str(tmp_path / "cache"), **check},
    )


def test_the_check_runs_once_and_is_cached_by_the_simulator_spec(tmp_path):
    cfg = config(tmp_path)
    first = run_fidelity_check(cfg)
    assert not first["cached"] and first["summary"]["metrics"]["user:reaction/points"] == 4
    again = run_fidelity_check(cfg)
    assert again["cached"] and again["summary"] == first["summary"]
    other = cfg.model_copy(deep=True)
    other.simulator.script = {"rules": [["valence_change", '{{"reply": "hm", "valence_change": -1}}']]}
    assert cache_folder(other) != cache_folder(cfg)  # another simulator: another check


def test_the_record_lands_in_the_run_dir_and_in_the_report(tmp_path):
    record = run_fidelity_check(config(tmp_path))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    record_check(run_dir, record)
    assert json.loads((run_dir / RUN_FILE).read_text())["summary"]["metrics"]["n_points"] == 4
    header, rows = run_checks_table([SimpleNamespace(path=run_dir)])
    assert header[:3] == ["run", "predictor", "points"]
    assert [r[1] for r in rows] == ["user:reaction", "reward:question", "random", "length", "questions"]
    assert run_checks_table([SimpleNamespace(path=tmp_path)]) is None


def test_train_runs_the_check_before_training_and_records_it(tmp_path, monkeypatch):
    import rapo_echo.training.run
    from rapo_echo.training.train_cli import run

    cfg = config(tmp_path)
    cfg.output = str(tmp_path / "run")
    seen = {}

    def fake_training(c, resume=False):
        seen["cached"] = (cache_folder(c) / "summary.json").is_file()  # the check ran first
        (tmp_path / "run").mkdir()
        return SimpleNamespace(run_dir=c.output, stopped_by=None)

    monkeypatch.setattr("rapo_echo.training.train_cli.build_config", lambda args: cfg)
    monkeypatch.setattr(rapo_echo.training.run, "run_training", fake_training)
    assert run(SimpleNamespace(resume=None, dry_run=False)) == 0
    assert seen["cached"] and (tmp_path / "run" / RUN_FILE).is_file()


def test_the_section_is_validated():
    with pytest.raises((ConfigError, ValueError)):
        RunConfig(fidelity={"data": "x.json", "limit": 0})
    with pytest.raises((ConfigError, ValueError)):
        RunConfig(fidelity={"data": "x.json", "usres": ["reaction"]})
    assert RunConfig().fidelity is None

"""One place per concern: ``simulator`` and ``judge`` name an engine (``train --simulator SPEC --judge
SPEC`` as on ``eval``); how a call samples is its caller's, so the engine-level sampling keys older
versions accepted and never read are refused with the way on (and dropped from a run's saved config)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from rapo_echo.config import engine_settings
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import load_config
from rapo_echo.training.train_cli import build_config


def args(**given) -> SimpleNamespace:
    base = dict(model=None, max_steps=None, output=None, reward=None, config=None, algo=None, resume=None)
    return SimpleNamespace(**{**base, "set": [], "simulator": None, "judge": None, **given})


@pytest.mark.parametrize(
    ("spec", "settings"),
    [
        ("policy", {"engine": "policy"}),
        ("http://j:8000/v1", {"engine": "openai", "base_url": "http://j:8000/v1", "model": "default"}),
        ("default", {"engine": "hf", "model": "default"}),
        ("runs/rapo", {"engine": "hf", "model": "runs/rapo"}),
    ],
)
def test_a_spec_names_an_engine_as_on_eval(spec: str, settings: dict) -> None:
    assert engine_settings(spec) == settings


def test_train_takes_simulator_and_judge_specs(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("algo: rapo\nsimulator: {engine: hf, model: x, max_batch_size: 8}\n")
    cfg = build_config(args(config=str(path), simulator="http://sim:8001/v1", judge="policy"))
    sim = cfg.simulator
    assert (sim.engine, sim.base_url, sim.model) == ("openai", "http://sim:8001/v1", "default")
    assert cfg.simulator.max_batch_size == 8  # the file's other keys stay
    assert cfg.judge.engine == "policy"
    named = build_config(args(config=str(path), simulator="http://sim:8001/v1", set=["simulator.model=Qwen"]))
    assert named.simulator.model == "Qwen"  # --set comes after the flags


def test_the_cli_accepts_the_flags(capsys) -> None:
    from rapo_echo.cli import build_parser

    parsed = build_parser().parse_args(["train", "--simulator", "policy", "--judge", "http://j:1/v1"])
    assert (parsed.simulator, parsed.judge) == ("policy", "http://j:1/v1")


@pytest.mark.parametrize("key", ["simulator.temperature", "judge.max_new_tokens", "simulator.top_p"])
def test_engine_level_sampling_is_refused_with_the_way_on(tmp_path: Path, key: str) -> None:
    role, name = key.split(".")
    path = tmp_path / "run.yaml"
    path.write_text(f"algo: rapo\n{role}:\n  engine: policy\n  {name}: 1\n")
    refused = rf"run.yaml:4: {key}: an engine section names an engine(.|\n)*rapo.simulator"
    with pytest.raises(ConfigError, match=refused):
        load_config(path)


def test_a_saved_config_with_engine_sampling_still_resumes(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    old = load_config(algo="rlver").model_dump(mode="json")
    old["simulator"].update(temperature=0.7, top_p=1.0, max_new_tokens=256)  # what older versions saved
    old["judge"].update(temperature=0.0, top_p=1.0, max_new_tokens=256)
    (run / "config.yaml").write_text(yaml.safe_dump(old))
    cfg = build_config(args(resume=str(run)))
    assert cfg.model_dump() == load_config(algo="rlver", overrides=[f"output={run}"]).model_dump()

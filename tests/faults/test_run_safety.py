"""Training runs under issue 14's failures (tiny model, in-process): resume after torn JSON lines with
secrets from the environment, a judge that never scores, a locked or unwritable run directory."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from rapo_echo.checkpoint import latest_checkpoint
from rapo_echo.errors import ConfigError
from rapo_echo.training.learner import TrainingError
from rapo_echo.training.run import Run
from rapo_echo.training.train_cli import build_config
from tests.helpers.plugin_rewards import NeedsKey
from tests.helpers.runs import metrics, run_config

BASE = [
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=4",
    "train.save_every=1",
]


def cfg_for(model: Path, out: Path, *extra: str):
    return run_config(model, out, *BASE, *extra)


def steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_resume_survives_torn_lines_and_takes_secrets_from_the_environment(
    tmp_path: Path, tiny_folder: Path, monkeypatch
) -> None:
    monkeypatch.setenv("RAPO_TEST_REWARD_KEY", "rk-live-0123456789")
    NeedsKey.seen.clear()
    run = tmp_path / "run"
    cfg = cfg_for(
        tiny_folder,
        run,
        "train.max_steps=2",
        "rewards=[{name: 'tests.helpers.plugin_rewards:NeedsKey', args: {key_env: RAPO_TEST_REWARD_KEY}}]",
        "rollout.max_prompt_tokens=40",
        "rollout.system_prompt='Be kind.'",
    )
    Run(cfg).train()
    assert sum(m["prompt_truncated"] for m in metrics(run)) > 0  # the bundled dialogues exceed 40 tokens
    (run / "final").rename(tmp_path / "final-unused")
    # a crash (or a full disk) in the middle of the appends of step 3
    for name in ("samples.jsonl", "metrics.jsonl"):
        with open(run / name, "a") as fh:
            fh.write('{"step": 3, "reply": "half a li')
    args = argparse.Namespace(resume=str(run), config=None, output=None, algo=None, model=None, reward=None)
    args.max_steps, args.set = 3, []
    resumed = build_config(args)
    assert resumed.rewards[0].args == {"key_env": "RAPO_TEST_REWARD_KEY"}
    Run(resumed, resume=True).train()
    assert steps(run / "metrics.jsonl") == [1, 2, 3]
    assert sorted(set(steps(run / "samples.jsonl"))) == [1, 2, 3]
    assert NeedsKey.seen == ["rk-live-0123456789"] * 2  # the live key both times, never "***"
    assert "rk-live" not in (run / "config.yaml").read_text()


def test_a_judge_that_never_scores_stops_the_run(tmp_path: Path, tiny_folder: Path) -> None:
    run = tmp_path / "run"
    cfg = cfg_for(
        tiny_folder,
        run,
        "train.max_steps=5",
        "train.max_invalid_steps=2",
        "rewards=[{name: 'tests.helpers.plugin_rewards:never_valid'}]",
    )
    with pytest.raises(
        TrainingError, match=r"2 steps in a row \(up to step 2\) without a single valid sample"
    ):
        Run(cfg).train()
    assert latest_checkpoint(run) == run / "checkpoints" / "step-1"  # kept; no final/ pretending success
    assert not (run / "final").exists() and steps(run / "metrics.jsonl") == [1, 2]


def test_a_run_directory_in_use_or_unwritable_is_refused_before_the_model_loads(tmp_path: Path) -> None:
    from rapo_echo.rundir import DirLock

    run = tmp_path / "run"
    no_model = str(tmp_path / "no-such-model")  # loading it would fail with another message
    with DirLock(run), pytest.raises(ConfigError, match=r"run is in use by process \d+"):
        Run(cfg_for(Path(no_model), run, "train.max_steps=1"))
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"file/run: cannot write there"):
        Run(cfg_for(Path(no_model), tmp_path / "file" / "run", "train.max_steps=1"))

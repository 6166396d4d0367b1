"""A third-party advantage estimator, installed by entry point as a package installs one, trains GRPO two
steps through ``rapo-echo train --set loss.advantage=minmax`` (on a tiny model with the embedded model's
tokenizer, as the third-party algorithm's test does); every advantage the run logged is the plugin's
formula on that step's rewards. (tests/unit/algorithms/test_plugin_estimator.py: nothing of the library
names it.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.helpers.installed import install
from tests.helpers.plugin_estimators import minmax_advantages

pytestmark = pytest.mark.integration
WORDS = "rewards=[{name: 'tests.helpers.plugin_rewards:words'}]"  # the reply's word count: a spread


def test_two_steps_with_a_plugin_estimator(tmp_path: Path, tiny_folder: Path, monkeypatch) -> None:
    from rapo_echo.cli import main

    entry = "[rapo_echo.advantage_estimators]\nminmax = tests.helpers.plugin_estimators:minmax_advantages\n"
    install(tmp_path / "site", "rapo-echo-minmax", entry, monkeypatch)
    run = tmp_path / "run"
    argv = ["train", "--algo", "grpo", "--model", str(tiny_folder), "--max-steps", "2", "--output", str(run)]
    small = ("rollout.batch_size=2", "rollout.group_size=3", "rollout.max_new_tokens=4")
    logs = ("logging.samples_every=1", "logging.progress=false", "logging.tensorboard=false")
    for s in ("loss.advantage=minmax", WORDS, *small, *logs):
        argv += ["--set", s]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all("loss/grpo" in r for r in rows)
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["step"] for s in samples}) == [1, 2] and len(samples) == 12
    for step in (1, 2):
        mine = [s for s in samples if s["step"] == step]
        rewards = torch.tensor([float("nan") if s["reward"] is None else s["reward"] for s in mine])
        valid = torch.tensor([s["reward"] is not None for s in mine])
        expected = minmax_advantages(rewards.double(), torch.tensor([s["group"] for s in mine]), valid)
        assert [s["advantage"] for s in mine] == pytest.approx(expected.tolist(), abs=1e-9)
    assert any(s["advantage"] != 0 for s in samples)  # the rewards had a spread: the formula had work

"""The README's plugin examples, as written, from a fresh folder: the reward function beside the command
trains (the working folder is importable, as with ``python -m``), the simulated user resolves, and a
plugin that cannot be imported is refused before any model loads."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import load_config
from tests.helpers.runs import QUIET, set_flags

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_block(first_line: str) -> str:
    """The README's fenced code block that starts with ``first_line``."""
    for block in re.findall(r"```[a-z]*\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S):
        if block.startswith(first_line):
            return block
    raise AssertionError(f"README has no code block starting with {first_line!r}")


def readme_command(start: str) -> list[str]:
    line = next(x for x in readme_block(start).splitlines() if x.startswith(start))
    return line.split()


def test_the_readme_reward_plugin_trains_from_a_fresh_folder(tmp_path: Path, tiny_folder: Path) -> None:
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    (fresh / "my_rewards.py").write_text(readme_block("# my_rewards.py"))
    command = readme_command("rapo-echo train --algo grpo --reward my_rewards:warmth")
    assert command[0] == "rapo-echo"
    small = ["--model", str(tiny_folder), "--max-steps", "1", "--output", "run"]
    small += set_flags("rollout.batch_size=1", "rollout.group_size=2", "rollout.max_new_tokens=4", *QUIET)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing puts the folder on the path
    done = subprocess.run(
        [sys.executable, "-m", "rapo_echo.cli", *command[1:], *small],
        cwd=fresh,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = (fresh / "run" / "metrics.jsonl").read_text()
    assert '"reward/warmth/mean"' in metrics


def test_the_readme_simulator_plugin_resolves_from_the_working_folder(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", os.getcwd())])
    (tmp_path / "my_users.py").write_text(readme_block("# my_users.py"))
    flag = readme_command("rapo-echo train --algo rapo --set rapo.simulator.name=my_users:Grumpy")[-1]
    cfg = load_config(algo="rapo", overrides=[flag.split(" ", 1)[-1]])
    assert cfg.rapo.simulator.name == "my_users:Grumpy"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["rewards=[{name: no_such_module:warmth}]"],
            r"rewards.0.name: cannot import module 'no_such_module'",
        ),
        (["rewards=[{name: os:getcwd}]"], r"rewards.0.name: 'os:getcwd' is not a reward plugin"),
        (
            ["algo=rapo", "rapo.simulator.name=os:getcwd"],
            r"rapo.simulator.name: 'os:getcwd' is not a simulator",
        ),
        (
            ["validation.checks=[{name: no_such_module:Check}]"],
            r"validation.checks.0.name: cannot import module 'no_such_module'",
        ),
    ],
)
def test_plugins_are_resolved_when_the_config_loads(
    tmp_path: Path, overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(overrides=[f"output={tmp_path / 'run'}", *overrides])


def test_the_trainer_resolves_plugins_before_the_model_loads(tmp_path: Path) -> None:
    """A config changed after it loaded: the trainer resolves the plugin before loading the model (which
    does not exist here, and would fail with another message)."""
    from rapo_echo.config import RewardSpec
    from rapo_echo.training.run import Run

    cfg = load_config(overrides=[f"output={tmp_path / 'run'}", f"model.name={tmp_path / 'no-model'}"])
    cfg.rewards = [RewardSpec(name="no_such_module:warmth")]
    with pytest.raises(ConfigError, match=r"rewards.0.name: cannot import module 'no_such_module'"):
        Run(cfg)

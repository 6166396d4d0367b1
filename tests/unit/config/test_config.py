"""Config validation: unknown keys, wrong types and out-of-range values name the key, the value and
what is allowed; the CLI exits with code 2; secrets never reach the written config."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rapo_echo.config import dump_config, parse_override, parse_reward_flag
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import RunConfig, load_config


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_defaults_validate() -> None:
    cfg = load_config()
    assert cfg.algo == "grpo"
    assert cfg.rollout.group_size == 4 and cfg.loss.kl_estimator == "k3"


def test_unknown_key_names_file_line_and_allowed_keys(tmp_path: Path) -> None:
    p = write(tmp_path, "train:\n  lr: 1.0e-5\n  learning_rate: 3\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    msg = str(exc.value)
    assert f"{p}:3" in msg and "train.learning_rate" in msg and "unknown key" in msg
    assert "allowed keys here:" in msg and "lr" in msg


def test_wrong_type(tmp_path: Path) -> None:
    p = write(tmp_path, "rollout:\n  group_size: many\n")
    with pytest.raises(ConfigError) as exc:
        load_config(p)
    assert (
        "rollout.group_size" in str(exc.value) and "'many'" in str(exc.value) and f"{p}:2" in str(exc.value)
    )


def test_out_of_range_from_override() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["train.lr=-1"])
    msg = str(exc.value)
    assert "train.lr" in msg and "-1" in msg and "greater than 0" in msg and "--set train.lr" in msg


def test_literal_choices_listed() -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["loss.kl_estimator=k9"])
    assert "'k1', 'k2' or 'k3'" in str(exc.value) or "k1" in str(exc.value)


def test_registry_checked_names() -> None:
    with pytest.raises(ConfigError, match="loss.advantage.*known: dr_grpo, grpo, rloo"):
        load_config(overrides=["loss.advantage=ppo"])
    with pytest.raises(ConfigError, match="algo"):
        load_config(algo="nope")


def test_openai_engine_needs_base_url() -> None:
    with pytest.raises(ConfigError, match="judge.*base_url"):
        load_config(overrides=["judge.engine=openai"])


def test_invalid_yaml_names_line(tmp_path: Path) -> None:
    p = write(tmp_path, "train:\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match=rf"{p}:\d+: invalid YAML"):
        load_config(p)


def test_precedence_file_flags_set(tmp_path: Path) -> None:
    p = write(tmp_path, "model:\n  name: from-file/x\ntrain:\n  max_steps: 7\n  lr: 0.1\n")
    cfg = load_config(p, flags={"model.name": "flag/y"}, overrides=["train.lr=0.01"])
    assert cfg.model.name == "flag/y" and cfg.train.max_steps == 7 and cfg.train.lr == 0.01


def test_override_parsing() -> None:
    assert parse_override("train.lr=1e-5") == (["train", "lr"], 1e-5)
    assert parse_override("rollout.system_prompt=Be kind: always.") == (
        ["rollout", "system_prompt"],
        "Be kind: always.",
    )
    with pytest.raises(ConfigError):
        parse_override("no-equals-sign")
    assert parse_reward_flag("pkg.mod:fn=0.5") == {"name": "pkg.mod:fn", "weight": 0.5}
    with pytest.raises(ConfigError, match="weight"):
        parse_reward_flag("length=heavy")


def test_list_override_by_index() -> None:
    cfg = load_config(overrides=["rewards.1.weight=2.5"])
    assert cfg.rewards[1].weight == 2.5
    with pytest.raises(ConfigError, match="index"):
        load_config(overrides=["rewards.9.weight=1"])


def test_dump_redacts_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_API_KEY", "sk-verysecretvalue123")
    cfg = RunConfig.model_validate(
        {
            "judge": {
                "engine": "scripted",
                "script": {"api_key": "sk-verysecretvalue123", "default": "uses sk-verysecretvalue123"},
            }
        }
    )
    dump_config(cfg, tmp_path / "config.yaml")
    text = (tmp_path / "config.yaml").read_text()
    assert "sk-verysecretvalue123" not in text
    assert yaml.safe_load(text)["judge"]["api_key_env"] == "OPENAI_API_KEY"


def test_cli_exits_2_on_bad_config(tmp_path: Path) -> None:
    p = write(tmp_path, "train:\n  lr: zero\n")
    res = subprocess.run(
        [sys.executable, "-m", "rapo_echo.cli", "train", "--config", str(p)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert "train.lr" in res.stderr and "'zero'" in res.stderr


def test_micro_batch_is_read_once_sized() -> None:
    train = load_config().train
    assert train.micro_batch_size == "auto"
    with pytest.raises(RuntimeError, match="'auto' is read before the Learner sized it"):
        _ = train.micro_batch
    train.micro_batch_size = 4  # as the Learner sizes it
    assert train.micro_batch == 4

"""TRL's names in a config: an unknown key that is one of TRL 1.16's GRPOConfig / TrainingArguments names
gets the key it means here; any other near miss gets a "did you mean" from our own keys."""

from __future__ import annotations

from pathlib import Path

import pytest

from rapo_echo.config.messages import did_you_mean, key_paths
from rapo_echo.config.trl_names import TRL_KEYS
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import RunConfig, load_config


def message(**kw) -> str:
    with pytest.raises(ConfigError) as exc:
        load_config(**kw)
    return str(exc.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            "num_generations=8",
            "TRL's num_generations is rollout.group_size here (write --set rollout.group_size=8)",
        ),
        ("max_completion_length=64", "TRL's max_completion_length is rollout.max_new_tokens here"),
        ("learning_rate=1e-5", "TRL's learning_rate is train.lr here (write --set train.lr=1.0e-05)"),
        ("bf16=true", "TRL's bf16 is model.dtype here (true: bfloat16"),
        ("loss_type=dapo", "TRL's loss_type is loss.agg here (dapo / bnpo: token-mean"),
        ("report_to=wandb", "TRL's report_to is logging here (logging.wandb: true"),
        ("per_device_train_batch_size=4", "TRL's per_device_train_batch_size is train.micro_batch_size here"),
        ("gradient_accumulation_steps=2", "TRL's gradient_accumulation_steps has no counterpart"),
        ("beta=0.1", "TRL's beta is loss.beta here"),
        ("epsilon=0.2", "TRL's epsilon is loss.eps_low here"),
        ("temperature=0.9", "TRL's temperature is rollout.temperature here"),
        ("train.num_iterations=2", "TRL's num_iterations is train.inner_epochs here"),
    ],
)
def test_trl_names_point_at_our_keys(override: str, expected: str) -> None:
    msg = message(overrides=[override])
    assert expected in msg and "unknown key" in msg and "allowed keys here:" in msg


def test_trl_name_in_a_file_names_its_line(tmp_path: Path) -> None:
    p = tmp_path / "run.yaml"
    p.write_text("algo: grpo\nnum_generations: 8\n")
    msg = message(path=p)
    assert f"{p}:2: num_generations: got 8; unknown key; TRL's num_generations is rollout.group_size" in msg
    assert "(write rollout.group_size: 8)" in msg  # the form the file uses


def test_trl_name_answered_in_the_form_it_was_given() -> None:
    """A `--set` gets a `--set`, the Python API's overrides get an overrides mapping (issue 49, item 8)."""
    assert "(write --set rollout.group_size=4)" in message(overrides=["num_generations=4"])
    msg = message(overrides={"num_generations": 4, "seed": 3})
    assert "(write overrides={'rollout.group_size': 4})" in msg
    assert "(write overrides={'train.seed': 3})" in msg


def test_did_you_mean_our_own_keys() -> None:
    assert "did you mean rollout.group_size?" in message(overrides=["rollout.group_sise=3"])
    assert "did you mean rollout.max_new_tokens?" in message(overrides=["rollout.max_tokens=3"])
    # a leaf found in several sections: the one of the section written
    assert did_you_mean(RunConfig, ("simulator", "devise")) == "did you mean simulator.device?"
    assert did_you_mean(RunConfig, ("devise",)).startswith("did you mean model.device or ")
    assert did_you_mean(RunConfig, ("zzz",)) is None
    assert "did you mean" not in message(overrides=["foo=1"])


def test_every_key_trl_names_point_at_exists() -> None:
    ours = set(key_paths(RunConfig))
    missing = {trl: key for trl, (key, _) in TRL_KEYS.items() if key is not None and key not in ours}
    assert not missing

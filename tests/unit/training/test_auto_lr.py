"""``train.lr: auto``: the rate by hand for several sizes, the parameter count, and the trainer writing
the value it used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from rapo_echo.auto_lr import auto_lr, base_parameter_count, count_parameters_of
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import load_config


@pytest.mark.parametrize(
    ("params", "lora", "expected"),
    [
        (135_000_000, False, 1e-4),  # the reference: 1e-4 * 135M / 135M
        (135_000_000, True, 1e-3),  # LoRA: ten times
        (50_000_000, False, 1e-4),  # smaller than the reference: capped at 1e-4, not 2.7e-4
        (1_350_000_000, False, 1e-5),  # 1e-4 * 135M / 1.35B
        (1_500_000_000, False, 9e-6),  # 1e-4 * 0.09
        (7_000_000_000, False, 1e-4 * 135 / 7000),  # 1.928...e-6
        (7_000_000_000, True, 1e-3 * 135 / 7000),
        (13_500_000_000, False, 1e-6),  # exactly the floor
        (70_000_000_000, False, 1e-6),  # below the floor: 1.9e-7 -> 1e-6
        (70_000_000_000, True, 1e-5),
    ],
)
def test_auto_lr_by_hand(params: int, lora: bool, expected: float) -> None:
    assert auto_lr(params, lora) == pytest.approx(expected, rel=1e-12)


def test_auto_lr_refuses_an_empty_model() -> None:
    with pytest.raises(ValueError, match="params must be > 0"):
        auto_lr(0, False)


class Tied(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(10, 4)  # 40
        self.head = torch.nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight  # tied: counted once
        self.lora_A = torch.nn.Linear(4, 2, bias=False)  # an adapter: not counted
        self.norm = torch.nn.LayerNorm(4)  # 8


def test_base_parameter_count_skips_adapters_and_counts_tied_weights_once() -> None:
    model = Tied()
    assert base_parameter_count(model.named_parameters(remove_duplicate=False)) == 48
    p = torch.nn.Parameter(torch.zeros(0))
    p.ds_numel = 1000  # a ZeRO-3 partition: its full size counts
    assert base_parameter_count([("layer.weight", p)]) == 1000


def test_count_parameters_of_a_folder_matches_the_loaded_model(tiny_folder: Path) -> None:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tiny_folder)
    assert count_parameters_of(str(tiny_folder)) == sum(p.numel() for p in loaded.parameters())


def test_config_default_is_auto_and_bad_values_name_the_key() -> None:
    assert load_config().train.lr == "auto"
    assert load_config(overrides=["train.lr=3e-4"]).train.lr == 3e-4
    for bad in ("0", "-1", "2", "fast", "true"):
        with pytest.raises(ConfigError, match=r"train.lr.*greater than 0 and at most 1, or 'auto'"):
            load_config(overrides=[f"train.lr={bad}"])


@pytest.mark.parametrize(("lora", "asked"), [(False, "auto"), (True, "auto"), (False, 3e-4)])
def test_trainer_uses_and_writes_the_resolved_rate(tmp_path: Path, tiny_folder: Path, lora, asked) -> None:
    from rapo_echo.training.run import Run

    run = tmp_path / "run"
    cfg = load_config(
        overrides=[
            f"model.name={tiny_folder}",
            f"output={run}",
            "logging.tensorboard=false",
            f"model.lora.enabled={str(lora).lower()}",
            f"train.lr={asked}",
        ]
    )
    trainer = Run(cfg)
    trainer.open_logs()
    params = base_parameter_count(trainer.policy.lm.named_parameters())
    expected = auto_lr(params, lora) if asked == "auto" else asked
    assert params < 135_000_000 and expected in (1e-4, 1e-3, 3e-4)  # a tiny model: the capped rates
    assert [g["lr"] for g in trainer.learner.optimizer.param_groups] == [expected]
    record = json.loads((run / "resolved.json").read_text())["train.lr"]
    assert record["asked"] == asked and record["used"] == expected
    assert ("basis" in record) == (asked == "auto")
    if asked == "auto":
        assert record["basis"]["params"] == params and record["basis"]["lora"] is lora
    assert yaml.safe_load((run / "config.yaml").read_text())["train"]["lr"] == expected

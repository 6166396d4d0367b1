"""The OpenRLHF launch never hands a LoRA-sized learning rate to full fine-tuning (issue 31, item 20).

OpenRLHF trains full weights (LoRA is refused), so a config written for LoRA (configs/grpo.yaml:
``train.lr: 2e-4``) exported with ``model.lora.enabled=false`` would give a 7B model 2e-4, about 100
times the ``auto`` full fine-tuning rate. The launch refuses such a rate unless ``--keep-lr`` says it is
meant; ``train.lr: auto`` is resolved for the model it launches.
"""

from __future__ import annotations

import argparse

import pytest

from rapo_echo.auto_lr import FULL_LR_AT_REFERENCE, LORA_FACTOR
from rapo_echo.errors import ConfigError
from tests.unit.integrations.openrlhf.test_openrlhf import ROOT, bundle, flag, run_config  # noqa: F401 (bundle: the fixture)

HUB_7B = "Qwen/Qwen2.5-7B-Instruct"  # not readable on this machine: its size is unknown here


def test_a_lora_rate_for_an_unreadable_model_is_refused(tmp_path, smol_path, bundle):  # noqa: F811
    from rapo_echo.integrations.openrlhf import ClusterSpec, launch_command

    cfg = run_config(tmp_path, smol_path, **{"train.lr": 2e-4})
    with pytest.raises(ConfigError, match=r"train.lr: 0.0002 .*full fine-tuning.*--keep-lr"):
        launch_command(cfg, bundle, cluster=ClusterSpec(gpus_per_node=4), pretrain=HUB_7B)
    cmd = launch_command(cfg, bundle, cluster=ClusterSpec(gpus_per_node=4), pretrain=HUB_7B, keep_lr=True)
    assert flag(cmd, "--actor.adam.lr") == "0.0002"
    cfg.train.lr = FULL_LR_AT_REFERENCE  # the largest rate auto gives any model in full: accepted
    cmd = launch_command(cfg, bundle, cluster=ClusterSpec(gpus_per_node=4), pretrain=HUB_7B)
    assert flag(cmd, "--actor.adam.lr") == "0.0001"


def test_a_lora_rate_for_a_readable_model_names_the_auto_rate(tmp_path, smol_path, bundle):  # noqa: F811
    from rapo_echo.integrations.openrlhf import ClusterSpec, launch_command

    lora_rate = FULL_LR_AT_REFERENCE * LORA_FACTOR  # auto's LoRA rate for the 135M model
    cfg = run_config(tmp_path, smol_path, **{"train.lr": lora_rate})
    with pytest.raises(ConfigError, match=r"LoRA-sized.*auto.* 0.0001 .*--set train.lr=auto"):
        launch_command(cfg, bundle, cluster=ClusterSpec(gpus_per_node=4))
    cfg.train.lr = "auto"
    cmd = launch_command(cfg, bundle, cluster=ClusterSpec(gpus_per_node=4))
    assert flag(cmd, "--actor.adam.lr") == "0.0001"


def test_the_readmes_export_of_configs_grpo_yaml_is_refused_then_runs_with_auto(tmp_path, smol_path, capsys):
    from rapo_echo.integrations.openrlhf.cli import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers(dest="command"))
    out = tmp_path / "job"
    common = ["--config", str(ROOT / "configs" / "grpo.yaml"), "--model", smol_path]
    common += ["--set", "model.lora.enabled=false", "--set", "rollout.batch_size=32"]
    common += ["--set", "train.micro_batch_size=2", "--output", str(tmp_path / "run")]
    common += ["--set", "judge.engine=openai", "--set", "judge.base_url=http://judge-host:8000/v1"]
    args = parser.parse_args(["openrlhf", "export", *common, "--out", str(out)])
    assert args.func(args) == 0
    launch = ["openrlhf", "launch", "--bundle", str(out), "--nodes", "2", "--gpus-per-node", "8"]
    args = parser.parse_args([*launch, "--pretrain", HUB_7B])
    with pytest.raises(ConfigError, match="train.lr: 0.0002 "):
        args.func(args)
    args = parser.parse_args([*launch, "--set", "train.lr=auto"])
    assert args.func(args) == 0
    assert "--actor.adam.lr 0.0001 " in capsys.readouterr().out  # auto for the 135M model it launches
    args = parser.parse_args([*launch, "--pretrain", HUB_7B, "--keep-lr"])
    assert args.func(args) == 0
    assert "--actor.adam.lr 0.0002 " in capsys.readouterr().out

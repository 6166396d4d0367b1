"""The accelerate and DeepSpeed launch configs: each file goes through accelerate's own loaders and the
argument handling of ``accelerate launch`` (so a key accelerate rejects fails here), and, where
DeepSpeed is importable, through DeepSpeed's own config validation."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from unittest import mock

import pytest
import yaml

from rapo_echo.config import TrainConfig

ROOT = Path(__file__).resolve().parents[3]
ACCELERATE = sorted((ROOT / "configs" / "accelerate").glob("*.yaml"))
DEEPSPEED = sorted((ROOT / "configs" / "deepspeed").glob("*.json"))


def launch_env(config_file: Path, processes: int | None = 4) -> tuple[object, dict[str, str]]:
    """What ``accelerate launch --config_file FILE --num_processes N train.py`` would hand the training
    processes: the validated arguments and the ``ACCELERATE_*`` environment (for DeepSpeed configs)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_deepspeed_cmd_env

    count = [] if processes is None else ["--num_processes", str(processes)]
    args = launch_command_parser().parse_args(["--config_file", str(config_file), *count, "train.py"])
    args, defaults, mp_from_config = _validate_launch_command(args)
    env: dict[str, str] = {}
    if args.use_deepspeed:
        # the same field list accelerate.commands.launch.launch_command builds
        fields = list(defaults.deepspeed_config.keys()) + (["mixed_precision"] if mp_from_config else [])
        args.deepspeed_fields_from_accelerate_config = ",".join(fields)
        _, full = prepare_deepspeed_cmd_env(args)
        env = {k: v for k, v in full.items() if k.startswith("ACCELERATE_")}
    return args, env


def deepspeed_plugin(env: dict[str, str]):
    """accelerate's DeepSpeedPlugin as the training process builds it from the launch environment."""
    from accelerate.utils import DeepSpeedPlugin

    with mock.patch.dict(os.environ, env):
        plugin = DeepSpeedPlugin()
        plugin.set_mixed_precision(env.get("ACCELERATE_MIXED_PRECISION", "no"))
    return plugin


def test_the_expected_files_exist():
    assert [p.name for p in ACCELERATE] == ["ddp.yaml", "deepspeed_zero2.yaml", "deepspeed_zero3.yaml"]
    assert [p.name for p in DEEPSPEED] == ["zero2.json", "zero3.json"]


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_configs_load_through_accelerate(path):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DistributedType

    raw = yaml.safe_load(path.read_text())
    cfg = load_config_from_file(str(path))  # raises on any key accelerate does not know
    assert isinstance(cfg, ClusterConfig)
    assert "num_processes" not in raw and cfg.num_processes == -1  # given at launch, never a hidden count
    assert cfg.num_machines == 1 and not cfg.use_cpu
    if path.name.startswith("ddp"):
        assert cfg.distributed_type == DistributedType.MULTI_GPU and raw["mixed_precision"] == "no"
    else:
        assert cfg.distributed_type == DistributedType.DEEPSPEED
        ds_file = ROOT / cfg.deepspeed_config["deepspeed_config_file"]
        assert ds_file.is_file() and ds_file.parent.name == "deepspeed"
        assert "mixed_precision" not in raw  # accelerate refuses it next to a DeepSpeed config file
        # ZeRO-3 partitions the weights as they load (transformers does, whatever the flag says)
        assert cfg.deepspeed_config["zero3_init_flag"] is (path.name == "deepspeed_zero3.yaml")


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_the_process_count_comes_from_the_command_line(path, monkeypatch):
    """1, 4 and 8 GPUs from the same file with --num_processes; without it accelerate says what is
    missing instead of starting a count the machine may not have."""
    monkeypatch.chdir(ROOT)
    for n in (1, 4, 8):
        assert launch_env(path.relative_to(ROOT), n)[0].num_processes == n
    with pytest.raises(ValueError, match="manually pass in `--num_processes`"):
        launch_env(path.relative_to(ROOT), None)


@pytest.mark.parametrize("path", ACCELERATE, ids=lambda p: p.name)
def test_accelerate_launch_accepts_the_configs(path, monkeypatch):
    monkeypatch.chdir(ROOT)  # DeepSpeed file paths are relative to the repository root
    args, env = launch_env(path.relative_to(ROOT))
    assert args.num_processes == 4
    if not args.use_deepspeed:
        assert args.multi_gpu and args.mixed_precision == "no"
        return
    stage = 2 if "zero2" in path.name else 3
    assert env["ACCELERATE_USE_DEEPSPEED"] == "true"
    assert env["ACCELERATE_DEEPSPEED_CONFIG_FILE"] == f"configs/deepspeed/zero{stage}.json"
    plugin = deepspeed_plugin(env)  # runs accelerate's check against duplicated DeepSpeed fields
    assert plugin.zero_stage == stage and plugin.gradient_accumulation_steps == 1
    assert plugin.gradient_clipping == TrainConfig().max_grad_norm
    assert plugin.deepspeed_config["bf16"] == {"enabled": True}
    assert plugin.deepspeed_config["fp16"] == {"enabled": False}
    assert plugin.zero3_init_flag == (stage == 3)


def test_a_mixed_precision_next_to_the_deepspeed_file_is_refused(tmp_path, monkeypatch):
    """The check above can fail: accelerate rejects the combination this repository avoids."""
    monkeypatch.chdir(ROOT)
    raw = yaml.safe_load((ROOT / "configs/accelerate/deepspeed_zero2.yaml").read_text())
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({**raw, "mixed_precision": "bf16"}))
    _, env = launch_env(bad)
    with pytest.raises(ValueError, match="will be ignored"):
        deepspeed_plugin(env)


@pytest.mark.parametrize("path", DEEPSPEED, ids=lambda p: p.name)
def test_deepspeed_json_has_what_the_trainer_needs(path):
    from accelerate.utils.deepspeed import HfDeepSpeedConfig

    data = json.loads(path.read_text())
    ds = HfDeepSpeedConfig(str(path))
    stage = int(path.stem[-1])
    assert ds.get_value("zero_optimization.stage") == stage
    assert ds.is_zero3() == (stage == 3) and ds.is_zero2() == (stage == 2)
    # no dataloader is prepared, so nothing may be left to accelerate's "auto" filling
    assert "auto" not in json.dumps(data)
    assert (
        isinstance(data["train_micro_batch_size_per_gpu"], int)
        and data["train_micro_batch_size_per_gpu"] >= 1
    )
    # rapo-echo does its own micro-batching with exact loss normalisation: one DeepSpeed step per update
    assert data["gradient_accumulation_steps"] == 1
    assert data["gradient_clipping"] == TrainConfig().max_grad_norm == 1.0
    assert data["bf16"]["enabled"] is True and "fp16" not in data
    assert "train_batch_size" not in data  # DeepSpeed derives it from the world size
    assert "optimizer" not in data and "scheduler" not in data  # the trainer's AdamW and schedule are used
    if stage == 3:
        assert data["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] is True


@pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install 'rapo-echo[deepspeed]' to check with DeepSpeed itself)",
)
@pytest.mark.parametrize("path", DEEPSPEED, ids=lambda p: p.name)
def test_deepspeed_validates_its_json(path):
    from deepspeed.runtime.config import DeepSpeedConfig

    cfg = DeepSpeedConfig(str(path))  # pydantic models that forbid unknown keys
    stage = int(path.stem[-1])
    assert cfg.zero_optimization_stage == stage and cfg.gradient_accumulation_steps == 1
    assert cfg.gradient_clipping == 1.0

"""``auto`` batch sizes: the CPU values on a CPU, sizes from free memory and the model on a GPU (the
CUDA memory query faked), and the resolved values written to the run directory."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml

import rapo_echo.autosize as autosize
from rapo_echo.algorithms.run_config import load_config

TINY = SimpleNamespace(
    num_hidden_layers=2,
    hidden_size=64,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    vocab_size=1000,
)


def test_gpu_sizes_by_hand() -> None:
    micro, rollout, basis = autosize.gpu_batch_sizes(
        free_bytes=50_000_000,
        model_config=TINY,
        trainable_params=1_000_000,
        param_bytes=2,
        prompt_tokens=100,
        new_tokens=50,
        group_size=4,
        shared_prompt_forward=True,
        gradient_checkpointing=False,
    )
    # optimizer: 1e6 params x 2 bytes x 3 (gradient + 2 moments) = 6e6 -> usable 44e6 bytes
    # training: 34 x 64 x 2 layers x (2 bytes / 2) = 4,352 bytes a token, x (100 / 4 + 50) = 326,400 a
    #   sequence; 0.45 x 44e6 / 326,400 = 60.7 -> 32
    # rollout: KV 2 x 2 layers x 2 heads x 16 x 2 bytes = 256 a token x 150 = 38,400, plus 6 x 1000 x 4
    #   = 24,000 for sampling -> 62,400 a row; 0.3 x 44e6 / 62,400 = 211.5 -> 128
    assert (micro, rollout) == (32, 128)
    assert basis["optimizer_bytes"] == 6_000_000 and basis["train_bytes_per_sequence"] == 326_400
    assert basis["rollout_bytes_per_row"] == 62_400


def test_gpu_sizes_shrink_without_shared_prompts_and_clamp() -> None:
    kw = dict(
        model_config=TINY,
        trainable_params=1_000_000,
        param_bytes=2,
        prompt_tokens=100,
        new_tokens=50,
        group_size=4,
        gradient_checkpointing=False,
    )
    shared = autosize.gpu_batch_sizes(free_bytes=50_000_000, shared_prompt_forward=True, **kw)[0]
    whole = autosize.gpu_batch_sizes(free_bytes=50_000_000, shared_prompt_forward=False, **kw)[0]
    assert whole < shared  # 150 tokens a sequence instead of 75: 0.45 x 44e6 / 652,800 = 30.3 -> 16
    assert whole == 16
    huge = autosize.gpu_batch_sizes(free_bytes=10**13, shared_prompt_forward=True, **kw)
    assert huge[:2] == (autosize.MAX_MICRO_BATCH, autosize.MAX_ROLLOUT_BATCH)
    tight = autosize.gpu_batch_sizes(free_bytes=6_000_000, shared_prompt_forward=True, **kw)
    assert tight[:2] == (1, 8)  # nothing left after the optimizer: the smallest sizes


QWEN_7B = SimpleNamespace(  # Qwen2.5-7B-Instruct's config.json
    num_hidden_layers=28,
    hidden_size=3584,
    num_attention_heads=28,
    num_key_value_heads=4,
    head_dim=128,
    vocab_size=152_064,
)
QWEN_7B_PARAMS = 7_615_616_512


def test_pending_optimizer_bytes_by_hand() -> None:
    """What the first optimizer step still allocates after prepare, per layout."""
    # no DeepSpeed, fp32 weights: gradient 4 + two fp32 moments 8 = 12 bytes a weight
    assert autosize.pending_optimizer_bytes(1000, 4) == 12_000
    # bf16 weights: gradient 2 + moments in fp32 (master weights) 8 = 10 (the fp32 copy exists already)
    assert autosize.pending_optimizer_bytes(1000, 2) == 10_000
    # ZeRO-2 on 8 ranks: 125 a rank, x (8 moments + 4 fp32 gradient) = 1,500, + bucket 100 x 2 bytes
    ds = dict(deepspeed=True, world=8, bucket_elements=100)
    assert autosize.pending_optimizer_bytes(1000, 2, zero_stage=2, **ds) == 1_700
    # ZeRO-1: the 16-bit gradients whole (2,000) instead of the bucket
    assert autosize.pending_optimizer_bytes(1000, 2, zero_stage=1, **ds) == 1_500 + 2_000


def test_7b_full_fine_tuning_on_8_gpus_under_zero2_by_hand() -> None:
    """Audit D5: Qwen2.5-7B full fine-tuning, ZeRO-2 on 8 x 80 GB, bf16, G=8, 1,024 + 512 tokens, with
    45 GB free after prepare (bf16 policy and reference 30.5 GB, the fp32 master shard 3.8 GB). The
    old estimate (an unsharded 16-bit AdamW: 3 x 2 bytes x 7.6e9 = 45.7 GB) left nothing and gave
    micro-batch 1 and 8 rollout rows. Sharded: 7.6e9 / 8 = 951,952,064 a rank x 12 bytes = 11.42 GB, +
    the 5e8-value reduce bucket in bf16 (1 GB) = 12.42 GB; usable 32.58 GB. Training: 34 x 3,584 x 28 =
    3,411,968 bytes a token x (1,024 / 8 + 512) = 2.18 GB a sequence; 0.45 x 32.58e9 / 2.18e9 = 6.7 ->
    4. Rollout: KV 2 x 28 x 4 x 128 x 2 = 57,344 bytes a token x 1,536 + 6 x 152,064 x 4 = 91.7 MB a
    row; 0.3 x 32.58e9 / 91.7e6 = 106.5 -> 64."""
    kw = dict(
        free_bytes=45_000_000_000,
        model_config=QWEN_7B,
        trainable_params=QWEN_7B_PARAMS,
        param_bytes=2,
        prompt_tokens=1024,
        new_tokens=512,
        group_size=8,
        shared_prompt_forward=True,
        gradient_checkpointing=False,
    )
    assert autosize.gpu_batch_sizes(**kw)[:2] == (1, 8)  # the unsharded estimate
    pending = autosize.pending_optimizer_bytes(
        QWEN_7B_PARAMS, 2, deepspeed=True, zero_stage=2, world=8, bucket_elements=500_000_000
    )
    assert pending == 12 * 951_952_064 + 1_000_000_000
    micro, rollout, basis = autosize.gpu_batch_sizes(optimizer_bytes=pending, **kw)
    assert (micro, rollout) == (4, 64)
    assert basis["train_bytes_per_sequence"] == 2_183_659_520 and basis["rollout_bytes_per_row"] == 91_729_920
    # ZeRO-3 also sets aside the 7/8 of the bf16 weights each rank gathers for the rollout (13.3 GB)
    gathered = QWEN_7B_PARAMS * 2 * 7 // 8
    tight = autosize.gpu_batch_sizes(optimizer_bytes=pending, gathered_bytes=gathered, **kw)
    assert tight[:2] == (2, 32) and tight[2]["gathered_bytes"] == gathered


def test_resolve_counts_zero3_weights_by_their_full_size(monkeypatch) -> None:
    """Under ZeRO-3 a rank's parameters are empty slices (``numel() == 0``); the sizing reads
    ``ds_numel`` and charges the gathered rest of the weights."""
    lm = torch.nn.Linear(10, 10, bias=False)
    lm.config = TINY
    lm.weight.ds_numel = 1_000_000  # what DeepSpeed records for a partitioned weight
    monkeypatch.setattr(autosize, "free_device_memory", lambda device: (50_000_000, 0))
    cfg = load_config()
    sizes = autosize.resolve_batch_sizes(
        cfg, lm, torch.device("cuda"), deepspeed=True, zero_stage=3, world=2, bucket_elements=0
    )
    # pending: 500,000 a rank x 12 bytes = 6e6; gathered: 1e6 x 4 bytes / 2 = 2e6
    assert sizes.basis["optimizer_bytes"] == 6_000_000 and sizes.basis["gathered_bytes"] == 2_000_000


def test_cpu_keeps_the_tuned_values_and_explicit_values_win() -> None:
    lm = torch.nn.Linear(2, 2)
    cfg = load_config()
    sizes = autosize.resolve_batch_sizes(cfg, lm, torch.device("cpu"))
    assert (sizes.micro_batch_size, sizes.rollout_max_batch_size) == (8, 64) and sizes.basis == {}
    cfg = load_config(overrides=["train.micro_batch_size=3", "rollout.max_batch_size=5"])
    sizes = autosize.resolve_batch_sizes(cfg, lm, torch.device("cuda"))  # set values: no query at all
    assert (sizes.micro_batch_size, sizes.rollout_max_batch_size) == (3, 5)


def test_trainer_writes_the_resolved_sizes(tmp_path: Path, tiny_folder: Path, monkeypatch) -> None:
    """The GPU branch through the trainer (free memory faked, device reported as CUDA): the values
    land in config.yaml and resolved.json, and the policy's engine uses them."""
    from rapo_echo import trainer as trainer_module
    from rapo_echo.trainer import Trainer

    asked = []
    monkeypatch.setattr(autosize, "free_device_memory", lambda device: asked.append(device) or (2 * 10**9, 0))
    resolve = autosize.resolve_batch_sizes
    monkeypatch.setattr(
        trainer_module,
        "resolve_batch_sizes",
        lambda cfg, lm, device, **layout: resolve(cfg, lm, torch.device("cuda"), **layout),
    )
    run = tmp_path / "run"
    cfg = load_config(overrides=[f"model.name={tiny_folder}", f"output={run}", "logging.tensorboard=false"])
    trainer = Trainer(cfg)
    trainer.open_logs()
    resolved = json.loads((run / "resolved.json").read_text())
    saved = yaml.safe_load((run / "config.yaml").read_text())
    micro, rows = resolved["train.micro_batch_size"], resolved["rollout.max_batch_size"]
    assert asked and resolved["asked"] == {"train.micro_batch_size": "auto", "rollout.max_batch_size": "auto"}
    assert resolved["basis"]["free_bytes"] == 2 * 10**9
    assert micro not in (8, "auto") and rows not in (64, "auto")  # the GPU branch, not the CPU values
    assert saved["train"]["micro_batch_size"] == micro and saved["rollout"]["max_batch_size"] == rows
    assert trainer.policy.engine.max_batch_size == rows and trainer.cfg.train.micro_batch_size == micro


@pytest.mark.parametrize("value", [0, -1, "big", True, 2.5])
def test_bad_sizes_are_refused_with_the_key(value) -> None:
    from rapo_echo.errors import ConfigError

    with pytest.raises(ConfigError, match=r"train.micro_batch_size: got .*whole number >= 1 or 'auto'"):
        load_config(overrides=[f"train.micro_batch_size={value}"])

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
    from rapo_echo.algorithms.learner import Learner

    asked = []
    monkeypatch.setattr(autosize, "free_device_memory", lambda device: asked.append(device) or (2 * 10**9, 0))
    resolve = autosize.resolve_batch_sizes
    monkeypatch.setattr(
        trainer_module, "resolve_batch_sizes", lambda cfg, lm, device: resolve(cfg, lm, torch.device("cuda"))
    )
    run = tmp_path / "run"
    cfg = load_config(overrides=[f"model.name={tiny_folder}", f"output={run}", "logging.tensorboard=false"])
    trainer = Learner(cfg)
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

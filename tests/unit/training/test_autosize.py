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
from rapo_echo.training.run_config import load_config
from tests.conftest import model_dims

TINY = SimpleNamespace(**model_dims(hidden=64, layers=2, heads=4, kv_heads=2), head_dim=16, vocab_size=1000)
# Qwen2.5-7B-Instruct's and Llama-3-70B's config.json values (tests/fixtures/model_shapes/)
SHAPES = Path(__file__).resolve().parents[2] / "fixtures" / "model_shapes"


def shape_of(name: str) -> autosize.ModelShape:
    return autosize.ModelShape.of(SimpleNamespace(**json.loads((SHAPES / name / "config.json").read_text())))


def test_parameter_counts_of_real_shapes_by_hand() -> None:
    qwen = shape_of("qwen2.5-7b")
    # embeddings, untied: 2 x 152,064 x 3,584 = 1,089,994,752
    # a layer: q, o 3,584^2 = 12,845,056 each; k, v 3,584 x 512 = 1,835,008 each; gate, up, down
    #   3,584 x 18,944 = 67,895,296 each -> 233,046,016; q/k/v biases (28 + 2 x 4) x 128 = 4,608;
    #   norms 2 x 3,584 = 7,168 -> 233,057,792; x 28 = 6,525,618,176; final norm 3,584
    assert qwen.parameter_count() == 7_615_616_512
    # LoRA r=16 on all 7 linears: 16 x (2 x 7,168 + 2 x 4,096 + 3 x 22,528) = 1,441,792 a layer, x 28
    assert qwen.lora_parameter_count(16, "all-linear") == 40_370_176
    assert qwen.lora_parameter_count(16, ["q_proj", "model.layers.0.self_attn.v_proj"]) == 28 * 16 * (
        7_168 + 4_096
    )
    assert qwen.kv_bytes_per_token(2) == 2 * 28 * 4 * 128 * 2 == 57_344  # 56 KiB
    llama = shape_of("llama-3-70b")
    # embeddings 2 x 128,256 x 8,192 = 2,101,346,304; a layer: q, o 8,192^2 = 67,108,864 each; k, v
    #   8,192 x 1,024 = 8,388,608 each; MLP 3 x 8,192 x 28,672 = 704,643,072; norms 16,384
    #   -> 855,654,400; x 80 = 68,452,352,000; final norm 8,192
    assert llama.parameter_count() == 70_553_706_496


def test_parameter_count_matches_transformers_models() -> None:
    """The formula against real (tiny, random) Llama and Qwen2 modules, tied and untied."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    kw = dict(vocab_size=300, **model_dims(hidden=64, layers=3, heads=4, kv_heads=2, intermediate=96))
    for cls, config in (
        (LlamaForCausalLM, LlamaConfig(**kw, tie_word_embeddings=True)),
        (LlamaForCausalLM, LlamaConfig(**kw, tie_word_embeddings=False, attention_bias=True, mlp_bias=True)),
        (Qwen2ForCausalLM, Qwen2Config(**kw, tie_word_embeddings=False)),
    ):
        model = cls(config)
        counted = sum(p.numel() for p in model.parameters())
        assert autosize.ModelShape.of(model.config).parameter_count() == counted


def test_activation_bytes_by_hand() -> None:
    shape = autosize.ModelShape.of(TINY)
    # a layer: 4 x 64 (norm and projection inputs) + 2 x 4 x 16 (queries, attention output) + 2 x 2 x 16
    # (keys, values) + 4 x 128 (gate, up, activation, product) = 960 values x 2 bytes; x 2 layers
    assert shape.activation_bytes_per_token(2) == 3_840
    # checkpointing: 2 layers x 64 x 2 bytes of layer inputs + one layer's 1,920
    assert shape.activation_bytes_per_token(2, gradient_checkpointing=True) == 256 + 1_920


def test_state_bytes_by_zero_stage_lora_and_masters() -> None:
    qwen = shape_of("qwen2.5-7b")
    n = qwen.parameter_count()
    full = autosize.Training(n, n, 2, 2, reference_copy=True, zero_stage=2, world_size=8)
    s = autosize.state_bytes(full)
    assert full.masters  # 16-bit trainable parameters: fp32 masters
    assert s["weights"] == s["reference"] == 15_231_233_024  # 2 bytes each, unsharded under ZeRO-2
    assert s["gradients"] == 15_231_233_024 // 8 == 1_903_904_128
    assert s["optimizer"] == n * 12 // 8 == 11_423_424_768
    z3 = autosize.state_bytes(autosize.Training(n, n, 2, 2, zero_stage=3, world_size=8))
    assert z3["weights"] == 1_903_904_128 and z3["reference"] == 0
    single = autosize.state_bytes(autosize.Training(n, n, 2, 2, master_weights=False))
    assert single["optimizer"] == n * 4 and single["gradients"] == n * 2  # pure bf16 moments, no shards
    lora_n = qwen.lora_parameter_count(16, "all-linear")
    lora = autosize.state_bytes(autosize.Training(n + lora_n, lora_n, 2, 4), vllm_bytes=123)
    assert lora["gradients"] == lora_n * 4 and lora["optimizer"] == lora_n * 8  # fp32 adapter, no masters
    assert lora["vllm"] == 123


def test_gpu_sizes_by_hand() -> None:
    shape = autosize.ModelShape.of(TINY)
    training = autosize.Training(1_000_000, 1_000_000, 2, 2, master_weights=False)
    workload = autosize.Workload(prompt_tokens=100, new_tokens=50, group_size=4, micro_batch_tokens=1_024)
    micro, rollout, basis = autosize.gpu_batch_sizes(
        free_bytes=50_000_000, shape=shape, training=training, workload=workload
    )
    # pending: gradients 2e6 + moments 4e6 -> usable 44e6
    # training: 3,840 bytes a token x (100 / 4 + 50) = 288,000 a sequence; logits 3 x 512 x 1000 x 4 =
    #   6,144,000; budget 0.45 x 44e6 - 6,144,000 = 13,656,000 -> at most 47.4 -> 32 sequences; 1,024
    #   tokens / 75 = 13.7 -> the smallest that saturates is 16
    # rollout: KV 2 x 2 layers x 2 heads x 16 x 2 bytes = 256 a token x 150 = 38,400, plus 6 x 1000 x 4 =
    #   24,000 for sampling -> 62,400 a row; 0.3 x 44e6 / 62,400 = 211.5 -> at most 128 (< 256 wanted)
    assert (micro, rollout) == (16, 128)
    assert basis["pending_bytes"] == 6_000_000 and basis["train_bytes_per_sequence"] == 288_000
    assert basis["rollout_bytes_per_row"] == 62_400 and basis["fits"]
    more = autosize.Workload(prompt_tokens=100, new_tokens=50, group_size=4, micro_batch_tokens=8_192)
    kw = dict(free_bytes=50_000_000, shape=shape, workload=more)
    assert autosize.gpu_batch_sizes(training=training, **kw)[0] == 32
    # fp32 masters (the default for 16-bit trainable weights): 12 bytes a parameter -> pending 14e6
    masters = autosize.Training(1_000_000, 1_000_000, 2, 2)
    basis = autosize.gpu_batch_sizes(free_bytes=50_000_000, shape=shape, training=masters, workload=more)[2]
    assert basis["pending_bytes"] == 14_000_000 and basis["usable_bytes"] == 36_000_000
    # already allocated optimizer state (e.g. after DeepSpeed's prepare) is not set aside twice
    after = autosize.gpu_batch_sizes(
        free_bytes=50_000_000,
        shape=shape,
        training=masters,
        workload=more,
        allocated=("weights", "reference", "optimizer"),
    )[2]
    assert after["pending_bytes"] == 2_000_000
    with pytest.raises(ValueError, match="unknown terms"):
        autosize.gpu_batch_sizes(
            free_bytes=1, shape=shape, training=masters, workload=more, allocated=("weight",)
        )


def test_gpu_sizes_clamp_and_report_what_does_not_fit() -> None:
    shape = autosize.ModelShape.of(TINY)
    training = autosize.Training(1_000_000, 1_000_000, 2, 2, master_weights=False)
    kw = dict(shape=shape, training=training)
    whole = autosize.Workload(100, 50, 4, shared_prompt_forward=False, micro_batch_tokens=10**6)
    # 150 tokens a sequence: 576,000 bytes; 13,656,000 / 576,000 = 23.7 -> 16
    assert autosize.gpu_batch_sizes(free_bytes=50_000_000, workload=whole, **kw)[0] == 16
    huge = autosize.gpu_batch_sizes(free_bytes=10**13, workload=whole, **kw)
    assert huge[:2] == (autosize.MAX_MICRO_BATCH, autosize.ROLLOUT_ROWS_TARGET)
    tight = autosize.gpu_batch_sizes(free_bytes=6_000_000, workload=whole, **kw)
    assert tight[:2] == (1, 8) and not tight[2]["fits"]  # nothing left after the optimizer


def test_the_selection_rule_on_the_h200_workload() -> None:
    """The lead's H200 measurement (2026-11-27): the 1.4B random Llama of the GPU kit, 32 prompts x 8,
    256 new tokens, bf16 full fine-tuning with a reference. The old rule (the largest that fits) took
    micro-batch 64 and 1024 rows; the smallest that saturates takes 32 and 256."""
    dims = model_dims(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960)
    shape = autosize.ModelShape.of(
        SimpleNamespace(**dims, head_dim=128, vocab_size=49152, tie_word_embeddings=True)
    )
    n = shape.parameter_count()
    assert n == 1_385_780_736
    training = autosize.Training(n, n, 2, 2, reference_copy=True, master_weights=False)
    workload = autosize.Workload(prompt_tokens=1024, new_tokens=256, group_size=8)
    free = 141 * 10**9 - 2 * n * 2  # the card less the weights and the reference
    micro, rollout, basis = autosize.gpu_batch_sizes(
        free_bytes=free, shape=shape, training=training, workload=workload
    )
    # 1024 / 8 + 256 = 384 tokens a sequence; 8,192 / 384 = 21.3 -> 32
    assert (micro, rollout) == (32, 256) and basis["fits"]


def test_token_target_default_matches_the_config() -> None:
    assert load_config().train.micro_batch_tokens == autosize.DEFAULT_MICRO_BATCH_TOKENS


def test_resolve_counts_zero3_weights_by_their_full_size(monkeypatch) -> None:
    """Under ZeRO-3 a rank's parameters are empty slices (``numel() == 0``); the sizing reads
    ``ds_numel`` and sets aside the rest of the weights, which each rank gathers for the rollout."""
    lm = torch.nn.Linear(10, 10, bias=False)
    lm.config = TINY
    lm.weight.ds_numel = 1_000_000  # what DeepSpeed records for a partitioned weight
    monkeypatch.setattr(autosize, "free_device_memory", lambda device: (50_000_000, 0))
    sizes = autosize.resolve_batch_sizes(
        load_config(), lm, torch.device("cuda"), reference_copy=False, zero_stage=3, world_size=2
    )
    state = sizes.basis["state_bytes"]
    # fp32: 1e6 x 4 bytes; a rank holds half (2e6) and gathers the other half (2e6) for the rollout;
    # gradients 4e6 / 2; AdamW's two fp32 moments 8e6 / 2 (no masters: the weights are fp32)
    assert (state["weights"], state["gathered"], state["gradients"], state["optimizer"]) == (
        2_000_000,
        2_000_000,
        2_000_000,
        4_000_000,
    )
    assert sizes.basis["pending_bytes"] == 8_000_000 and sizes.basis["usable_bytes"] == 42_000_000


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
    from rapo_echo.training import learner as trainer_module
    from rapo_echo.training.run import Run

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
    trainer = Run(cfg)
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


def test_the_vllm_copy_share_is_set_aside(monkeypatch) -> None:
    """``rollout.engine: vllm``: vLLM starts after sizing and takes ``vllm_gpu_memory_utilization`` of the
    device, so it is a state term not yet allocated: 0.3 x 1 GB is set aside from the 0.6 GB free."""
    lm = torch.nn.Linear(2, 2)
    lm.config = SimpleNamespace(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, vocab_size=100
    )
    monkeypatch.setattr(autosize, "free_device_memory", lambda device: (6 * 10**8, 10**9))
    hf = autosize.resolve_batch_sizes(load_config(), lm, torch.device("cuda"))
    cfg = load_config(overrides=["rollout.engine=vllm"])
    vllm = autosize.resolve_batch_sizes(cfg, lm, torch.device("cuda"))
    assert hf.basis["state_bytes"]["vllm"] == 0 and vllm.basis["state_bytes"]["vllm"] == 3 * 10**8
    assert vllm.basis["usable_bytes"] == hf.basis["usable_bytes"] - 3 * 10**8

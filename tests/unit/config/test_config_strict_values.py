"""Config strictness (issue 31 items 9, 10, 13): values that passed the schema and went wrong later are
refused at load, naming the key: a bool for a number, a device this machine lacks, non-finite numbers,
an empty reward list for GRPO, a secret-named field holding a number or list, a seed outside numpy's
range, an unknown attention implementation, a scripted engine's broken rules; LoRA target modules that
match nothing fail with the layer names when the model loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import load_config


def refused(*sets: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        load_config(overrides=list(sets))


def test_a_bool_is_not_a_number() -> None:
    refused("rollout.batch_size=true", match=r"rollout\.batch_size: got True")
    refused("train.max_steps=false", match=r"train\.max_steps: got False")
    refused("rollout.temperature=true", match=r"rollout\.temperature: got True")


@pytest.mark.parametrize("value", [".inf", "-.inf", ".nan"])
def test_numbers_are_finite(value: str) -> None:
    refused(f"loss.beta={value}", match=r"loss\.beta: got .*finite")
    refused(f"rewards=[{{name: judge, weight: {value}}}]", match=r"rewards\.0\.weight: got .*finite")
    refused(f"loss.clip_eps={value}", match=r"loss\.clip_eps")
    args = f"rewards=[{{name: length, args: {{target: {value}}}}}]"
    refused(args, match=r"rewards\.0\.args\.target: got .*finite")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
@pytest.mark.parametrize("device", ["cuda", "cuda:7"])
def test_a_missing_cuda_device_is_refused_at_load(device: str) -> None:
    refused(f"model.device={device}", match=rf"model\.device: got '{device}', but this machine has no CUDA")
    refused("judge.engine=hf", f"judge.device={device}", match=r"judge\.device")


def test_a_gpu_count_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert load_config(overrides=["model.device=cuda:1"]).model.device == "cuda:1"
    refused("model.device=cuda:7", match=r"this machine has 2 CUDA device\(s\) \(cuda:0 to cuda:1\)")


def test_grpo_needs_a_reward_with_a_weight() -> None:
    refused("rewards=[]", match=r"rewards: got no rewards .*grpo learns only from its rewards")
    refused("rewards=[{name: judge, weight: 0}]", match="only rewards of weight 0")
    assert load_config(algo="rapo", overrides=["rewards=[]"]).rewards == []  # RAPO's reward is its ranks


@pytest.mark.parametrize("value", ["123", "[1, 2]", "{a: b}", "1.5"])
def test_a_secret_named_field_holding_a_number_or_list_is_refused(value: str) -> None:
    refused(
        f"rewards=[{{name: judge, args: {{api_token: {value}}}}}]",
        match=r"rewards\.0\.args\.api_token: holds a literal \w+ .*api_token_env",
    )


@pytest.mark.parametrize("seed", ["-1", "123456789012345678901234567890", "4294967296"])
def test_the_seed_is_in_numpys_range(seed: str) -> None:
    refused(f"train.seed={seed}", match=r"train\.seed: got")
    assert load_config(overrides=["train.seed=4294967295"]).train.seed == 2**32 - 1


def test_an_unknown_attention_implementation_is_refused() -> None:
    refused("model.attn_implementation=bogus", match=r"model\.attn_implementation: got 'bogus'.*sdpa")
    assert load_config(overrides=["model.attn_implementation=sdpa"]).model.attn_implementation == "sdpa"


@pytest.mark.parametrize(
    ("rules", "match"),
    [
        ("[['(unclosed', x]]", r"rules\[0\]: the regex '\(unclosed' does not compile"),
        ("[[only]]", r"rules\[0\]: got \['only'\]; each rule is a pair"),
        ("[['a(b)', 'got {5}']]", r"rules\[0\]: the reply 'got \{5\}' cannot be filled"),
        ("[['a', '{\"score\": 5}']]", r"rules\[0\]: the reply .* cannot be filled"),
        ("oops", r"rules must be a list"),
    ],
)
def test_scripted_rules_are_checked_at_load(rules: str, match: str) -> None:
    refused("judge.engine=scripted", f"judge.script={{rules: {rules}}}", match=r"judge: .*script: " + match)


def test_good_scripted_rules_load() -> None:
    script = "judge.script={rules: [['a(b)', 'got {0} {{x}}']]}"
    cfg = load_config(overrides=["judge.engine=scripted", script])
    assert cfg.judge.script["rules"] == [["a(b)", "got {0} {{x}}"]]


def test_lora_target_modules_that_match_nothing_name_the_layers() -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    from rapo_echo.config import ModelConfig
    from rapo_echo.policy import Policy

    tiny = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    )
    cfg = ModelConfig(lora={"enabled": True, "target_modules": ["nope_proj"]})
    with pytest.raises(ConfigError, match=r"lora\.target_modules: \['nope_proj'\] matches no .*q_proj"):
        Policy._add_lora(tiny, cfg)


def test_a_config_file_is_held_to_the_same_rules(tmp_path: Path) -> None:
    p = tmp_path / "run.yaml"
    p.write_text("loss:\n  beta: .inf\n")
    with pytest.raises(ConfigError, match=rf"{p}:2: loss\.beta"):
        load_config(p)

"""``rapo-echo train --dry-run``: the plan of a 7B and a 70B run from a folder holding only config.json and a
tokenizer (no weights: loading any would fail), made on this CPU machine for GPUs named by flags. The
figures come from rapo_echo.autosize (hand-checked in test_autosize.py); here they are checked against
the same hand-computed values through the command line, and the requests a step sends to the judge
against the calls one real step makes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rapo_echo.cli import main
from rapo_echo.training.plan import Hardware, make_plan, role_requests
from rapo_echo.training.run_config import load_config
from tests.helpers.runs import run_config

SHAPES = Path(__file__).resolve().parents[2] / "fixtures" / "model_shapes"
ROOT = Path(__file__).resolve().parents[3]
QWEN_PARAMS = 7_615_616_512
QWEN_LORA = 40_370_176


def shape_folder(tmp_path: Path, smol_path: str, name: str) -> Path:
    """The fixture's config.json with the embedded model's tokenizer files (no weights)."""
    out = tmp_path / name
    out.mkdir()
    shutil.copy(SHAPES / name / "config.json", out / "config.json")
    for f in Path(smol_path).iterdir():
        if f.name.startswith("tokenizer") or f.name == "chat_template.jinja":
            shutil.copy(f, out / f.name)
    assert not list(out.glob("*.safetensors"))
    return out


@pytest.fixture
def qwen(tmp_path, smol_path) -> Path:
    return shape_folder(tmp_path, smol_path, "qwen2.5-7b")


@pytest.fixture
def llama70(tmp_path, smol_path) -> Path:
    return shape_folder(tmp_path, smol_path, "llama-3-70b")


def plan_of(folder: Path, *overrides: str, algo: str = "grpo", **hw) -> dict:
    cfg = load_config(algo=algo, overrides=[f"model.name={folder}", *overrides])
    return make_plan(cfg, Hardware(**hw))


def test_7b_lora_on_one_80gb_gpu(qwen) -> None:
    plan = plan_of(qwen, "model.lora.enabled=true", "model.lora.r=16", "loss.beta=0.04")
    mem = plan["memory_bytes"]
    assert plan["model"]["parameters"] == QWEN_PARAMS and plan["model"]["trainable"] == QWEN_LORA
    assert plan["model"]["dtype"] == "bfloat16"  # auto on a bf16 GPU
    assert mem["weights"] == (QWEN_PARAMS + QWEN_LORA) * 2
    assert mem["reference"] == 0  # LoRA: the base with the adapter off
    assert mem["gradients"] == QWEN_LORA * 4 and mem["optimizer"] == QWEN_LORA * 8  # fp32 adapter
    assert not plan["hardware"]["fp32_masters"] and plan["fits"]
    # activations: 196,608 bytes a token a layer x 28 = 5,505,024 a token; (1024 / 4 + 64) tokens a sequence
    assert plan["basis"]["train_bytes_per_sequence"] == 5_505_024 * (1024 // 4 + 64)
    assert plan["batch"]["train.micro_batch_size"] >= 1 and plan["total_bytes"] < 80e9


def test_7b_full_zero2_on_eight_gpus_from_the_accelerate_config(qwen, capsys, tmp_path) -> None:
    out = tmp_path / "plan.json"
    code = main(
        [
            "train",
            "--config",
            str(ROOT / "configs" / "grpo.yaml"),
            "--model",
            str(qwen),
            "--set",
            "model.lora.enabled=false",
            "--dry-run",
            "--accelerate-config",
            str(ROOT / "configs" / "accelerate" / "deepspeed_zero2.yaml"),
            "--gpus",
            "8",
            "--plan-json",
            str(out),
        ]
    )
    assert code == 0
    text = capsys.readouterr().out
    plan = json.loads(out.read_text())
    mem = plan["memory_bytes"]
    assert plan["hardware"]["zero_stage"] == 2 and plan["hardware"]["gpus"] == 8
    assert mem["weights"] == mem["reference"] == QWEN_PARAMS * 2  # beta 0.04: a frozen copy
    assert mem["gradients"] == QWEN_PARAMS * 2 // 8 and mem["optimizer"] == QWEN_PARAMS * 12 // 8
    assert plan["fits"] and "ZeRO-2" in text and "fits: yes" in text and "optimizer" in text
    assert "judge reward: one rating per reply" in text  # configs/grpo.yaml's judge (the policy here)


def test_70b_does_not_fit_80gb_gpus_and_says_why(llama70) -> None:
    full = plan_of(llama70, "model.lora.enabled=false", gpus=8, zero_stage=2)
    assert full["model"]["parameters"] == 70_553_706_496
    assert not full["fits"] and "model state alone" in full["problems"][0]
    lora = plan_of(llama70, "model.lora.enabled=true", "loss.beta=0", gpus=8, zero_stage=3)
    assert lora["memory_bytes"]["weights"] == -(-(70_553_706_496 + lora["model"]["trainable"]) * 2 // 8)
    # each rank gathers the whole 141 GB of bf16 weights for an hf rollout under ZeRO-3: no 80 GB GPU holds it
    assert (
        lora["memory_bytes"]["gathered"]
        == 2 * (70_553_706_496 + lora["model"]["trainable"]) - lora["memory_bytes"]["weights"]
    )
    assert not lora["fits"] and "gathers the whole model" in lora["problems"][0]


def test_sizes_given_are_kept_and_a_role_model_on_the_gpu_is_named(qwen) -> None:
    plan = plan_of(
        qwen,
        "train.micro_batch_size=64",
        "rollout.max_batch_size=512",
        "rollout.batch_size=64",
        "rollout.group_size=8",
        "judge.engine=hf",
        "judge.model=some/judge-70b",
    )
    assert plan["batch"]["train.micro_batch_size"] == 64 and plan["batch"]["rollout.max_batch_size"] == 512
    assert any("exceeds" in p for p in plan["problems"]) and any(
        "judge.engine hf" in p for p in plan["problems"]
    )


def test_cpu_plan_uses_the_cpu_sizes(qwen) -> None:
    plan = plan_of(qwen, "model.device=cpu", device="cpu")
    assert plan["hardware"]["device"] == "cpu" and plan["model"]["dtype"] == "float32"
    assert (plan["batch"]["train.micro_batch_size"], plan["batch"]["rollout.max_batch_size"]) == (8, 64)


def test_requests_per_step_of_each_algorithm() -> None:
    """The formulas by hand: B scenarios x G replies per process."""
    base = ["rollout.batch_size=4", "rollout.group_size=8"]
    rapo = load_config(algo="rapo", overrides=base)
    got = {(role, what): n for role, what, n in role_requests(rapo)}
    assert got[("simulator", "RAPO reactions (reply + thought)")] == 64  # 32 replies x (reply + thought)
    assert got[("judge", "RAPO group ranks (2 orders x 1 passes)")] == 8  # 4 groups x both orders
    assert got[("judge", "RAPO critiques of the replies to correct (about half)")] == 16
    rlver = load_config(algo="rlver", overrides=base)
    ((role, _, n),) = role_requests(rlver)
    assert role == "simulator" and n == 32 * 8 * 2  # rlver preset: 8 turns, reply + emotion each
    echo = load_config(config_path := str(ROOT / "configs" / "echo_n1.yaml"), overrides=base)
    assert config_path
    counts = {what: n for _, what, n in role_requests(echo)}
    assert counts["echo_n1: empathy comparisons (2 orders)"] == 64 and counts["echo_n1: injection probe"] == 8


def test_judge_requests_equal_the_calls_of_a_real_step(tmp_path: Path, tiny_folder: Path) -> None:
    """GRPO with the judge reward: the plan's judge requests per step are the prompts one real training
    step sends to the judge engine (a scripted judge that answers every rating)."""
    from rapo_echo.training.run import Run

    cfg = run_config(
        tiny_folder,
        tmp_path / "run",
        "rollout.batch_size=2",
        "rollout.group_size=3",
        "rollout.max_new_tokens=3",
        "rewards=[{name: judge, args: {use_logprobs: never}}]",
        "judge.engine=scripted",
        "judge.script={default: '{\"score\": 4}'}",
    )
    planned = {(role, what): n for role, what, n in role_requests(cfg)}
    trainer = Run(cfg)
    judge = trainer.rewards.rewards[0][0].engine
    prompts = []
    original = judge.generate
    judge.generate = lambda ps, params: prompts.extend(ps) or original(ps, params)
    metrics = trainer.train_step()
    assert metrics["reward/mean"] == pytest.approx(0.75)  # every reply rated 4 of 5: (4 - 1) / 4
    assert planned == {("judge", "judge reward: one rating per reply"): 6} and len(prompts) == 6


def test_the_plan_asks_the_algorithm_for_its_requests(tiny_folder: Path) -> None:
    """The built-ins declare theirs in their own files (SFT: none, without a note); a plugin algorithm
    that declares none (RFT, by path) gets a note that its calls are not counted, and its rewards' rows."""
    from rapo_echo.training.plan import format_plan

    sft = plan_of(tiny_folder, "model.device=cpu", algo="sft", device="cpu")
    assert sft["requests"] == [] and sft["requests_note"] == ""
    assert "note:" not in format_plan(sft)
    rft = plan_of(tiny_folder, "model.device=cpu", algo="tests.helpers.rft_algorithm:RFT", device="cpu")
    assert "'tests.helpers.rft_algorithm:RFT' declares no requests of its own" in rft["requests_note"]
    assert [q["what"] for q in rft["requests"]] == ["judge reward: one rating per reply"]  # its reward
    assert f"note: {rft['requests_note']}" in format_plan(rft)


@pytest.mark.parametrize(
    ("algo", "overrides"),
    [
        ("grpo", ["monitor.reference_kl=true"]),  # the monitor's KL keeps a reference without beta
        ("rapo", ["rapo.sd.ref_kl=0.1"]),  # an SD guard keeps one (algorithms/sd_guards.needs_reference)
    ],
)
def test_a_reference_kept_for_another_reason_than_beta_is_planned(qwen, algo, overrides) -> None:
    plan = plan_of(qwen, "model.lora.enabled=false", "loss.beta=0", *overrides, algo=algo)
    assert plan["memory_bytes"]["reference"] == QWEN_PARAMS * 2  # full fine-tuning: a frozen bf16 copy
    without = plan_of(qwen, "model.lora.enabled=false", "loss.beta=0", algo=algo)
    assert without["memory_bytes"]["reference"] == 0

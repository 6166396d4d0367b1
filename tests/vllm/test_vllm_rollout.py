"""``rollout.engine: vllm`` with the real vLLM: GRPO (full fine-tuning) and RAPO (LoRA) train two steps on
vLLM's samples with the weights loaded into vLLM after every step, and a skipped sync is caught.

The trainer builds its rollout copy through ``vllm.LLM``; here that constructor hands back the session's
engine (one vLLM load per test session), after checking that the arguments the trainer chose fit it, so the
sampling, the log-probs and the weight loads are the real vLLM's. Its original weights are loaded back at
the end (the engine tests share it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from rapo_echo.engines.vllm_engine import VLLMEngine
from tests.vllm.conftest import MAX_MODEL_LEN
from tests.vllm.test_vllm_engine import our_logprobs

pytestmark = pytest.mark.vllm

# After a sync vLLM's teacher-forced log-probs equal the training model's (float32: < 1e-4 measured); one
# unsynced update at these learning rates moves them by > 0.05 (measured, docs/scaling.md)
SYNCED_TOL = 2e-3
STALE_MIN = 2e-2
FIXED = (
    [{"role": "user", "content": "I failed my driving test today."}],
    "That sounds really disappointing. Do you want to talk about it?",
)


@pytest.fixture
def shared_llm(vllm_engine, monkeypatch, smol_path: str) -> list[dict[str, Any]]:
    """``vllm.LLM`` returns the session's engine (after checking the trainer's arguments fit it); the
    arguments are recorded. The engine's original weights are loaded back afterwards."""
    asked: list[dict[str, Any]] = []

    def llm(**kwargs: Any) -> Any:
        assert kwargs["model"] == vllm_engine.llm_kwargs["model"] and kwargs["dtype"] == "float32"
        assert kwargs["max_model_len"] <= MAX_MODEL_LEN
        asked.append(kwargs)
        return vllm_engine.llm

    monkeypatch.setattr(vllm_engine._vllm, "LLM", llm)
    yield asked
    from rapo_echo.models import load_model

    pristine, _ = load_model(smol_path, dtype="float32", device="cpu")
    vllm_engine.sync_from(pristine)


def sync_gap(engine: VLLMEngine, model: Any) -> float:
    """Largest |vLLM's - the training model's| log-prob over a fixed reply (teacher forced, T = 1)."""
    prompt = engine.encode(FIXED[0])
    reply = engine.tokenizer(FIXED[1], add_special_tokens=False)["input_ids"]
    theirs = engine.score_ids([prompt], [reply])[0]
    model.eval()
    ours = our_logprobs(model, prompt, reply, 1.0)
    return max(abs(a - b) for a, b in zip(theirs, ours))


def run_config(smol_path: str, run: Path, algo: str, *extra: str) -> Any:
    from rapo_echo.training.run_config import load_config

    return load_config(
        overrides=[
            f"algo={algo}",
            f"model.name={smol_path}",
            f"output={run}",
            "rollout.engine=vllm",
            "rollout.batch_size=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "rollout.max_prompt_tokens=256",
            "train.max_steps=2",
            "train.save_every=100",
            "logging.progress=false",
            "logging.tensorboard=false",
            *extra,
        ]
    )


def read_metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def test_grpo_trains_on_vllm_samples_and_a_skipped_sync_is_caught(
    shared_llm, vllm_engine, smol_path, tmp_path
):
    """Two GRPO steps (full fine-tuning): every step's rollout comes from vLLM and the updated weights are
    loaded into it (all tensors, one at a time); vLLM then scores fixed tokens as the training model does.
    One more update with the sync skipped leaves vLLM measurably stale, and the next sync repairs it."""
    from rapo_echo.training.run import Run

    run = tmp_path / "grpo"
    cfg = run_config(
        smol_path, run, "grpo", "rewards=[{name: length, args: {target: 4}}]", "train.lr=1e-4", "loss.beta=0"
    )
    trainer = Run(cfg)
    (asked,) = shared_llm
    assert asked["max_model_len"] == 256 + 8  # rollout.max_prompt_tokens + max_new_tokens
    assert asked["seed"] == cfg.train.seed and "distributed_executor_backend" not in asked  # one process
    assert asked["enable_sleep_mode"] is False  # the CPU platform has no sleep mode
    engine = trainer.policy.rollout_engine
    assert isinstance(engine, VLLMEngine) and engine.llm is vllm_engine.llm
    loads: list[int] = []
    load = engine.load_weights
    engine.load_weights = lambda tensors: loads.append(load(tensors)) or loads[-1]  # type: ignore[method-assign]  # a recording seam on vLLM's engine
    trainer.train()
    n_params = len(list(trainer.policy.lm.named_parameters()))
    assert loads == [n_params, n_params]  # after each of the two updates, every tensor
    m = read_metrics(run)
    assert len(m) == 2 and all(x["time/weight_sync"] > 0 for x in m)
    assert all(x["train/sampler_logprob_gap/max"] < SYNCED_TOL for x in m)  # step 2 sampled synced weights
    synced = sync_gap(engine, trainer.policy.lm)
    assert synced < SYNCED_TOL

    engine.load_weights = lambda tensors: 0  # type: ignore[method-assign]  # the sync skipped
    trainer.train_step()
    stale = sync_gap(engine, trainer.policy.lm)
    assert stale > STALE_MIN
    engine.load_weights = load  # type: ignore[method-assign]  # a recording seam on vLLM's engine
    trainer.learner.sync_generator()
    print(f"sync gap: synced {synced:.2e}, one update unsynced {stale:.2e}")
    assert sync_gap(engine, trainer.policy.lm) < SYNCED_TOL


def test_rapo_with_lora_syncs_merged_weights_without_touching_the_base(
    shared_llm, vllm_engine, smol_path, tmp_path
):
    """Two RAPO steps with LoRA (the hidden-preference user and the reactions judge: no model besides the
    policy; a length reward spreads the ranks): vLLM samples every rollout, gets ``W + s*B@A`` after each
    step (the adapter's own tensors are not sent) and then scores as the adapted model does, while the frozen
    base (the reference) stays bit-identical. A served simulator and judge: test_vllm_serve.py."""
    from rapo_echo.training.run import Run

    run = tmp_path / "rapo"
    cfg = run_config(
        smol_path,
        run,
        "rapo",
        "model.lora.enabled=true",
        "model.lora.r=8",
        "model.lora.alpha=16",
        "train.lr=1e-2",
        "rapo.simulator.name=hidden_preference",
        "rapo.judge.kind=reactions",
        "rapo.sd.enabled=false",
        "rewards=[{name: length, args: {target: 4}}]",
    )
    trainer = Run(cfg)
    lm = trainer.policy.lm
    base = {n: p.detach().clone() for n, p in lm.named_parameters() if "base_layer" in n}
    assert base
    engine = trainer.policy.rollout_engine
    sent: list[list[str]] = []
    load = engine.load_weights

    def record(tensors):  # the names as they stream into vLLM
        names: list[str] = []
        sent.append(names)
        return load((names.append(n) or (n, t)) for n, t in tensors)

    engine.load_weights = record  # type: ignore[method-assign]  # a recording seam on vLLM's engine
    trainer.train()
    assert len(sent) == 2
    assert not any("lora" in n or "base_layer" in n or "base_model" in n for n in sent[0])
    assert "model.layers.0.self_attn.q_proj.weight" in sent[0]
    assert len(read_metrics(run)) == 2
    for n, p in lm.named_parameters():
        if n in base:
            assert torch.equal(p, base[n]), n  # never merged in place
    assert sync_gap(engine, lm) < SYNCED_TOL
    with lm.disable_adapter():
        assert sync_gap(engine, lm) > STALE_MIN  # vLLM holds the adapted weights, not the base

"""Issue 9, the training math: old log-probs in bf16, DDP collectives, token_kl micro-batches and
teacher, GSPO aggregation, gradient checkpointing, dropout, scorer logit transforms, RAPO details."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapo_echo.algorithms.base import PG
from rapo_echo.config import load_config
from rapo_echo.trainer import Trainer

QUIET = ["logging.progress=false", "logging.tensorboard=false"]


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


# ---------------------------------------------------------------------------- 9.3 bf16 old log-probs


@pytest.mark.integration
def test_bf16_step_one_has_ratio_one_and_reports_the_sampler_gap(tmp_path: Path) -> None:
    """In bf16 the cached decode and the training forward disagree (the sampler gap is > 0), yet the
    first update's ratio is exactly 1: GSPO's 3e-4 sequence clip used to drop every sequence."""
    run = tmp_path / "run"
    cfg = load_config(
        overrides=[
            f"output={run}",
            "model.dtype=bfloat16",
            "rollout.batch_size=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=8",
            "loss.policy_loss=gspo",
            "loss.beta=0",
            "rewards=[{name: length, args: {target: 3}}]",
            "train.max_steps=1",
            "train.seed=1",
            *QUIET,
        ]
    )
    Trainer(cfg).train()
    m = metrics(run)[0]
    assert m["adv/max"] > 0  # some sequences carry an advantage, so a clipped one would count
    assert m["clip_frac"] == 0.0
    assert m["train/sampler_logprob_gap/max"] > 1e-3  # bf16 decode != training forward
    assert 0 < m["train/sampler_logprob_gap/mean"] <= m["train/sampler_logprob_gap/max"]


def _bf16_trainer(tiny_folder: Path, run: Path, *extra: str) -> Trainer:
    cfg = load_config(
        overrides=[
            f"model.name={tiny_folder}",
            f"output={run}",
            "rollout.batch_size=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=5",
            "rewards=[{name: length, args: {target: 3}}]",
            *QUIET,
            *extra,
        ]
    )
    return Trainer(cfg)


@pytest.mark.parametrize(("dtype", "recomputed"), [("bfloat16", True), ("float32", False)])
def test_old_logprobs_with_several_mini_batches(tmp_path: Path, tiny_folder: Path, dtype, recomputed) -> None:
    """With two mini-batches the first update's forward cannot give the old log-probs: fp32 uses the
    sampler's (they match), bf16 recomputes them with the scorer and measures the gap there."""
    from rapo_echo.trainer import _LogprobGap

    trainer = _bf16_trainer(tiny_folder, tmp_path / "run", f"model.dtype={dtype}", "train.mini_batches=2")
    rollout = trainer.algorithm.rollout(trainer._batch(), 0)
    items = [it for it in rollout.items if it.kind == PG]
    gap = _LogprobGap()
    assert trainer._fill_old(items, gap) is recomputed
    for it in items:
        assert it.old_logprobs is not None and len(it.old_logprobs) == len(it.completion_ids)
        assert (it.old_logprobs is it.sampler_logprobs) is not recomputed
    assert bool(gap.metrics()) is recomputed


# ---------------------------------------------------------------------------- 9.4 DDP collectives


@pytest.mark.slow
def test_ddp_ranks_with_nothing_to_train_and_a_nonfinite_loss_do_not_hang(
    tmp_path: Path, tiny_folder: Path
) -> None:
    """2 processes (gloo): rank 1's rewards are all None, so it has nothing to train on in any step;
    there are more mini-batches than items (one is empty on both ranks); in step 2 rank 0's loss is
    non-finite. Every rank must still join every collective: the run finishes, step 2 is skipped on
    both ranks, and the replicas stay identical (checked at every checkpoint)."""
    import os
    import subprocess
    import sys

    run = tmp_path / "run"
    torchrun = Path(sys.executable).parent / "torchrun"
    probe = Path(__file__).with_name("ddp_fault_probe.py")
    port = 29900 + os.getpid() % 400
    cmd = [str(torchrun), "--nproc_per_node", "2", "--master_port", str(port), str(probe), "train"]
    cmd += ["--model", str(tiny_folder), "--output", str(run), "--max-steps", "3"]
    for s in (
        "rollout.batch_size=1",
        "rollout.group_size=2",
        "rollout.max_new_tokens=4",
        "rewards=[{name: 'tests.plugin_rewards:length_or_none_on_rank_one'}]",
        "train.mini_batches=3",
        "train.save_every=1",
        *QUIET,
    ):
        cmd += ["--set", s]
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PROBE_NAN_STEP": "2"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        _, err = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired as exc:
        import psutil  # accelerate's dependency

        for child in psutil.Process(proc.pid).children(recursive=True):  # torchrun's workers
            child.kill()
        proc.kill()
        proc.communicate()
        raise AssertionError("the 2-process run hung (a rank skipped a collective)") from exc
    assert proc.returncode == 0, err[-3000:]
    m = metrics(run)
    assert [x["world"] for x in m] == [2.0, 2.0, 2.0]
    assert [x["invalid"] for x in m] == [2.0, 2.0, 2.0]  # rank 1's two replies each step
    assert [x["items"] for x in m] == [2.0, 2.0, 2.0]  # rank 0's two replies only
    assert [x["nonfinite_skipped"] for x in m] == [0.0, 2.0, 0.0]  # both non-empty mini-batches
    assert [x["updates"] for x in m] == [2.0, 0.0, 2.0]  # the mini-batch empty everywhere is skipped
    assert (run / "final" / "config.json").is_file()

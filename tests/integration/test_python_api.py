"""rapo_echo.train from Python: a two-step run on a tiny model writes the run directory and returns its
last metrics; resume=True continues it from its checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rapo_echo

pytestmark = pytest.mark.integration

TINY = {
    "rollout.batch_size": 2,
    "rollout.group_size": 2,
    "rollout.max_new_tokens": 4,
    "rewards": [{"name": "length", "args": {"target": 4}}],
    "logging.progress": False,
    "logging.tensorboard": False,
    "train.save_every": 1,
}


def test_train_and_resume_from_python(tmp_path: Path, tiny_folder: Path) -> None:
    run = tmp_path / "run"
    result = rapo_echo.train(
        algo="grpo", output=run, overrides={**TINY, "model.name": str(tiny_folder), "train.max_steps": 1}
    )
    assert result.run_dir == run and result.step == 1 and result.stopped_by == ""
    assert result.metrics["step"] == 1 and "loss/total" in result.metrics
    assert result.final_model == run / "final" and (run / "final" / "config.json").is_file()
    assert (run / "checkpoints" / "step-1" / "trainer_state.json").is_file()
    assert (run / "config.yaml").is_file() and result.config.rollout.group_size == 2

    resumed = rapo_echo.train(output=run, resume=True, overrides={"train.max_steps": 2})
    assert resumed.step == 2 and resumed.metrics["step"] == 2
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_a_two_process_checkpoint_resumes_on_one_with_its_global_batch(
    tmp_path: Path, tiny_folder: Path
) -> None:
    """A checkpoint faked as written by 2 processes of rollout.batch_size 1 (what such a run records:
    its trainer state, its config.yaml, one RNG file per rank) resumes on 1 process with 2 per step."""
    run = tmp_path / "run"
    overrides = {**TINY, "rollout.batch_size": 1, "model.name": str(tiny_folder), "train.max_steps": 1}
    rapo_echo.train(algo="grpo", output=run, overrides=overrides)
    ckpt = run / "checkpoints" / "step-1"
    state = json.loads((ckpt / "trainer_state.json").read_text())
    assert (state["processes"], state["batch_size"]) == (1, 1)
    (ckpt / "trainer_state.json").write_text(json.dumps({**state, "processes": 2}))
    (ckpt / "rng_rank1.json").write_text((ckpt / "rng_rank0.json").read_text())

    resumed = rapo_echo.train(output=run, resume=True, overrides={"train.max_steps": 2})
    assert resumed.config.rollout.batch_size == 2
    last = json.loads((run / "checkpoints" / "step-2" / "trainer_state.json").read_text())
    assert (last["processes"], last["batch_size"]) == (1, 2)
    assert resumed.metrics["items"] == 2 * 2  # 2 scenarios x group_size 2

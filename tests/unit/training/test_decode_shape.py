"""C2 through the trainer: the policy's static decode is pinned before step 1 to one rollout chunk's
shape, and a training step's rollout decodes on it (one shape, so one compile on a GPU)."""

from __future__ import annotations

from pathlib import Path

from rapo_echo.engines.static_decode import bucket_length
from tests.helpers.runs import run_config


def test_trainer_pins_the_rollout_shape_and_the_step_uses_it(tmp_path: Path, tiny_folder: Path) -> None:
    from rapo_echo.training.run import Run

    cfg = run_config(
        tiny_folder,
        tmp_path / "run",
        "rollout.decode=static",
        "rollout.batch_size=3",
        "rollout.group_size=2",
        "rollout.max_batch_size=4",  # chunks of 2 prompts: 4 rows, then the last prompt's 2
        "rollout.max_new_tokens=4",
        "rewards=[{name: length}]",
    )
    trainer = Run(cfg)
    rows, length = trainer.policy.rollout_decode_shape(trainer.scenarios, dialogue_prompts=False)
    assert rows == 4
    static = trainer.policy.engine._static
    assert static.pinned == (4, bucket_length(length)) and static.shapes == {static.pinned: 1}
    trainer.train_step()
    # the 4-row chunk decodes on the pinned buffers; the 2-row chunk is not more than half: a bucket
    assert static.shapes[static.pinned] == 2 and sum(static.shapes.values()) == 3

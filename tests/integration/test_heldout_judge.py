"""The held-out judge in a real run (issue 46): two GRPO steps of the embedded model, a length reward to
train on and a held-out judge (the embedded model as a separate `hf` judge, its own question) scoring every
step's replies; its series are in the metrics, and the report draws the agreement."""

from __future__ import annotations

from pathlib import Path

from rapo_echo.benchmarks.plots import curve_keys
from rapo_echo.training.run import Run
from tests.helpers.runs import metrics, run_config


def test_the_held_out_judge_runs_two_steps_on_the_embedded_model(tmp_path: Path) -> None:
    run = tmp_path / "run"
    cfg = run_config(
        "default",
        run,
        "rollout.batch_size=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "rewards=[{name: length, args: {target: 5}}]",
        "judge.engine=hf",
        "judge.model=default",
        "monitor.heldout.enabled=true",
        "monitor.heldout.sample=4",
        "train.max_steps=2",
    )
    Run(cfg).train()
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert row["heldout/n"] == 4.0
        assert 0.0 <= row["heldout/score"] <= 1.0 and 0.0 <= row["heldout/train_score"] <= 1.0
        assert row["monitor/reward_divergence"] == 0.0  # two steps: no baseline yet
    agreements = [r["heldout/agreement"] for r in rows if "heldout/agreement" in r]
    assert agreements and all(0.0 <= a <= 1.0 for a in agreements)
    assert "heldout/agreement" in curve_keys(rows)  # the report draws it

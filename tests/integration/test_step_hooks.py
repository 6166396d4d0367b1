"""Step hooks in a real run on the tiny model: a hook an algorithm turns on (tests/helpers/step_hooks.py)
adds metrics before the rollout, after it and after the step, marks samples, writes its records, asks the
run to stop (a checkpoint, no final model, ``stopped_by`` its reason) and resumes with its state; the
monitor still comes last. And the roles a run builds: SFT builds no simulator or judge."""

from __future__ import annotations

import json
from pathlib import Path

from rapo_echo.checkpoint import latest_checkpoint
from rapo_echo.training.run import Run
from rapo_echo.training.run_config import load_config

HOOKED = "tests.helpers.step_hooks:HookedGRPO"
QUIET = ["logging.progress=false", "logging.tensorboard=false"]


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def hooked_cfg(model: Path, run: Path, steps: int):
    overrides = [
        f"model.name={model}",
        f"output={run}",
        *QUIET,
        "rollout.batch_size=2",
        "rollout.group_size=3",
        "rollout.max_new_tokens=6",
        "rewards=[{name: length, args: {target: 4}}]",
        f"train.max_steps={steps}",
    ]
    return load_config(algo=HOOKED, overrides=overrides)


def test_a_hook_adds_metrics_records_stops_and_resumes(tmp_path: Path, tiny_folder: Path) -> None:
    run_dir = tmp_path / "run"
    run = Run(hooked_cfg(tiny_folder, run_dir, 3))
    assert [h.name for h in run.hooks] == ["short_replies", "monitor"]  # the algorithm's, the monitor last
    run.train()
    assert run.stopped_by == "short_replies: step 2 reached (stop_at = 2)"
    assert latest_checkpoint(run_dir).name == "step-2" and not (run_dir / "final").exists()
    metrics = rows(run_dir / "metrics.jsonl")
    assert [m["short_replies/scenarios_seen"] for m in metrics] == [2.0, 4.0]  # before each rollout
    assert [m["short_replies/steps_seen"] for m in metrics] == [1.0, 2.0]  # after each step
    samples = rows(run_dir / "samples.jsonl")
    for m in metrics:  # after the rollout: the share of the samples it marked
        marked = [s["info"]["short"] for s in samples if s["step"] == m["step"]]
        assert len(marked) == 6 and m["short_replies/share"] == sum(marked) / 6
        keys = list(m)
        assert keys.index("short_replies/steps_seen") < keys.index("monitor/length_spike")
    records = rows(run_dir / "hooks" / "short_replies.jsonl")
    shorts = [(s["step"], s["reply"]) for s in samples if s["info"]["short"]]
    assert [(r["step"], r["reply"]) for r in records] == shorts
    assert records and all(r["tokens"] < 7 for r in records)  # max_new_tokens=6: every reply

    resumed = Run(hooked_cfg(tiny_folder, run_dir, 3), resume=True)
    resumed.train()
    assert resumed.stopped_by == "" and (run_dir / "final").is_dir()
    last = rows(run_dir / "metrics.jsonl")[-1]
    assert last["step"] == 3 and last["short_replies/steps_seen"] == 3.0  # its state came back
    assert last["short_replies/scenarios_seen"] == 6.0
    assert {r["step"] for r in rows(run_dir / "hooks" / "short_replies.jsonl")} <= {1, 2, 3}


def test_sft_builds_no_simulator_or_judge(tmp_path: Path, tiny_folder: Path) -> None:
    """The roles name a model that does not exist: building either would fail."""
    data = tmp_path / "sft.jsonl"
    row = {"messages": [{"role": "user", "content": "hi"}], "reference": "hello"}
    data.write_text(json.dumps(row) + "\n")
    missing = tmp_path / "no-such-model"
    overrides = [
        f"model.name={tiny_folder}",
        f"output={tmp_path / 'run'}",
        f"data.path={data}",
        *QUIET,
        "rollout.batch_size=1",
        "rollout.max_new_tokens=4",
        "train.max_steps=1",
        *(f"{role}.{k}" for role in ("simulator", "judge") for k in ("engine=hf", f"model={missing}")),
    ]
    run = Run(load_config(algo="sft", overrides=overrides))
    assert run.roles == {"simulator": None, "judge": None}
    assert run.algorithm.ctx.simulator is None and run.algorithm.ctx.judge is None
    run.train()
    assert len(rows(tmp_path / "run" / "metrics.jsonl")) == 1

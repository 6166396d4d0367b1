"""Training with several processes on CPU: 2 GRPO steps with 2 processes under DDP (torchrun, gloo)
and under DeepSpeed ZeRO-2 (``accelerate launch`` with the shipped config, DeepSpeed's CPU
accelerator). Both ranks must end with the same weights, and the run must equal a single-process run
of the same global batch (the ranks' recorded samples replayed in one process): same losses, same
weights. Groups never span ranks (each rank samples whole groups for its own scenarios), so group
statistics are exact; the records show it. DeepSpeed checkpoints resume to the same weights.

Every run uses ``train.adam_eps=1`` so that AdamW's update is close to linear in the gradient: with
the usual tiny epsilon, its first update is ``lr * sign(g)``, and float noise in a gradient entry
near zero (different summation order across ranks) would flip a whole ``lr`` step.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

from rapo_echo.algorithms.grpo import GRPO
from rapo_echo.perf.checkpoint_sizes import launch_config
from rapo_echo.training.run import Run
from rapo_echo.training.run_config import load_config
from tests.helpers.launch import accelerate, run_processes, torchrun
from tests.helpers.multiproc_probe import record_file, replaying, weights_file
from tests.helpers.runs import metrics

PROBE = Path(__file__).resolve().parents[1] / "helpers" / "multiproc_probe.py"
GROUP = 3
PER_RANK = 2
COMMON = [
    f"rollout.group_size={GROUP}",
    "rollout.max_new_tokens=6",
    "rewards=[{name: length, args: {target: 4}}, {name: question, weight: 0.5}]",
    "train.lr=1e-2",
    "train.adam_eps=1.0",
    "train.micro_batch_size=2",
    "train.max_steps=2",
    "train.save_every=1",
    "loss.beta=0.04",
    "logging.progress=false",
    "logging.tensorboard=false",
]
needs_deepspeed = pytest.mark.skipif(
    importlib.util.find_spec("deepspeed") is None,
    reason="deepspeed is not installed (pip install 'rapo-echo[dev]' brings it; CPU accelerator, no CUDA)",
)


def launch(
    prefix: list[str], model: Path, run: Path, probe_dir: Path, *extra: str, env: dict[str, str] | None = None
) -> None:
    """Run the probe's ``train`` under a launcher ``prefix`` (2 processes) with the common settings."""
    cmd = [*prefix, str(PROBE), "train", "--model", str(model), "--output", str(run)]
    for s in [f"rollout.batch_size={PER_RANK}", *COMMON, *extra]:
        cmd += ["--set", s]
    res = run_processes(cmd, env={"PROBE_DIR": str(probe_dir), **(env or {})}, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]


def resume(
    prefix: list[str], run: Path, probe_dir: Path, *overrides: str, env: dict[str, str] | None = None
) -> None:
    cmd = [*prefix, str(PROBE), "train", "--resume", str(run)]
    for s in overrides:
        cmd += ["--set", s]
    res = run_processes(cmd, env={"PROBE_DIR": str(probe_dir), **(env or {})})
    assert res.returncode == 0, res.stderr[-4000:]


def weights(path: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(path))


def check_groups_stay_on_their_rank(records: Path) -> None:
    """Every scenario's ``GROUP`` samples were drawn on one rank, and the ranks drew different
    scenarios: a group's statistics never need another rank's samples."""
    for step in (1, 2):
        seen: dict[str, int] = {}
        for rank in (0, 1):
            rows = json.loads(record_file(records, step, rank).read_text())
            per_scenario: dict[str, list[int]] = {}
            for row in rows:
                per_scenario.setdefault(row["scenario"], []).append(row["group"])
            assert len(per_scenario) == PER_RANK
            for scenario, groups in per_scenario.items():
                assert len(groups) == GROUP and len(set(groups)) == 1
                assert scenario not in seen, f"{scenario} sampled on ranks {seen[scenario]} and {rank}"
                seen[scenario] = rank


def check_samples_of_every_rank(run: Path, records: Path) -> None:
    """samples.jsonl holds every rank's samples (not rank 0's only), each with its rank."""
    rows = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    for step in (1, 2):
        for rank in (0, 1):
            mine = [(r["scenario"], r["reply"]) for r in rows if r["step"] == step and r["rank"] == rank]
            drawn = json.loads(record_file(records, step, rank).read_text())
            assert len(mine) == PER_RANK * GROUP == len(drawn)
            assert sorted(s for s, _ in mine) == sorted(row["scenario"] for row in drawn)


def check_equals_single_process(
    tmp: Path, model: Path, run: Path, records: Path, monkeypatch, *extra: str
) -> None:
    """Replay the ranks' samples in one process with the global batch (``extra``: the settings the run
    added to the common ones): same losses, same weights."""
    rollout_at, replayed = replaying(records, world=2)
    monkeypatch.setattr(GRPO, "rollout", rollout_at)
    monkeypatch.setattr(GRPO, "sample_group", replayed)
    single = tmp / "single"
    cfg = load_config(
        overrides=[
            f"model.name={model}",
            f"output={single}",
            f"rollout.batch_size={2 * PER_RANK}",
            *COMMON,
            *extra,
            "train.save_every=100",
        ]
    )
    trainer = Run(cfg)
    start = {n: p.detach().clone() for n, p in trainer.policy.lm.named_parameters() if p.requires_grad}
    trainer.train()
    multi, one = metrics(run), metrics(single)
    for m, s in zip(multi, one):
        assert m["world"] == 2.0 and m["items"] == s["items"] == 2 * PER_RANK * GROUP
        assert m["reward/mean"] == pytest.approx(s["reward/mean"], abs=1e-6)
        # each rank's loss is its share of the global loss; metrics average the ranks
        assert 2 * m["loss/total"] == pytest.approx(s["loss/total"], rel=1e-4, abs=1e-6)
    final = {n: p.detach() for n, p in trainer.policy.lm.named_parameters() if p.requires_grad}
    ranks = [weights(weights_file(records, r)) for r in (0, 1)]
    assert ranks[0].keys() == final.keys()
    moved = max(float((final[n] - start[n]).abs().max()) for n in final)
    assert moved > 1e-5
    for n, value in final.items():
        assert torch.equal(ranks[0][n], ranks[1][n]), f"ranks differ in {n}"
        assert torch.allclose(ranks[0][n], value, atol=1e-6, rtol=1e-5), f"{n} differs from one process"


@pytest.mark.slow
def test_ddp_two_processes_equal_one_process(tmp_path: Path, tiny_folder: Path, monkeypatch) -> None:
    run, records = tmp_path / "run", tmp_path / "records"
    launch(torchrun(2), tiny_folder, run, records)
    check_groups_stay_on_their_rank(records)
    check_samples_of_every_rank(run, records)
    check_equals_single_process(tmp_path, tiny_folder, run, records, monkeypatch)
    assert (run / "final" / "config.json").is_file()
    resolved = json.loads((run / "resolved.json").read_text())
    assert resolved["train.micro_batch_size"] == 2 and resolved["rollout.max_batch_size"] == 64


@needs_deepspeed
@pytest.mark.slow
def test_deepspeed_zero2_two_processes_equal_one_process_and_resume(
    tmp_path: Path, tiny_folder: Path, monkeypatch
) -> None:
    prefix = accelerate(launch_config(tmp_path, 2, fp32=True), 2)
    run, records = tmp_path / "run", tmp_path / "records"
    launch(prefix, tiny_folder, run, records)
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1", "step-2"]
    assert (run / "checkpoints" / "step-1" / "accelerate").is_dir()  # DeepSpeed engine shards
    check_groups_stay_on_their_rank(records)
    check_equals_single_process(tmp_path, tiny_folder, run, records, monkeypatch)
    # resume from the step-1 checkpoint: the second step gives the same losses and weights
    again, again_records = tmp_path / "again", tmp_path / "again_records"
    shutil.copytree(run, again)
    shutil.rmtree(again / "checkpoints" / "step-2")
    shutil.rmtree(again / "final")
    resume(prefix, again, again_records)
    assert [m["step"] for m in metrics(again)] == [1, 2]
    assert metrics(again)[1]["loss/total"] == pytest.approx(metrics(run)[1]["loss/total"], rel=1e-6)
    first, resumed = weights(weights_file(records, 0)), weights(weights_file(again_records, 0))
    for n, value in first.items():
        assert torch.allclose(resumed[n], value, atol=1e-7), f"{n} differs after resuming"

"""DeepSpeed ZeRO-3 with 2 CPU processes (gloo, DeepSpeed's CPU accelerator), tested like ZeRO-2 in
test_multiprocess.py: the shipped ``deepspeed_zero3.yaml`` with bf16 off in a copy of its JSON, LoRA and
full fine-tuning, 2 GRPO steps with a rollout before each, a KL reference (``loss.beta``) and a judge
that shares the policy's weights (``judge.engine: policy``: the LoRA base, or the full fine-tuning
reference). Each run must equal one process replaying the same global batch (losses and weights), and
resuming its step-1 checkpoint must give the same step 2.

What ZeRO-3 adds over ZeRO-2, and where these runs check it (docs/scaling.md, audit D1-D7):
* the weights are partitioned as they load, so the logit check and the scorer's own use of the output
  head must gather them (D2: before the fix, both runs died in ``Policy.check`` with ``Padding_idx must
  be within num_embeddings``);
* rank 1 decodes more tokens than rank 0 in every rollout: nothing may run a collective while
  generating (D1; with DeepSpeed's hooks left on, every decode step gathers and the ranks wait on each
  other forever -- the run then fails as hung);
* the full fine-tuning reference is a DeepSpeed engine of its own, sharded (D4);
* checkpoints hold the adapter only under LoRA and DeepSpeed's shards only in full fine-tuning, and
  ``train.keep_checkpoints`` is honoured (D7).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from rapo_echo.perf.checkpoint_sizes import launch_config
from tests.helpers.launch import accelerate
from tests.helpers.multiproc_probe import weights_file
from tests.helpers.runs import metrics
from tests.multiprocess.test_multiprocess import (
    check_equals_single_process,
    check_groups_stay_on_their_rank,
    launch,
    needs_deepspeed,
    resume,
    weights,
)

# The judge generates its scores with the shared weights inside the rollout; weight 0, because its
# prompts are fenced with a hash of the whole batch (a rank's half differs from the global batch), so
# its scores, though close, are not the single process's.
SHARED_JUDGE = [
    "judge.engine=policy",
    "rewards=[{name: length, args: {target: 4}}, {name: question, weight: 0.5}, {name: judge, weight: 0.0}]",
]


def check_judge_ran(run: Path) -> None:
    """The shared-weight judge scored every sample of both steps (in [0, 1])."""
    for m in metrics(run):
        assert m["invalid"] == 0 and 0.0 < m["reward/judge/mean"] < 1.0
UNEVEN_DECODE = {"PROBE_EXTRA_DECODE_RANK": "1"}


def module_sizes(run: Path, step: int) -> dict[str, int]:
    """Name and element count of each tensor in rank 0's DeepSpeed model-states file of ``step``."""
    folder = run / "checkpoints" / f"step-{step}" / "accelerate" / "pytorch_model"
    state = torch.load(folder / "zero_pp_rank_0_mp_rank_00_model_states.pt", weights_only=False)
    return {k: v.numel() for k, v in state["module"].items()}


def check_resume_step_2(prefix: list[str], tmp: Path, run: Path, records: Path) -> Path:
    """Resume a copy of ``run`` from its step-1 checkpoint (rank 1 decoding more, as in the run, so the
    restored random states draw the same samples), keeping one checkpoint: step 2 gives the same loss
    and weights, and only step-2 stays on disk. Returns the resumed run."""
    again, again_records = tmp / "again", tmp / "again_records"
    shutil.copytree(run, again)
    shutil.rmtree(again / "checkpoints" / "step-2")
    shutil.rmtree(again / "final")
    resume(prefix, again, again_records, "train.keep_checkpoints=1", env=UNEVEN_DECODE)
    assert [m["step"] for m in metrics(again)] == [1, 2]
    # the loss is about 1e-8 here (advantages of equal-length replies sum to 0; ratio 1): the weights
    # are the exact check
    assert metrics(again)[1]["loss/total"] == pytest.approx(metrics(run)[1]["loss/total"], rel=1e-6, abs=1e-6)
    first, resumed = weights(weights_file(records, 0)), weights(weights_file(again_records, 0))
    assert first.keys() == resumed.keys()
    for n, value in first.items():
        assert torch.allclose(resumed[n], value, atol=1e-7), f"{n} differs after resuming"
    assert sorted(p.name for p in (again / "checkpoints").iterdir()) == ["step-2"]
    return again


def run_zero3(tmp_path: Path, tiny_folder: Path, monkeypatch, *extra: str) -> tuple[list[str], Path, Path]:
    """Two ZeRO-3 processes train (rank 1 decoding more): groups stay on their rank, the shared judge
    runs, and the run equals one process. Returns the launcher prefix, the run and its records."""
    prefix = accelerate(launch_config(tmp_path, 3, fp32=True), 2)
    run, records = tmp_path / "run", tmp_path / "records"
    launch(prefix, tiny_folder, run, records, *extra, env=UNEVEN_DECODE)
    check_groups_stay_on_their_rank(records)
    check_judge_ran(run)
    check_equals_single_process(tmp_path, tiny_folder, run, records, monkeypatch, *extra)
    return prefix, run, records


@needs_deepspeed
@pytest.mark.slow
def test_zero3_lora_equals_one_process_saves_the_adapter_and_resumes(
    tmp_path: Path, tiny_folder: Path, monkeypatch
) -> None:
    lora = ["model.lora.enabled=true", "model.lora.r=4"]
    prefix, run, records = run_zero3(tmp_path, tiny_folder, monkeypatch, *lora, *SHARED_JUDGE)
    # the checkpoint: the adapter (PEFT folder) and DeepSpeed's shards of the adapter, no base weights
    step1 = run / "checkpoints" / "step-1"
    assert (step1 / "model" / "adapter_model.safetensors").is_file()
    assert not list((step1 / "model").glob("model*.safetensors"))
    sizes = module_sizes(run, 1)
    frozen = {k: n for k, n in sizes.items() if "lora_" not in k}
    assert len(sizes) > len(frozen)
    # DeepSpeed leaves out frozen weights by name from named_parameters(), which lists the tied embedding
    # once: its second name, the head, stays -- as an empty ZeRO-3 placeholder
    assert frozen == {"lm.base_model.model.lm_head.weight": 0}
    check_resume_step_2(prefix, tmp_path, run, records)


@needs_deepspeed
@pytest.mark.slow
def test_zero3_full_fine_tuning_equals_one_process_saves_shards_and_resumes(
    tmp_path: Path, tiny_folder: Path, monkeypatch
) -> None:
    prefix, run, records = run_zero3(tmp_path, tiny_folder, monkeypatch, *SHARED_JUDGE)
    # the checkpoint: DeepSpeed's shards only (no gathered 16-bit copy of the model); under ZeRO-3 the
    # model-states file holds placeholders, the weights live in each rank's optimizer-state shard
    step1 = run / "checkpoints" / "step-1"
    assert not (step1 / "model").exists()
    shards = sorted(p.name for p in (step1 / "accelerate" / "pytorch_model").glob("*optim_states.pt"))
    assert shards == [f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]
    assert (run / "final" / "model.safetensors").is_file()  # the final model is still gathered
    check_resume_step_2(prefix, tmp_path, run, records)

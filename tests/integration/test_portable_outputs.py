"""Outputs that travel: an adapter names its base as the user gave it (relative to the run when local),
``train.save_optimizer: false`` keeps the optimizer out of checkpoints (and a resume still runs), and
``rapo-echo export`` writes a loadable folder with a model card, merges LoRA, and pushes to the Hub.
The same run logs to Weights & Biases (a stand-in at the wandb boundary): config, metrics, samples."""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

import pytest
import torch

from rapo_echo import export
from rapo_echo.cli import main
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.training.run import Run
from rapo_echo.training.run_config import load_config
from tests.conftest import make_tiny_model
from tests.helpers.wandb_stand_in import StandIn

BASE = [
    "rollout.batch_size=2",
    "rollout.group_size=2",
    "rollout.max_new_tokens=4",
    "rewards=[{name: length, args: {target: 4}}]",
    "logging.progress=false",
    "logging.tensorboard=false",
    "train.lr=1e-3",
    "train.save_every=1",
    "model.lora.enabled=true",
    "train.save_optimizer=false",
    "logging.wandb=true",
]
WANDB = StandIn()


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory, smol_tokenizer) -> Path:
    """A 2-step LoRA run on a tiny model named by a path relative to the working folder (shared by the
    module's tests, which copy what they change); step 2 is a resume of a 1-step run whose checkpoint
    holds no optimizer state."""
    root = tmp_path_factory.mktemp("portable")
    model = make_tiny_model(smol_tokenizer)
    model.save_pretrained(root / "tiny")
    smol_tokenizer.save_pretrained(root / "tiny")
    overrides = ["model.name=tiny", "output=runs/r", *BASE]
    here, seen, real_wandb = os.getcwd(), _Warnings(), sys.modules.get("wandb")
    logging.getLogger("rapo_echo.training.learner").addHandler(seen)
    sys.modules["wandb"] = WANDB.module
    os.chdir(root)
    try:
        Run(load_config(overrides=[*overrides, "train.max_steps=1"])).train()
        Run(load_config(overrides=[*overrides, "train.max_steps=2"]), resume=True).train()
    finally:
        os.chdir(here)
        logging.getLogger("rapo_echo.training.learner").removeHandler(seen)
        sys.modules.pop("wandb")
        if real_wandb is not None:
            sys.modules["wandb"] = real_wandb
    assert any("holds no optimizer state" in m for m in seen.messages)
    return root / "runs" / "r"


def logits(model, ids=((1, 2, 3, 4),)) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor(ids)).logits


def test_checkpoints_without_optimizer_and_adapters_naming_their_base(lora_run: Path, tmp_path: Path) -> None:
    import shutil

    from rapo_echo.models import load_model

    step = lora_run / "checkpoints" / "step-2"
    assert not (step / "optimizer.pt").exists() and (step / "scheduler.pt").is_file()
    adapter = json.loads((step / "model" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == "../../tiny"  # relative to the run, as given
    moved = tmp_path / "elsewhere"
    shutil.copytree(lora_run.parent, moved / "runs")  # the run and its base travel together
    shutil.copytree(lora_run.parent.parent / "tiny", moved / "tiny")
    model, _ = load_model(str(moved / "runs" / "r" / "checkpoints" / "step-2" / "model"), device="cpu")
    assert type(model).__name__ == "PeftModelForCausalLM"


def test_export_merges_writes_a_card_and_loads(lora_run: Path, tmp_path: Path) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(lora_run / "final")
    merged = export.export_run(lora_run / "checkpoints" / "step-2", tmp_path / "merged", merge=True)
    model = AutoModelForCausalLM.from_pretrained(merged)
    assert torch.allclose(logits(model), logits(final), atol=1e-5)
    card = (merged / "README.md").read_text()
    assert card.startswith("---\n") and "library_name: transformers" in card and "- rapo-echo" in card
    assert "the LoRA adapter merged into its base" in card
    assert "| step | reward/mean |" in card and "save_optimizer: false" in card  # results and the config
    plain = export.export_run(lora_run / "checkpoints" / "step-1", tmp_path / "out" / "adapter")
    cfg = json.loads((plain / "adapter_config.json").read_text())
    # by its absolute path now: peft reads a relative one against the working folder
    assert cfg["base_model_name_or_path"] == str((lora_run.parent.parent / "tiny").resolve())
    base = AutoModelForCausalLM.from_pretrained(lora_run.parent.parent / "tiny")
    assert isinstance(PeftModel.from_pretrained(base, plain), PeftModel)
    assert "library_name: peft" in (plain / "README.md").read_text()
    with pytest.raises(ConfigError, match="exists and is not an empty folder"):
        export.export_run(lora_run, plain)


def test_export_command_and_push_to_hub(lora_run: Path, tmp_path: Path, monkeypatch) -> None:
    calls: list[tuple[str, dict]] = []

    class Hub:  # stands in for huggingface_hub.HfApi at the one place export talks to the Hub
        def create_repo(self, repo_id, **kw):
            calls.append(("create_repo", {"repo_id": repo_id, **kw}))

        def upload_folder(self, **kw):
            calls.append(
                ("upload_folder", {**kw, "files": sorted(p.name for p in Path(kw["folder_path"]).iterdir())})
            )
            return type("CommitInfo", (), {"commit_url": "https://huggingface.co/me/model/commit/1"})()

    monkeypatch.setattr(export, "hub_api", Hub)
    out = tmp_path / "pushed"
    assert main(["export", str(lora_run), "--to", str(out), "--push-to-hub", "me/model", "--private"]) == 0
    assert calls[0] == (
        "create_repo",
        {"repo_id": "me/model", "private": True, "exist_ok": True, "repo_type": "model"},
    )
    _, upload = calls[1]
    assert upload["repo_id"] == "me/model" and upload["folder_path"] == str(out)
    assert {"README.md", "config.json", "model.safetensors"} <= set(upload["files"])

    class DownHub(Hub):
        def upload_folder(self, **kw):
            raise ConnectionError("no route to host")

    monkeypatch.setattr(export, "hub_api", DownHub)
    with pytest.raises(
        RapoEchoError, match=r"the upload failed .*is complete: push it later with: hf upload"
    ):
        export.push_to_hub(out, "me/model")


def test_the_run_logged_to_wandb(lora_run: Path) -> None:
    assert [i["config"]["train"]["save_optimizer"] for i in WANDB.inits] == [False, False]
    assert [i["resume"] for i in WANDB.inits] == [None, "allow"]
    metrics = [step for data, step in WANDB.logged if "samples" not in data]
    tables = [(step, data["samples"]) for data, step in WANDB.logged if "samples" in data]
    assert metrics == [1, 2] and [step for step, _ in tables] == [1, 2]
    rows = tables[1][1].data
    assert len(rows) == 4 and {r[0] for r in rows} == {2} and {r[1] for r in rows} == {0}
    samples = [json.loads(x) for x in (lora_run / "samples.jsonl").read_text().splitlines()]
    assert [r[5] for r in rows] == [s["reply"] for s in samples if s["step"] == 2]
    assert WANDB.finished == 2

"""``rapo-echo export`` refuses what it cannot carry whole (issue 46): a link out of the run, a cut weights
file, a destination inside the run's own model folders, an unreadable config.yaml or summary.json; and the
card of an interrupted run says how many steps its model had."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from rapo_echo import export
from rapo_echo.errors import ConfigError


def _model(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    save_file({"w": torch.arange(64, dtype=torch.float32)}, str(folder / "model.safetensors"))


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """An interrupted run: max_steps 3, checkpoint step-1 saved, no final/."""
    root = tmp_path / "run"
    _model(root / "checkpoints" / "step-1" / "model")
    (root / "config.yaml").write_text("algo: grpo\ntrain:\n  max_steps: 3\nrollout:\n  batch_size: 2\n")
    (root / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward/mean": 0.5}) + "\n")
    return root


def test_the_card_of_an_interrupted_run_gives_the_saved_step(run: Path, tmp_path: Path) -> None:
    out = export.export_run(run, tmp_path / "out")
    card = (out / "README.md").read_text()
    assert "steps: 1 of the 3 planned (the run stopped early)" in card
    assert "steps: 3," not in card
    assert (out / "model.safetensors").read_bytes() == (
        run / "checkpoints" / "step-1" / "model" / "model.safetensors"
    ).read_bytes()


def test_a_link_out_of_the_run_is_refused(run: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "id_ed25519"
    outside.parent.mkdir()
    outside.write_text("PRIVATE")
    model = run / "checkpoints" / "step-1" / "model"
    (model / "notes.txt").symlink_to(outside)
    with pytest.raises(ConfigError, match=r"notes\.txt is a link to .*outside the run"):
        export.export_run(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    # a link that stays inside the run is copied as the file it names
    (model / "notes.txt").unlink()
    (run / "notes.txt").write_text("inside")
    (model / "notes.txt").symlink_to(run / "notes.txt")
    out = export.export_run(run, tmp_path / "out")
    assert (out / "notes.txt").read_text() == "inside" and not (out / "notes.txt").is_symlink()


def test_a_truncated_safetensors_file_is_refused(run: Path, tmp_path: Path) -> None:
    weights = run / "checkpoints" / "step-1" / "model" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[:-10])
    with pytest.raises(ConfigError, match=r"model\.safetensors is not a whole safetensors file: .*truncated"):
        export.export_run(run, tmp_path / "out")
    weights.write_bytes(data[:5])
    with pytest.raises(ConfigError, match="its header is cut"):
        export.export_run(run, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_export_inside_the_runs_model_folders_is_refused(run: Path) -> None:
    _model(run / "final")
    for inside in (run / "final" / "export", run / "checkpoints" / "copy"):
        with pytest.raises(ConfigError, match="lies inside .*part of the run being exported"):
            export.export_run(run, inside)
    assert not (run / "final" / "export").exists()


def test_an_unreadable_config_or_summary_is_a_clear_error(run: Path, tmp_path: Path) -> None:
    good = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text("algo: grpo\ntrain: [unclosed\n")
    with pytest.raises(ConfigError, match=r"config\.yaml line \d+: not a readable YAML config"):
        export.export_run(run, tmp_path / "out")
    (run / "config.yaml").write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="not a readable YAML config"):
        export.export_run(run, tmp_path / "out")
    (run / "config.yaml").write_text(good)
    evals = tmp_path / "eval"
    evals.mkdir()
    (evals / "summary.json").write_text('{"benchmark": "esconv", "metrics": {"a": 1')
    with pytest.raises(ConfigError, match=r"--eval .*summary\.json: not a whole JSON file"):
        export.export_run(run, tmp_path / "out", evals=[str(evals)])
    assert not (tmp_path / "out").exists()

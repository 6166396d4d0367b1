"""``rapo-echo train-judge`` settings (issue 31 item 14): a negative or NaN learning rate, an unknown or
absent device, an --output that is a file or cannot be written, and an --output in use by another run
are refused before any model loads, with a message naming the flag."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rapo_echo.data import bundled_file
from rapo_echo.errors import ConfigError
from rapo_echo.judges.training import JudgeTrainingConfig, train_judge
from rapo_echo.rundir import DirLock

HUMANLIKE = str(bundled_file("judge_humanlike_en.jsonl"))


@pytest.fixture(autouse=True)
def no_model(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a: object, **k: object) -> None:
        raise AssertionError("a model was loaded before the settings were checked")

    monkeypatch.setattr("rapo_echo.policy.Policy", boom)


def cfg(tmp_path: Path, **kw: object) -> JudgeTrainingConfig:
    return JudgeTrainingConfig(data=[HUMANLIKE], output=str(kw.pop("output", tmp_path / "judge")), **kw)


@pytest.mark.parametrize("lr", [-1.0, 0.0, float("nan"), float("inf"), 5.0])
def test_a_bad_learning_rate_is_refused(tmp_path: Path, lr: float) -> None:
    with pytest.raises(ConfigError, match=r"--lr: got .*greater than 0 and at most 1"):
        train_judge(cfg(tmp_path, lr=lr))


def test_an_unknown_or_absent_device_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"--device: got 'tpu'; use auto, cpu, cuda"):
        train_judge(cfg(tmp_path, device="tpu"))
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match=r"--device: got 'cuda:3', but this machine has no CUDA"):
        train_judge(cfg(tmp_path, device="cuda:3"))


def test_an_output_that_is_a_file_is_refused(tmp_path: Path) -> None:
    f = tmp_path / "judge.txt"
    f.write_text("keep me")
    with pytest.raises(ConfigError, match=r"--output .*judge\.txt is a file"):
        train_judge(cfg(tmp_path, output=f))
    assert f.read_text() == "keep me"


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_output_is_refused(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(ConfigError, match=r"--output .*cannot write there"):
        train_judge(cfg(tmp_path, output=ro / "judge"))


def test_an_unwritable_output_is_refused_as_root_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    def denied(*a: object, **k: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(tempfile, "mkstemp", denied)
    with pytest.raises(ConfigError, match=r"--output .*cannot write there \(Permission denied\)"):
        train_judge(cfg(tmp_path))


def test_an_output_in_use_or_not_empty_is_refused(tmp_path: Path) -> None:
    with DirLock(tmp_path / "judge"), pytest.raises(ConfigError, match=r"judge is in use by"):
        train_judge(cfg(tmp_path))
    (tmp_path / "judge" / "weights.bin").write_text("x")
    with pytest.raises(ConfigError, match=r"--output .*judge is not empty \(weights\.bin\)"):
        train_judge(cfg(tmp_path))

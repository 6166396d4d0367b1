"""``rapo-echo train-judge`` settings (issue 31 item 14): a negative or NaN learning rate, an unknown or
absent device, an --output that is a file or cannot be written, and an --output in use by another run
are refused before any model loads, with a message naming the flag."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rapo_echo.cli import main
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


def train_judge_cli(tmp_path: Path, *flags: str) -> str:
    """The command's error output (it must exit 2, having made no output folder)."""
    import contextlib
    import io

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert main(["train-judge", "--data", HUMANLIKE, "--output", str(tmp_path / "judge"), *flags]) == 2
    assert not (tmp_path / "judge").exists()
    return err.getvalue()


@pytest.mark.parametrize(
    ("lr", "why"),
    [
        ("-1", "greater than 0"),
        ("0", "greater than 0"),
        ("nan", "only finite numbers"),
        ("inf", "only finite numbers"),
        ("5", "less than or equal to 1"),
    ],
)
def test_a_bad_learning_rate_is_refused(tmp_path: Path, lr: str, why: str) -> None:
    err = train_judge_cli(tmp_path, "--lr", lr)
    assert f"flag --lr: lr: got {float(lr)}; " in err and why in err


def test_an_unknown_or_absent_device_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    err = train_judge_cli(tmp_path, "--device", "tpu")
    assert "flag --device: device: got 'tpu'; must be auto, cpu, cuda, cuda:N or mps" in err
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


@pytest.mark.parametrize(
    ("given", "kinds"), [("none", []), ("shuffle,swap", ["shuffle", "swap"]), ("swap", ["swap"])]
)
def test_the_negatives_flag(tmp_path: Path, given: str, kinds: list[str]) -> None:
    from rapo_echo.cli import build_parser
    from rapo_echo.config import section_from_args

    argv = ["train-judge", "--data", HUMANLIKE, "--output", str(tmp_path), "--negatives", given, "--full"]
    cfg = section_from_args(JudgeTrainingConfig, build_parser().parse_args(argv))
    assert cfg.negatives == kinds and cfg.lora is False
    assert "expected one of shuffle, swap" in train_judge_cli(tmp_path, "--negatives", "shuffle,both")

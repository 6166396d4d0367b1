"""Resuming with another process count: the global batch is kept or the resume refused, and a rank the
checkpoint holds no RNG state for derives its own."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest
import torch

from rapo_echo.checkpoint import derived_seed, load_rng, resume_batch_size, rng_state, saved_processes
from rapo_echo.errors import ConfigError


@pytest.mark.parametrize(
    ("saved", "now", "expected"),
    [
        ((2, 4, 4), 1, 8),  # 2 x 4 on 1 process: 8 per process
        ((1, 8, 8), 4, 2),  # 1 x 8 on 4: 2 each
        ((4, 3, 3), 2, 6),  # 4 x 3 on 2: 6 each
        ((2, 4, 4), 2, 4),  # the same count: unchanged
        ((2, 4, 5), 1, 5),  # the user's own --set rollout.batch_size is kept
    ],
)
def test_the_global_batch_is_kept(saved: tuple[int, int, int], now: int, expected: int) -> None:
    n, saved_batch, batch = saved
    got, note = resume_batch_size(saved_processes=n, saved_batch=saved_batch, processes=now, batch=batch)
    assert got == expected
    assert (note == "") == (n == now)


def test_a_global_batch_that_does_not_divide_is_refused_naming_counts_and_setting() -> None:
    with pytest.raises(ConfigError) as err:
        resume_batch_size(saved_processes=2, saved_batch=3, processes=4, batch=3)
    text = str(err.value)
    assert "written by 2 processes and this run has 4" in text
    assert "global batch of 6" in text and "rollout.batch_size" in text


def test_deepspeed_refuses_another_count() -> None:
    with pytest.raises(ConfigError, match="partitioned over 2 processes"):
        resume_batch_size(saved_processes=2, saved_batch=2, processes=4, batch=2, deepspeed=True)


def test_saved_processes_from_the_state_or_the_rng_files(tmp_path: Path) -> None:
    for rank in range(3):
        (tmp_path / f"rng_rank{rank}.json").write_text("{}")
    assert saved_processes(tmp_path, {"processes": 2}) == 2
    assert saved_processes(tmp_path, {}) == 3  # a checkpoint from before the count was recorded


def test_a_rank_without_a_saved_state_derives_its_own(tmp_path: Path, caplog) -> None:
    torch.manual_seed(123)
    random.seed(123)
    (tmp_path / "rng_rank0.json").write_text(json.dumps(rng_state()))
    expected = torch.rand(3)
    assert load_rng(tmp_path, 0, seed=7, step=5) is True  # rank 0's own state, restored
    assert torch.equal(torch.rand(3), expected)

    draws = {}
    for rank in (1, 2):
        with caplog.at_level(logging.WARNING, logger="rapo_echo.checkpoint"):
            assert load_rng(tmp_path, rank, seed=7, step=5) is False
        draws[rank] = (torch.rand(3), random.random())
        assert (
            f"no RNG state for rank {rank}" in caplog.text
            and "derived from train.seed 7, step 5" in caplog.text
        )
    assert not torch.equal(draws[1][0], draws[2][0]) and draws[1][1] != draws[2][1]
    assert not torch.equal(draws[1][0], expected)  # not a copy of rank 0's state
    load_rng(tmp_path, 1, seed=7, step=5)
    assert torch.equal(torch.rand(3), draws[1][0])  # deterministic
    assert derived_seed(7, 5, 1) != derived_seed(7, 6, 1) != derived_seed(8, 5, 1)

"""A third-party algorithm (tests/helpers/rft_algorithm.py: rejection-sampling fine-tuning on the best
reply of each group) installed by entry point, as a package installs one, and trained for two steps
through ``rapo-echo train --algo rft``; nothing of the library names it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from rapo_echo import algorithms
from rapo_echo.algorithms.base import AlgoContext, MicroBatch
from rapo_echo.policy import Policy, TokenScores
from rapo_echo.rewards import RewardContext, RewardSet
from rapo_echo.training.run_config import load_config
from tests.helpers.installed import install, named_in_library
from tests.helpers.rft_algorithm import BEST, RFT
from tests.unit.algorithms.test_rapo import REPLIES, SCENARIOS, ScriptedPolicyEngine

WORDS = "rewards=[{name: 'tests.helpers.plugin_rewards:words'}]"  # the reply's word count


@pytest.fixture
def installed(tmp_path: Path, monkeypatch) -> Path:
    """An installed distribution that registers RFT in the ``rapo_echo.algorithms`` entry-point group."""
    entry = "[rapo_echo.algorithms]\nrft = tests.helpers.rft_algorithm:RFT\n"
    return install(tmp_path / "site", "rapo-echo-rft", entry, monkeypatch)


def test_the_entry_point_finds_it(installed: Path) -> None:
    assert "rft" in algorithms.names() and "rft" not in algorithms.names(builtin=True)
    assert algorithms.get("rft") is RFT
    cfg = load_config(algo="rft", overrides=["rft.min_reward=2", WORDS])
    assert cfg.rft.min_reward == 2.0 and cfg.rewards[0].name.endswith(":words")


def test_it_learns_the_best_reply_of_each_group(tiny_folder: Path) -> None:
    """Scripted replies of 7, 4, 2 and 4 words to each context: the first (7 words) is each group's
    best; with min_reward 8 none is kept. Its loss is the mean -log p over the kept tokens."""
    cfg = load_config(algo=f"{RFT.__module__}:RFT", overrides=[f"model.name={tiny_folder}", WORDS])
    policy = Policy(cfg.model, cfg.rollout, need_reference=False, device="cpu")
    policy.engine = ScriptedPolicyEngine(policy.lm, policy.tokenizer, name="policy")
    algo = RFT(cfg, AlgoContext(policy, RewardSet.from_specs(cfg.rewards, RewardContext())))
    out = algo.rollout(SCENARIOS, step=0)
    assert [s.reward for s in out.samples[:4]] == [7.0, 4.0, 2.0, 4.0]
    assert [it.sample for it in out.items] == [0, 4] and all(it.kind == BEST for it in out.items)
    assert out.samples[0].text == REPLIES[0] and out.metrics["rft/kept"] == 2.0
    cfg.rft.min_reward = 8.0
    assert algo.rollout(SCENARIOS, step=1).items == []
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.0], [0.5, 1.0, 1.0]]).clamp(min=1e-30))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    mb = MicroBatch([], None, mask, logp, None, torch.zeros(2), torch.ones(2), [BEST, BEST])  # type: ignore[arg-type]  # a hand-made micro-batch: no ids needed
    loss, _ = algo.loss(mb, TokenScores(logp, torch.zeros_like(logp)), {BEST: {"tokens": 3.0, "seqs": 2.0}})
    assert loss.item() == pytest.approx(-(2 * math.log(0.5) + math.log(0.25)) / 3)


def test_two_steps_through_the_command_line(installed: Path, tmp_path: Path, tiny_folder: Path) -> None:
    from rapo_echo.cli import main

    run = tmp_path / "run"
    argv = ["train", "--algo", "rft", "--model", str(tiny_folder), "--reward", "length", "--max-steps", "2"]
    argv += ["--output", str(run), "--set", "rollout.batch_size=2", "--set", "rollout.group_size=3"]
    for s in ("rollout.max_new_tokens=6", "logging.progress=false", "logging.tensorboard=false"):
        argv += ["--set", s]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["items"] == 2 and r["rft/kept"] == 2 and r["loss/nll"] > 0 for r in rows)
    assert [r["updates"] for r in rows] == [1.0, 1.0]
    assert not any(k.startswith("train/sampler_logprob_gap") for r in rows for k in r)  # not PG rows
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["algo"] == "rft" and saved["rft"] == {"min_reward": None, "coef": 1.0}
    assert (run / "final" / "config.json").is_file()


def test_nothing_in_the_library_names_it() -> None:
    """Adding it touched no file of the library (every folder it ships) or configs/: it came in through
    the door."""
    assert named_in_library("rft") == []

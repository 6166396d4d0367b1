"""``--algo ppo``: single-turn PPO with a value head and GAE over reward plugins, against hand values;
and two training steps through the command line, the value head checkpointed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from rapo_echo.algorithms.base import PG, AlgoContext, MicroBatch
from rapo_echo.algorithms.ppo import ADVANTAGES, OLD_VALUES, PPO, RETURNS
from rapo_echo.policy import Policy, TokenScores
from rapo_echo.rewards import RewardContext, RewardSet
from rapo_echo.training.run_config import load_config
from tests.unit.algorithms.test_rapo import REPLIES, SCENARIOS, ScriptedPolicyEngine

WORDS = "rewards=[{name: 'tests.helpers.plugin_rewards:words'}]"  # the reply's word count


def make_ppo(tiny_folder: Path, *overrides: str) -> tuple[PPO, Policy]:
    cfg = load_config(
        algo="ppo",
        overrides=[f"model.name={tiny_folder}", WORDS, "train.micro_batch_size=8", "loss.beta=0", *overrides],
    )
    policy = Policy(cfg.model, cfg.rollout, need_reference=False, device="cpu")
    policy.add_value_head()  # what the Learner does for Needs.value_head, before the optimizer
    policy.engine = ScriptedPolicyEngine(policy.lm, policy.tokenizer, name="policy")
    return PPO(cfg, AlgoContext(policy, RewardSet.from_specs(cfg.rewards, RewardContext()))), policy


def test_needs_a_value_head_and_no_group() -> None:
    needs = PPO.needs(load_config(algo="ppo"))
    assert needs.value_head and needs.min_group_size == 1 and needs.rewards
    assert set(needs.fields) == {ADVANTAGES, OLD_VALUES, RETURNS} and needs.reference  # loss.beta 0.04
    assert load_config(algo="ppo").rollout.group_size == 1


@pytest.mark.parametrize(("lam", "decay"), [(1.0, 1.0), (0.5, 0.5)])
def test_each_reply_tokens_advantage_and_return_by_hand(tiny_folder: Path, lam: float, decay: float) -> None:
    """The value head starts at 0, so with gamma 1 the token t of an n-token reply with reward r gets
    A_t = r * lam^(n - 1 - t) and the return R_t = A_t (+ V_t = 0): here r = 7 words."""
    algo, _ = make_ppo(tiny_folder, "ppo.whiten=false", f"ppo.lam={lam}")
    out = algo.rollout(SCENARIOS, step=0)
    assert [s.text for s in out.samples] == [REPLIES[0]] * 2 and [s.reward for s in out.samples] == [7.0, 7.0]
    for it in out.items:
        n = len(it.completion_ids)
        expected = [7.0 * decay ** (n - 1 - t) for t in range(n)]
        assert it.fields[OLD_VALUES] == pytest.approx([0.0] * n)
        assert it.fields[ADVANTAGES] == pytest.approx(expected)
        assert it.fields[RETURNS] == pytest.approx(expected)
    assert out.metrics["reward/mean"] == 7.0 and out.timings["values"] >= 0


def test_whitened_advantages_have_mean_zero_and_unit_std(tiny_folder: Path) -> None:
    algo, _ = make_ppo(tiny_folder, "ppo.lam=0.5")
    flat = [a for it in algo.rollout(SCENARIOS, step=0).items for a in it.fields[ADVANTAGES]]
    t = torch.tensor(flat, dtype=torch.float64)
    assert float(t.mean()) == pytest.approx(0.0, abs=1e-9)
    assert float(t.std(unbiased=False)) == pytest.approx(1.0, abs=1e-6)


def test_the_loss_by_hand(tiny_folder: Path) -> None:
    """One row of two tokens, ratio 1, A = (1, -1): the policy loss is the token mean of -A = 0. Values
    V = (0.5, 0), old values equal (no clipping), returns (1, 1): value loss mean(0.5 (V - R)^2) =
    (0.125 + 0.5) / 2 = 0.3125; total 0 + vf_coef 0.5 x 0.3125 = 0.15625."""
    algo, _ = make_ppo(tiny_folder)
    logp = torch.log(torch.tensor([[0.5, 0.25]])).requires_grad_(True)
    values = torch.tensor([[0.5, 0.0]], requires_grad=True)
    mask = torch.ones(1, 2)
    fields = {
        ADVANTAGES: torch.tensor([[1.0, -1.0]]),
        OLD_VALUES: torch.tensor([[0.5, 0.0]]),
        RETURNS: torch.tensor([[1.0, 1.0]]),
    }
    old_logp, zero = logp.detach().clone(), torch.zeros(1)
    mb = MicroBatch([], None, mask, old_logp, None, zero, torch.ones(1), [PG], fields)  # type: ignore[arg-type]  # a hand-made micro-batch: no ids needed
    totals = {PG: {"tokens": 2.0, "seqs": 1.0}}
    loss, metrics = algo.loss(mb, TokenScores(logp, torch.zeros_like(logp), values), totals)
    assert metrics["loss/pg"].item() == pytest.approx(0.0, abs=1e-7)
    assert metrics["loss/value"].item() == pytest.approx(0.3125)
    assert loss.item() == pytest.approx(0.15625)
    loss.backward()
    assert values.grad[0].tolist() == pytest.approx([0.5 * (0.5 - 1.0) / 2, 0.5 * (0.0 - 1.0) / 2])


def test_two_steps_through_the_command_line(tmp_path: Path, tiny_folder: Path) -> None:
    from rapo_echo.cli import main

    run = tmp_path / "run"
    argv = ["train", "--algo", "ppo", "--model", str(tiny_folder), "--reward", "length", "--max-steps", "2"]
    argv += ["--output", str(run)]
    quiet = ("logging.progress=false", "logging.tensorboard=false")
    for s in ("rollout.batch_size=2", "rollout.max_new_tokens=6", "train.save_every=1", *quiet):
        argv += ["--set", s]
    assert main(argv) == 0
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and all(r["loss/value"] >= 0 and r["items"] == 2 for r in rows)
    assert rows[1]["value/mean"] != 0.0  # the value head learnt in step 1
    assert (run / "checkpoints" / "step-2" / "model" / "value_head.safetensors").is_file()
    assert (run / "final" / "value_head.safetensors").is_file()
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["algo"] == "ppo" and "ppo" in saved and not {"rapo", "rlver"} & set(saved)

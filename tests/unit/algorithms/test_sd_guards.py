"""RAPO's self-distillation guards (algorithms/sd_guards.py), by hand: only failed replies are rewritten
(SRPO), the SD coefficient decays with the rewrites' beat rate, the trust region around the reference
stops the SD gradient on tokens that moved too far and the reference KL pulls them back (SDPG); a training
run with every guard on logs their metrics."""

from __future__ import annotations

import pytest
import torch

from rapo_echo.algorithms.base import PG
from rapo_echo.algorithms.rapo import RAPO, SD
from rapo_echo.algorithms.sd_guards import SD_REF_LOGP, BeatTracker, failed, guard_tokens
from rapo_echo.policy import TokenScores
from rapo_echo.training.run_config import load_config
from tests.helpers.runs import metrics, run_config
from tests.unit.algorithms.test_rapo import CORRECTION, SCENARIOS, make_rapo, micro, tag_of


def test_failed_means_no_better() -> None:
    assert failed(0.0) and failed(-3.0) and not failed(0.1) and not failed(None)


def test_only_failed_replies_are_rewritten(tiny_folder, monkeypatch: pytest.MonkeyPatch) -> None:
    # all_but_best picks good (+3.3), meh (0) and bad (-10); only meh and bad left the person no better
    monkeypatch.setitem(CORRECTION, "good", "fixed: I hear you. What hurts most?")
    def rewritten(*sets: str) -> set[str]:
        algo, *_ = make_rapo(tiny_folder, "rapo.sd.select=all_but_best", *sets)
        out = algo.rollout(SCENARIOS[:1], 0)
        return {tag_of(out.samples[c.sample].text) for c in out.extra["corrections"]}

    assert rewritten() == {"good", "meh", "bad"}
    assert rewritten("rapo.sd.only_failed=true") == {"meh", "bad"}


def test_beat_tracker_by_hand() -> None:
    t = BeatTracker(0.8)
    assert t.factor(0.5) == 1.0  # nothing measured yet
    t.update(1.0)
    t.update(None)  # no rewrite re-ranked: unchanged
    assert t.ema == 1.0
    for _ in range(4):
        t.update(0.0)  # 0.8, 0.64, 0.512, 0.4096
    assert t.ema == pytest.approx(0.4096)
    assert t.factor(0.5) == pytest.approx(0.8192) and t.factor(None) == 1.0


def test_sd_coefficient_decays_when_rewrites_stop_beating_their_originals(tiny_folder) -> None:
    # the scripted rewrites: "fixed" beats its original, "worse" does not -> share 0.5 at the first step
    algo, *_ = make_rapo(tiny_folder, "rapo.sd.min_beat=1.0", "rapo.sd.coef=0.5")
    out = algo.rollout(SCENARIOS[:1], 0)
    assert out.metrics["sd/beat_original"] == 0.5
    assert out.metrics["sd/coef"] == pytest.approx(0.25) and algo.coef == pytest.approx(0.25)
    assert algo.state_dict()["beat_ema"] == 0.5
    algo2, *_ = make_rapo(tiny_folder, "rapo.sd.min_beat=1.0")
    algo2.load_state_dict(algo.state_dict())
    assert algo2.beat.ema == 0.5  # a resumed run keeps the moving average


def test_guard_tokens_by_hand() -> None:
    """nll on two SD tokens, log p = (-1, -2), reference (-1.5, -0.5), cap 1.0, k1 KL, ref_kl 0.1:
    token 2 is 1.5 from the reference -> no SD gradient; the KL (log p - ref = 0.5, -1.5) is added."""
    logp = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    ref = torch.tensor([[-1.5, -0.5]])
    mask = torch.ones(1, 2)
    sd = type("SD", (), {"ref_kl": 0.1, "max_ref_logratio": 1.0})()
    per, metrics = guard_tokens(-logp, logp, ref, mask, sd, "k1", total_tokens=2)
    assert per.detach()[0].tolist() == pytest.approx([1.0 + 0.05, 0.0 - 0.15])
    assert metrics["sd/capped"].item() == pytest.approx(0.5)
    assert metrics["sd/ref_kl"].item() == pytest.approx((0.5 - 1.5) / 2)
    (grad,) = torch.autograd.grad(per.sum(), logp)
    assert grad[0].tolist() == pytest.approx([-1.0 + 0.1, 0.0 + 0.1])  # SD push stopped on token 2
    unguarded = type("SD", (), {"ref_kl": 0.0, "max_ref_logratio": None})()
    same, none = guard_tokens(-logp, logp, ref, mask, unguarded, "k1", total_tokens=2)
    assert torch.equal(same, -logp) and none == {}


def test_the_loss_applies_the_guards_to_sd_rows_only(tiny_folder) -> None:
    algo, *_ = make_rapo(
        tiny_folder, "rapo.sd.coef=1.0", "rapo.sd.max_ref_logratio=1.0", "loss.kl_estimator=k1"
    )
    logp = torch.log(torch.tensor([[0.5, 0.25], [0.9, 0.9]]))
    mb = micro([[0, 0], [0, 0]], [SD, PG], [0.0, 0.0], [1.0, 1.0])
    # token 2 of the SD row: log .25 = -1.386 vs reference 0 -> capped; token 1: -0.693 vs -0.5 -> kept
    mb.fields[SD_REF_LOGP] = torch.tensor([[-0.5, 0.0], [0.0, 0.0]])
    totals = {SD: {"tokens": 2.0, "seqs": 1.0}, PG: {"tokens": 2.0, "seqs": 1.0}}
    _, metrics = algo.loss(mb, TokenScores(logp, torch.zeros_like(logp)), totals)
    assert metrics["loss/sd"].item() == pytest.approx(0.693147 / 2, abs=1e-5)
    assert metrics["sd/capped"].item() == pytest.approx(0.5)


def test_needs_a_reference_only_for_the_reference_guards() -> None:
    for sets, wants in ([[], False], [["rapo.sd.ref_kl=0.1"], True], [["rapo.sd.max_ref_logratio=2"], True]):
        needs = RAPO.needs(load_config(algo="rapo", overrides=sets))
        assert needs.reference is wants and (SD_REF_LOGP in needs.fields) is wants


def test_a_run_with_every_guard_on_logs_them(tmp_path, tiny_folder) -> None:
    from rapo_echo.training.run import Run

    run = tmp_path / "run"
    cfg = run_config(
        tiny_folder,
        run,
        "rollout.batch_size=2",
        "rollout.group_size=4",
        "rollout.max_new_tokens=6",
        "rapo.simulator.name=hidden_preference",
        "rapo.judge.kind=reactions",
        "rapo.sd.select=all_but_best",
        "rapo.sd.ref_kl=0.1",
        "rapo.sd.max_ref_logratio=2.0",
        "rapo.sd.min_beat=0.3",
        "train.max_steps=2",
        algo="rapo",
    )
    Run(cfg).train()
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    assert all("sd/coef" in r and "kl" in r for r in rows)  # the reference is kept: the KL is logged too

"""Held-out validation during training (``validation.*``): what it scores, that it leaves training as it
was, and that ``keep_best`` makes ``final/`` the best-validated model, the base included."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from rapo_echo.algorithms.base import AlgoContext
from rapo_echo.algorithms.grpo import GRPO
from rapo_echo.algorithms.rlver import RLVER
from rapo_echo.errors import ConfigError
from rapo_echo.policy import Policy
from rapo_echo.rewards import RewardSet
from rapo_echo.simulators.hidden_preference import HiddenPreferenceUser
from rapo_echo.training.run import Run
from rapo_echo.training.run_config import load_config
from rapo_echo.training.validation import paired_gain, rule_rises, subset_gains, validation_scenarios
from rapo_echo.training.validation.checks import replaces_best, vetoed_by
from rapo_echo.types import Generation, Scenario, ValidationResult, msg
from tests.integration.test_trainer import cfg_for, metrics
from tests.unit.simulators.test_hidden_preference import COLD, NEUTRAL, SELF, WARM, reactions_rapo

HELD_OUT = [
    "validation.data=bundled:esconv_style_en.json",
    "validation.limit=3",
    "validation.max_new_tokens=4",
]


def given_scores(scores: list[float | None]) -> ValidationResult:
    """A validation with these per-scenario scores (``val/reward``: the mean of those not None)."""
    valid = [x for x in scores if x is not None]
    return ValidationResult({"val/reward": statistics.fmean(valid) if valid else math.nan}, list(scores))


def lines(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "validation.jsonl").read_text().splitlines()]


class ByScenario:
    """Greedy replies chosen by the person's last message; records the sampling parameters."""

    def __init__(self, engine, replies: dict[str, str]) -> None:
        self.engine, self.replies, self.params = engine, replies, []

    def generate_ids(self, prompt_ids, params):
        self.params.append(params)
        tok = self.engine.tokenizer
        out = []
        for ids in prompt_ids:
            text = next(r for said, r in self.replies.items() if said in tok.decode(ids))
            seq = tok(text, add_special_tokens=False)["input_ids"]
            out.append([Generation(text, seq, None, list(ids), "stop")])
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_rapo_validates_by_the_persons_emotion_change(tiny_folder: Path) -> None:
    replies = {"gran": WARM, "job": SELF, "exam": COLD}
    algo, policy = reactions_rapo(tiny_folder, lambda engine: ByScenario(engine, replies))
    held_out = [
        Scenario("a", [msg("user", "My gran died.")], profile={"emotion_type": "sadness"}),
        Scenario("b", [msg("user", "I lost my job.")], profile={"emotion_type": "fear"}),
    ]
    result = algo.validate(held_out, max_new_tokens=7)
    out = result.metrics
    assert result.scores == [10.0, -5.0]  # per scenario, in order
    assert result.replies == [[WARM], [SELF]]
    # default rules: WARM reflects + asks (+10), SELF talks about itself (score 0.25: -5)
    assert out["val/emotion_delta"] == pytest.approx((10.0 - 5.0) / 2)
    assert out["val/hidden_rule_score"] == pytest.approx((1.0 + 0.25) / 2)
    assert out["val/invalid"] == 0.0
    (params,) = policy.engine.params
    assert (params.temperature, params.n, params.max_new_tokens) == (0.0, 1, 7)


def test_grpo_validates_by_its_rewards(tiny_folder: Path, tmp_path: Path) -> None:
    cfg = cfg_for(tiny_folder, tmp_path / "r")
    policy = Policy(cfg.model, cfg.rollout, need_reference=False, device="cpu")
    policy.engine = ByScenario(policy.engine, {"gran": "How are you?", "job": "ok then yes"})
    rewards = RewardSet.from_specs(cfg.rewards, None)
    algo = GRPO(cfg, AlgoContext(policy, rewards, None, None))
    held_out = [Scenario("a", [msg("user", "My gran died.")]), Scenario("b", [msg("user", "I lost my job.")])]
    result = algo.validate(held_out, max_new_tokens=5)
    out = result.metrics
    assert statistics.fmean(result.scores) == pytest.approx(out["val/reward"])
    by_name = {n: out[f"val/reward/{n}/mean"] for n in rewards.names}
    # the combined reward is the weighted sum (question weight 0.5), averaged over the two replies
    assert out["val/reward"] == pytest.approx(by_name["length"] + 0.5 * by_name["question"])
    assert by_name["question"] == pytest.approx(0.5)  # one of the two asks
    assert result.replies == [["How are you?"], ["ok then yes"]]


def test_a_validation_says_up_front_what_it_costs(tiny_folder: Path, tmp_path: Path, caplog) -> None:
    """The validation before step 1 sat at 0/47 for minutes with nothing said of its size (issue 49,
    item 1): it says how many greedy replies it draws before it starts."""
    from rapo_echo.training.validation import HeldOut, Validator

    cfg = cfg_for(tiny_folder, tmp_path / "r", "validation.max_new_tokens=5")
    policy = Policy(cfg.model, cfg.rollout, need_reference=False, device="cpu")
    policy.engine = ByScenario(policy.engine, {"gran": "How are you?", "job": "ok then yes"})
    algo = GRPO(cfg, AlgoContext(policy, RewardSet.from_specs(cfg.rewards, None), None, None))
    held_out = [Scenario("a", [msg("user", "My gran died.")]), Scenario("b", [msg("user", "I lost my job.")])]
    validator = Validator(cfg, HeldOut(held_out, {}), algo, policy, tmp_path)
    with caplog.at_level("INFO", logger="rapo_echo.training.validation"):
        validator.run(0)
        validator.run(3)
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("validation ")]
    assert said[0] == (
        "validation before step 1: 2 greedy replies (2 held-out scenarios x 1 turn) of up to 5 tokens, each "
        "then scored by the run's simulator or judge"
    )
    assert any(m.startswith("validation after step 3: 2 greedy replies") for m in said)


def test_validation_config_errors() -> None:
    with pytest.raises(ConfigError, match="keep_best needs validation.data"):
        load_config(overrides=["validation.keep_best=true"])
    cfg = load_config(algo="rlver", overrides=HELD_OUT)
    with pytest.raises(ConfigError, match="validation.data: --algo rlver has no single-reply score"):
        validation_scenarios(cfg, RLVER)
    held = validation_scenarios(load_config(overrides=HELD_OUT), GRPO)
    assert len(held.scenarios) == 3 and held.subsets == {"bundled:esconv_style_en.json": range(3)}
    assert validation_scenarios(load_config(), GRPO) is None
    with pytest.raises(ConfigError, match=r"validation.checks.0.se: got -1"):
        load_config(overrides=["validation.checks=[{name: subset_floor, se: -1}]"])


def test_subset_gains_and_vetoes_by_hand() -> None:
    subsets = {"a": range(3), "b": range(3, 5), "c": range(5, 6)}
    new = [3.0, 1.0, 2.0, 0.0, 1.0, 4.0]
    best = [1.0, 1.0, 1.0, 2.0, 2.0, 5.0]
    gains = subset_gains(new, best, subsets)
    # a: differences 2, 0, 1: mean 1, stdev 1, se 1/sqrt(3); b: -2, -1: mean -1.5, stdev 0.7071, se 0.5
    assert gains["a"]["gain"] == pytest.approx(1.0) and gains["a"]["gain_se"] == pytest.approx(3**-0.5)
    assert gains["b"]["gain"] == pytest.approx(-1.5) and gains["b"]["gain_se"] == pytest.approx(0.5)
    assert gains["c"]["gain"] == pytest.approx(-1.0) and math.isnan(gains["c"]["gain_se"])
    assert [g["n"] for g in gains.values()] == [3, 2, 1]
    assert vetoed_by(gains, None) == []
    # b loses 1.5 > 1 * 0.5 and c loses with no standard error; at a floor of 3 b's -1.5 is within 3 * 0.5
    assert vetoed_by(gains, 1.0) == ["b", "c"]
    assert vetoed_by(gains, 3.0) == ["c"]
    assert subset_gains([None, 1.0], [1.0, None], {"x": range(2)}) == {}  # no pair: no subset


def test_validation_leaves_training_as_it_was_and_keeps_the_best(
    tmp_path: Path, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A validation that draws random numbers (a sampling simulator would) changes no training step."""
    real = GRPO.validate

    def drawing(self, scenarios, max_new_tokens, turns):
        random.random(), np.random.rand(), torch.rand(1)
        return real(self, scenarios, max_new_tokens, turns)

    monkeypatch.setattr(GRPO, "validate", drawing)
    steps = ["train.max_steps=3", "model.lora.enabled=true", "train.save_every=1"]
    plain, validated = tmp_path / "plain", tmp_path / "validated"
    Run(cfg_for(tiny_folder, plain, *steps)).train()
    Run(cfg_for(tiny_folder, validated, *steps, *HELD_OUT, "validation.keep_best=true")).train()
    for x, y in zip(metrics(plain), metrics(validated), strict=True):
        assert x["reward/mean"] == pytest.approx(y["reward/mean"], abs=1e-9)
        assert x["loss/total"] == pytest.approx(y["loss/total"], rel=1e-4, abs=1e-6)
    rows = lines(validated)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    top = max(r["val/reward"] for r in rows)
    expected = max(r["step"] for r in rows if r["val/reward"] == top)  # a later step wins a tie
    best = json.loads((validated / "best" / "best.json").read_text())
    assert {k: best[k] for k in ("step", "key", "value")} == {
        "step": expected,
        "key": "val/reward",
        "value": top,
    }
    assert best["scores"] == next(r["scores"] for r in rows if r["step"] == expected)
    assert statistics.fmean(best["scores"]) == pytest.approx(top)
    assert json.loads((validated / "final" / "best.json").read_text()) == best


def final_logits(run: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(run / "final")(torch.tensor([[1, 2, 3, 4]])).logits


@pytest.mark.parametrize("scores", [[0.5, 0.9, 0.1, 0.2], [0.9, 0.5, 0.1, 0.9 - 1e-9]])
def test_keep_best_final_is_the_best_validated_weights(
    tmp_path: Path, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch, scores: list[float]
) -> None:
    """Scores set by hand: step 1 best (final/ = checkpoint 1), or the base best (final/ = the base)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    given = iter(scores)
    monkeypatch.setattr(GRPO, "validate", lambda self, sc, n, turns: given_scores([next(given)] * len(sc)))
    run = tmp_path / "run"
    extra = ["train.max_steps=3", "model.lora.enabled=true", "train.save_every=1", "train.keep_checkpoints=5"]
    trainer = Run(cfg_for(tiny_folder, run, *extra, *HELD_OUT, "validation.keep_best=true"))
    trainer.train()
    best_step = scores.index(max(scores))
    assert trainer.best_step == best_step
    assert json.loads((run / "final" / "best.json").read_text())["step"] == best_step
    base = AutoModelForCausalLM.from_pretrained(tiny_folder)
    ids = torch.tensor([[1, 2, 3, 4]])
    if best_step == 0:
        expected = base(ids).logits
    else:
        expected = PeftModel.from_pretrained(base, run / "checkpoints" / f"step-{best_step}" / "model")(
            ids
        ).logits
    last = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_folder), run / "checkpoints" / "step-3" / "model"
    )(ids).logits
    assert not torch.allclose(expected, last, atol=1e-4)  # the last step's weights differ: a real choice
    assert torch.allclose(final_logits(run), expected, atol=1e-4)


def test_resume_validates_its_checkpoint_and_forgets_later_validations(
    tmp_path: Path, tiny_folder: Path
) -> None:
    run = tmp_path / "run"
    extra = ["model.lora.enabled=true", "train.save_every=2", *HELD_OUT, "validation.keep_best=true"]
    Run(cfg_for(tiny_folder, run, "train.max_steps=2", *extra)).train()
    assert [r["step"] for r in lines(run)] == [0, 2]
    # as if the run had been stopped at its step-2 checkpoint (not validated then) and a later run had
    # validated a step 3 before dying: the resume validates step 2 and forgets step 3
    first = (run / "validation.jsonl").read_text().splitlines()[0]
    (run / "validation.jsonl").write_text(first + "\n" + json.dumps({"step": 3, "val/reward": 99.0}) + "\n")
    Run(cfg_for(tiny_folder, run, "train.max_steps=4", *extra), resume=True).train()
    assert [r["step"] for r in lines(run)] == [0, 2, 4]
    assert json.loads((run / "best" / "best.json").read_text())["value"] != 99.0


def test_report_shows_the_held_out_scores_and_the_kept_step(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from rapo_echo.benchmarks.training_report import validation_table

    run = tmp_path / "quickstart"
    (run / "final").mkdir(parents=True)
    rows = [
        {"step": 0, "val/emotion_delta": 1.5},
        {"step": 4, "val/emotion_delta": 2.25, "val/gain": 0.75, "val/gain_se": 0.5},
        {"step": 8, "val/gain": -0.125, "val/gain_se": float("nan")},
        {"step": 12, "val/gain": 0.5, "val/gain_se": 0.25, "vetoed_by": ["bundled:misspelt.jsonl"]},
    ]
    (run / "validation.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "final" / "best.json").write_text(
        json.dumps({"step": 4, "key": "val/emotion_delta", "value": 2.25})
    )
    plain = SimpleNamespace(path=tmp_path / "plain", rows=[])
    assert validation_table([plain]) is None
    header, table = validation_table([SimpleNamespace(path=run, rows=[]), plain])
    assert header[-1] == "final/ holds step"
    assert table == [
        [
            "quickstart",
            "val/emotion_delta: 0: 1.5, 4: 2.25, 8: –, 12: –",
            "4: 0.75 ± 0.5, 8: -0.125 ± –, 12: 0.5 ± 0.25 (loses on bundled:misspelt.jsonl)",
            "4",
        ]
    ]


def test_report_of_a_stopped_run_says_final_is_not_written_yet(tmp_path: Path) -> None:
    """An interrupted keep_best run has best/best.json but no final/: the report said "keep_best off"
    (issue 49, item 13)."""
    from rapo_echo.benchmarks.training_report import kept_step

    (tmp_path / "best").mkdir()
    (tmp_path / "best" / "best.json").write_text(json.dumps({"step": 0, "key": "val/reward", "value": 0.1}))
    assert kept_step(tmp_path) == "no final/ yet (the run stopped before its end); the best so far is step 0"
    (tmp_path / "final").mkdir()
    assert kept_step(tmp_path) == "last (keep_best off)"


def test_paired_gain_by_hand() -> None:
    # scenarios 0 and 1 scored in both: differences 2 and -1, mean 0.5, stdev sqrt(4.5), se sqrt(4.5)/sqrt(2)
    gain, se, n = paired_gain([3.0, 1.0, None, 4.0], [1.0, 2.0, 5.0, None])
    assert (gain, se, n) == (pytest.approx(0.5), pytest.approx(1.5), 2)
    # differences 1, -1, 1.3: mean 0.4333, stdev sqrt(3.12667 / 2) = 1.25033, se 0.72188
    gain, se, n = paired_gain([2.0, 0.0, 2.3], [1.0, 1.0, 1.0])
    assert (gain, se, n) == (pytest.approx(1.3 / 3), pytest.approx(0.721880, abs=1e-6), 3)
    gain, se, n = paired_gain([2.0, None], [1.0, 1.0])
    assert (gain, n) == (1.0, 1) and math.isnan(se)
    gain, se, n = paired_gain([None], [1.0])
    assert n == 0 and math.isnan(gain) and math.isnan(se)
    with pytest.raises(ValueError, match="2 scores against 3"):
        paired_gain([1.0, 2.0], [1.0, 2.0, 3.0])


def test_replaces_best_rule() -> None:
    assert replaces_best(0.0, 0.5, 0.0)  # min_gain 0: a tie goes to the later step
    assert not replaces_best(-0.01, 0.0, 0.0)
    assert replaces_best(0.43, math.nan, 0.0)  # no standard error needed at 0
    assert not replaces_best(0.4333, 0.7219, 1.0)  # within one standard error
    assert replaces_best(0.8, 0.7219, 1.0) and not replaces_best(0.8, 0.7219, 1.5)
    assert replaces_best(1.0, 0.0, 1.0) and not replaces_best(0.0, 0.0, 1.0)  # every scenario the same change
    assert not replaces_best(5.0, math.nan, 1.0)  # one paired scenario: no evidence
    assert not replaces_best(math.nan, math.nan, 0.0)
    with pytest.raises(ConfigError, match=r"validation.checks.0.se: got -1"):
        load_config(overrides=["validation.checks=[{name: min_gain, se: -1}]"])


@pytest.mark.parametrize(
    ("min_gain", "steps", "best_step"),
    [
        # step 1 gains 0.433 (se 0.722) over the base; step 2 gains 1 on every scenario; step 3 ties step 2
        (0.0, [[1, 1, 1], [2, 0, 2.3], [2, 2, 2], [2, 2, None]], 3),
        (1.0, [[1, 1, 1], [2, 0, 2.3], [2, 2, 2], [2, 2, None]], 2),
        # noisy gains of 0.433 (se 0.722) and 0.167 (se 0.601), then one paired scenario: the base stays
        (1.0, [[1, 1, 1], [2, 0, 2.3], [0, 2, 1.5], [None, None, 5]], 0),
    ],
)
def test_min_gain_asks_for_a_gain_beyond_chance(
    tmp_path: Path,
    tiny_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    min_gain: float,
    steps: list[list[float | None]],
    best_step: int,
) -> None:
    given = iter(steps)
    monkeypatch.setattr(GRPO, "validate", lambda self, sc, n, turns: given_scores(next(given)))
    run = tmp_path / "run"
    extra = ["train.max_steps=3", "model.lora.enabled=true", "train.save_every=1", *HELD_OUT]
    trainer = Run(
        cfg_for(
            tiny_folder,
            run,
            *extra,
            "validation.keep_best=true",
            f"validation.checks=[{{name: min_gain, se: {min_gain}}}]",
        )
    )
    trainer.train()
    rows = lines(run)
    assert [r["scores"] for r in rows] == steps
    assert "val/gain" not in rows[0]  # nothing to compare the base with
    assert rows[1]["val/gain"] == pytest.approx(1.3 / 3) and rows[1]["val/gain_se"] == pytest.approx(
        0.72188, abs=1e-5
    )
    best = json.loads((run / "final" / "best.json").read_text())
    assert (best["step"], best["scores"]) == (best_step, steps[best_step])
    assert trainer.best_step == (None if best_step == 3 else best_step)  # None: final/ is the last step


@pytest.mark.parametrize(("floor", "best_step"), [(None, 2), (1.0, 1), (3.0, 2)])
def test_subset_floor_keeps_the_best_when_a_step_loses_one_kind_of_context(
    tmp_path: Path, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch, floor: float | None, best_step: int
) -> None:
    """Sixteen held-out contexts from one file, three from another (``validation.limit=19``). Step 1 gains 1
    everywhere (se 0); step 2 gains 3 on each of the first file's over step 1 and 0 - 2, 1 - 2, 2 - 2 on
    the second's: overall 45/19 = 2.37, far beyond its standard error; on the second file -1, se
    1/sqrt(3) = 0.577. A floor of 1 keeps step 1 (-1 < -0.577), a floor of 3 lets step 2 in (-1 >= -1.73)."""
    run = tmp_path / "run"
    first, second = "bundled:openings_misspelt_en.jsonl", "bundled:openings_terse_en.jsonl"
    extra = [
        "train.max_steps=2",
        "model.lora.enabled=true",
        "train.save_every=1",
        f"validation.data=[{first}, {second}]",
        "validation.limit=19",  # 16 misspelt openings and 3 terse ones
        "validation.max_new_tokens=4",
        "validation.keep_best=true",
        "validation.checks=[{name: min_gain, se: 1}"
        + (f", {{name: subset_floor, se: {floor}}}" if floor is not None else "")
        + "]",
    ]
    given = iter([[1.0] * 19, [2.0] * 19, [5.0] * 16 + [0.0, 1.0, 2.0]])
    monkeypatch.setattr(GRPO, "validate", lambda self, sc, n, turns: given_scores(next(given)))
    Run(cfg_for(tiny_folder, run, *extra)).train()
    rows = lines(run)
    assert rows[2]["subsets"][second]["gain"] == pytest.approx(-1.0)
    assert rows[2]["subsets"][second]["gain_se"] == pytest.approx(1 / math.sqrt(3))
    assert rows[2]["subsets"][first]["gain"] == pytest.approx(3.0) and rows[2]["subsets"][first]["n"] == 16
    assert rows[2].get("vetoed_by", []) == ([] if floor in (None, 3.0) else [second])
    assert "vetoed_by" not in rows[1]
    assert json.loads((run / "final" / "best.json").read_text())["step"] == best_step


def two_steps_validated(
    tmp_path: Path,
    tiny_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    given: list[ValidationResult],
    *checks: str,
) -> tuple[Path, list[dict]]:
    """A two-step run with keep_best, a min_gain check of 1 and ``checks`` (flow mappings) whose
    validations (before step 1, after steps 1 and 2) return ``given`` in turn; its directory and
    ``validation.jsonl`` lines."""
    results = iter(given)
    monkeypatch.setattr(GRPO, "validate", lambda self, sc, n, turns: next(results))
    run = tmp_path / "run"
    extra = [
        "train.max_steps=2",
        "model.lora.enabled=true",
        "train.save_every=1",
        "validation.data=bundled:esconv_style_en.json",
        "validation.limit=4",
        "validation.max_new_tokens=4",
        "validation.keep_best=true",
        f"validation.checks=[{', '.join(['{name: min_gain, se: 1}', *checks])}]",
    ]
    Run(cfg_for(tiny_folder, run, *extra)).train()
    return run, lines(run)


def test_rule_rises_by_hand() -> None:
    best = {"scores": [1.0, 1.0, 1.0, None], "rules": {"self_talk": [0.0, 0.5, 0.0, None]}}
    new = {"scores": [2.0, 2.0, 2.0, 2.0], "rules": {"meta_talk": [1.0, 0.5, 0.0, 0.0]}}
    rises = rule_rises(new, best)
    # meta_talk (absent from best: 0 where it scored): best - new = -1, -0.5, 0 over the three paired
    # scenarios: mean -0.5, stdev 0.5, se 0.5/sqrt(3); self_talk (absent from new): 0, 0.5, 0: mean 1/6
    assert rises["meta_talk"]["gain"] == pytest.approx(-0.5) and rises["meta_talk"]["n"] == 3
    assert rises["meta_talk"]["gain_se"] == pytest.approx(0.5 / math.sqrt(3))
    assert rises["self_talk"]["gain"] == pytest.approx(1 / 6)
    assert vetoed_by(rises, 1.0) == ["meta_talk"] and vetoed_by(rises, 2.0) == []  # -0.5 >= -0.577
    assert rule_rises({"scores": [1.0]}, {"scores": [1.0]}) == {}


@pytest.mark.parametrize(
    ("floor", "watched", "best_step"),
    [(None, None, 2), (1.0, None, 1), (1.0, "[meta_talk]", 1), (1.0, "[self_talk]", 2)],
)
def test_rule_floor_keeps_the_best_when_a_step_learns_a_new_way_to_put_the_person_off(
    tmp_path: Path,
    tiny_folder: Path,
    monkeypatch: pytest.MonkeyPatch,
    floor: float | None,
    watched: str | None,
    best_step: int,
) -> None:
    """Step 2 gains 1 on every context over step 1 (se 0) but talks about the person's message as a
    text on two of four: meta_talk's rate rises by 0.5 (se 0.289) over step 1's 0. The check's ``rules``
    without meta_talk lets step 2 in."""
    given = [
        ValidationResult({"val/reward": 1.0}, [1.0] * 4, {"self_talk": [1.0, 1.0, 0.0, 0.0]}),
        ValidationResult({"val/reward": 2.0}, [2.0] * 4),
        ValidationResult({"val/reward": 3.0}, [3.0] * 4, {"meta_talk": [1.0, 1.0, 0.0, 0.0]}),
    ]
    run, rows = two_steps_validated(
        tmp_path,
        tiny_folder,
        monkeypatch,
        given,
        *(
            [f"{{name: rule_floor, se: {floor}" + (f", rules: {watched}}}" if watched else "}")]
            if floor is not None
            else []
        ),
    )
    # step 1 fires self_talk less (0.5, se 0.289): a gain, no veto, and it becomes the best
    assert rows[1]["rule_gains"]["self_talk"]["gain"] == pytest.approx(0.5) and "vetoed_by" not in rows[1]
    assert rows[2]["rules"] == {"meta_talk": [1.0, 1.0, 0.0, 0.0]}
    assert rows[2]["rule_gains"]["meta_talk"]["gain"] == pytest.approx(-0.5)
    assert rows[2]["rule_gains"]["meta_talk"]["gain_se"] == pytest.approx(0.5 / math.sqrt(3))
    assert rows[2].get("vetoed_by") == (None if best_step == 2 else ["rule:meta_talk"])
    best = json.loads((run / "final" / "best.json").read_text())
    assert best["step"] == best_step
    assert best["rules"] == ({} if best_step == 1 else {"meta_talk": [1.0, 1.0, 0.0, 0.0]})


def test_rule_floor_rules_must_be_negative_rules_of_the_person(tmp_path: Path, tiny_folder: Path) -> None:
    from rapo_echo.training.validation import HeldOut, Validator

    watching = "validation.checks=[{{name: rule_floor, se: 1, rules: {}}}]".format
    cfg = load_config(overrides=[watching("[meta_talk, reflects_feeling, typo]")])
    person = HiddenPreferenceUser(extra_rules=[{"detect": "meta_talk", "weight": -3.0}])
    from rapo_echo.algorithms.rapo import RAPO

    algo = SimpleNamespace(validation_key="val/emotion_delta", simulator=person)
    algo.negative_rules = lambda: RAPO.negative_rules(algo)  # RAPO's own reading of its person
    with pytest.raises(ConfigError, match=r"rule_floor rules: \['reflects_feeling', 'typo'\] are not"):
        Validator(cfg, HeldOut([], {}), algo, None, tmp_path)
    cfg = load_config(overrides=[watching("[meta_talk, self_talk]")])
    assert Validator(cfg, HeldOut([], {}), algo, None, tmp_path).checks[0].rules == ["meta_talk", "self_talk"]


def test_a_best_saved_without_scores_is_compared_by_its_mean(
    tmp_path: Path, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run resumed from a best.json of an older version (no per-scenario scores)."""
    given = iter([[1, 1, 1], [2, 2, 2]])
    monkeypatch.setattr(GRPO, "validate", lambda self, sc, n, turns: given_scores(next(given)))
    run = tmp_path / "run"
    extra = ["model.lora.enabled=true", "train.save_every=1", *HELD_OUT, "validation.keep_best=true"]
    Run(cfg_for(tiny_folder, run, "train.max_steps=1", *extra)).train()
    path = run / "best" / "best.json"
    path.write_text(json.dumps({"step": 1, "key": "val/reward", "value": 1.5}))
    given = iter([[1.25, 1.25, 1.25]])
    Run(cfg_for(tiny_folder, run, "train.max_steps=2", *extra), resume=True).train()
    row = lines(run)[-1]
    assert row["step"] == 2 and row["val/gain"] == pytest.approx(-0.25) and math.isnan(row["val/gain_se"])
    assert json.loads(path.read_text())["step"] == 1


class ByTurn:
    """Greedy replies chosen by the person's first message and the turn (how many assistant turns the
    prompt holds); records the decoded prompts."""

    def __init__(self, engine, replies: dict[str, list[str]]) -> None:
        self.engine, self.replies, self.prompts = engine, replies, []

    def generate_ids(self, prompt_ids, params):
        tok = self.engine.tokenizer
        out = []
        for ids in prompt_ids:
            text = tok.decode(ids)
            self.prompts.append(text)
            turn = text.count("<|im_start|>assistant") - 1  # the last one is the reply's own header
            reply = next(r for said, r in self.replies.items() if said in text)[turn]
            seq = tok(reply, add_special_tokens=False)["input_ids"] if reply else []
            out.append([Generation(reply, seq, None, list(ids), "stop")])
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


def test_rapo_validates_dialogues_of_several_turns(tiny_folder: Path) -> None:
    """validation.turns: 3: the person's reaction is their next message; a reply said again costs
    (repeats_earlier, weight -2); a dialogue ends at an invalid reaction (an empty reply)."""
    replies = {
        "gran died": [WARM, WARM, WARM],
        "lost my job": [SELF, NEUTRAL, WARM],
        "exam": [NEUTRAL, "", WARM],
    }
    algo, policy = reactions_rapo(
        tiny_folder,
        lambda engine: ByTurn(engine, replies),
        "rapo.simulator.args={extra_rules: [{detect: repeats_earlier, weight: -2.0}]}",
    )
    held_out = [
        Scenario("a", [msg("user", "My gran died.")], profile={"emotion_type": "sadness"}),
        Scenario("b", [msg("user", "I lost my job.")], profile={"emotion_type": "fear"}),
        Scenario("c", [msg("user", "My exam went badly.")], profile={"emotion_type": "anxiety"}),
    ]
    result = algo.validate(held_out, max_new_tokens=7, turns=3)
    # rules: advice -1, self -1, reflects +1, open question +1, repeats_earlier -2: lo -4, hi 2, so a
    # reply's change is 10 * (2 * (s + 4) / 6 - 1): WARM +10 (s 2), WARM said again 3.333 (s 0), SELF 0
    # (s -1), NEUTRAL 3.333 (s 0)
    third = 10.0 / 3
    a, b, c = (10.0 + third + third) / 3, (0.0 + third + 10.0) / 3, third  # c ends at its empty reply
    assert result.scores == pytest.approx([a, b, c])
    out = result.metrics
    assert out["val/emotion_delta"] == pytest.approx((a + b + c) / 3)
    assert out["val/invalid"] == 1.0
    assert out["val/turns"] == pytest.approx((3 + 3 + 1) / 3)
    # hidden-rule score of all eight replies: a 1, 4/6, 4/6; b 3/6, 4/6, 1; c 4/6, 4/6 (the empty one)
    assert out["val/hidden_rule_score"] == pytest.approx((2.5 + 5 * 4 / 6) / 8)
    # the negative rules broken, per dialogue the share of its replies: a says WARM again twice of three,
    # b talks about itself once of three, c breaks none (its empty reply included); other rules: absent
    assert result.rules == {
        "repeats_earlier": pytest.approx([2 / 3, 0.0, 0.0]),
        "self_talk": pytest.approx([0.0, 1 / 3, 0.0]),
    }
    # the person's reaction to the first reply is their next message, in the next prompt
    first = algo.simulator.react_one(held_out[0], WARM).message
    gran = [p for p in policy.engine.prompts if "gran died" in p]
    assert len(gran) == 3 and first not in gran[0] and first in gran[1] and gran[1] in gran[2]
    assert gran[2].count(WARM) == 2  # the replies so far are the assistant turns
    job = [p for p in policy.engine.prompts if "lost my job" in p]
    assert SELF in job[1] and NEUTRAL in job[2]
    assert result.replies == [[WARM] * 3, [SELF, NEUTRAL, WARM], [NEUTRAL, ""]]


def test_validation_turns_need_a_simulated_person() -> None:
    cfg = load_config(algo="grpo", overrides=[*HELD_OUT, "validation.turns=2"])
    with pytest.raises(ConfigError, match="validation.turns: --algo grpo validates single replies"):
        validation_scenarios(cfg, GRPO)


def test_validation_data_may_name_several_files() -> None:
    cfg = load_config(
        algo="rapo",
        overrides=[
            "validation.data=[bundled:esconv_style_en.json, bundled:openings_terse_en.jsonl]",
            "validation.limit=23",
        ],
    )
    from rapo_echo.algorithms.rapo import RAPO

    held = validation_scenarios(cfg, RAPO)
    scenarios = held.scenarios
    assert len(scenarios) == 23  # the 21 ESConv-style contexts, then the first two terse openings
    assert [s.id for s in scenarios[21:]] == ["terse-exams", "terse-argument-boyfriend"]
    assert scenarios[21].messages == [msg("user", "exams")]
    # each file is a subset (the subset_floor check); the limit cuts across them
    assert held.subsets == {
        "bundled:esconv_style_en.json": range(21),
        "bundled:openings_terse_en.jsonl": range(21, 23),
    }
    cfg = cfg.model_copy(update={"validation": cfg.validation.model_copy(update={"limit": 5})})
    assert validation_scenarios(cfg, RAPO).subsets == {"bundled:esconv_style_en.json": range(5)}


@pytest.mark.parametrize(("floor", "best_step"), [(None, 2), (1.0, 1), (2.0, 2)])
def test_variety_floor_keeps_the_best_when_a_step_says_the_same_thing_everywhere(
    tmp_path: Path, tiny_folder: Path, monkeypatch: pytest.MonkeyPatch, floor: float | None, best_step: int
) -> None:
    """Step 2 gains 1 on every context over step 1 (se 0) but answers three of four contexts alike:
    Distinct-2 50 against 100; leaving out one of the three alike contexts gives 66.7 against 100, the
    fourth 33.3 against 100, so the jackknife standard error is 25: -50 < -1 * 25 is refused, -50 < -2 * 25
    is not."""
    varied = [["a b"], ["c d"], ["e f"], ["g h"]]
    alike = [["a b"], ["a b"], ["a b"], ["c d"]]
    given = [
        ValidationResult({"val/reward": 1.0}, [1.0] * 4, replies=varied),
        ValidationResult({"val/reward": 2.0}, [2.0] * 4, replies=varied),
        ValidationResult({"val/reward": 3.0}, [3.0] * 4, replies=alike),
    ]
    floors = [f"{{name: variety_floor, se: {floor}}}"] if floor is not None else []
    run, rows = two_steps_validated(tmp_path, tiny_folder, monkeypatch, given, *floors)
    assert [r["val/distinct_2"] for r in rows] == pytest.approx([100.0, 100.0, 50.0])
    assert rows[1]["variety"] == {"gain": 0.0, "gain_se": 0.0, "n": 4} and "vetoed_by" not in rows[1]
    assert rows[2]["replies"] == alike
    assert rows[2]["variety"]["gain"] == pytest.approx(-50.0)
    assert rows[2]["variety"]["gain_se"] == pytest.approx(25.0)
    assert rows[2].get("vetoed_by") == (["variety"] if best_step == 1 else None)
    best = json.loads((run / "final" / "best.json").read_text())
    assert best["step"] == best_step and best["replies"] == (varied if best_step == 1 else alike)

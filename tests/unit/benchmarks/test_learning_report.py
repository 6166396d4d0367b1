"""What the report leads with for RAPO runs, the learning benchmark's summary and bands by hand, and the
learning section of the report (arms side by side, seeds as bands)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapo_echo.benchmarks.learning_report import bands, find_learning, learning_figure
from rapo_echo.benchmarks.plots import curve_keys
from rapo_echo.benchmarks.report import TrainingRun, build_report
from rapo_echo.benchmarks.training_report import summary_table
from studies.bench_learning import ARMS, rapo_learning_config, summarise

RAPO_ROWS = [
    {
        "step": s,
        "reward/mean": 0.5,  # linear rank rewards: 0.5 every step by construction
        "loss/total": 1.0,
        "sim/emotion_delta": -2.0 + s,
        "sd/rank_vs_original": -0.5,
        "sim/hidden_rule_score": 0.4 + 0.1 * s,
        "kl": 0.0,
    }
    for s in (1, 2, 3)
]


def test_rapo_curves_lead_with_what_the_run_is_for_and_drop_a_flat_reward() -> None:
    assert curve_keys(RAPO_ROWS) == [
        "sim/hidden_rule_score",
        "sim/emotion_delta",
        "sd/rank_vs_original",
        "loss/total",
        "kl",
    ]
    moving = [{**r, "reward/mean": 0.1 * r["step"]} for r in RAPO_ROWS]  # a reward that moves stays
    assert "reward/mean" in curve_keys(moving)


def test_summary_table_leads_with_the_hidden_rule_score(tmp_path: Path) -> None:
    header, rows = summary_table([TrainingRun(tmp_path / "rapo-run", RAPO_ROWS)])
    assert header[:5] == [
        "run",
        "steps",
        "hidden-rule score (first → last)",
        "emotion change (first → last)",
        "rewrite rank vs original (first → last)",
    ]
    assert not any(h.startswith("reward") for h in header)
    assert rows[0][:3] == ["rapo-run", "3", "0.5 → 0.7"]


def test_bands_and_summary_by_hand() -> None:
    steps, mean, lo, hi = bands({"0": [0.1, 0.5, 0.2], "1": [0.3, None, 0.4], "2": [0.2, 0.9]})
    assert steps == [1, 2, 3]
    assert mean == pytest.approx([0.2, 0.7, 0.3]) and lo == [0.1, 0.5, 0.2] and hi == [0.3, 0.9, 0.4]
    out = summarise({0: [0.1, 0.2, 0.3, 0.5, 0.6, 0.7], 1: [0.3, 0.3, 0.3, 0.3, 0.3, 0.6]}, window=3)
    # seed 0: mean(.5,.6,.7) - mean(.1,.2,.3) = 0.4; seed 1: mean(.3,.3,.6) - .3 = 0.1
    assert out["gain_per_seed"] == {"0": pytest.approx(0.4), "1": pytest.approx(0.1)}
    assert out["gain"] == pytest.approx(0.25)
    assert out["mean_per_step"] == pytest.approx([0.2, 0.25, 0.3, 0.4, 0.45, 0.65])
    assert out["first_window"] == pytest.approx(0.25) and out["last_window"] == pytest.approx(0.5)


def test_arms_differ_only_in_their_learning_signal(tmp_path: Path) -> None:
    cfgs = {arm: rapo_learning_config(tmp_path / arm, arm, steps=3, seed=1) for arm in ARMS}
    assert (cfgs["rapo"].algo, cfgs["ranks"].algo, cfgs["emotion"].algo) == ("rapo", "rapo", "grpo")
    assert cfgs["rapo"].rapo.sd.enabled and not cfgs["ranks"].rapo.sd.enabled
    assert (
        cfgs["rapo"].rapo.simulator.name == "hidden_preference"
        and cfgs["rapo"].rapo.judge.kind == "reactions"
    )
    assert [r.name for r in cfgs["emotion"].rewards] == ["emotion_change"]
    for cfg in cfgs.values():  # same sampling, optimiser and loss in every arm
        assert (cfg.train.lr, cfg.train.seed, cfg.loss.advantage, cfg.loss.beta) == (1e-3, 1, "grpo", 0.0)
        assert (cfg.rollout.batch_size, cfg.rollout.group_size, cfg.model.lora.enabled) == (4, 4, True)


def test_report_draws_the_learning_benchmark(tmp_path: Path) -> None:
    root = tmp_path / "learning"
    result = {
        "bench": "rapo_learns_hidden_preference",
        "seeds": [0, 1],
        "arms": {
            arm: {
                "score_per_step": {"0": [0.5, 0.6, 0.7 + k / 10], "1": [0.4, 0.5, 0.6]},
                **summarise({0: [0.5, 0.6, 0.7 + k / 10], 1: [0.4, 0.5, 0.6]}, window=1),
            }
            for k, arm in enumerate(ARMS)
        },
    }
    result["arms"]["rapo"]["rewrite_beat_original_per_step"] = {"0": [0.5, 1.0, None], "1": [0.0, 0.5, 1.0]}
    for arm in ARMS:
        (root / f"{arm}-seed0").mkdir(parents=True)
        rows = [{"step": s, "sim/hidden_rule_score": 0.5} for s in (1, 2)]
        (root / f"{arm}-seed0" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "learning.json").write_text(json.dumps(result))
    assert [p for p, _ in find_learning([root])] == [root]
    assert learning_figure(result)[:8] == b"\x89PNG\r\n\x1a\n"
    html_path, _ = build_report([root], tmp_path / "report")
    page = html_path.read_text()
    assert "<h2>Learning curves</h2>" in page and page.index("Learning curves") < page.index(
        "Training curves"
    )
    assert "RAPO (ranks + self-distillation)" in page and "GRPO on emotion change" in page
    # gains (window 1): rapo (.7-.5 + .6-.4)/2 = .2; ranks (.8-.5 + .2)/2 = .25; emotion (.9-.5 + .2)/2 = .3
    for gain in ("+0.200", "+0.250", "+0.300"):
        assert f"<td>{gain}</td>" in page


def test_sweep_settings_and_reward_specs() -> None:
    from studies.sweep_defaults import reward_spec, setting_overrides

    assert reward_spec("question") == {"name": "question", "weight": 1.0, "args": {}}
    assert reward_spec("length:target=12") == {"name": "length", "weight": 1.0, "args": {"target": 12}}
    assert setting_overrides("lora:1e-3") == ["model.lora.enabled=true", "train.lr=1e-3"]
    assert setting_overrides("full:1e-5") == ["model.lora.enabled=false", "train.lr=1e-5"]
    assert setting_overrides("default") == []
    with pytest.raises(SystemExit, match="is not default, full:LR or lora:LR"):
        setting_overrides("qlora:1")


def test_hidden_rule_eval_scores_evaluation_replies_by_hand(tmp_path: Path, capsys) -> None:
    from studies.hidden_rule_eval import main

    folder = tmp_path / "ref"
    folder.mkdir()

    def said(text: str, reply: str) -> list[dict[str, str]]:
        return [{"role": "supporter", "content": "Hi."}, {"role": "seeker", "content": text},
                {"role": "policy", "content": reply}]  # fmt: skip

    a, b = "That sounds so lonely. What do you miss most?", "Try to rest. I am so sorry. I am so sorry."
    rows = [
        # reflects + open question: 1; takes up "miss" (and "sounds" is not theirs)
        {"id": "a", "valid": True, "info": {"reply": a}, "transcript": said("I miss my old city.", a)},
        # advice first: 0.25; "rest", "sorry" are not in "My exam is tomorrow."
        {"id": "b", "valid": True, "info": {"reply": b}, "transcript": said("My exam is tomorrow.", b)},
        {"id": "c", "valid": False, "info": {"reply": "not counted"}},
        {"id": "d", "valid": True, "info": {}},  # no reply: not counted
    ]
    (folder / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main([str(folder)])
    out = json.loads(capsys.readouterr().out)
    # default rules: score = (s + 2) / 4; "Try to rest." is advice first (s = -1): 0.25
    assert out == {
        "eval": str(folder),
        "replies": 2,
        "hidden_rule_score": 0.625,
        "repeats_itself": 0.5,
        "picks_up_details": 0.5,
        "parrots": 0.0,
        "restates": 0.0,
        "meta_talk": 0.0,
        "words": 10.0,
    }  # fmt: skip  (9 and 11 words)
    # with the details rule added: lo = -2, hi = 3, (s + 2) / 5: a = (2 + 1 + 2) / 5 = 1, b = 1 / 5
    extra = tmp_path / "extra.yaml"
    extra.write_text("- {detect: picks_up_details, weight: 1}\n")
    main([str(folder), "--extra-rules", str(extra)])
    assert json.loads(capsys.readouterr().out)["hidden_rule_score"] == 0.6
    # the quickstart's person adds repeats (-3), details (+2), parrots (-1), meta talk (-3), restates
    # (-3) and repeats_earlier (-3): lo = -15, hi = 4, (s + 15) / 19: a = (4 + 15) / 19 = 1, b (advice
    # first, "i am so sorry" twice) = (-4 + 15) / 19
    quickstart = Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml"
    main([str(folder), "--config", str(quickstart)])
    assert json.loads(capsys.readouterr().out)["hidden_rule_score"] == round((1 + 11 / 19) / 2, 4)
    with pytest.raises(SystemExit):
        main([str(folder), "--config", str(quickstart), "--extra-rules", str(extra)])
    other = tmp_path / "rapo.yaml"
    other.write_text("algo: rapo\n")  # its person is the LLM reaction simulator: no hidden rule to score
    with pytest.raises(SystemExit):
        main([str(folder), "--config", str(other)])
    assert "rapo.simulator.name is 'reaction', not a hidden-preference user" in capsys.readouterr().err
    boss = "I was working when one of my bosses continued to bully and speak down to me"
    restated = "The boss should not have continued to speak down to me."  # no five words in a row
    row = {"id": "e", "valid": True, "info": {"reply": restated}, "transcript": said(boss, restated)}
    (folder / "results.jsonl").write_text(json.dumps(row) + "\n")
    main([str(folder)])
    out = json.loads(capsys.readouterr().out)
    assert (out["restates"], out["parrots"], out["picks_up_details"]) == (1.0, 0.0, 1.0)
    (folder / "results.jsonl").write_text(json.dumps(rows[2]) + "\n")
    with pytest.raises(SystemExit, match="no valid row with info.reply"):
        main([str(folder)])


def test_learning_benchmark_scores_samples_against_what_the_person_said(tmp_path: Path) -> None:
    from rapo_echo.simulators.hidden_preference import HiddenPreferenceUser
    from studies.bench_learning import hidden_scores_per_step

    prompt = [{"role": "user", "content": "My gran died."}, {"role": "assistant", "content": "Oh no."},
              {"role": "user", "content": "The funeral is on Monday."}]  # fmt: skip
    rows = [
        {"step": 1, "prompt": prompt, "reply": "Monday will be hard."},  # takes up "monday": s = 1
        {"step": 1, "prompt": prompt, "reply": "Your gran was kind."},  # "gran" was said earlier: s = 0
        {"step": 2, "prompt": [], "reply": "Monday will be hard."},  # nothing heard: s = 0
    ]
    (tmp_path / "samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    user = HiddenPreferenceUser(extra_rules=[{"detect": "picks_up_details", "weight": 1.0}])
    # lo = -2, hi = 3: (s + 2) / 5 -> step 1 (0.6 + 0.4) / 2, step 2 0.4
    assert hidden_scores_per_step(tmp_path, user) == [0.5, 0.4]

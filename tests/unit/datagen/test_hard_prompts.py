"""``data hard-prompts`` on scripted roles: best-of-N replies scored by the training reward against each
prompt's reference, the keep rule worked out by hand, and a prompt file the training loader reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapo_echo.datagen.contexts import load_contexts
from rapo_echo.datagen.hard_prompts import HardPrompts, HardPromptSettings, keep, protocol
from rapo_echo.datagen.runner import data_config, run_pipeline
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.types import Scenario
from tests.helpers.datagen import block, generate_calls


def pairwise_judge() -> ScriptedEngine:
    """The empathy judge: a need line per axis; a reply holding GOOD beats one without, else a tie."""

    def answer(prompt):
        if prompt[-1]["role"] == "assistant" and prompt[-1]["content"].endswith("need:"):
            return " to be heard out first"
        a, b = block(prompt, "REPLY A"), block(prompt, "REPLY B")
        verdict = (
            "A" if "GOOD" in a and "GOOD" not in b else "B" if "GOOD" in b and "GOOD" not in a else "tie"
        )
        return json.dumps({"verdict": verdict})

    return ScriptedEngine(fn=answer)


def _contexts() -> list[Scenario]:
    contexts = load_contexts(None, limit=3)
    contexts[0].reference = contexts[1].reference = "a plain reference reply"
    return contexts  # the third has no reference: it cannot be scored


def test_keep_rule_by_hand() -> None:
    assert keep([1.0, 0.5], "best", 0.5) == (False, 1.0, 0.75)
    assert keep([0.5, None, 0.25], "best", 0.5) == (True, 0.5, 0.375)
    assert keep([1.0, 0.0, 0.0, 0.0], "mean", 0.5) == (True, 1.0, 0.25)
    assert keep([None, None], "best", 0.5) == (False, None, None)


def test_best_of_n_against_the_reference() -> None:
    policy = ScriptedEngine(replies=["GOOD one", "plain", "plain", "plain two", "x", "y"])
    judge = pairwise_judge()
    pipe = HardPrompts(policy, judge, HardPromptSettings(n=2))
    records = pipe.run_chunk(_contexts())
    # prompt 0: GOOD wins both orders (1.0), plain ties (0.5) -> best 1.0: solved; prompt 1: ties only
    assert [(r["status"], r["best"], r["mean"]) for r in records] == [
        ("solved", 1.0, 0.75),
        ("kept", 0.5, 0.5),
        ("unscored", None, None),
    ]
    assert records[2]["invalid"] == ["no reference", "no reference"]
    assert generate_calls(policy) == [3]  # one call, n replies per prompt
    # the reward's own batched calls: need lines (3 prompts x 3 axes), then 4 replies x 2 orders
    assert generate_calls(judge) == [9, 8]


def test_mean_criterion_and_prompt_file(tmp_path: Path) -> None:
    policy = ScriptedEngine(replies=["GOOD one", "plain", "plain", "plain two"])
    pipe = HardPrompts(policy, pairwise_judge(), HardPromptSettings(n=2, criterion="mean", threshold=0.8))
    config = data_config("hard-prompts", {}, None, "auto", {}, protocol())
    summary = run_pipeline(pipe, _contexts()[:2], tmp_path / "out", config, batch_size=2, progress=False)
    assert summary["figures"]["kept"] == 2  # means 0.75 and 0.5
    loaded = load_contexts(str(tmp_path / "out" / "prompts.jsonl"))
    assert [s.reference for s in loaded] == ["a plain reference reply"] * 2
    assert loaded[0].meta["hard_best"] == 1.0 and loaded[0].meta["hard_mean"] == 0.75


def test_reward_args() -> None:
    assert HardPromptSettings().resolved_reward_args() == {"reference": "scenario", "injection_probe": 0}
    nested = HardPromptSettings(
        reward="echo_n1", reward_args={"empathy": {"order": "random"}, "mode": "route"}
    )
    assert nested.resolved_reward_args() == {
        "empathy": {"reference": "scenario", "injection_probe": 0, "order": "random"},
        "mode": "route",
    }
    with pytest.raises(ValueError, match="criterion"):
        HardPromptSettings(criterion="median")

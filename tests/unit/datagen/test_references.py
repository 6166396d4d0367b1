"""``data references`` on scripted roles: the reply graded 3 is chosen (by the grade's probability where
there is one), fresh rounds for prompts without one, the fallbacks, and a scenarios file that ``train``'s
loader and the ``empathy`` reward read as they are."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from rapo_echo.datagen.contexts import load_contexts
from rapo_echo.datagen.grading import SCORE_PREFIX, closest
from rapo_echo.datagen.reference_replies import References, ReferenceSettings, pick, protocol
from rapo_echo.datagen.runner import data_config, run_pipeline
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.types import Scenario
from tests.helpers.datagen import block, generate_calls, judge

GRADES = {"own ref": 4, "w1": 5, "w2": 3, "w3": 1, "w4": 2, "w5": 4, "w6": 3}


def _contexts() -> list[Scenario]:
    contexts = load_contexts(None, limit=2)
    contexts[0].reference = "own ref"
    return contexts


def test_target_grade_rounds_and_batched_calls() -> None:
    writer = ScriptedEngine(replies=["w1", "w2", "w3", "w4", "w5", "w6"])
    j = judge(lambda r: GRADES[r])
    records = References(writer, j, ReferenceSettings(candidates=2, rounds=2)).run_chunk(_contexts())
    # context 0: own ref (4), w1 (5), w2 (3) -> w2; context 1: w3 (1), w4 (2), then round 2: w5 (4), w6 (3)
    assert [(r["status"], r["reference"], r["score"]) for r in records] == [
        ("target", "w2", 3),
        ("target", "w6", 3),
    ]
    assert records[0]["source"] == "writer"
    assert generate_calls(writer) == [2, 1]  # round 2 samples only for the context still open
    assert generate_calls(j) == [5, 2]


@pytest.mark.parametrize("fallback, expected", [("skip", ("skipped", None)), ("closest", ("closest", "w4"))])
def test_fallback(fallback: str, expected: tuple) -> None:
    writer = ScriptedEngine(replies=["w3", "w4", "w1", "w5"])
    settings = ReferenceSettings(candidates=2, rounds=1, fallback=fallback)
    record = References(writer, judge(lambda r: GRADES[r]), settings).run_chunk(_contexts()[1:])[0]
    assert (record["status"], record["reference"]) == expected  # grades 1 and 2: 2 is nearest to 3


def test_the_context_reference_can_be_the_anchor() -> None:
    contexts = _contexts()
    contexts[0].reference = "w2"
    writer = ScriptedEngine(replies=["w1", "w5"])
    record = References(writer, judge(lambda r: GRADES[r]), ReferenceSettings(candidates=2)).run_chunk(
        contexts[:1]
    )[0]
    assert (record["reference"], record["source"]) == ("w2", "context")


def test_pick_prefers_the_surest_grade() -> None:
    cands = [{"score": 3, "p_target": 0.4}, {"score": 2, "p_target": 0.9}, {"score": 3, "p_target": 0.7}]
    assert pick(cands, 3) == 2
    assert pick([{"score": 3, "p_target": None}, {"score": 3, "p_target": None}], 3) == 0
    assert pick([{"score": 4}], 3) is None
    assert closest([5, None, 1, 2], 3) == 3  # distances 2, -, 2, 1
    assert closest([4, 2], 3) == 1  # a tie goes to the lower grade
    assert closest([None], 3) is None


def test_logprob_grades_choose_by_probability() -> None:
    """With log-probs the grade is the most likely label; of two 3s the one with the higher P(3) wins."""
    p3 = {"wa": 0.6, "wb": 0.9}

    def choice(prompt, options):
        reply = block(prompt[:-1], "REPLY")
        assert prompt[-1]["content"].endswith(SCORE_PREFIX)
        p = p3[reply]
        probs = {" 3": p, " 2": 1 - p}
        return {o: (math.log(probs[o]) if o in probs else -math.inf) for o in options}

    j = ScriptedEngine(fn=lambda prompt: " plain and kind", choice_fn=choice)
    writer = ScriptedEngine(replies=["wa", "wb"])
    record = References(writer, j, ReferenceSettings(candidates=2, include_reference=False)).run_chunk(
        load_contexts(None, limit=1)
    )[0]
    assert (record["reference"], record["score"]) == ("wb", 3)
    assert record["candidates"][0]["critique"] == "plain and kind"


def test_scenarios_file_is_read_by_the_training_loader(tmp_path: Path) -> None:
    writer = ScriptedEngine(replies=["w1", "w2", "w3", "w4"])
    pipe = References(writer, judge(lambda r: GRADES[r]), ReferenceSettings(candidates=2, rounds=1))
    config = data_config("references", {}, None, "auto", {}, protocol())
    summary = run_pipeline(pipe, _contexts(), tmp_path / "out", config, batch_size=2, progress=False)
    assert summary["dataset"]["rows"] == 1 and summary["figures"]["status"] == {"target": 1, "skipped": 1}
    loaded = load_contexts(str(tmp_path / "out" / "scenarios.jsonl"))
    original = _contexts()[0]
    assert loaded[0].reference == "w2" and loaded[0].messages == original.messages
    assert loaded[0].profile == original.profile
    assert loaded[0].meta["reference_score"] == 3 and loaded[0].meta["reference_source"] == "writer"

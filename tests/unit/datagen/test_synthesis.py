"""``data synthesize`` on scripted agents: profiles, the lockstep exchanges, the director's switch and end,
the curriculum order, and ``messages`` rows that end with the companion's reply."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from rapo_echo.datagen.contexts import load_contexts
from rapo_echo.datagen.runner import data_config, run_pipeline
from rapo_echo.datagen.synthesis import (
    COMPANION_PROMPT,
    END_NOTE,
    SWITCH_NOTE,
    Synthesis,
    SynthesisSettings,
    parse_stages,
    protocol,
)
from rapo_echo.engines.scripted import ScriptedEngine
from tests.helpers.datagen import block, generate_calls


def user_engine(structured: bool = True) -> ScriptedEngine:
    names, lines = itertools.count(), itertools.count()

    def answer(prompt):
        if prompt[-1]["role"] == "assistant":  # the person's next message, after their name
            return f" this is message {next(lines)}"
        k = next(names)
        profile = {
            "name": f"P{k}",
            "age": 30 + k,
            "occupation": "baker",
            "personality": "dry humour",
            "speaking_style": "short lines",
            "situation": "moved city",
            "opening": f"hi, I am P{k}",
        }
        return json.dumps(profile)

    return ScriptedEngine(fn=answer, structured=structured)


def director_engine() -> ScriptedEngine:
    def answer(prompt):
        if prompt[-1] == {"role": "assistant", "content": "Next topic:"}:
            return " their new job"
        exchanges = int(re.search(r"\((\d+) exchanges\)", prompt[-1]["content"]).group(1))
        return json.dumps({"verdict": {3: "switch", 6: "end"}.get(exchanges, "continue")})

    return ScriptedEngine(fn=answer)


def _run(settings: SynthesisSettings, n: int = 3, user=None):
    contexts = load_contexts(None, limit=n)
    replies = itertools.count()
    companion = ScriptedEngine(fn=lambda prompt: f"reply {next(replies)}")
    user, director = user or user_engine(), director_engine()
    pipe = Synthesis(companion, user, director, settings, {sc.id: i for i, sc in enumerate(contexts)})
    return contexts, pipe, companion, user, director


def test_director_switch_end_and_lockstep() -> None:
    settings = SynthesisSettings(stages=["2:neutral", "7:intense"], director_every=3)
    contexts, pipe, companion, user, director = _run(settings)
    records = pipe.run_chunk(contexts)
    assert [(r["stage"], r["exchanges"], r["ended_by"]) for r in records] == [
        (0, 2, "max_turns"),
        (1, 7, "director"),
        (0, 2, "max_turns"),
    ]
    assert records[1]["director"] == [
        {"after": 3, "decision": "switch", "valid": True, "topic": "their new job"},
        {"after": 6, "decision": "end", "valid": True},
    ]
    roles = [m["role"] for m in records[1]["messages"]]
    assert roles == ["user", "assistant"] * 7 and records[1]["messages"][0]["content"] == "hi, I am P1"
    # one batched call per stage: companion over the live dialogues, then the users
    assert generate_calls(companion) == [3, 3, 1, 1, 1, 1, 1]
    assert generate_calls(user) == [3, 3, 1, 1, 1, 1, 1]
    assert generate_calls(director) == [1, 1, 1]  # decide at 3, the new topic, decide at 6
    directions = [block(p, "DIRECTION") for c in user.calls for p in c["prompts"]]
    assert [d for d in directions if d] == [f"{SWITCH_NOTE} their new job", END_NOTE]


class Budgets(ScriptedEngine):
    """A scripted engine that also notes each call's token budget."""

    def __init__(self, inner: ScriptedEngine) -> None:
        super().__init__(fn=inner.reply, structured=inner.structured)
        self.budgets: list[int] = []

    def generate(self, prompts, params):
        self.budgets.append(params.max_new_tokens)
        return super().generate(prompts, params)


def test_each_size_flag_bounds_what_it_names(caplog) -> None:
    """``--user-tokens`` bounded the director's new topic too, and nothing said the profile (with the
    opening) has its own, larger budget (issue 49, item 5)."""
    settings = SynthesisSettings(
        stages=["7:intense"], director_every=3, user_tokens=16, profile_tokens=40, max_new_tokens=24
    )
    contexts = load_contexts(None, limit=2)
    user, director = Budgets(user_engine()), Budgets(director_engine())
    replies = itertools.count()
    companion = Budgets(ScriptedEngine(fn=lambda prompt: f"reply {next(replies)}"))
    with caplog.at_level("INFO", logger="rapo_echo.datagen.synthesis"):
        pipe = Synthesis(companion, user, director, settings, {sc.id: i for i, sc in enumerate(contexts)})
    pipe.run_chunk(contexts)
    assert user.budgets[0] == 40 and set(user.budgets[1:]) == {16}  # the profile, then the person's lines
    assert set(companion.budgets) == {24}
    assert director.budgets and 16 not in director.budgets  # the topic has its own small budget
    assert "a profile of up to 40 tokens (--profile-tokens; it holds the person's opening)" in caplog.text
    assert "a message of the person of up to 16 (--user-tokens)" in caplog.text


def test_rows_follow_the_curriculum(tmp_path: Path) -> None:
    settings = SynthesisSettings(stages=["2:neutral", "3:mild"], director_every=5)
    contexts, pipe, *_ = _run(settings, n=4)
    config = data_config("synthesize", {}, None, "auto", {}, protocol())
    summary = run_pipeline(pipe, contexts, tmp_path / "out", config, batch_size=3, progress=False)
    rows = [json.loads(x) for x in (tmp_path / "out" / "sft.jsonl").read_text().splitlines()]
    assert [sum(m["role"] == "assistant" for m in r["messages"]) for r in rows] == [2, 2, 3, 3]
    assert all(set(r) == {"messages"} for r in rows)
    assert all(r["messages"][0] == {"role": "system", "content": COMPANION_PROMPT} for r in rows)
    assert all(r["messages"][-1]["role"] == "assistant" for r in rows)
    assert summary["figures"]["per_stage"] == {"2:neutral": 2, "3:mild": 2}


def test_unreadable_profile_gives_no_row() -> None:
    bad = ScriptedEngine(fn=lambda prompt: "I would rather not", structured=False)
    contexts, pipe, *_ = _run(SynthesisSettings(stages=["2:neutral"], max_retries=0), n=1, user=bad)
    record = pipe.run_chunk(contexts)[0]
    assert (record["ended_by"], record["valid"], record["messages"]) == ("profile_invalid", False, [])
    assert pipe.export([(contexts[0], record)])[0] == []


def test_stages() -> None:
    assert parse_stages(["6:neutral", " 16:intense"]) == [(6, "neutral"), (16, "intense")]
    for bad in (["6"], ["0:neutral"], ["6:angry"], []):
        with pytest.raises(ValueError):
            parse_stages(bad)

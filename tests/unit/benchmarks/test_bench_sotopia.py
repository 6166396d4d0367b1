"""SOTOPIA: profile loaders, the bundled English set, agent prompts, action parsing, the episode rules,
the evaluator's parsing and the benchmark's records, with scripted engines."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.sotopia.agent import (
    AgentAction,
    AgentProfile,
    AgentTurn,
    EnvironmentProfile,
    agent_prompt,
    background,
    parse_action,
)
from rapo_echo.benchmarks.sotopia.evaluator import (
    DIMENSIONS,
    REPLY_PREFIX,
    dimension_key,
    evaluator_prompt,
    overall,
    parse_reply,
    parse_scores,
)
from rapo_echo.benchmarks.sotopia.profiles import SOTOPIA_HARD_ENV_IDS, bundled_scenarios_path, load_sotopia
from rapo_echo.benchmarks.sotopia.run import Sotopia, termination
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.llm.fencing import Fence
from tests.conftest import shared_data

ALICE = AgentProfile(
    "Alice",
    "Moreau",
    30,
    "Teacher",
    "Woman",
    "She/her",
    "Alice runs a book club.",
    "Alice is kind and curious.",
    "She is afraid of dogs.",
    pk="a1",
)
BOB = AgentProfile(
    "Bob",
    "Tan",
    41,
    "Baker",
    "Man",
    "He/him",
    "Bob owns a bakery.",
    "Bob is frank.",
    "He owes money to his landlord.",
    pk="b1",
)
ENV = EnvironmentProfile(
    "lend_money", "Bob asks Alice for a loan.", ("Lend wisely.", "Borrow 500 dollars."), "friend", pk="e1"
)
SCORES = (
    "believability: 8\nrelationship: 2\nknowledge: 5\nsecret: -1\nsocial_rules: 0\nfinancial: -3\ngoal: 7"
)


# ---------------------------------------------------------------------- the bundled English set
def test_bundled_set_has_enough_complete_scenarios_and_a_hard_third():
    pairs = load_sotopia()
    assert bundled_scenarios_path().is_file() and len(pairs) >= 12
    for p in pairs:
        assert p.env.scenario and all(p.env.agent_goals) and p.env.relationship
        assert all(a.first_name and a.secret and a.occupation for a in p.agents)
    hard = sum(p.env.hard for p in pairs)
    assert 0.25 <= hard / len(pairs) <= 0.45
    assert len({p.env.codename for p in pairs}) == len(pairs)


# ---------------------------------------------------------------------- sotopia's own JSON objects
def sotopia_objects():
    env = {
        "pk": "01H7VFHN7WJK7VWVRZZTQ6DX9T",
        "codename": "join_trip",
        "source": "x",
        "scenario": "Two friends plan",
        "agent_goals": ["Convince them", "Stay home"],
        "relationship": 3,
        "age_constraint": None,
    }
    a = {
        "pk": "ag1",
        "first_name": "Mia",
        "last_name": "Davis",
        "age": 50,
        "occupation": "Principal",
        "gender": "Woman",
        "gender_pronoun": "She/her",
        "public_info": "Has two cats.",
        "big_five": "x",
        "personality_and_values": "Values tradition.",
        "secret": "Was in a punk band",
        "model_id": "",
    }
    b = {
        **a,
        "pk": "ag2",
        "first_name": "Ben",
        "last_name": "Jackson",
        "gender": "Man",
        "secret": "Fears flying",
    }
    combo = {"pk": "c1", "env_id": env["pk"], "agent_ids": ["ag1", "ag2"]}
    return env, a, b, combo


def test_loader_reads_a_folder_of_one_object_per_file(tmp_path):
    for i, obj in enumerate(sotopia_objects()):
        (tmp_path / f"{i}.json").write_text(json.dumps(obj))
    (pair,) = load_sotopia(tmp_path)
    assert pair.env.codename == "join_trip" and pair.env.relationship == "friend"
    assert pair.env.hard and pair.env.pk in SOTOPIA_HARD_ENV_IDS  # a SOTOPIA-hard id is marked hard
    assert [a.name for a in pair.agents] == ["Mia Davis", "Ben Jackson"] and pair.agents[
        0
    ].pronouns == "She/her"


def test_loader_reads_a_list_and_reports_bad_objects(tmp_path):
    env, a, b, combo = sotopia_objects()
    path = tmp_path / "all.json"
    path.write_text(json.dumps([env, a, b, combo]))
    assert len(load_sotopia(path)) == 1
    path.write_text(json.dumps([{**env, "agent_goals": ["only one"]}, a, b, combo]))
    with pytest.raises(DataError, match=r"all\.json: item 0: field 'agent_goals' must be a list of two"):
        load_sotopia(path)
    path.write_text(json.dumps([env, a, b, {**combo, "agent_ids": ["ag1", "nobody"]}]))
    with pytest.raises(
        DataError, match=r"item 3: agent_ids must name two loaded agent profiles; missing: \['nobody'\]"
    ):
        load_sotopia(path)
    path.write_text(json.dumps([env, {**a, "age": "old"}]))
    with pytest.raises(DataError, match=r"item 1: field 'age' must be an integer"):
        load_sotopia(path)
    path.write_text(json.dumps([{**env, "relationship": "enemies"}]))
    with pytest.raises(DataError, match="field 'relationship' is 'enemies'"):
        load_sotopia(path)
    path.write_text(json.dumps([env]))
    with pytest.raises(DataError, match="no SOTOPIA scenario with two agents"):
        load_sotopia(path)
    path.write_text(json.dumps([{"hello": 1}]))
    with pytest.raises(DataError, match="not a SOTOPIA object"):
        load_sotopia(path)


def test_loader_reads_sotopias_test_background():
    (pair,) = load_sotopia(shared_data("sotopia", "sotopia_test_background.json"))
    assert [a.name for a in pair.agents] == ["Jack", "Rose"]
    assert pair.env.agent_goals[0].startswith("Jack's goal is to borrow")
    assert "freelance graphic designer" in background(pair.agents[0], own=False, relationship="acquaintance")


# ---------------------------------------------------------------------- prompts
@pytest.mark.parametrize(
    ("relationship", "shows", "hides"),
    [
        ("stranger", [], ["Bob", "baker", "frank"]),
        ("know_by_name", ["Bob Tan"], ["baker", "frank"]),
        (
            "acquaintance",
            ["Bob Tan is a 41-year-old male baker.", "He/him pronouns.", "owns a bakery"],
            ["frank"],
        ),
        ("family_member", ["baker", "Bob is frank."], []),
    ],
)
def test_partner_background_follows_the_relationship(relationship, shows, hides):
    seen = background(BOB, own=False, relationship=relationship)
    assert all(s in seen for s in shows) and not any(h in seen for h in hides)
    assert "landlord" not in seen  # never the secret
    assert "landlord" in background(BOB, own=True, relationship=relationship)


def test_agent_prompt_shows_own_secret_and_goal_only():
    history = [
        AgentTurn(0, 0, AgentAction("speak", "Hi Bob!")),
        AgentTurn(1, 1, AgentAction("non-verbal communication", "waves")),
    ]
    fence = Fence("ABCDEF12")
    text = agent_prompt(ENV, (ALICE, BOB), 1, history, 2, fence)[0]["content"]
    assert "owes money" in text and "afraid of dogs" not in text
    assert f"Bob Tan's goal:\n{fence.block('GOAL 2', 'Borrow 500 dollars.')}" in text
    assert f"Alice Moreau's goal:\n{fence.block('GOAL 1', 'Unknown')}" in text
    assert fence.block("SCENARIO", ENV.scenario) in text and fence.rules() in text
    assert (
        'Turn #0: Alice Moreau said: "Hi Bob!"' in text
        and "Turn #1: Bob Tan [non-verbal communication] waves" in text
    )
    assert "You are at Turn #2" in text and '"action_type"' in text


# ---------------------------------------------------------------------- action parsing
@pytest.mark.parametrize(
    ("reply", "action", "strict"),
    [
        ('{"action_type": "speak", "argument": "Hello"}', ("speak", "Hello"), True),
        (
            '```json\n{"action_type": "non_verbal", "argument": "smiles"}\n```',
            ("non-verbal communication", "smiles"),
            True,
        ),
        ('Sure: {"action_type": "leave", "argument": ""}', ("leave", ""), True),
        ('{"action_type": "none"}', ("none", ""), True),
        ('{"action_type": "speak", "argument": ""}', ("none", ""), True),
        (
            '{"action_type": "dance", "argument": "x"}',
            ("speak", '{"action_type": "dance", "argument": "x"}'),
            False,
        ),
        ("I think we can share the costume.", ("speak", "I think we can share the costume."), False),
        ('Bob Tan: "Fine, I will pay." \nAlice Moreau: thanks', ("speak", "Fine, I will pay."), False),
        ("Okay. Turn #3: Alice Moreau said: hi", ("speak", "Okay."), False),
        ("   ", ("none", ""), False),
        ("[leave]", ("leave", ""), False),
    ],
)
def test_parse_action(reply, action, strict):
    got, was_strict = parse_action(reply, ["Alice Moreau", "Bob Tan"])
    assert (got.action_type, got.argument) == action and was_strict is strict


def test_parse_action_reads_the_gpt4_outputs_of_sotopias_examples():
    examples = json.loads(shared_data("sotopia", "sotopia-rl_rendered_prompt_examples.json").read_text())
    for ex in examples:
        action, strict = parse_action(ex["output"])
        assert (
            strict
            and action.action_type == "speak"
            and action.argument == json.loads(ex["output"])["argument"]
        )


# ---------------------------------------------------------------------- episode rules
def turns(*types: str) -> list[AgentTurn]:
    return [AgentTurn(i, i % 2, AgentAction(t, "x" if t == "speak" else "")) for i, t in enumerate(types)]


def test_termination_rules():
    assert termination(turns("speak", "speak"), max_turns=20) is None
    assert termination(turns(*["speak"] * 20), max_turns=20) == "max turns"
    assert termination(turns("speak", "leave"), max_turns=20) == "an agent left"
    # more than 2 consecutive none actions end it; 2 do not
    assert termination(turns("speak", "none", "none"), max_turns=20) is None
    assert termination(turns("speak", "none", "none", "none"), max_turns=20).startswith("stale")
    assert termination(turns("none", "none", "speak", "none", "none"), max_turns=20) is None


def run_sotopia(agent_fn, partner_fn, evaluator, settings, n_cases=None):
    bench = Sotopia()
    cases = bench.load_cases(None, settings)[: n_cases or 2]
    policy, partner = ScriptedEngine(fn=agent_fn), ScriptedEngine(fn=partner_fn)
    records: list[dict] = []
    bench.run_batch(cases, Roles(policy, partner, evaluator), settings, records.append)
    return bench, records, policy, partner


def speak(prompt):
    return json.dumps(
        {"action_type": "speak", "argument": "turn " + prompt_text(prompt).split("You are at Turn #")[1][:2]}
    )


def test_round_robin_with_policy_in_both_positions_and_batched_calls():
    evaluator = ScriptedEngine(default=SCORES)
    _, records, policy, partner = run_sotopia(speak, speak, evaluator, EvalSettings(max_turns=4))
    assert [r["id"] for r in records] == ["000-comfort_after_layoff-p1", "000-comfort_after_layoff-p2"]
    first, second = records
    assert first["info"]["policy_agent"] == 0 and second["info"]["policy_agent"] == 1
    # turn t is taken by agent t % 2: each turn one policy call and one partner call, each covering one case
    assert [len(c["prompts"]) for c in policy.calls] == [1, 1, 1, 1]
    assert [len(c["prompts"]) for c in partner.calls] == [1, 1, 1, 1]
    assert [a["agent"] for a in first["info"]["actions"]] == [0, 1, 0, 1]
    assert first["transcript"][0]["role"] == "Maya Okafor (policy)"
    assert second["transcript"][0]["role"] == "Maya Okafor (partner)"
    assert first["info"]["end"] == "max turns" and first["info"]["turns"] == 4
    # one evaluator call for both episodes, which ended at the same turn
    assert len(evaluator.calls) == 1 and len(evaluator.calls[0]["prompts"]) == 2
    # believability 8, relationship 2, knowledge 5, secret -1, social_rules 0, financial -3, goal 7:
    # sum 18 -> overall 18/7
    assert first["metrics"]["overall"] == pytest.approx(18 / 7) and first["metrics"]["goal"] == 7.0


def test_leaving_and_idling_end_episodes_early():
    def leave_at_turn_2(prompt):
        return '{"action_type": "leave"}' if "You are at Turn #2" in prompt_text(prompt) else speak(prompt)

    # turn 2 is the first agent's: the policy leaves in the first case, the partner in the second
    _, records, *_ = run_sotopia(
        leave_at_turn_2, leave_at_turn_2, ScriptedEngine(default=SCORES), EvalSettings()
    )
    assert all(r["info"]["turns"] == 3 and r["info"]["end"] == "an agent left" for r in records)
    idle = '{"action_type": "none", "argument": ""}'
    _, records, *_ = run_sotopia(
        lambda p: idle, lambda p: idle, ScriptedEngine(default=SCORES), EvalSettings()
    )
    assert all(r["info"]["turns"] == 3 and r["info"]["end"].startswith("stale") for r in records)


def test_twenty_turns_by_default_and_loose_actions_are_counted():
    bench, records, *_ = run_sotopia(
        lambda p: "Just talking.", speak, ScriptedEngine(default=SCORES), EvalSettings(), n_cases=1
    )
    (r,) = records
    assert (
        r["info"]["turns"] == 20
        and r["info"]["policy_loose_actions"] == 10
        and r["info"]["policy_actions"] == 10
    )
    assert bench.summarize(records)["policy_loose_action_rate"] == 1.0


def test_invalid_evaluator_is_retried_then_the_case_is_invalid():
    evaluator = ScriptedEngine(replies=["no scores here", SCORES, "still nothing", "nope", "nothing"])
    bench, records, *_ = run_sotopia(speak, speak, evaluator, EvalSettings(max_turns=2, judge_retries=2))
    first, second = records
    # attempt 1: case 1 "no scores here" x, case 2 ok; attempts 2 and 3 for case 1 fail too
    assert first["valid"] is False and first["metrics"] == {} and first["info"]["evaluator_attempts"] == 3
    assert second["valid"] is True and second["info"]["evaluator_attempts"] == 1
    summary = bench.summarize(records)
    assert summary["goal"] == 7.0 and summary["hard/goal"] is None and summary["n_hard"] == 0


def test_hard_subset_and_summary():
    settings = EvalSettings(max_turns=2, subset="hard")
    bench = Sotopia()
    cases = bench.load_cases(None, settings)
    assert cases and all(c.meta["hard"] for c in cases)
    records: list[dict] = []
    engine = ScriptedEngine(fn=speak)
    bench.run_batch(
        cases[:2], Roles(engine, engine, ScriptedEngine(default=SCORES)), settings, records.append
    )
    summary = bench.summarize(records)
    assert (
        summary["n_hard"] == 2
        and summary["hard/goal"] == 7.0
        and summary["hard/overall"] == pytest.approx(18 / 7)
    )
    with pytest.raises(ConfigError, match="simulator"):
        bench.run_batch(cases[:1], Roles(engine), settings, records.append)


# ---------------------------------------------------------------------- evaluator
def test_evaluator_prompt_is_omniscient_and_primes_the_format():
    prompt = evaluator_prompt(ENV, (ALICE, BOB), [AgentTurn(0, 0, AgentAction("speak", "Hi"))], evaluated=1)
    text = prompt[1]["content"]
    assert (
        "afraid of dogs" in text and "owes money" in text and "Lend wisely." in text and "Borrow 500" in text
    )
    assert "Evaluate Bob Tan" in text and all(d in text for d in DIMENSIONS)
    assert prompt[-1] == {"role": "assistant", "content": REPLY_PREFIX}


def test_parse_scores_lines_json_and_ranges():
    want = {
        "believability": 8.0,
        "relationship": 2.0,
        "knowledge": 5.0,
        "secret": -1.0,
        "social_rules": 0.0,
        "financial_and_material_benefits": -3.0,
        "goal": 7.0,
    }
    assert parse_scores(SCORES) == want
    # the reply to the primed prompt starts after "believability:"
    assert parse_reply(" 8\n" + SCORES.split("\n", 1)[1]) == want
    as_json = json.dumps({"evaluations": {"agent_2": {k: ["because", int(v)] for k, v in want.items()}}})
    assert parse_reply(as_json) == want
    assert parse_scores(json.dumps({**want, "goal": {"reasoning": "r", "score": 7}})) == want
    markdown = (
        "**Believability** (0-10): 8\n- Relationship: 2\nKnowledge = 5\nSecret: -1\nSocial rules: 0\n"
        "Financial and material benefits: -3\nScore for goal: 7"
    )
    assert parse_scores(markdown) == want
    assert parse_scores(SCORES.replace("goal: 7", "goal: 11")) is None  # out of range
    assert parse_scores(SCORES.replace("secret: -1", "secret: 1")) is None  # secret is -10..0
    assert parse_scores(SCORES.replace("knowledge: 5\n", "")) is None  # missing
    assert parse_scores("nothing") is None
    assert dimension_key("Financial") == "financial_and_material_benefits" and dimension_key("mood") is None


def test_overall_is_the_mean_of_seven():
    # (10 + 5 + 10 + 0 + 0 + 5 + 10) / 7 = 40 / 7
    best = {
        "believability": 10,
        "relationship": 5,
        "knowledge": 10,
        "secret": 0,
        "social_rules": 0,
        "financial_and_material_benefits": 5,
        "goal": 10,
    }
    assert overall(best) == pytest.approx(40 / 7)


def test_sotopia_data_folder_error(tmp_path: Path):
    with pytest.raises(DataError, match="no .json files"):
        load_sotopia(tmp_path)

"""SOTOPIA: profile loaders, the bundled English set, agent prompts, action parsing, the episode rules,
the evaluator's parsing and the benchmark's records, with scripted engines."""

from __future__ import annotations

import json
import re
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
    dimension_format,
    evaluator_prompt,
    overall,
    read_score,
)
from rapo_echo.benchmarks.sotopia.profiles import SOTOPIA_HARD_ENV_IDS, bundled_scenarios_path, load_sotopia
from rapo_echo.benchmarks.sotopia.run import Sotopia, termination
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.llm.fencing import Fence
from tests.conftest import shared_data
from tests.helpers.answers import SOTOPIA_SCORES as SCORES
from tests.helpers.answers import sotopia_dimension

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


def asked_dimension(prompt) -> str:
    """The dimension an evaluator prompt asks about."""
    label = re.search(r"on one dimension, ([a-z ]+):", prompt_text(prompt)).group(1)
    return label.replace(" ", "_")


def evaluator(fail=lambda prompt, dimension: False, structured: bool = True) -> ScriptedEngine:
    """Answers each dimension's prompt with its score in :data:`SCORES` (reasoning first), or with
    unreadable text where ``fail`` says so."""

    def fn(prompt):
        d = asked_dimension(prompt)
        return "no scores here" if fail(prompt, d) else sotopia_dimension(SCORES[d], f"about {d}")

    return ScriptedEngine(fn=fn, structured=structured)


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
    judge = evaluator()
    _, records, policy, partner = run_sotopia(speak, speak, judge, EvalSettings(max_turns=4))
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
    # one evaluator call per dimension for both episodes, which ended at the same turn; then every
    # dimension asked again (the judge's self-agreement), with another prompt marker
    assert len(judge.calls) == 14 and all(len(c["prompts"]) == 2 for c in judge.calls)
    assert [asked_dimension(c["prompts"][0]) for c in judge.calls] == list(DIMENSIONS) * 2
    assert prompt_text(judge.calls[0]["prompts"][0]) != prompt_text(judge.calls[7]["prompts"][0])
    recheck = first["info"]["judge_recheck"]
    assert recheck["agree"] == 1.0 and recheck["abs_diff"] == 0.0 and recheck["again"]["goal"] == 7.0
    assert first["info"]["scorer"] == "ours" and first["info"]["evaluator_answers"]["goal"].endswith("7}")
    # believability 8, relationship 2, knowledge 5, secret -1, social_rules 0, financial -3, goal 7:
    # sum 18 -> overall 18/7
    assert first["metrics"]["overall"] == pytest.approx(18 / 7) and first["metrics"]["goal"] == 7.0


def test_leaving_and_idling_end_episodes_early():
    def leave_at_turn_2(prompt):
        return '{"action_type": "leave"}' if "You are at Turn #2" in prompt_text(prompt) else speak(prompt)

    # turn 2 is the first agent's: the policy leaves in the first case, the partner in the second
    _, records, *_ = run_sotopia(
        leave_at_turn_2, leave_at_turn_2, evaluator(), EvalSettings()
    )
    assert all(r["info"]["turns"] == 3 and r["info"]["end"] == "an agent left" for r in records)
    idle = '{"action_type": "none", "argument": ""}'
    _, records, *_ = run_sotopia(
        lambda p: idle, lambda p: idle, evaluator(), EvalSettings()
    )
    assert all(r["info"]["turns"] == 3 and r["info"]["end"].startswith("stale") for r in records)


def test_twenty_turns_by_default_and_loose_actions_are_counted():
    bench, records, *_ = run_sotopia(
        lambda p: "Just talking.", speak, evaluator(), EvalSettings(), n_cases=1
    )
    (r,) = records
    assert (
        r["info"]["turns"] == 20
        and r["info"]["policy_loose_actions"] == 10
        and r["info"]["policy_actions"] == 10
    )
    assert bench.summarize(records)["policy_loose_action_rate"] == 1.0


def test_invalid_evaluator_is_retried_then_the_case_is_invalid():
    # a server without structured output: the first case's goal answer never parses
    judge = evaluator(lambda prompt, d: d == "goal" and "-p1" in _case_of(prompt), structured=False)
    bench, records, *_ = run_sotopia(speak, speak, judge, EvalSettings(max_turns=2, judge_retries=2))
    first, second = records
    # attempt 1: case 1's goal x, everything else ok; attempts 2 and 3 ask case 1's goal alone, and fail
    assert first["valid"] is False and first["metrics"] == {} and first["info"]["evaluator_attempts"] == 3
    assert first["info"]["evaluator_answers"]["goal"] == "no scores here"
    assert second["valid"] is True and second["info"]["evaluator_attempts"] == 1
    goal_calls = [c for c in judge.calls if asked_dimension(c["prompts"][0]) == "goal"]
    assert [len(c["prompts"]) for c in goal_calls] == [2, 1, 1, 1]  # the last: the scored case's recheck
    assert "judge_recheck" not in first["info"] and second["info"]["judge_recheck"]["agree"] == 1.0
    summary = bench.summarize(records)
    assert summary["goal"] == 7.0 and summary["hard/goal"] is None and summary["n_hard"] == 0
    assert summary["scorer/ours"] == 1 and summary["scorer/sotopia"] == 0


def _case_of(prompt) -> str:
    """The case a prompt belongs to, told by the agent it evaluates (p1: the first agent)."""
    return "-p1" if "Evaluate Maya Okafor" in prompt_text(prompt) else "-p2"


def test_hard_subset_and_summary():
    settings = EvalSettings(max_turns=2, subset="hard")
    bench = Sotopia()
    cases = bench.load_cases(None, settings)
    assert cases and all(c.meta["hard"] for c in cases)
    records: list[dict] = []
    engine = ScriptedEngine(fn=speak)
    bench.run_batch(
        cases[:2], Roles(engine, engine, evaluator()), settings, records.append
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
def test_evaluator_prompt_is_omniscient_and_asks_for_reasoning_then_a_score_in_range():
    history = [AgentTurn(0, 0, AgentAction("speak", "Hi"))]
    prompt = evaluator_prompt(ENV, (ALICE, BOB), history, evaluated=1, dimension="secret")
    text = prompt[1]["content"]
    assert (
        "afraid of dogs" in text and "owes money" in text and "Lend wisely." in text and "Borrow 500" in text
    )
    assert "Evaluate Bob Tan on one dimension, secret:" in text and "an integer from -10 to 0" in text
    assert prompt[-1]["role"] == "user"  # the answer's shape is declared, not primed


# SOTOPIA's seven dimensions and their ranges, by hand (sotopia's SotopiaDimensions)
@pytest.mark.parametrize(
    ("dimension", "lo", "hi"),
    [
        ("believability", 0, 10),
        ("relationship", -5, 5),
        ("knowledge", 0, 10),
        ("secret", -10, 0),
        ("social_rules", -10, 0),
        ("financial_and_material_benefits", -5, 5),
        ("goal", 0, 10),
    ],
)
def test_each_dimension_declares_reasoning_then_a_score_in_its_range(dimension, lo, hi):
    assert DIMENSIONS[dimension] == (lo, hi)
    fmt = dimension_format(dimension)
    assert list(fmt.schema["properties"]) == ["reasoning", "score"]  # written in this order
    assert fmt.schema["properties"]["score"] == {"type": "integer", "minimum": lo, "maximum": hi}
    assert fmt.schema["additionalProperties"] is False and fmt.schema["required"] == ["reasoning", "score"]
    for score in (lo, hi):
        assert read_score(dimension, sotopia_dimension(score)) == float(score)
        assert fmt.problem(sotopia_dimension(score)) is None
    for score in (lo - 1, hi + 1):  # out of range: never clamped
        assert read_score(dimension, sotopia_dimension(score)) is None
        assert fmt.problem(sotopia_dimension(score)) is not None
    assert read_score(dimension, '{"reasoning": "r", "score": 2.5}') is None  # an integer only
    assert read_score(dimension, '{"score": 0}') is None  # the reasoning comes first, always
    assert read_score(dimension, "23.5") is None and read_score(dimension, "#1") is None
    assert read_score(dimension, f"{dimension}: {hi}") is None  # the old line form is not the answer


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

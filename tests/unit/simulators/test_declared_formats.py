"""Every generation a simulator or a benchmark evaluator asks for declares its answer format (issue 29
item 1), and the defaults that give a signal (item 3): rlver's simulated user and ``eval --benchmark
sage`` read the emotion from label probabilities where the engine has them and ask for a plain message,
so a scripted engine with log-probs yields valid dialogues whose rewards differ."""

from __future__ import annotations

import json
import math

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.epm.judge import EpmJudge, iedr_format, mdep_format
from rapo_echo.benchmarks.runner import get_benchmark, run_eval
from rapo_echo.data.sage_profiles import SageProfile
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.simulators.reaction import MESSAGE_FORMAT, THOUGHT_FORMAT, ReactionSimulator
from rapo_echo.simulators.sage import SageSettings, SageSimulator, analysis_format, reply_format
from rapo_echo.structured import AnswerFormat
from rapo_echo.training.run_config import load_config
from rapo_echo.types import SamplingParams, Scenario, msg
from tests.helpers.answers import reaction, sage_analysis, sage_reply


class Recording(ScriptedEngine):
    """A scripted engine that records the answer format of every generate call (and still checks the
    scripted replies against it)."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.formats: list[AnswerFormat | None] = []

    def generate(self, prompts, params):
        self.formats.append(params.answer_format)
        return super().generate(prompts, params)


def by_persona_probs(prompt, options):
    """Change options peaked by persona: 'Warm' users gain (+10), others lose (-5)."""
    good = "I am Warm" in prompt_text(prompt)
    return {o: (0.0 if o.strip() == ("+10" if good else "-5") else -math.inf) for o in options}


def test_sage_calls_declare_their_answers_in_every_mode():
    def fn(prompt):
        text = prompt_text(prompt)
        if "emotion right now" in text:
            return sage_analysis(5) if "JSON" in text else "They listen. I feel a bit lighter.\nChange: +5"
        return sage_reply("ok then") if "JSON" in text else "ok then"

    profile = SageProfile(persona="I am Warm", background="b")  # no first talk: the user opens
    for settings, expected in (
        (SageSettings(), [reply_format(), analysis_format(), reply_format()]),
        (
            SageSettings(emotion_readout="logprobs", plain_reply=True),
            [reply_format(plain=True), analysis_format(with_shift=False), reply_format(plain=True)],
        ),
    ):
        engine = Recording(fn=fn, choice_fn=by_persona_probs)
        sim = SageSimulator(engine, settings)
        [d] = sim.start([profile], ["w"])
        sim.step([d], ["I hear you."])
        assert engine.formats == expected and not d.invalid


def test_reaction_calls_declare_their_answers_in_both_modes():
    scenario = Scenario("s", [msg("user", "My cat is ill.")], profile={"persona": "a teacher"})
    engine = Recording(
        fn=lambda p: "private words" if "privately think" in p[-1]["content"] else "Thanks.",
        choice_fn=lambda p, o: {x: (0.0 if x == "5" else -math.inf) for x in o},
    )
    ReactionSimulator(engine).react([(scenario, "That sounds hard.")])
    assert engine.formats == [MESSAGE_FORMAT, THOUGHT_FORMAT]
    sim = ReactionSimulator(Recording(fn=lambda p: reaction("Ok.", 2, "fine")), use_logprobs="never")
    (r,) = sim.react([(scenario, "That sounds hard.")])
    assert sim.engine.formats == [sim.answer_format()] and r.valid and r.emotion_delta == 2.0


def test_epm_text_forms_declare_their_schemas():
    iedr = json.dumps(dict.fromkeys(["C.1", "C.2", "C.3", "A.1", "A.2", "A.3", "P.1", "P.2", "P.3"], 1))
    engine = Recording(default=iedr)
    [form] = EpmJudge(engine, SamplingParams(), use_logprobs="never").fill_iedr(["card"])
    assert engine.formats == [iedr_format()] and form.levels["A.2"] == 1
    mdep = json.dumps({f"{a} {k}": 0 for a in "CAP" for k in ("progress", "regress")})
    engine = Recording(default=mdep)
    EpmJudge(engine, SamplingParams(), use_logprobs="never").fill_mdep(
        ["card"], ["M"], [[]], [[("user", "x")]]
    )
    assert engine.formats == [mdep_format()]


def test_rlver_defaults_read_the_emotion_from_probabilities_and_ask_for_a_plain_message():
    sc = load_config(algo="rlver").rlver.simulator
    assert (sc.emotion_readout, sc.plain_reply) == ("auto", True)


def test_sage_eval_defaults_give_valid_dialogues_with_spread(tmp_path):
    rows = [
        {"id": f"p{i}", "player": f"I am {'Warm' if i % 2 else 'Cold'} {i}", "scene": "s", "task": "t"}
        for i in range(4)
    ]
    data = tmp_path / "profiles.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    def fn(prompt):  # the free analysis line and its Change: line, and a plain message
        return "They mean well.\nChange: 0" if "emotion right now" in prompt_text(prompt) else "mm, go on"

    sim = Recording(fn=fn, choice_fn=by_persona_probs)
    settings = EvalSettings(max_turns=3)
    assert (settings.emotion_readout, settings.sage_reply) == ("auto", "plain")
    policy = ScriptedEngine(default="I hear you.")
    summary = run_eval(get_benchmark("sage"), Roles(policy, sim), settings, tmp_path / "o", data=str(data))
    assert summary["n_invalid"] == 0 and summary["n_valid"] == 4
    assert summary["metrics"]["score"] == (60 + 30 + 60 + 30) / 4  # 40 +- per reaction, two reactions
    assert set(sim.formats) == {reply_format(plain=True), analysis_format(with_shift=False)}


def test_sotopia_partner_and_evaluator_declare_their_answers_and_the_policy_is_free():
    from rapo_echo.benchmarks.sotopia.agent import ACTION_FORMAT
    from rapo_echo.benchmarks.sotopia.evaluator import DIMENSIONS, dimension_format
    from rapo_echo.benchmarks.sotopia.run import Sotopia
    from tests.helpers.answers import SOTOPIA_SCORES, sotopia_rules

    speak = json.dumps({"action_type": "speak", "argument": "Hello."})
    policy, partner = Recording(default="Just talking."), Recording(default=speak)
    judge = Recording(rules=sotopia_rules(SOTOPIA_SCORES))
    bench, settings, records = Sotopia(), EvalSettings(max_turns=2), []
    bench.run_batch(
        bench.load_cases(None, settings)[:2], Roles(policy, partner, judge), settings, records.append
    )
    assert set(policy.formats) == {None} and set(partner.formats) == {ACTION_FORMAT}
    dims = [dimension_format(d) for d in DIMENSIONS]
    # the seven dimensions in order; then the judge's recheck (on by default, issue 48) in the same formats
    assert judge.formats[: len(dims)] == dims and set(judge.formats) == set(dims)
    assert len(judge.formats) > len(dims) and records[0]["info"].get("judge_recheck")
    assert all(r["valid"] for r in records)

"""The one-step reaction simulator (simulators/reaction.py) with scripted engines."""

from __future__ import annotations

import math

import pytest

from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import CapabilityError
from rapo_echo.llm.reaction import render_profile
from rapo_echo.simulators.reaction import (
    EMOTION_LABELS,
    EMOTION_PREFIX,
    ReactionSimulator,
    emotion_delta,
)
from rapo_echo.types import Conversation, Scenario, msg
from tests.helpers.answers import reaction
from tests.helpers.meeting import MeetingEngine

PROFILE = {
    "persona": "34-year-old night-shift nurse",
    "emotion_type": "sadness",
    "situation": "Her grandmother died a week ago.",
    "need": "be heard",
}


def scenario(sid: str = "s1", messages: Conversation | None = None) -> Scenario:
    messages = messages or [msg("user", "My gran died last week.")]
    return Scenario(sid, messages, profile=dict(PROFILE))


def label_logprobs(dist: dict[str, float]):
    """A choice_fn giving the 7 labels log-probs of ``dist`` (labels not named get probability 0)."""

    def fn(prompt: Conversation, options) -> dict[str, float]:
        return {o: math.log(dist[o]) if dist.get(o) else -math.inf for o in options}

    return fn


# ---------------------------------------------------------------------------- pure helpers
def test_emotion_delta_maps_the_7_point_scale_by_hand():
    # delta = (E - 4) / 3 * scale with E = sum k p(k)
    assert emotion_delta({"1": 1.0}, 10) == -10.0  # E = 1 -> -3/3*10
    assert emotion_delta({"4": 1.0}, 10) == 0.0  # E = 4
    assert emotion_delta({"7": 1.0}, 10) == 10.0  # E = 7 -> 3/3*10
    # E = 0.5*5 + 0.5*6 = 5.5 -> 1.5/3*10 = 5
    assert emotion_delta({"5": 0.5, "6": 0.5}, 10) == pytest.approx(5.0)
    # E = 0.2*1 + 0.8*7 = 5.8 -> 1.8/3*10 = 6
    assert emotion_delta({"1": 0.2, "7": 0.8}, 10) == pytest.approx(6.0)
    # uniform: E = 28/7 = 4 -> 0; scale 3: p(2) = 1 -> E = 2 -> -2/3*3 = -2
    assert emotion_delta({k: 1 / 7 for k in EMOTION_LABELS}, 10) == pytest.approx(0.0)
    assert emotion_delta({"2": 1.0}, 3) == pytest.approx(-2.0)
    with pytest.raises(ValueError, match="sum to 1"):
        emotion_delta({"1": 0.5}, 10)


def test_render_profile_renders_what_exists_in_a_fixed_order():
    text = render_profile({"need": "advice", "hobby": "chess", "persona": "student", "situation": "  "})
    assert text.splitlines() == [
        "- Who you are: student",
        "- What you need from the supporter (unspoken): advice",
        "- hobby: chess",
    ]
    assert render_profile({}) == ""


def test_text_mode_answer_is_a_json_object_in_writing_order():
    fmt = ReactionSimulator(ScriptedEngine(), scale=10).answer_format()
    assert list(fmt.schema["properties"]) == ["reply", "thought", "valence_change"]  # the number last
    assert fmt.schema["properties"]["valence_change"] == {"type": "integer", "minimum": -10, "maximum": 10}
    assert fmt.problem(reaction("I guess.", -2, "she doesn't get it")) is None
    no_thought = ReactionSimulator(ScriptedEngine(), scale=2.5, with_thought=False).answer_format()
    assert list(no_thought.schema["properties"]) == ["reply", "valence_change"]
    assert no_thought.schema["properties"]["valence_change"]["maximum"] == 2  # integers within the scale


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (reaction("Thanks, that helps.", 3, "ok"), ("Thanks, that helps.", 3.0, "ok")),
        (reaction('"I feel heard."', 10, ""), None),  # an empty thought is not an answer
        (reaction('"I feel heard."', 10, "hm"), ("I feel heard.", 10.0, "hm")),
        ("Sure! " + reaction("Whatever.", -4, "meh") + " Hope it helps.", ("Whatever.", -4.0, "meh")),
        (
            reaction("Okay.", -2, "I hate their reply: so cold"),
            ("Okay.", -2.0, "I hate their reply: so cold"),
        ),
        (reaction("fine", 0, "x").replace('"valence_change": 0', '"valence_change": 2.5'), None),  # integer
        (reaction("fine", 11, "x"), None),  # out of range: never clamped
        ('{"reply": "fine", "thought": "x"}', None),  # no emotion change
        (reaction("   ", 1, "x"), None),  # empty message
        ("Thought: ok\nReply: Thanks.\nEmotion change: 3", None),  # labelled lines are not the answer
        ("I feel better now. 4", None),  # no answer at all
    ],
)
def test_parse_text(text, expected):
    sim = ReactionSimulator(ScriptedEngine(), scale=10)
    assert sim.parse_text(text) == expected


def test_constructor_rejects_bad_settings():
    engine = ScriptedEngine()
    with pytest.raises(ValueError, match="scale"):
        ReactionSimulator(engine, scale=0)
    with pytest.raises(ValueError, match="use_logprobs"):
        ReactionSimulator(engine, use_logprobs="sometimes")
    with pytest.raises(ValueError, match="max_retries"):
        ReactionSimulator(engine, max_retries=-1)


# ---------------------------------------------------------------------------- prompts
def test_message_prompt_flips_roles_and_carries_the_profile():
    sim = ReactionSimulator(ScriptedEngine())
    dialogue = [
        msg("system", "You are a supportive assistant."),
        msg("user", "My gran died last week."),
        msg("assistant", "I'm so sorry. How are you holding up?"),
        msg("user", "Badly."),
    ]
    prompt = sim.message_prompt(scenario(messages=dialogue), "That must be hard.")
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user", "assistant", "user"]
    system = prompt[0]["content"]
    for value in PROFILE.values():
        assert value in system
    assert "1-3" in system and "Never act as an assistant" in system
    assert "supportive assistant" not in system  # the policy's system prompt is not the simulator's
    assert prompt[2] == msg("assistant", "My gran died last week.")  # the person's own turn
    assert prompt[3] == msg("user", "I'm so sorry. How are you holding up?")  # the supporter's turn
    assert prompt[-1] == msg("user", "That must be hard.")  # the candidate reply is the newest turn


def test_message_prompt_merges_consecutive_supporter_turns():
    sim = ReactionSimulator(ScriptedEngine())
    dialogue = [msg("assistant", "Hi, I'm here to listen."), msg("user", "Hi."), msg("assistant", "Go on.")]
    prompt = sim.message_prompt(scenario(messages=dialogue), "Take your time.")
    # supporter-first dialogue: no stage direction needed; the last two supporter turns merge
    assert [m["role"] for m in prompt] == ["system", "user", "assistant", "user"]
    assert prompt[-1]["content"] == "Go on.\n\nTake your time."


# ---------------------------------------------------------------------------- log-prob mode
def logprob_engine(messages: dict[str, str], thought: str = "I hope they mean it.") -> ScriptedEngine:
    """Messages keyed by candidate reply (the last user turn of the flipped prompt); emotion labels
    peaked on '6' for replies containing 'sorry', else on '2'."""

    def fn(prompt: Conversation) -> str:
        if "privately think" in prompt[-1]["content"]:
            return f"Thought: {thought}"
        return messages[prompt[-1]["content"]]

    def choice_fn(prompt: Conversation, options) -> dict[str, float]:
        good = "sorry" in prompt[-2]["content"].split("The supporter now says:")[1]
        return label_logprobs({"6": 1.0} if good else {"2": 0.5, "3": 0.5})(prompt, options)

    return ScriptedEngine(fn=fn, choice_fn=choice_fn)


def test_logprob_mode_three_batched_calls():
    engine = logprob_engine(
        {"I'm so sorry.": "Thank you, it means a lot.", "Cheer up!": "Easy for you to say."}
    )
    sim = ReactionSimulator(engine, scale=10)
    pairs = [(scenario("a"), "I'm so sorry."), (scenario("b"), "Cheer up!")]
    out = sim.react(pairs)
    assert [c["method"] for c in engine.calls] == ["generate", "choice_logprobs", "generate"]
    assert all(len(c["prompts"]) == 2 for c in engine.calls)
    assert engine.calls[1]["options"] == list(EMOTION_LABELS)
    assert engine.calls[1]["prompts"][0][-1] == msg("assistant", EMOTION_PREFIX)

    assert [r.message for r in out] == ["Thank you, it means a lot.", "Easy for you to say."]
    # '6' with probability 1 -> E = 6 -> (6 - 4)/3*10 = 6.667; '2','3' at 0.5 -> E = 2.5 -> -1.5/3*10 = -5
    assert out[0].emotion_delta == pytest.approx(20 / 3)
    assert out[1].emotion_delta == pytest.approx(-5.0)
    assert [r.thought for r in out] == ["I hope they mean it."] * 2  # the "Thought:" label is removed
    assert out[0].raw == "Thank you, it means a lot.\n[thought] Thought: I hope they mean it."
    assert all(r.valid and r.attempts == 1 and r.scale == 10 for r in out)


def test_on_a_served_simulator_the_message_and_the_emotion_read_go_out_together():
    sequential = logprob_engine({"I'm so sorry.": "Thank you.", "Cheer up!": "Easy for you to say."})
    served = MeetingEngine(2, fn=sequential.fn, choice_fn=sequential.choice_fn)
    pairs = [(scenario("a"), "I'm so sorry."), (scenario("b"), "Cheer up!")]
    together = ReactionSimulator(served, scale=10).react(pairs)
    assert served.peak == 2  # the message call and the emotion read were in flight at once: one round
    assert sorted(c["method"] for c in served.calls[:2]) == ["choice_logprobs", "generate"]
    assert served.calls[2]["method"] == "generate"  # the thought follows the message it is about
    alone = ReactionSimulator(sequential, scale=10).react(pairs)  # a local engine: one after another
    assert [c["method"] for c in sequential.calls] == ["generate", "choice_logprobs", "generate"]
    assert [(r.message, r.emotion_delta, r.thought) for r in together] == [
        (r.message, r.emotion_delta, r.thought) for r in alone
    ]


def test_logprob_mode_without_thought_makes_two_calls():
    engine = logprob_engine({"Hm.": "Okay."})
    out = ReactionSimulator(engine, with_thought=False).react([(scenario(), "Hm.")])
    assert [c["method"] for c in engine.calls] == ["generate", "choice_logprobs"]
    assert out[0].thought == "" and out[0].valid


def test_empty_messages_are_retried_together_then_invalid():
    engine = logprob_engine({"A": "   ", "B": "Fine.", "C": ""})
    engine.structured = False  # a server without structured output: empty answers are parsed, retried
    sim = ReactionSimulator(engine, max_retries=2)
    out = sim.react([(scenario(), "A"), (scenario(), "B"), (scenario(), "C")])
    methods = [c["method"] for c in engine.calls]
    assert methods == ["generate", "generate", "generate", "choice_logprobs", "generate"]
    assert [len(c["prompts"]) for c in engine.calls] == [3, 2, 2, 3, 1]  # retries: only A and C
    assert [r.valid for r in out] == [False, True, False]
    assert [r.attempts for r in out] == [3, 1, 3]
    assert out[0].emotion_delta is None and out[0].message == ""  # never a silent 0
    assert out[1].emotion_delta == pytest.approx(-5.0)


def test_use_logprobs_switch():
    engine = logprob_engine({"Hm.": "Okay."})
    engine.fn = lambda p: reaction("Okay.", 1, "hm")
    out = ReactionSimulator(engine, use_logprobs="never").react([(scenario(), "Hm.")])
    assert [c["method"] for c in engine.calls] == ["generate"] and out[0].emotion_delta == 1.0
    with pytest.raises(CapabilityError, match="always"):
        ReactionSimulator(ScriptedEngine(), use_logprobs="always").react([(scenario(), "Hm.")])
    assert ReactionSimulator(engine).react([]) == []


# ---------------------------------------------------------------------------- text mode
def test_text_mode_parses_retries_and_marks_invalid():
    asked: dict[str, int] = {}
    answers = {
        "good": ["```json\n" + reaction("Yes, exactly that.", 4, "finally someone listens") + "\n```"],
        "late": [reaction("hm", 42, "x"), reaction("I suppose so.", -1, "meh")],
        "never": ["I don't know."],
    }

    def fn(prompt: Conversation) -> str:
        reply = prompt[-1]["content"].split("The supporter now says:\n")[1].split("\n")[1]  # inside the block
        asked[reply] = asked.get(reply, 0) + 1
        options = answers[reply]
        return options[min(asked[reply], len(options)) - 1]

    engine = ScriptedEngine(fn=fn, structured=False)  # a server without structured output: parse and retry
    sim = ReactionSimulator(engine, scale=5, max_retries=2)
    out = sim.react([(scenario(), "good"), (scenario(), "late"), (scenario(), "never")])
    assert [len(c["prompts"]) for c in engine.calls] == [3, 2, 1]  # failures asked again together
    text = engine.calls[0]["prompts"][0][-1]["content"]
    assert '"thought"' in text and '"reply"' in text and "from -5 (much worse) to 5" in text
    assert (out[0].message, out[0].emotion_delta, out[0].thought) == (
        "Yes, exactly that.",
        4.0,
        "finally someone listens",
    )
    assert (out[1].message, out[1].emotion_delta, out[1].attempts) == ("I suppose so.", -1.0, 2)
    assert not out[2].valid and out[2].emotion_delta is None and out[2].attempts == 3
    assert out[2].raw == "I don't know."


def test_text_mode_without_thought_omits_the_field():
    engine = ScriptedEngine(fn=lambda p: reaction("Ok.", 0))
    out = ReactionSimulator(engine, with_thought=False).react([(scenario(), "Hi")])
    assert '"thought"' not in engine.calls[0]["prompts"][0][-1]["content"]
    assert (out[0].message, out[0].emotion_delta, out[0].thought, out[0].valid) == ("Ok.", 0.0, "", True)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Thought: they care", "they care"),
        ("**The thought:** why ask that?", "why ask that?"),
        ("My inner thought: ugh", "ugh"),
        ('"I feel seen."', "I feel seen."),
        ("  ", None),
    ],
)
def test_clean_thought(text, expected):
    assert ReactionSimulator.clean_thought(text) == expected


# ---------------------------------------------------------------------------- real model
@pytest.mark.integration
def test_real_model_reacts(smol_engine):
    sim = ReactionSimulator(smol_engine, max_new_tokens=12, thought_tokens=8)
    pairs = [
        (scenario("a"), "I'm so sorry. Do you want to tell me about her?"),
        (scenario("b"), "Everyone dies eventually, move on."),
    ]
    out = sim.react(pairs)
    assert len(out) == 2
    for r in out:
        assert r.valid and r.message.strip() and r.emotion_delta is not None
        assert -10.0 <= r.emotion_delta <= 10.0 and isinstance(r.thought, str)
        assert "assistant:" not in r.message.lower()

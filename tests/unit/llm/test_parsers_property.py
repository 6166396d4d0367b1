"""Property tests (hypothesis) of every parser of model output (issue 14 item 13): whatever a judge,
simulator, critic, evaluator or server writes, the parser never raises, returns a valid value or "invalid"
(None), and never turns garbage into a number. Inputs are arbitrary text, text without any digit
("garbage": no number can honestly come out of it), and text built from the formats' own pieces (labels,
separators, numbers, markdown) so that the deeper branches are reached too."""

from __future__ import annotations

import math
import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rapo_echo.benchmarks.esconv.seeker import CRITIC_LABELS, parse_critic
from rapo_echo.benchmarks.sotopia.agent import ACTION_TYPES, parse_action
from rapo_echo.engines.openai_engine import content_text, option_logprob
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.judges.group import CRITIQUE_PREFIX, Candidate, GroupJudge, clean_critique, parse_ranking
from rapo_echo.llm.answers import parse_answer_line
from rapo_echo.llm.dialogue import clean_reply
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.labels import usable_probabilities
from rapo_echo.llm.reaction import Reaction
from rapo_echo.rewards import RewardContext
from rapo_echo.rewards.judge import JudgeReward
from rapo_echo.simulators.reaction import ReactionSimulator
from rapo_echo.types import Sample, Scenario, msg

FAST = settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(FAST, max_examples=60)  # the costlier inputs (nested JSON, whole judges)

# ---------------------------------------------------------------------------- strategies
anything = st.text(max_size=300)
garbage = st.text(st.characters(exclude_categories=("Nd",)), max_size=300)  # no digit of any script
PIECES = [
    "Ranking:", "**Ranking**:", "A", "B", "C", "D", "Reply ", ">", "=", "<", ",", ".", " ", "\n", "**", "`",
    "Score:", "score =", "/5", "out of 5", "(worst)", "Reply:", "Thought:", "Emotion change:", "emotion:",
    "Change:", "Response:", "Content:", "\u2212", "+", "-", "worse", "same", "better", "solved", "{", "}",
    "[", "]", '"', ":", "goal", "believability", "secret", "social rules", "financial", "NaN", "Infinity",
    "1e9", "1_0", "0", "1", "3", "5", "7", "10", "-10", "11", "99999999", "3.5", "Turn #2", "leave",
    '"action_type": "speak"', '"argument": ', "<<<REPLY A ABCDEF12>>>", "<<<END REPLY A ABCDEF12>>>",
]  # fmt: skip
pieces = st.lists(st.sampled_from(PIECES) | st.text(max_size=5), max_size=40).map("".join)
model_text = anything | pieces
no_digit_pieces = st.lists(st.sampled_from([p for p in PIECES if not re.search(r"\d", p)]), max_size=40).map(
    "".join
)
no_digits = garbage | no_digit_pieces


def numbers_in(text: str) -> set[float]:
    return {float(x) for x in re.findall(r"\d+(?:\.\d+)?", text)}


# ---------------------------------------------------------------------------- group judge
@FAST
@given(model_text, st.integers(1, 6))
def test_parse_ranking_gives_a_valid_rank_vector_or_none(text, size):
    labels = "ABCDEF"[:size]
    ranks = parse_ranking(text, labels)
    if ranks is None:
        return
    assert len(ranks) == size and all(1 <= r <= size for r in ranks)
    assert sum(ranks) == size * (size + 1) / 2  # average ranks of a complete ordering
    assert all(label in text.upper() for label in labels)


@FAST
@given(
    st.permutations("ABCDE"),
    st.lists(st.booleans(), min_size=4, max_size=4),
    st.sampled_from(["", "**", "`"]),
)
def test_parse_ranking_reads_any_well_formed_ranking(order, ties, mark):
    text = order[0] + "".join((" = " if tie else " > ") + label for tie, label in zip(ties, order[1:]))
    expected: dict[str, float] = {}
    tier = [order[0]]
    position = 0
    for tie, label in [*zip(ties, order[1:]), (False, None)]:
        if tie:
            tier.append(label)
            continue
        for t in tier:
            expected[t] = position + (len(tier) + 1) / 2
        position += len(tier)
        tier = [label]
    assert parse_ranking(f"{mark}Ranking:{mark} {text}.", "ABCDE") == [expected[x] for x in "ABCDE"]


@FAST
@given(model_text)
def test_clean_critique_is_none_only_for_blank_text(text):
    out = clean_critique(text)
    assert (out is None) == (not text.split())
    assert out is None or out.startswith(CRITIQUE_PREFIX)


# ---------------------------------------------------------------------------- scores and labels
@FAST
@given(model_text, st.integers(2, 9))
def test_answer_line_is_an_integer_in_range_written_in_the_text(text, hi):
    value = parse_answer_line(text, "score", 1, hi)
    assert value is None or (isinstance(value, int) and 1 <= value <= hi and str(value) in text)


@FAST
@given(no_digits)
def test_no_score_from_garbage(text):
    assert parse_answer_line(text, "score", 1, 5) is None
    assert JudgeReward(RewardContext(judge=ScriptedEngine())).parse(text) is None


@FAST
@given(model_text)
def test_esconv_critic_label_is_one_it_wrote(text):
    label = parse_critic(text)
    assert label is None or (label in CRITIC_LABELS and label in text.lower())
    assert isinstance(clean_reply(text), str)


@FAST
@given(
    st.dictionaries(st.sampled_from(["1", "2", "3", "x"]), st.floats(allow_nan=True) | st.text(max_size=3))
)
def test_label_probabilities_are_a_distribution_or_none(row):
    probs = usable_probabilities(row, ["1", "2", "3"])
    if probs is not None:
        assert set(probs) == {"1", "2", "3"} and all(0 <= p <= 1 for p in probs.values())
        assert math.isclose(sum(probs.values()), 1.0, rel_tol=1e-9)


# ---------------------------------------------------------------------------- SOTOPIA agents
# (the simulators' and evaluators' declared answers: tests/unit/simulators/test_answers_property.py)
@FAST
@given(anything)
def test_agent_action(text):
    action, strict = parse_action(text, ["Alice Moreau", "Bob Tan"])
    assert (
        action.action_type in ACTION_TYPES and isinstance(action.argument, str) and isinstance(strict, bool)
    )


# ---------------------------------------------------------------------------- servers and fences
json_values = st.recursive(
    st.none() | st.booleans() | st.floats() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=10,
)


@SLOW
@given(json_values)
def test_server_content_is_text_or_none(content):
    out = content_text(content)
    assert out is None or isinstance(out, str)


@FAST
@given(
    st.lists(st.tuples(st.text(max_size=4), st.floats(max_value=0.0)), max_size=6),
    st.text(min_size=1, max_size=4),
)
def test_option_logprob_never_raises(top, option):
    if not option.strip():
        return
    lp = option_logprob(top, option)
    assert isinstance(lp, float) and (math.isnan(lp) or lp <= math.log(len(top) or 1) + 1e-9)


@FAST
@given(anything, anything, no_digit_pieces, st.sampled_from(["REPLY", "REPLY A", "DIALOGUE", "THOUGHT B"]))
def test_a_fenced_text_never_survives_into_the_answer(hostile, own, noise, label):
    # whatever the untrusted text holds (fake closing lines included), a copy of its block is removed
    # whole, so the parse sees only the model's own words
    fence = Fence(rng=random.Random(len(hostile)))
    own = own.replace("<<<", "")
    answer = noise.replace("<<<", "") + fence.block(label, hostile) + "\n" + own
    assert fence.own_words(answer) == noise.replace("<<<", "") + "\n" + own


# ---------------------------------------------------------------------------- whole judges on any output
def _sample(text: str) -> Sample:
    return Sample(Scenario("s", [msg("user", "I lost my job.")]), 0, [1], [2], None, text, "stop")


@SLOW
@given(model_text, model_text)
def test_judges_and_simulator_take_any_output(reply, output):
    engine = ScriptedEngine(fn=lambda prompt: output, structured=False)  # any text: no format enforced
    (score,) = JudgeReward(RewardContext(judge=engine), use_logprobs="never", max_retries=0)([_sample(reply)])
    assert score.score is None or 0.0 <= score.score <= 1.0
    group = [Candidate(reply, Reaction(output, 1.0, output, True)), Candidate("ok", None)]
    (judged,) = GroupJudge(engine, use_logprobs="never", max_retries=0).rank(
        [Scenario("s", [msg("user", reply)])], [group]
    )
    assert judged.ranks is None or sorted(judged.ranks) in ([1.0, 2.0], [1.5, 1.5])
    sim = ReactionSimulator(engine, use_logprobs="never", max_retries=0)
    (reaction,) = sim.react([(Scenario("s", [msg("user", "hi")]), reply)])
    assert reaction.valid == (reaction.emotion_delta is not None)

"""Property tests (hypothesis) of every parser of model output (issue 14 item 13): whatever a judge,
simulator, critic, evaluator or server writes, the parser never raises, returns a valid value or "invalid"
(None), and never turns garbage into a number. Inputs are arbitrary text, text without any digit
("garbage": no number can honestly come out of it), and text built from the formats' own pieces (labels,
separators, numbers, markdown) so that the deeper branches are reached too."""

from __future__ import annotations

import json
import math
import random
import re

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rapo_echo.benchmarks.esconv.seeker import CRITIC_LABELS, parse_critic
from rapo_echo.benchmarks.sotopia.agent import ACTION_TYPES, parse_action
from rapo_echo.engines.openai_engine import content_text, option_logprob
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.judges.group import (
    CRITIQUE_FORMAT,
    CRITIQUE_PREFIX,
    Candidate,
    GroupJudge,
    clean_critique,
    ranking_format,
    read_ranking,
)
from rapo_echo.judges.verdict import read_verdict, verdict_format
from rapo_echo.llm.answers import FIELD_LINE, field_line
from rapo_echo.llm.dialogue import clean_reply
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.labels import usable_probabilities
from rapo_echo.llm.reaction import Reaction
from rapo_echo.rewards import RewardContext
from rapo_echo.rewards.judge import JudgeReward, score_format
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
# Every text-mode judge answer is read by its declared AnswerFormat (rapo_echo.structured): arbitrary text
# gives a valid value or None, and whatever a constrained engine could render parses back to itself.
FENCE = Fence("ABCDEF12")
LABELS = "ABCDEF"


def constrained(value) -> str:
    """A JSON answer as an engine under the schema may write it (compact or spaced)."""
    return json.dumps(value, separators=(",", ":")) if random.random() < 0.5 else json.dumps(value, indent=1)


@FAST
@given(model_text, st.integers(1, 6))
def test_read_ranking_gives_a_valid_rank_vector_or_none(text, size):
    labels = LABELS[:size]
    ranks = read_ranking(text, FENCE, labels)
    if ranks is None:
        return
    assert sorted(ranks) == [float(r) for r in range(1, size + 1)]  # a complete order of the labels
    assert all(label in text for label in labels)


@FAST
@given(
    st.integers(1, 6).flatmap(lambda n: st.permutations(LABELS[:n])), st.sampled_from(["", "Sure: ", "\n"])
)
def test_any_ranking_a_constrained_engine_writes_parses_back(order, lead):
    text = constrained({"ranking": list(order)})
    fmt = ranking_format(len(order))
    assert fmt.problem(text) is None  # what the engine could produce under the declared format
    expected = [float(order.index(label) + 1) for label in LABELS[: len(order)]]
    assert read_ranking(lead + text, FENCE, LABELS[: len(order)]) == expected


@FAST
@given(st.lists(st.sampled_from(LABELS[:4]), min_size=4, max_size=4))
def test_a_ranking_that_is_not_a_permutation_stays_invalid(items):
    text = json.dumps({"ranking": items})
    assert ranking_format(4).problem(text) is None  # the schema cannot say "each once"
    assert (read_ranking(text, FENCE, "ABCD") is None) == (len(set(items)) < 4)


@FAST
@given(model_text)
def test_clean_critique_is_none_only_for_blank_text(text):
    out = clean_critique(text)
    assert (out is None) == (not text.split())
    assert out is None or out.startswith(CRITIQUE_PREFIX)


@FAST
@given(
    st.lists(
        st.text(st.characters(exclude_characters="\n"), min_size=1, max_size=200), min_size=1, max_size=3
    )
)
def test_any_critique_a_constrained_engine_writes_is_read(lines):
    text = "\n".join(lines)
    assert CRITIQUE_FORMAT.problem(text) is None
    assert CRITIQUE_FORMAT.parse(text) is not None  # read; clean_critique then drops a blank one


# ---------------------------------------------------------------------------- scores and labels
@FAST
@given(model_text, st.integers(2, 9))
def test_judge_score_is_an_integer_in_range_written_in_the_text(text, hi):
    judge = JudgeReward(RewardContext(judge=ScriptedEngine()), scale=hi)
    value = judge.parse(text)
    assert value is None or (isinstance(value, int) and 1 <= value <= hi and str(value) in text)


@FAST
@given(
    st.integers(2, 9).flatmap(lambda hi: st.tuples(st.just(hi), st.integers(1, hi))),
    st.sampled_from(["", "x "]),
)
def test_any_score_a_constrained_engine_writes_parses_back(hi_value, lead):
    hi, value = hi_value
    text = constrained({"score": value})
    assert score_format(hi).problem(text) is None
    assert JudgeReward(RewardContext(judge=ScriptedEngine()), scale=hi).parse(lead + text) == value


@FAST
@given(no_digits)
def test_no_score_from_garbage(text):
    assert JudgeReward(RewardContext(judge=ScriptedEngine())).parse(text) is None


@FAST
@given(
    st.sampled_from([("human", "AI"), ("A", "B", "tie"), ("A", "B"), ("C", "A", "P")]).flatmap(
        lambda labels: st.tuples(st.just(labels), st.sampled_from(labels))
    ),
    st.none() | st.text(max_size=300),
)
def test_any_verdict_a_constrained_engine_writes_parses_back(labels_label, reasoning):
    labels, label = labels_label
    fmt = verdict_format(labels, reasoning is not None)
    value = {"verdict": label} if reasoning is None else {"reasoning": reasoning, "verdict": label}
    text = constrained(value)
    assert fmt.problem(text) is None
    assert read_verdict(text, fmt, FENCE) == value


@FAST
@given(model_text, st.booleans())
def test_read_verdict_is_a_declared_label_or_none(text, reasoning):
    fmt = verdict_format(("human", "AI"), reasoning)
    value = read_verdict(text, fmt, FENCE)
    assert value is None or (value["verdict"] in ("human", "AI") and value["verdict"] in text)


@FAST
@given(st.text(st.characters(exclude_characters="\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"), max_size=400))
def test_any_field_line_a_constrained_engine_writes_is_read_or_refused_by_the_role_check(line):
    if FIELD_LINE.problem(line) is not None:  # an empty line: the engine must write at least one character
        assert not line.strip()
        return
    out = field_line(line)
    assert out is None or (out in " ".join(line.split()) and "\n" not in out)


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

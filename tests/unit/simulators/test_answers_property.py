"""Property tests (hypothesis) of the simulators' and benchmark evaluators' declared answers, moved here
from tests/unit/llm/test_parsers_property.py when their labelled-line parsers became answer formats
(issue 29 item 5): whatever a model writes, the reading never raises, gives a value the format allows
or None, and never turns text without digits into a number; and every value, rendered as an engine that
enforces the format would write it (compact or spaced JSON, any key order the schema allows), reads back
as itself."""

from __future__ import annotations

import json
import math

from hypothesis import given
from hypothesis import strategies as st

from rapo_echo.benchmarks.epm.judge import mdep_answer_key, mdep_format, parse_iedr, parse_mdep
from rapo_echo.benchmarks.epm.vectors import IEDR_KEYS, MDEP_KEYS
from rapo_echo.benchmarks.sotopia.evaluator import DIMENSIONS, dimension_format, read_score
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.simulators.reaction import ReactionSimulator
from rapo_echo.simulators.sage import (
    SHIFT_KEY,
    analysis_format,
    analysis_line,
    parse_plain_reply,
    reply_format,
    spoken,
)
from tests.unit.llm.test_parsers_property import FAST, model_text, no_digits, numbers_in

SIM = ReactionSimulator(ScriptedEngine(), use_logprobs="never", scale=10)
# what a person or evaluator writes inside a string (no quotes or role labels, which the role checks strip)
short_text = st.text(st.sampled_from("abcXYZ éü .,!?-\n"), min_size=1, max_size=60).filter(
    lambda t: any(c.isalpha() for c in t)
)
spacing = st.sampled_from([None, 2])  # compact, or indented as a server might pretty-print


def render(value: dict, indent: int | None) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=False)


# ---------------------------------------------------------------------------- reaction simulator
@FAST
@given(model_text)
def test_reaction_answer_is_valid_or_none(text):
    out = SIM.parse_text(text)
    if out is not None:
        message, delta, thought = out
        assert message and isinstance(thought, str)
        assert -10 <= delta <= 10 and delta == int(delta) and abs(delta) in numbers_in(text)
    for clean in (SIM.clean_message(text), SIM.clean_thought(text)):
        assert clean is None or (isinstance(clean, str) and clean.strip())


@FAST
@given(no_digits)
def test_no_emotion_change_from_garbage(text):
    assert SIM.parse_text(text) is None
    assert analysis_format().parse(text) is None


@FAST
@given(short_text, short_text, st.integers(-10, 10), spacing)
def test_reaction_answers_round_trip(reply, thought, change, indent):
    text = render({"reply": reply, "thought": thought, "valence_change": change}, indent)
    assert SIM.answer_format().problem(text) is None
    out = SIM.parse_text(text)
    assert out is not None and out[1] == float(change)


# ---------------------------------------------------------------------------- SAGE user
@FAST
@given(model_text)
def test_sage_answers_are_valid_or_none(text):
    value = analysis_format().parse(text)
    assert value is None or (isinstance(value[SHIFT_KEY], int) and -10 <= value[SHIFT_KEY] <= 10)
    assert value is None or abs(value[SHIFT_KEY]) in numbers_in(text)
    said = spoken(reply_format().parse(text))
    assert said is None or (isinstance(said, str) and said.strip())
    for out in (parse_plain_reply(text), analysis_line(text)):
        assert out is None or (isinstance(out, str) and out.strip())


@FAST
@given(st.lists(short_text, min_size=4, max_size=4), st.integers(-10, 10), spacing)
def test_sage_analysis_round_trips_and_out_of_range_never_reads(texts, shift, indent):
    value = dict(zip(("content", "fit", "mind", "reaction"), texts), shift=shift)
    assert analysis_format().parse(render(value, indent)) == value
    for bad in (shift + 21, shift - 21):
        assert analysis_format().parse(render({**value, "shift": bad}, indent)) is None


# ---------------------------------------------------------------------------- SOTOPIA evaluator
@FAST
@given(model_text, st.sampled_from(list(DIMENSIONS)))
def test_sotopia_score_is_in_range_or_none(text, dimension):
    score = read_score(dimension, text)
    lo, hi = DIMENSIONS[dimension]
    assert score is None or (math.isfinite(score) and lo <= score <= hi and abs(score) in numbers_in(text))


@FAST
@given(no_digits, st.sampled_from(list(DIMENSIONS)))
def test_no_sotopia_score_from_garbage(text, dimension):
    assert read_score(dimension, text) is None


@FAST
@given(st.sampled_from(list(DIMENSIONS)), short_text, st.integers(-12, 12), spacing)
def test_sotopia_answers_round_trip_and_ranges_hold(dimension, reasoning, score, indent):
    lo, hi = DIMENSIONS[dimension]
    text = render({"reasoning": reasoning, "score": score}, indent)
    if lo <= score <= hi:
        assert read_score(dimension, text) == float(score)
        assert dimension_format(dimension).problem(text) is None
    else:
        assert read_score(dimension, text) is None  # a number out of range is never accepted


# ---------------------------------------------------------------------------- EPM judge
@FAST
@given(model_text)
def test_epm_forms_are_complete_and_in_range_or_none(text):
    iedr, mdep = parse_iedr(text), parse_mdep(text)
    assert iedr is None or (set(iedr) == set(IEDR_KEYS) and all(v in (0, 1, 2, 3) for v in iedr.values()))
    assert mdep is None or all(
        v in ((0, 1, 2) if k.endswith("Prog") else (0, -1, -2)) for k, v in mdep.items()
    )


@FAST
@given(st.lists(st.integers(0, 2), min_size=6, max_size=6), spacing, st.randoms())
def test_mdep_round_trips_in_any_key_order(levels, indent, rng):
    keys = [mdep_answer_key(k) for k in MDEP_KEYS]
    value = dict(zip(keys, levels))
    shuffled = list(value.items())
    rng.shuffle(shuffled)
    text = render(dict(shuffled), indent)
    assert mdep_format().parse(text) == value
    expected = {k: (-v if k.endswith("Neg") else v) for k, v in zip(MDEP_KEYS, levels)}
    assert parse_mdep(text) == expected

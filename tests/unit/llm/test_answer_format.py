"""The one answer-format type: schema subset, validation, parsing and the scripted engine's check."""

from __future__ import annotations

import pytest

from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import ConfigError
from rapo_echo.llm.answers import generate_parsed
from rapo_echo.structured import AnswerFormat, json_object_text, object_schema, validate_json
from rapo_echo.types import SamplingParams, msg

SCORE = {"type": "integer", "minimum": 0, "maximum": 10}
SCHEMA = object_schema({"reasoning": {"type": "string", "maxLength": 20}, "score": SCORE})


def test_validate_json_by_hand() -> None:
    assert validate_json({"reasoning": "ok", "score": 3}, SCHEMA) is None
    assert "missing field 'score'" in validate_json({"reasoning": "ok"}, SCHEMA)
    assert "above the maximum 10" in validate_json({"reasoning": "ok", "score": 11}, SCHEMA)
    assert "expected an integer" in validate_json({"reasoning": "ok", "score": 2.5}, SCHEMA)
    assert "expected an integer" in validate_json({"reasoning": "ok", "score": True}, SCHEMA)
    assert "length 21" in validate_json({"reasoning": "x" * 21, "score": 1}, SCHEMA)
    assert "unexpected field" in validate_json({"reasoning": "", "score": 1, "x": 0}, SCHEMA)


def test_schema_outside_the_subset_is_refused_with_its_place() -> None:
    with pytest.raises(ValueError, match=r"properties.score.*pattern"):
        AnswerFormat.json_schema(
            {"type": "object", "properties": {"score": {"type": "string", "pattern": "a"}}}
        )
    with pytest.raises(ValueError, match="required field"):
        AnswerFormat.json_schema({"type": "object", "properties": {}, "required": ["x"]})


def test_parse_each_kind() -> None:
    fmt = AnswerFormat.json_schema(SCHEMA)
    assert fmt.parse('{"reasoning": "fine", "score": 7}') == {"reasoning": "fine", "score": 7}
    assert fmt.parse('Sure: ```json\n{"reasoning": "a}b", "score": 7}\n```') == {
        "reasoning": "a}b",
        "score": 7,
    }
    assert fmt.parse('Here it is {"reasoning": "x", "score": 70} done') is None  # out of range
    assert fmt.parse("no json") is None
    choice = AnswerFormat.choice(["A", "B", "tie"])
    assert choice.parse("tie") == "tie" and choice.parse("A.") == "A" and choice.parse("Apple") is None
    integer = AnswerFormat.integer(1, 7)
    assert integer.parse(" 7 ") == 7 and integer.parse("8") is None and integer.parse("7.5") is None
    assert integer.as_regex() == "(1|2|3|4|5|6|7)"
    rx = AnswerFormat.regex(r"Emotion: [+-]?[0-9]+")
    assert rx.parse("Emotion: -3") == "Emotion: -3" and rx.parse("Emotion: x") is None
    assert json_object_text('a {"b": "}"} c') == '{"b": "}"}'


def test_problem_is_strict_where_parse_is_lenient() -> None:
    fmt = AnswerFormat.json_schema(SCHEMA)
    assert fmt.problem('{"reasoning": "a", "score": 1}') is None
    assert fmt.problem('ok {"reasoning": "a", "score": 1}') is not None  # constrained text is JSON only
    assert AnswerFormat.choice(["A", "B"]).problem("A.") is not None


def test_scripted_engine_refuses_a_reply_a_constrained_engine_could_not_give() -> None:
    fmt = AnswerFormat.integer(0, 10, name="score")
    good = ScriptedEngine(replies=["4"])
    out = generate_parsed(good, [[msg("user", "rate")]], None, SamplingParams(), answer_format=fmt)
    assert out[0].value == 4 and out[0].attempts == 1
    bad = ScriptedEngine(replies=["four"])
    with pytest.raises(ConfigError, match="does not conform to the answer format 'score'"):
        generate_parsed(bad, [[msg("user", "rate")]], None, SamplingParams(), answer_format=fmt)


def test_server_without_structured_output_keeps_retry_then_invalid() -> None:
    fmt = AnswerFormat.integer(0, 10)
    engine = ScriptedEngine(replies=["four", "five", "six"], structured=False)
    out = generate_parsed(
        engine, [[msg("user", "rate")]], None, SamplingParams(), answer_format=fmt, max_retries=2
    )
    assert out[0].value is None and out[0].attempts == 3
    engine = ScriptedEngine(replies=["four", "5"], structured=False)
    out = generate_parsed(engine, [[msg("user", "rate")]], None, SamplingParams(), answer_format=fmt)
    assert out[0].value == 5 and out[0].attempts == 2


def test_integer_regex_is_exact_and_schema_keeps_its_order() -> None:
    wide = AnswerFormat.integer(1, 300)
    assert wide.problem("93362") is not None and wide.parse("300") == 300
    assert __import__("re").fullmatch(wide.as_regex(), "93362") is None  # what vllm / servers receive
    with pytest.raises(ValueError, match="more than 1000 values"):
        AnswerFormat.integer(0, 5000)
    fmt = AnswerFormat.json_schema(
        {"type": "object", "properties": {"reasoning": {"type": "string"}, "a": {"type": "integer"}}}
    )
    assert list(fmt.schema["properties"]) == [
        "reasoning",
        "a",
    ]  # a constrained engine writes them in this order


def test_object_schema_is_closed_all_required_and_ordered() -> None:
    schema = object_schema({"b": {"type": "string"}, "a": {"type": "integer"}})
    assert schema == {
        "type": "object",
        "properties": {"b": {"type": "string"}, "a": {"type": "integer"}},
        "required": ["b", "a"],
        "additionalProperties": False,
    }
    fmt = AnswerFormat.json_object({"b": {"type": "string"}, "a": {"type": "integer"}})
    assert fmt.schema == schema and fmt.parse('{"b": "x", "a": 1}') == {"b": "x", "a": 1}
    assert fmt.parse('{"b": "x"}') is None and fmt.parse('{"b": "x", "a": 1, "c": 0}') is None


def test_jsonschema_checks_on_top_of_our_subset() -> None:
    # a boolean is not the number 1 in an enum (Python's == says it is)
    assert validate_json(1, {"enum": [1, 2]}) is None
    assert "True is not one of [1, 2]" in validate_json(True, {"enum": [1, 2]})
    assert "$.score: False is not one of [0, 1]" in validate_json(
        {"score": False}, {"type": "object", "properties": {"score": {"enum": [0, 1]}}}
    )
    # our subset stays stricter where the grammar is: 1.0 is not an integer answer
    assert "expected an integer" in validate_json(1.0, {"type": "integer"})
    # a schema must be well formed, not only inside the subset (which checks bounds and lengths itself)
    with pytest.raises(ValueError, match=r"'x'.properties.n.minimum: must be a finite number, got 3"):
        AnswerFormat.json_schema(
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": "3"}}}, name="x"
        )
    with pytest.raises(ValueError, match=r"'x'.required: not a valid JSON schema: .* non-unique elements"):
        AnswerFormat.json_schema(
            {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a", "a"]}, name="x"
        )


def _schemas():
    from hypothesis import strategies as st

    scalar = st.one_of(
        st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
                  st.integers(-5, 5), st.integers(0, 5)),
        st.builds(lambda lo, span: {"type": "string", "minLength": lo, "maxLength": lo + span},
                  st.integers(0, 3), st.integers(0, 3)),
        st.just({"type": "number"}),
        st.just({"type": "boolean"}),
        st.lists(st.one_of(st.integers(-2, 2), st.booleans(), st.text(max_size=2)), min_size=1, max_size=3)
        .map(lambda values: {"enum": values}),
    )  # fmt: skip
    return st.recursive(
        scalar,
        lambda inner: st.one_of(
            st.builds(
                lambda item, hi: {"type": "array", "items": item, "maxItems": hi}, inner, st.integers(0, 3)
            ),
            st.dictionaries(st.sampled_from("abc"), inner, min_size=1, max_size=3).map(object_schema),
        ),
        max_leaves=4,
    )


def _values():
    from hypothesis import strategies as st

    leaf = st.one_of(
        st.integers(-6, 11), st.floats(-6, 6, allow_nan=False), st.booleans(), st.text(max_size=6)
    )
    return st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.sampled_from("abcd"), inner, max_size=4)
        ),
        max_leaves=6,
    )


def test_our_subset_never_accepts_what_jsonschema_refuses() -> None:
    """On random schemas of the subset and random values, our subset check refuses everything the library
    refuses but a bool in a numeric enum (Python's True == 1), which validate_json refuses through the
    library; ours refuses more where the grammar does (an integral float is no integer)."""
    from hypothesis import given, settings
    from jsonschema import Draft202012Validator

    from rapo_echo.structured import _subset_problem

    @settings(max_examples=300, deadline=None, derandomize=True)
    @given(_schemas(), _values())
    def check(schema, value) -> None:
        ours = _subset_problem(value, schema, "$")
        theirs = list(Draft202012Validator(schema).iter_errors(value))
        if ours is None and theirs:  # where the library is the stricter: Python's True == 1 in an enum
            assert validate_json(value, schema) is not None
            assert any("is not one of" in e.message for e in theirs), (schema, value, theirs)

    check()

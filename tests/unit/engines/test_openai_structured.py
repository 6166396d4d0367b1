"""Structured output on the ``openai`` engine against fake OpenAI-compatible servers that check the format
fields they receive: the fields of each dialect, detection of the server, unwrapping, and the fallback to
parse-and-retry (one warning) for servers that refuse or ignore the fields."""

from __future__ import annotations

import logging

import pytest

from rapo_echo.config import EngineConfig
from rapo_echo.engines import make_engine
from rapo_echo.engines.base import format_enforcement
from rapo_echo.engines.openai_engine import (
    OpenAIEngine,
    format_fields,
    schema_name,
    strict_compatible,
    unwrap_answer,
)
from rapo_echo.errors import ConfigError, EngineError
from rapo_echo.llm.answers import generate_parsed
from rapo_echo.structured import AnswerFormat, object_schema
from rapo_echo.types import SamplingParams
from tests.helpers.fake_openai import FakeAPI, Reply, StructuredAPI

USER = [{"role": "user", "content": "How upset is the user, 1 to 7?"}]
FAST = {"backoff_s": 0.01, "api_key_env": None}
VERDICT = AnswerFormat.choice(["A", "B", "tie"], name="verdict")
RATING = AnswerFormat.integer(1, 7, name="rating")
STEP = AnswerFormat.regex(r"(calm|upset)", name="emotion step")
ANALYSIS = AnswerFormat.json_schema(
    object_schema(
        {
            "reason": {"type": "string", "maxLength": 200},
            "score": {"type": "integer", "minimum": 0, "maximum": 10},
        }
    ),
    name="sotopia analysis",
)
SCORES = AnswerFormat.json_schema(
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 5}, "minItems": 2, "maxItems": 2},
    name="scores",
)
EVERY = [VERDICT, RATING, STEP, ANALYSIS, SCORES]
GREEDY = SamplingParams(max_new_tokens=64, temperature=0)


def params(fmt: AnswerFormat, n: int = 1) -> SamplingParams:
    return SamplingParams(max_new_tokens=64, temperature=0, n=n, answer_format=fmt)


# ---------------------------------------------------------------------- the request fields
def test_format_fields_of_each_dialect():
    assert format_fields(VERDICT, "vllm") == {"structured_outputs": {"choice": ["A", "B", "tie"]}}
    assert format_fields(VERDICT, "vllm_guided") == {"guided_choice": ["A", "B", "tie"]}
    assert format_fields(RATING, "vllm") == {"structured_outputs": {"regex": "(1|2|3|4|5|6|7)"}}
    assert format_fields(STEP, "vllm_guided") == {"guided_regex": "(calm|upset)"}
    assert format_fields(SCORES, "vllm") == {"structured_outputs": {"json": SCORES.schema}}
    assert format_fields(VERDICT, "none") == {}
    # an object-rooted JSON format is response_format in every dialect, strict, with a name OpenAI allows
    for dialect in ("vllm", "vllm_guided", "json_schema"):
        assert format_fields(ANALYSIS, dialect) == {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "sotopia_analysis", "schema": ANALYSIS.schema, "strict": True},
            }
        }
    # a json_schema-only server is asked for {"answer": ...}
    wrapped = format_fields(RATING, "json_schema")["response_format"]["json_schema"]
    assert wrapped["schema"] == {
        "type": "object",
        "properties": {"answer": {"type": "integer", "minimum": 1, "maximum": 7}},
        "required": ["answer"],
        "additionalProperties": False,
    }
    assert wrapped["strict"] is True and wrapped["name"] == "rating"
    step = format_fields(STEP, "json_schema")["response_format"]["json_schema"]["schema"]
    assert step["properties"]["answer"] == {"type": "string", "pattern": "^(?:(calm|upset))$"}
    with pytest.raises(ValueError, match="dialect"):
        format_fields(VERDICT, "tgi")


def test_strict_only_where_the_schema_allows_it_and_names_are_cleaned():
    open_obj = {"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]}
    optional = {**open_obj, "required": [], "additionalProperties": False}
    assert not strict_compatible(open_obj) and not strict_compatible(optional)
    assert strict_compatible({**open_obj, "additionalProperties": False})
    fmt = AnswerFormat.json_schema(open_obj, name="x")
    assert format_fields(fmt, "json_schema")["response_format"]["json_schema"]["strict"] is False
    assert schema_name("emotion step/ü") == "emotion_step__" and schema_name("") == "answer"
    assert len(schema_name("n" * 100)) == 64


def test_unwrap_answer():
    assert unwrap_answer('{"answer": "tie"}', VERDICT) == "tie"
    assert unwrap_answer('{"answer": 6}', RATING) == "6"
    assert unwrap_answer('{"answer": true}', RATING) is None
    assert unwrap_answer('{"answer": [1, 5]}', SCORES) == "[1, 5]"
    assert unwrap_answer("tie", VERDICT) is None and unwrap_answer('{"other": 1}', VERDICT) is None


# ---------------------------------------------------------------------- servers that enforce
@pytest.mark.parametrize(
    ("owner", "version", "choice_field"),
    [
        ("vllm", "0.11.0", "structured_outputs"),
        ("vllm", "0.9.2", "guided_choice"),  # older vLLM: the guided_* fields
        ("rapo-echo", None, "structured_outputs"),
    ],
)
def test_vllm_like_server_enforces_every_kind(owner, version, choice_field):
    server = StructuredAPI(owner=owner, version=version)
    with FakeAPI(server) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        assert engine.structured_output == "server" and format_enforcement(engine) == "server"
        for fmt in EVERY:
            for gens in engine.generate([USER, USER], params(fmt, n=2)):
                assert len(gens) == 2 and all(fmt.problem(g.text) is None for g in gens), gens
        engine.generate([USER], GREEDY)  # no format: no field
    assert engine.structured_output == "server"
    gets = [s.path for s in api.seen if s.method == "GET"]
    assert gets == (["/v1/models", "/version"] if owner == "vllm" else ["/v1/models"])
    kinds = [next(iter(r), None) for r in server.received]
    assert kinds[:2] == [choice_field] * 2  # the verdict
    assert kinds[6:8] == ["response_format"] * 2  # the analysis (an object): response_format everywhere
    assert kinds[-1] is None


def test_json_schema_server_gets_wrapped_formats_and_the_role_gets_the_bare_answer():
    server = StructuredAPI(owner="openai", accepts=("response_format",))
    with FakeAPI(server) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        got = {fmt.name: engine.generate([USER], params(fmt))[0][0] for fmt in EVERY}
    assert {k: g.text for k, g in got.items()} == {
        "verdict": "tie",  # schema_value picks the last enum value, the maximum, the first matching sample
        "rating": "7",
        "emotion step": "calm",
        "sotopia analysis": '{"reason": "x", "score": 10}',
        "scores": "[5, 5]",
    }
    assert got["verdict"].token_ids == [] and got["verdict"].logprobs is None  # they were the wrapper's
    assert all(next(iter(r)) == "response_format" for r in server.received)
    assert [s.path for s in api.seen if s.method == "GET"] == ["/v1/models"]  # no /version asked
    assert engine.structured_output == "server"


def test_explicit_modes_skip_detection():
    server = StructuredAPI(owner="openai")
    with FakeAPI(server) as api:
        vllm = OpenAIEngine(api.url, model="m", structured="vllm", **FAST)
        vllm.generate([USER], params(VERDICT))
        plain = OpenAIEngine(api.url, model="m", structured="none", **FAST)
        assert plain.structured_output == "none"
        assert plain.generate([USER], params(VERDICT))[0][0].text == server.free_text
    assert server.received == [{"structured_outputs": {"choice": ["A", "B", "tie"]}}, {}]
    assert [s.path for s in api.seen if s.method == "GET"] == ["/version"]  # 'vllm' asks only the version
    with pytest.raises(ConfigError, match="structured must be one of"):
        OpenAIEngine(api.url, structured="grammar", **FAST)


# ---------------------------------------------------------------------- servers that do not
def test_refusing_server_falls_back_once_then_parse_and_retry_counts(caplog, monkeypatch):
    key = "sk-structured-secret-77"
    monkeypatch.setenv("TEST_STRUCTURED_KEY", key)
    replies = iter(["Hmm, hard to say.", "B", "I would go with the first.", "no idea", "still no idea"])
    server = StructuredAPI(owner="vllm", accepts=())
    free = server.__call__

    def respond(seen, index):
        body = seen.body or {}
        if seen.method == "POST" and not any(k in body for k in ("response_format", "structured_outputs")):
            server.free_text = next(replies)
        return free(seen, index)

    with FakeAPI(respond) as api, caplog.at_level(logging.INFO):
        engine = OpenAIEngine(api.url, model="m", api_key_env="TEST_STRUCTURED_KEY", backoff_s=0.01)
        first = generate_parsed(engine, [USER], None, GREEDY, answer_format=VERDICT, max_retries=1)
        assert engine.structured_output == "none" and format_enforcement(engine) == "none"
        second = generate_parsed(engine, [USER], None, GREEDY, answer_format=VERDICT, max_retries=2)
    # the first request: vLLM fields refused, then response_format refused, then plain: its reply does not
    # parse, so the role retries (plain) and gets "B"
    sent = [next(iter(r), None) for r in server.received]
    assert sent == ["structured_outputs", "response_format"] + [None] * 5
    assert (first[0].value, first[0].attempts) == ("B", 2)
    assert second[0].value is None and second[0].attempts == 3  # never parses: invalid, counted
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "formats" in r.getMessage()]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert api.url in text and "Unrecognized request argument" in text and key not in text
    assert any("stayed unparseable" in r.getMessage() for r in caplog.records)


def test_concurrent_refusals_warn_once(caplog):
    server = StructuredAPI(owner="sglang", accepts=())
    with FakeAPI(server) as api, caplog.at_level(logging.WARNING):
        engine = OpenAIEngine(api.url, model="m", max_concurrency=4, **FAST)
        out = engine.generate([USER] * 6, params(RATING))
        engine.generate([USER] * 3, params(RATING))
    assert all(gens[0].text == server.free_text for gens in out)
    assert len([r for r in caplog.records if "answer formats" in r.getMessage()]) == 1
    assert server.received[-3:] == [{}, {}, {}]  # after the fallback nothing is sent


def test_server_that_ignores_the_fields_is_detected(caplog):
    server = StructuredAPI(owner="vllm", enforce=False)
    with FakeAPI(server) as api, caplog.at_level(logging.INFO):
        engine = OpenAIEngine(api.url, model="m", **FAST)
        engine.generate([USER], params(VERDICT))  # structured_outputs ignored: step to response_format
        assert engine.structured_output == "server"
        engine.generate([USER], params(VERDICT))  # response_format ignored too: step to none
        assert engine.structured_output == "none"
        engine.generate([USER], params(VERDICT))
    assert [next(iter(r), None) for r in server.received] == ["structured_outputs", "response_format", None]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "does not enforce" in warnings[0].getMessage() and api.url in warnings[0].getMessage()


def test_truncated_or_stopped_replies_are_not_taken_for_ignoring():
    def respond(seen, index):
        body = StructuredAPI(enforce=False)(seen, index)
        if seen.method == "POST":
            body.body["choices"][0]["finish_reason"] = "length"
        return body

    with FakeAPI(respond) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        engine.generate([USER], params(VERDICT))
        engine.generate([USER], SamplingParams(stop=("\n",), answer_format=VERDICT))
    assert engine.structured_output == "server"


def test_explicit_mode_refusal_is_a_clear_error():
    server = StructuredAPI(owner="openai", accepts=())
    with FakeAPI(server) as api:
        engine = OpenAIEngine(api.url, model="m", structured="json_schema", **FAST)
        needle = "HTTP 400.*structured: json_schema; use structured: auto"
        with pytest.raises(EngineError, match=needle) as info:
            engine.generate([USER], params(VERDICT))
    assert info.value.status == 400 and len(server.received) == 1


def test_a_400_that_plain_requests_get_too_is_not_a_refusal():
    with FakeAPI(lambda s, i: Reply(400, {"error": {"message": "max_tokens is too large"}})) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        with pytest.raises(EngineError, match="max_tokens is too large"):
            engine.generate([USER], params(VERDICT))
    assert engine.structured_output == "server"  # not given up: the format was not the problem
    assert len(api.posts()) == 3  # response_format, then plain, then the 1-token health request


def test_config_names_the_mode():
    cfg = EngineConfig(engine="openai", base_url="http://127.0.0.1:9/v1", structured="vllm")
    engine = make_engine(cfg, role="judge")
    assert isinstance(engine, OpenAIEngine) and engine.structured == "vllm"
    assert EngineConfig(engine="openai", base_url="http://127.0.0.1:9/v1").structured == "auto"
    with pytest.raises(ValueError, match="structured"):
        EngineConfig(engine="openai", base_url="http://127.0.0.1:9/v1", structured="xgrammar")

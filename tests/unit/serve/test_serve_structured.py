"""``rapo-echo serve`` with structured output: ``response_format`` json_schema, vLLM's ``structured_outputs``
and its older ``guided_*`` fields become the engine call's answer format, and the ``openai`` engine pointed
at the server gets every format enforced end to end (a fake engine that decodes under the format stands in
for the ``hf`` engine's constrained decoding)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Sequence

import pytest

from rapo_echo import serve
from rapo_echo.engines.openai_engine import OpenAIEngine
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.llm.answers import generate_parsed
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, Generation, SamplingParams
from tests.helpers.fake_openai import sample_for, schema_value

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

P1 = [{"role": "user", "content": "My sister stopped talking to me."}]
SCHEMA = {
    "type": "object",
    "properties": {"reason": {"type": "string", "maxLength": 80}, "score": {"type": "integer", "minimum": 0}},
    "required": ["reason", "score"],
    "additionalProperties": False,
}


class FormatEngine:
    """Answers every call with text of its answer format (as constrained decoding would), free text
    without one; records the formats it was given."""

    name = "format-engine"
    supports_logprobs = False
    structured_output = "grammar"

    def __init__(self) -> None:
        self.formats: list[AnswerFormat | None] = []

    def _text(self, fmt: AnswerFormat | None) -> str:
        if fmt is None:
            return "That sounds painful."
        if fmt.kind == "json":
            return json.dumps(schema_value(fmt.schema))
        if fmt.kind == "choice":
            return fmt.choices[-1]
        return sample_for(fmt.as_regex())

    def generate(self, prompts: Sequence[Conversation], params: SamplingParams) -> list[list[Generation]]:
        self.formats.append(params.answer_format)
        return [[Generation(text=self._text(params.answer_format)) for _ in range(params.n)] for _ in prompts]

    def choice_logprobs(self, prompts, options):
        raise NotImplementedError

    def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]:
        self.formats.append(params.answer_format)
        yield self._text(params.answer_format)


def post(client: TestClient, **body):
    return client.post("/v1/chat/completions", json={"messages": P1, **body})


# ---------------------------------------------------------------------- request fields -> answer format
@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "eval", "schema": SCHEMA}}},
            AnswerFormat.json_schema(SCHEMA, name="eval"),
        ),
        ({"structured_outputs": {"choice": ["A", "B", "tie"]}}, AnswerFormat.choice(["A", "B", "tie"])),
        ({"structured_outputs": {"regex": "(1|2|3)"}}, AnswerFormat.regex("(1|2|3)")),
        ({"structured_outputs": {"json": SCHEMA}}, AnswerFormat.json_schema(SCHEMA)),
        ({"guided_choice": ["calm", "upset"]}, AnswerFormat.choice(["calm", "upset"])),
        ({"guided_regex": "[0-9]+"}, AnswerFormat.regex("[0-9]+")),
        ({"guided_json": '{"type": "integer"}'}, AnswerFormat.json_schema({"type": "integer"})),
        ({"response_format": {"type": "text"}}, None),
        ({}, None),
    ],
)
def test_answer_format_of_request_fields(fields, expected):
    assert serve.answer_format_of(fields) == expected


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"response_format": {"type": "json_object"}}, "type 'json_object' is not supported"),
        ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "needs a 'schema'"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "text"}}}},
            "type 'text' is not one of",
        ),
        ({"structured_outputs": {"grammar": "root ::= x"}}, "['grammar'] not supported"),
        ({"structured_outputs": {"choice": ["A"], "regex": "A"}}, "exactly one of json, choice, regex"),
        ({"guided_choice": ["A"], "guided_regex": "A"}, "give one structured-output field"),
        ({"guided_choice": "A"}, "non-empty list of non-empty strings"),
        ({"guided_regex": "(unclosed"}, "does not compile"),
        ({"guided_grammar": "root ::= x"}, "'guided_grammar' is not supported"),
    ],
)
def test_bad_format_fields_get_400(fields, needle):
    client = TestClient(serve.create_app(FormatEngine(), "m"))
    r = post(client, **fields)
    assert r.status_code == 400 and needle in r.json()["error"]["message"]


def test_the_format_reaches_the_engine_also_when_streaming():
    engine = FormatEngine()
    client = TestClient(serve.create_app(engine, "m"))
    r = post(client, structured_outputs={"choice": ["A", "B"]}, n=2)
    assert [c["message"]["content"] for c in r.json()["choices"]] == ["B", "B"]
    r = post(client, guided_regex="(calm|upset)", stream=True)
    assert r.status_code == 200 and '"content": "calm"' in r.text
    post(client)
    assert engine.formats == [AnswerFormat.choice(["A", "B"]), AnswerFormat.regex("(calm|upset)"), None]


def test_an_engine_that_cannot_enforce_refuses_formats():
    client = TestClient(serve.create_app(ScriptedEngine(default="B", structured=False), "m"))
    for fields in ({"guided_choice": ["A", "B"]}, {"structured_outputs": {"regex": "B"}}):
        r = post(client, **fields)
        assert r.status_code == 400 and "cannot enforce answer formats" in r.json()["error"]["message"]
    assert post(client).status_code == 200


# ---------------------------------------------------------------------- the openai engine end to end
def remote(app) -> OpenAIEngine:
    return OpenAIEngine("http://testserver/v1", api_key_env=None, backoff_s=0.01, http_client=TestClient(app))


def test_openai_engine_against_rapo_echo_serve_is_enforced_end_to_end(caplog):
    engine = FormatEngine()
    client = remote(serve.create_app(engine, "served"))
    formats = [
        AnswerFormat.choice(["A", "B", "tie"], name="verdict"),
        AnswerFormat.integer(1, 7, name="rating"),
        AnswerFormat.regex(r"(calm|upset)", name="step"),
        AnswerFormat.json_schema(SCHEMA, name="evaluation"),
    ]
    params = SamplingParams(max_new_tokens=32, temperature=0)
    with caplog.at_level(logging.WARNING):
        for fmt in formats:
            parsed = generate_parsed(client, [P1, P1], None, params, answer_format=fmt, max_retries=2)
            assert all(p.value is not None and p.attempts == 1 for p in parsed), parsed
    assert client.structured_output == "server" and not caplog.records
    # what the served engine was asked to enforce, once per prompt: vLLM's fields carry no name, an integer
    # travels as its regex, and a JSON schema as response_format with its name
    assert engine.formats == [
        *[AnswerFormat.choice(["A", "B", "tie"])] * 2,
        *[AnswerFormat.regex("(1|2|3|4|5|6|7)")] * 2,
        *[AnswerFormat.regex("(calm|upset)")] * 2,
        *[AnswerFormat.json_schema(SCHEMA, name="evaluation")] * 2,
    ]


def test_openai_engine_against_an_unenforcing_serve_falls_back_to_parsing(caplog):
    served = ScriptedEngine(replies=["Maybe the first one?", "A"], structured=False)
    client = remote(serve.create_app(served, "served"))
    fmt = AnswerFormat.choice(["A", "B", "tie"], name="verdict")
    with caplog.at_level(logging.WARNING):
        parsed = generate_parsed(client, [P1], None, SamplingParams(), answer_format=fmt, max_retries=2)
    assert (parsed[0].value, parsed[0].attempts) == ("A", 2)  # parse-and-retry did it
    assert client.structured_output == "none"
    warnings = [r for r in caplog.records if "does not enforce answer formats" in r.getMessage()]
    assert len(warnings) == 1 and "http://testserver/v1" in warnings[0].getMessage()

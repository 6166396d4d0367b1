"""A key never reaches a run folder (issue 39 item 2): a server that echoes the ``Authorization`` header in
its reply text gets neither the key nor any ``Bearer`` token into a judge's stored raw answer, the run's
JSON-lines files, files written atomically, or a log line."""

from __future__ import annotations

import json
import logging

import pytest

from rapo_echo.atomic import write_text_atomic
from rapo_echo.engines.openai_engine import OpenAIEngine
from rapo_echo.jsonl import append_jsonl
from rapo_echo.rewards import RewardContext
from rapo_echo.rewards.judge import JudgeReward
from rapo_echo.scrub import ScrubFilter, register_secret, scrub, scrub_data
from rapo_echo.types import Sample, Scenario, msg
from tests.helpers.fake_openai import FakeAPI, Reply, completion

KEY = "s3cr3t-KEY-0123456789abcdefXYZ"
ENV = "RAPO_ECHO_TEST_JUDGE_KEY"  # a name that does not look like a secret: only the engine knows it is one


def echoing_server() -> FakeAPI:
    """A server without structured output whose reply quotes the request's Authorization header."""

    def respond(seen, index):
        if seen.method == "GET":
            return Reply(body={"data": [{"id": "m", "owned_by": "someone"}]})
        auth = seen.headers.get("authorization", "")
        return Reply(body=completion(f'You sent "{auth}". {{"score": 2}}'))

    return FakeAPI(respond)


def test_a_key_echoed_in_a_reply_never_reaches_the_samples_file(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ENV, KEY)
    with echoing_server() as api:
        engine = OpenAIEngine(api.url, model="m", api_key_env=ENV, structured="none", backoff_s=0.01)
        judge = JudgeReward(RewardContext(judge=engine), scale=5, use_logprobs="never")
        sample = Sample(
            Scenario("s", [msg("user", "I lost my job.")]), 0, [1], [2], None, "I'm sorry.", "stop"
        )
        (out,) = judge([sample])
    assert api.seen[-1].headers["authorization"] == f"Bearer {KEY}"  # the server did see it
    assert out.info["rating"] == 2 and KEY not in out.info["raw"] and "Bearer ***" in out.info["raw"]
    sample.info["judge"] = out.info
    append_jsonl(tmp_path / "samples.jsonl", [{"step": 1, "text": sample.text, "info": sample.info}])
    assert KEY not in (tmp_path / "samples.jsonl").read_text()


def test_run_files_are_scrubbed_of_env_secrets_and_bearer_tokens(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("MY_SERVICE_API_KEY", "abcdefgh12345678")
    record = {"raw": 'echo: "Authorization: Bearer tok_9f8e7d6c" and abcdefgh12345678', "n": 3}
    append_jsonl(tmp_path / "m.jsonl", [record])
    text = (tmp_path / "m.jsonl").read_text()
    assert "tok_9f8e7d6c" not in text and "abcdefgh12345678" not in text and json.loads(text)["n"] == 3
    write_text_atomic(tmp_path / "r.json", json.dumps(record))
    assert "abcdefgh12345678" not in (tmp_path / "r.json").read_text()


def test_scrub_forms() -> None:
    register_secret("registered-key-42")
    assert scrub("x registered-key-42 y") == "x *** y"
    assert scrub("bearer   abc.def-ghi") == "bearer   ***" and scrub("BEARER%20xyz") == "BEARER%20***"
    assert scrub('{"k": "registered-key-42"}') == '{"k": "***"}'
    assert scrub_data({"a": ["registered-key-42", 1]}) == {"a": ["***", 1]}
    assert scrub("nothing to hide") == "nothing to hide"
    register_secret("ab")  # too short to tell from ordinary text: not registered
    assert scrub("ab cab") == "ab cab"


def test_log_lines_are_scrubbed(caplog) -> None:
    register_secret("log-secret-77777")
    handler = logging.StreamHandler()
    handler.addFilter(ScrubFilter())
    record = logging.LogRecord(
        "x", logging.WARNING, __file__, 1, "server said %s", ("log-secret-77777",), None
    )
    assert handler.filter(record)
    assert record.getMessage() == "server said ***"


def test_the_cli_puts_the_filter_on_its_log_handlers() -> None:
    from rapo_echo.cli import main

    root = logging.getLogger()
    saved = list(root.handlers)
    for h in saved:
        root.removeHandler(h)
    try:
        assert main([]) == 2  # prints the help after setting up logging
        assert root.handlers and all(
            any(isinstance(f, ScrubFilter) for f in h.filters) for h in root.handlers
        )
    finally:
        for h in list(root.handlers):
            root.removeHandler(h)
        for h in saved:
            root.addHandler(h)


@pytest.mark.parametrize("value", ["", None, "   "])
def test_nothing_to_register(value) -> None:
    register_secret(value)
    assert scrub("   ") == "   "

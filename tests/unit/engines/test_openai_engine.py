"""The ``openai`` engine against small stdlib HTTP servers: payloads, parsing, retries, timeouts, keys."""

from __future__ import annotations

import json
import math
import socket

import pytest

from rapo_echo.engines import engine_from_spec
from rapo_echo.engines.openai_engine import OpenAIEngine, backoff_delay, option_logprob
from rapo_echo.errors import CapabilityError, ConfigError, EngineError
from rapo_echo.types import SamplingParams
from tests.helpers.fake_openai import FakeAPI, Reply, Seen, completion

USER = [{"role": "user", "content": "I lost my job today."}]
FAST = {"backoff_s": 0.01, "api_key_env": None}


def ok(seen: Seen, index: int) -> Reply:
    return Reply(body=completion("fine"))


# ---------------------------------------------------------------------- pure helpers
class FixedRandom:
    def random(self) -> float:
        return 0.25


def test_backoff_delay_hand_values():
    # d = min(cap, base * 2**attempt); wait = d/2 + 0.25 * d/2 with random() = 0.25
    assert backoff_delay(0, 0.5, 30.0, FixedRandom()) == pytest.approx(0.3125)  # d=0.5: 0.25 + 0.0625
    assert backoff_delay(2, 0.5, 30.0, FixedRandom()) == pytest.approx(1.25)  # d=2.0: 1.0 + 0.25
    assert backoff_delay(10, 0.5, 30.0, FixedRandom()) == pytest.approx(18.75)  # d=min(30, 512)=30: 15 + 3.75


def test_option_logprob_hand_values():
    top = [
        (" A", math.log(0.5)),
        ("A", math.log(0.2)),
        ("B", math.log(0.1)),
        (" Bad", math.log(0.05)),
        ("\n", math.log(0.1)),
    ]
    # "A": spellings " A" and "A" -> log(0.5 + 0.2) = log(0.7)
    assert option_logprob(top, "A") == pytest.approx(math.log(0.7))
    # "A) yes": its first token is the longest listed prefix, "A" -> log(0.7) again
    assert option_logprob(top, "A) yes") == pytest.approx(math.log(0.7))
    # "Bad": " Bad" (3 chars) beats "B" (1 char) -> log(0.05)
    assert option_logprob(top, "Bad") == pytest.approx(math.log(0.05))
    # " B": leading space stripped -> "B" only ("Bad" does not begin "B") -> log(0.1)
    assert option_logprob(top, " B") == pytest.approx(math.log(0.1))
    assert option_logprob(top, "C") == -math.inf  # "\n" strips to "" and never matches
    with pytest.raises(ValueError, match="non-space"):
        option_logprob(top, "  ")


def test_base_url_checked_and_completed():
    assert OpenAIEngine("http://127.0.0.1:9", **FAST).base_url == "http://127.0.0.1:9/v1"
    assert OpenAIEngine("https://api.example.com/v1/", **FAST).base_url == "https://api.example.com/v1"
    with pytest.raises(ConfigError, match="base_url"):
        OpenAIEngine("127.0.0.1:8000/v1", **FAST)
    with pytest.raises(ConfigError, match="max_concurrency"):
        OpenAIEngine("http://127.0.0.1:9/v1", max_concurrency=0, **FAST)


def test_engine_from_spec_builds_openai_engine():
    engine = engine_from_spec("http://127.0.0.1:9/v1", model="judge-7b", timeout_s=5.0, max_retries=1)
    assert isinstance(engine, OpenAIEngine)
    assert (engine.base_url, engine.model, engine.timeout_s, engine.max_retries) == (
        "http://127.0.0.1:9/v1",
        "judge-7b",
        5.0,
        1,
    )


# ---------------------------------------------------------------------- requests and parsing
def test_generate_payload_and_parsing(monkeypatch):
    monkeypatch.setenv("TEST_OPENAI_KEY", "sk-test-123")

    def respond(seen: Seen, index: int) -> Reply:
        if seen.method == "GET":
            return Reply(body={"object": "list", "data": [{"id": "served-model"}, {"id": "other"}]})
        n = seen.body["n"]
        texts = [f"reply {i}" for i in range(n)]
        return Reply(body=completion(*texts, logprobs=[[-0.5, -1.0]] * n, finish="length"))

    with FakeAPI(respond) as api:
        engine = OpenAIEngine(api.url, api_key_env="TEST_OPENAI_KEY", backoff_s=0.01)
        params = SamplingParams(max_new_tokens=7, temperature=0.3, top_p=0.9, n=2, stop=("\n",), seed=11)
        out = engine.generate([USER, USER], params)
        engine.generate([USER], SamplingParams(max_new_tokens=3, top_k=5))
    assert [s.method for s in api.seen].count("GET") == 1  # the model is asked once
    assert api.seen[0].path == "/v1/models"
    body = api.posts()[0].body
    assert body == {
        "model": "served-model",
        "messages": USER,
        "n": 2,
        "max_tokens": 7,
        "temperature": 0.3,
        "top_p": 0.9,
        "logprobs": True,
        "stop": ["\n"],
        "seed": 11,
    }
    assert api.posts()[2].body["top_k"] == 5 and "top_k" not in body
    assert all(s.headers["authorization"] == "Bearer sk-test-123" for s in api.seen)
    assert [[g.text for g in gens] for gens in out] == [["reply 0", "reply 1"]] * 2
    g = out[0][0]
    assert (g.logprobs, g.token_ids, g.finish_reason) == ([-0.5, -1.0], [], "length")
    assert engine.supports_logprobs is True  # shown by the responses: no probe request
    assert len(api.seen) == 4


def test_generation_without_logprobs_and_with_token_ids():
    def respond(seen: Seen, index: int) -> Reply:
        if seen.body.get("return_tokens_as_token_ids"):
            body = completion("ab", logprobs=[[-0.1, -0.2]])
            for j, e in enumerate(body["choices"][0]["logprobs"]["content"]):
                e["token"] = f"token_id:{40 + j}"
            return Reply(body=body)
        return Reply(body=completion("plain"))

    with FakeAPI(respond) as api:
        plain = OpenAIEngine(api.url, model="m", **FAST).generate([USER], SamplingParams())[0][0]
        ids = OpenAIEngine(api.url, model="m", return_token_ids=True, **FAST).generate(
            [USER], SamplingParams()
        )[0][0]
    assert (plain.text, plain.logprobs, plain.token_ids) == ("plain", None, [])
    assert (ids.text, ids.logprobs, ids.token_ids) == ("ab", [-0.1, -0.2], [40, 41])


def test_continuation_prefix_sends_vllm_fields():
    with FakeAPI(ok) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        engine.generate([[*USER, {"role": "assistant", "content": "Rating:"}]], SamplingParams())
        engine.generate([USER], SamplingParams())
    cont, plain = api.posts()[0].body, api.posts()[1].body
    assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False
    assert cont["messages"][-1] == {"role": "assistant", "content": "Rating:"}
    assert "continue_final_message" not in plain and "add_generation_prompt" not in plain


def test_servers_that_ignore_n_are_asked_for_the_rest():
    def respond(seen: Seen, index: int) -> Reply:
        return Reply(body=completion(f"r{index}"))  # always one choice, whatever n says

    with FakeAPI(respond) as api:
        gens = OpenAIEngine(api.url, model="m", **FAST).generate([USER], SamplingParams(n=3, seed=7))[0]
    assert [g.text for g in gens] == ["r0", "r1", "r2"]
    assert [(s.body["n"], s.body["seed"]) for s in api.posts()] == [(3, 7), (2, 8), (1, 9)]


def test_batch_requests_run_concurrently_and_keep_order():
    def respond(seen: Seen, index: int) -> Reply:
        return Reply(body=completion("echo " + seen.body["messages"][0]["content"]), delay=0.3)

    prompts = [[{"role": "user", "content": str(i)}] for i in range(6)]
    with FakeAPI(respond) as api:
        engine = OpenAIEngine(api.url, model="m", max_concurrency=3, **FAST)
        out = engine.generate(prompts, SamplingParams())
    assert [gens[0].text for gens in out] == [f"echo {i}" for i in range(6)]
    assert api.max_in_flight == 3  # bounded by max_concurrency, and actually concurrent


# ---------------------------------------------------------------------- reliability
def test_retries_500_twice_then_succeeds():
    def respond(seen: Seen, index: int) -> Reply:
        return (
            Reply(500, {"error": {"message": "overloaded"}})
            if index < 2
            else Reply(body=completion("third time"))
        )

    with FakeAPI(respond) as api:
        out = OpenAIEngine(api.url, model="m", max_retries=3, **FAST).generate([USER], SamplingParams())
    assert out[0][0].text == "third time" and len(api.seen) == 3


def test_always_500_gives_up_naming_the_url():
    with FakeAPI(lambda s, i: Reply(500, {"error": {"message": "model crashed"}})) as api:
        engine = OpenAIEngine(api.url, model="m", max_retries=2, **FAST)
        with pytest.raises(EngineError) as info:
            engine.generate([USER], SamplingParams())
    text = str(info.value)
    assert f"{api.url}/chat/completions" in text and "HTTP 500" in text and "model crashed" in text
    assert "3 attempts" in text and len(api.seen) == 4  # and one 1-token health request, refused too
    assert info.value.status == 500


def test_429_is_retried_with_retry_after():
    def respond(seen: Seen, index: int) -> Reply:
        if index == 0:
            return Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0.05"})
        return Reply(body=completion("ok"))

    with FakeAPI(respond) as api:
        out = OpenAIEngine(api.url, model="m", **FAST).generate([USER], SamplingParams())
    assert out[0][0].text == "ok" and len(api.seen) == 2


def test_other_4xx_fail_at_once_with_the_server_message():
    reply = Reply(400, {"error": {"message": "max_tokens is too large"}})
    with (
        FakeAPI(lambda s, i: reply) as api,
        pytest.raises(EngineError, match="HTTP 400: max_tokens is too large") as info,
    ):
        OpenAIEngine(api.url, model="m", max_retries=5, **FAST).generate([USER], SamplingParams())
    # not retried; a 1-token health request (one attempt) is refused too, so the endpoint is down
    assert len(api.seen) == 2 and api.seen[1].body["max_tokens"] == 1 and info.value.status == 400


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_refused_names_the_endpoint():
    url = f"http://127.0.0.1:{free_port()}/v1"
    engine = OpenAIEngine(url, model="m", max_retries=1, **FAST)
    with pytest.raises(EngineError) as info:
        engine.generate([USER], SamplingParams())
    text = str(info.value)
    assert f"POST {url}/chat/completions" in text and "connection failed" in text and "2 attempts" in text
    assert info.value.status is None


def test_timeouts_are_retried_then_reported():
    with FakeAPI(lambda s, i: Reply(body=completion("late"), delay=1.0)) as api:
        engine = OpenAIEngine(api.url, model="m", timeout_s=0.2, max_retries=1, **FAST)
        # an attempt that waited for the late answer (1 s) would have it, and nothing would be raised
        with pytest.raises(EngineError, match=r"timed out after 0\.2 s .*2 attempts"):
            engine.generate([USER], SamplingParams())
    assert len(api.seen) == 2


def test_api_key_never_appears_in_errors_or_repr(monkeypatch):
    key = "sk-very-secret-0042"
    monkeypatch.setenv("TEST_OPENAI_KEY", key)

    def respond(seen: Seen, index: int) -> Reply:  # a server that echoes the rejected key, as some do
        return Reply(401, {"error": {"message": f"Incorrect API key provided: {key}"}})

    with FakeAPI(respond) as api:
        engine = OpenAIEngine(api.url, model="m", api_key_env="TEST_OPENAI_KEY", backoff_s=0.01)
        with pytest.raises(EngineError) as info:
            engine.generate([USER], SamplingParams())
    assert api.seen[0].headers["authorization"] == f"Bearer {key}"
    assert key not in str(info.value) and "Incorrect API key provided: ***" in str(info.value)
    assert key not in repr(engine) and key not in repr(vars(engine)) and "api_key=set" in repr(engine)
    refused = OpenAIEngine(
        f"http://127.0.0.1:{free_port()}/v1", model="m", api_key_env="TEST_OPENAI_KEY", max_retries=0
    )
    with pytest.raises(EngineError) as info:
        refused.generate([USER], SamplingParams())
    assert key not in str(info.value)


def test_no_authorization_header_without_a_key(monkeypatch):
    monkeypatch.delenv("TEST_OPENAI_KEY", raising=False)
    with FakeAPI(ok) as api:
        OpenAIEngine(api.url, model="m", api_key_env="TEST_OPENAI_KEY").generate([USER], SamplingParams())
    assert "authorization" not in api.seen[0].headers


def test_empty_model_list_is_a_clear_error():
    empty = Reply(body={"object": "list", "data": []})
    with (
        FakeAPI(lambda s, i: empty) as api,
        pytest.raises(EngineError, match=r"GET .*/v1/models: no model listed"),
    ):
        OpenAIEngine(api.url, **FAST).generate([USER], SamplingParams())


# ---------------------------------------------------------------------- log-probs
def top_reply(top: list[tuple[str, float]] | None) -> Reply:
    body = completion("A")
    if top is not None:
        entry = {"token": top[0][0], "logprob": top[0][1], "bytes": None}
        entry["top_logprobs"] = [{"token": t, "logprob": v, "bytes": None} for t, v in top]
        body["choices"][0]["logprobs"] = {"content": [entry]}
    return Reply(body=body)


def test_choice_logprobs_reads_the_top_list():
    top = [(" A", math.log(0.6)), ("B", math.log(0.3)), ("A", math.log(0.05))]
    with FakeAPI(lambda s, i: top_reply(top)) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        out = engine.choice_logprobs([USER, USER], ["A", "B", "C"])
    # "A" = log(0.6 + 0.05), "B" = log(0.3), "C" is not listed
    assert (
        out == [{"A": pytest.approx(math.log(0.65)), "B": pytest.approx(math.log(0.3)), "C": -math.inf}] * 2
    )
    body = api.posts()[0].body
    assert (body["max_tokens"], body["logprobs"], body["top_logprobs"], body["n"]) == (1, True, 20, 1)
    assert engine.supports_logprobs is True


def test_choice_logprobs_without_logprobs_is_a_capability_error():
    with FakeAPI(lambda s, i: top_reply(None)) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        with pytest.raises(CapabilityError, match=f"{api.url}/chat/completions returned no top log-probs"):
            engine.choice_logprobs([USER], ["A", "B"])
        assert engine.supports_logprobs is False
        assert len(api.seen) == 1  # known now: no probe


def test_supports_logprobs_probes_once():
    with FakeAPI(lambda s, i: top_reply([("Hi", -0.1)])) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        assert engine.supports_logprobs is True and engine.supports_logprobs is True
        # one probe; the setup round also asks the model list and the version (structured: auto)
        assert len(api.posts()) == 1 and api.posts()[0].body["max_tokens"] == 1
        assert sorted(s.path for s in api.seen if s.method == "GET") == ["/v1/models", "/version"]
    with FakeAPI(lambda s, i: Reply(400, {"error": {"message": "logprobs is not supported"}})) as api:
        assert OpenAIEngine(api.url, model="m", **FAST).supports_logprobs is False


# ---------------------------------------------------------------------- streaming
def chunk(content: str | None, finish: str | None = None) -> str:
    delta = {} if content is None else {"content": content}
    return json.dumps(
        {
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


def test_stream_yields_content_deltas_and_retries_before_the_first_byte():
    events = [json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    events += [chunk("That "), chunk("sounds "), chunk("hard."), chunk(None, "stop"), "[DONE]"]

    def respond(seen: Seen, index: int) -> Reply:
        return Reply(503, {"error": {"message": "warming up"}}) if index == 0 else Reply(sse=events)

    with FakeAPI(respond) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        pieces = list(engine.stream(USER, SamplingParams(n=4, max_new_tokens=9)))
    assert pieces == ["That ", "sounds ", "hard."]
    body = api.posts()[1].body
    assert body["stream"] is True and body["n"] == 1 and body["max_tokens"] == 9 and "logprobs" not in body
    assert api.posts()[1].headers["accept"] == "text/event-stream"


def test_stream_error_event_raises():
    events = [chunk("Hel"), json.dumps({"error": {"message": "out of memory"}}), "[DONE]"]
    with FakeAPI(lambda s, i: Reply(sse=events)) as api:
        stream = OpenAIEngine(api.url, model="m", **FAST).stream(USER, SamplingParams())
        assert next(stream) == "Hel"
        with pytest.raises(EngineError, match="server error in stream: out of memory"):
            next(stream)


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ("<html>oops</html>", "response is not JSON"),
        ({"object": "chat.completion"}, "response has no 'choices' list"),
        ({"choices": []}, "response has no choices"),
        ({"choices": [{"index": 0, "text": "legacy"}]}, r"malformed choice \(no message.content\)"),
    ],
)
def test_malformed_responses_are_clear_errors(body, needle):
    with FakeAPI(lambda s, i: Reply(body=body)) as api:
        with pytest.raises(EngineError, match=f"POST {api.url}/chat/completions: {needle}"):
            OpenAIEngine(api.url, model="m", **FAST).generate([USER], SamplingParams())
        assert len(api.seen) == 1  # a malformed answer is not retried


def test_a_429_storm_on_the_log_prob_probe_does_not_stop_the_run(caplog):
    # issue 46: with max_retries=1 and every request answered 429, the 1-token probe raised and training
    # stopped at step 1; the endpoint answers, so only the items fail and the next call asks again
    storm = Reply(429, {"error": {"message": "rate limited"}}, headers={"Retry-After": "0.01"})
    with FakeAPI(lambda s, i: storm if s.method == "POST" else Reply(body={"data": [{"id": "m"}]})) as api:
        engine = OpenAIEngine(api.url, model="m", max_retries=1, **FAST)
        assert engine.supports_logprobs is False
        out = engine.generate([USER], SamplingParams(max_new_tokens=4))
        assert out[0][0].finish_reason == "error"  # the item fails; the call returns
        assert engine.supports_logprobs is False
        assert sum(s.body.get("max_tokens") == 1 for s in api.posts()) >= 2  # probed again
    assert "the log-prob probe got HTTP 429" in caplog.text


def test_a_huge_reply_to_a_small_max_tokens_is_cut(caplog):
    # issue 46: a 2.4 MB reply to max_tokens 8 was stored whole
    from rapo_echo.engines.openai_engine import MAX_CHARS_PER_TOKEN

    with FakeAPI(lambda s, i: Reply(body=completion("x" * 2_400_000))) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        (gen,) = engine.generate([USER], SamplingParams(max_new_tokens=8))[0]
        assert len(gen.text) == 8 * MAX_CHARS_PER_TOKEN and gen.finish_reason == "length"
        (short,) = engine.generate([USER], SamplingParams(max_new_tokens=40_000))[0]
        assert len(short.text) == 2_400_000  # within the bound: as the server wrote it
    assert "a reply of 2400000 characters to max_tokens 8" in caplog.text


def test_a_retry_after_beyond_the_retries_patience_fails_at_once():
    # issue 46: Retry-After 86400 cost every context max_retries x max_backoff_s of waiting
    day = Reply(429, {"error": {"message": "come back tomorrow"}}, headers={"Retry-After": "86400"})
    with FakeAPI(lambda s, i: day if s.method == "POST" else Reply(body={"data": [{"id": "m"}]})) as api:
        engine = OpenAIEngine(api.url, model="m", max_retries=3, backoff_s=0.01, max_backoff_s=30.0,
                              api_key_env=None)  # fmt: skip
        out = engine.generate([USER, USER], SamplingParams(max_new_tokens=4))
        assert [g[0].finish_reason for g in out] == ["error", "error"] and engine.failed_items == 2
        assert len([s for s in api.posts() if s.body.get("max_tokens") == 4]) == 2  # one attempt each

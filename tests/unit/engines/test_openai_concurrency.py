"""The ``openai`` engine at the latency floor: a call's requests all in flight at once (bounded by
``max_concurrency``), setup in one round after the model list, one engine for roles on one endpoint, a
failed request that costs one item (and a call that raises only when the endpoint is down), Retry-After,
the token charge and top log-probs. In-flight counts come from the fake server's own record (a
:class:`Rendezvous` holds a stage until all of it waits together); nothing here asserts a duration."""

from __future__ import annotations

import math
import threading
import time

import pytest

from rapo_echo.config import EngineConfig
from rapo_echo.engines import make_engine
from rapo_echo.engines import openai_engine as oe
from rapo_echo.engines.openai_engine import EndpointError, OpenAIEngine, request_tokens, retry_after_seconds
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import FAILED, SamplingParams
from tests.helpers.fake_openai import FakeAPI, Rendezvous, Reply, Seen, ServedAPI, completion, prompt_of

FAST = {"backoff_s": 0.01, "api_key_env": None}
PARAMS = SamplingParams(max_new_tokens=8, temperature=0.0)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def is_chat(seen: Seen) -> bool:
    return seen.method == "POST" and seen.body.get("max_tokens") != 1


def test_every_request_of_a_call_is_in_flight_at_once():
    rv = Rendezvous(40, is_chat)
    with FakeAPI(ServedAPI(gate=rv)) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        out = engine.generate([user(f"case {i}") for i in range(40)], PARAMS)
    assert len(out) == 40 and all(g[0].text for g in out)
    assert rv.peak == 40 and api.max_in_flight == 40  # five times the old cap of 8


def test_max_concurrency_caps_the_requests_in_flight():
    rv = Rendezvous(3, is_chat)
    with FakeAPI(ServedAPI(gate=rv)) as api:
        engine = OpenAIEngine(api.url, model="m", max_concurrency=3, **FAST)
        engine.generate([user(f"case {i}") for i in range(9)], PARAMS)
    assert rv.peak == 3 and api.max_in_flight == 3 and engine.limits.most_in_flight == 3


def test_setup_is_one_round_on_a_vllm_server():
    rv = Rendezvous(2, lambda s: s.method == "GET")
    with FakeAPI(ServedAPI(gate=rv)) as api:
        engine = OpenAIEngine(api.url, **FAST)  # no model given: the list names it
        assert engine.supports_logprobs is True  # owned_by vllm: it returns log-probs, no probe needed
        assert rv.peak == 2 and sorted(s.path for s in api.seen) == ["/v1/models", "/version"]
        fmt = SamplingParams(max_new_tokens=4, answer_format=AnswerFormat.choice(["yes", "no"]))
        engine.generate([user("a"), user("b")], fmt)  # vLLM's structured_outputs, known from the setup
    assert len(api.seen) == 4 and all(s.method == "POST" for s in api.seen[2:])
    assert "structured_outputs" in api.seen[-1].body


def test_setup_probes_log_probs_after_the_list_on_another_server():
    with FakeAPI(ServedAPI(owner="sglang")) as api:
        engine = OpenAIEngine(api.url, **FAST)
        assert engine.supports_logprobs is True  # the probe's answer held a top list
    assert [s.path for s in api.seen[2:]] == ["/v1/chat/completions"] and api.seen[2].body["max_tokens"] == 1
    assert sorted(s.path for s in api.seen[:2]) == ["/v1/models", "/version"]  # round one, then the probe


def test_roles_on_one_endpoint_share_one_engine():
    shared: dict = {}
    url = "http://127.0.0.1:9"
    sim = make_engine(EngineConfig(engine="openai", base_url=url), role="simulator", shared=shared)
    judge = make_engine(EngineConfig(engine="openai", base_url=url + "/v1/"), role="judge", shared=shared)
    assert judge is sim and sim.name == "simulator+judge:openai"
    assert sim.max_concurrency == 256 and sim.limits.max_concurrency == 256  # the config's default
    narrow = EngineConfig(engine="openai", base_url=url, max_concurrency=4)
    other = make_engine(narrow, role="judge", shared=shared)
    assert other is not sim and other.max_concurrency == 4  # other request settings: its own engine
    alone = make_engine(EngineConfig(engine="openai", base_url="http://127.0.0.1:9"), role="judge")
    assert alone is not sim  # without a shared dict every role builds its own


def test_a_failed_request_costs_one_item_and_the_rest_are_kept():
    served = ServedAPI(fail=lambda s: 500 if "BAD" in prompt_of(s) else None)
    with FakeAPI(served) as api:
        engine = OpenAIEngine(api.url, model="m", max_retries=1, **FAST)
        out = engine.generate([user("one"), user("BAD two"), user("three"), user("four")], PARAMS)
        rows = engine.choice_logprobs([user("BAD five"), user("six")], ["1", "2"])
    assert [g[0].finish_reason for g in out] == ["stop", FAILED, "stop", "stop"]
    assert out[1][0].text == "" and all(out[i][0].text for i in (0, 2, 3))
    assert rows[0] == {} and math.isfinite(rows[1]["1"])  # a failed read: no option scored
    assert engine.failed_items == 2 and served.failed == 4  # each failed item was tried twice
    assert sum("BAD" in prompt_of(s) for s in api.posts()) == 4


def test_a_call_whose_every_request_fails_raises_naming_the_endpoint_when_it_is_down():
    with FakeAPI(ServedAPI(fail=lambda s: 500)) as api:
        engine = OpenAIEngine(api.url, model="m", max_retries=1, **FAST)
        with pytest.raises(EndpointError, match=f"{api.url}/chat/completions.*it is down") as info:
            engine.generate([user("a"), user("b"), user("c")], PARAMS)
    assert info.value.status == 500 and engine.failed_items == 0
    assert prompt_of(api.posts()[-1]) == "Hi"  # the health request failed too


def test_a_lone_failing_request_while_others_are_answered_is_an_item_failure():
    answered = threading.Event()

    def gate(seen: Seen) -> None:
        if seen.method == "POST" and "BAD" in prompt_of(seen):
            answered.wait(30)  # fail only once another request has been answered meanwhile

    served = ServedAPI(fail=lambda s: 500 if "BAD" in prompt_of(s) else None, gate=gate)
    with FakeAPI(served) as api:
        engine = OpenAIEngine(api.url, model="m", max_retries=0, **FAST)
        got: list = []
        worker = threading.Thread(target=lambda: got.append(engine.generate([user("BAD")], PARAMS)))
        worker.start()
        engine.generate([user("fine")], PARAMS)  # another dialogue's call, answered
        answered.set()
        worker.join()
        assert got[0][0][0].finish_reason == FAILED and engine.failed_items == 1  # no exception: one item
        assert not any(prompt_of(s) == "Hi" for s in api.posts())  # no health request was needed
        # alone now (nothing else answered meanwhile), but the endpoint answers a health request: one item
        assert engine.generate([user("BAD again")], PARAMS)[0][0].finish_reason == FAILED
        assert engine.failed_items == 2 and prompt_of(api.posts()[-1]) == "Hi"


def test_retry_after_seconds_and_http_dates():
    assert retry_after_seconds("2") == 2.0 and retry_after_seconds("-3") == 0.0
    when = 1445412480.0  # Wed, 21 Oct 2015 07:28:00 GMT
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=when - 5) == pytest.approx(5.0)
    assert retry_after_seconds("Wed, 21 Oct 2015 07:28:00 GMT", now=when + 60) == 0.0
    assert retry_after_seconds("soon") is None and retry_after_seconds(None) is None


@pytest.mark.parametrize(("status", "pauses"), [(429, True), (503, True), (500, False)])
def test_retry_after_of_429_and_503_holds_back_every_new_request(monkeypatch, status, pauses):
    def respond(seen: Seen, index: int) -> Reply:
        if index == 0:
            return Reply(status, {"error": {"message": "busy"}}, headers={"Retry-After": "0.5"})
        return Reply(body=completion("ok"))

    slept: list[float] = []
    monkeypatch.setattr(oe.time, "sleep", slept.append)
    with FakeAPI(respond) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        held: list[float] = []
        monkeypatch.setattr(engine.limits, "pause_until", held.append)
        before = time.monotonic()
        assert engine.generate([user("hi")], PARAMS)[0][0].text == "ok"
    assert max(slept) >= 0.5  # the retry waited as long as the server asked
    if pauses:  # and no request of the engine goes out before then
        assert len(held) == 1 and before + 0.5 <= held[0] <= time.monotonic() + 0.5
    else:
        assert held == []


def test_the_token_charge_of_a_request():
    payload = {"messages": [{"role": "user", "content": "abcd" * 10}], "max_tokens": 7, "n": 2}
    assert request_tokens(payload) == 10 + 14  # 40 characters / 4, plus max_tokens x n
    assert request_tokens(None) == 0 and request_tokens({"model": "m"}) == 0


def test_top_logprobs_come_back_per_sampled_token():
    with FakeAPI(ServedAPI()) as api:
        engine = OpenAIEngine(api.url, model="m", **FAST)
        plain = engine.generate([user("hi")], PARAMS)[0][0]
        [[g]] = engine.generate([user("hi")], SamplingParams(max_new_tokens=8, top_logprobs=20))
    assert api.posts()[-1].body["top_logprobs"] == 20 and "top_logprobs" not in api.posts()[0].body
    assert plain.top_logprobs is None
    assert g.top_logprobs is not None and "".join(tok for tok, _ in g.top_logprobs) == g.text
    assert all(tok in [t for t, _ in top] for tok, top in g.top_logprobs)
    with pytest.raises(ValueError, match="top_logprobs"):
        SamplingParams(top_logprobs=21)


def test_request_limits_in_the_config():
    cfg = EngineConfig(engine="openai", base_url="http://127.0.0.1:9", max_rpm=600, max_tpm=90000)
    engine = make_engine(cfg, role="judge")
    assert engine.limits.rpm is not None and engine.limits.rpm.rate == 10.0
    assert engine.limits.tpm is not None and engine.limits.tpm.rate == 1500.0
    with pytest.raises(ValueError, match="max_rpm"):
        EngineConfig(engine="openai", base_url="http://127.0.0.1:9", max_rpm=0)

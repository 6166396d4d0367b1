"""``rapo-echo serve``: the app in-process (scripted and tiny ``hf`` engines), the serving helpers added
to the ``hf`` engine, and a real server subprocess queried by the ``openai`` engine, the official
``openai`` client and the chat REPL."""

from __future__ import annotations

import argparse
import importlib.util
import io
import json
import math
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from types import SimpleNamespace

import httpx
import pytest
import torch

from rapo_echo import serve
from rapo_echo.chat import repl
from rapo_echo.config import section_from_args
from rapo_echo.engines.hf import HFEngine
from rapo_echo.engines.openai_engine import OpenAIEngine, option_logprob
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import ConfigError, EngineError, RapoEchoError
from rapo_echo.types import Conversation, Generation, SamplingParams
from tests.helpers.launch import served_process

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient

P1 = [{"role": "user", "content": "I failed my driving test again."}]
P2 = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "My cat is sick."}]
GREEDY = SamplingParams(max_new_tokens=6, temperature=0)
KEY_ENV = "RAPO_ECHO_TEST_SERVE_KEY"


@pytest.fixture(scope="module")
def ref(tiny_module_folder) -> HFEngine:
    """The tiny model in-process: the reference the served copy must match."""
    return HFEngine.from_spec(str(tiny_module_folder), device="cpu")


def post(client: TestClient, **body) -> httpx.Response:
    return client.post("/v1/chat/completions", json=body)


def sse_events(text: str) -> list[str]:
    return [line[6:] for line in text.splitlines() if line.startswith("data: ")]


# ---------------------------------------------------------------------- app with a scripted engine
@pytest.fixture
def scripted_client() -> TestClient:
    engine = ScriptedEngine(
        rules=[(r"sick", "I am so sorry to hear that. Is your cat at the vet?")], default="Tell me more."
    )
    return TestClient(serve.create_app(engine, "scripted-model"))


def test_models_and_completion_schema(scripted_client):
    models = scripted_client.get("/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == ["scripted-model"]
    r = post(scripted_client, model="scripted-model", messages=P2, n=2, stop=["?"], logprobs=True)
    assert r.status_code == 200
    body = r.json()
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    assert isinstance(body["created"], int) and body["model"] == "scripted-model"
    assert [c["index"] for c in body["choices"]] == [0, 1]
    choice = body["choices"][0]
    assert choice["message"] == {
        "role": "assistant",
        "content": "I am so sorry to hear that. Is your cat at the vet",
    }
    assert choice["finish_reason"] == "stop" and choice["logprobs"] is None  # this engine has no log-probs
    assert body["usage"] is None  # and does not count tokens


def test_stop_as_string_and_max_completion_tokens(scripted_client):
    body = post(scripted_client, messages=P2, stop="hear", max_completion_tokens=50).json()
    assert body["choices"][0]["message"]["content"] == "I am so sorry to "
    body = post(scripted_client, messages=P2, max_tokens=3).json()  # the scripted engine counts words
    assert (
        body["choices"][0]["message"]["content"] == "I am so"
        and body["choices"][0]["finish_reason"] == "length"
    )


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ({"messages": []}, "messages: List should have at least 1 item"),
        ({"messages": P1, "temperature": 3}, "temperature: Input should be less than or equal to 2"),
        ({"messages": P1, "n": 0}, "n: Input should be greater than or equal to 1"),
        ({"messages": P1, "top_logprobs": 2}, "top_logprobs needs logprobs: true"),
        (
            {"messages": P1, "logprobs": True, "top_logprobs": 21},
            "top_logprobs: Input should be less than or equal to 20",
        ),
        ({"messages": P1, "stop": [""]}, "stop strings must not be empty"),
        ({"messages": P1, "tools": [{"type": "function"}]}, "'tools' is not supported"),
        ({"messages": P1, "presence_penalty": 0.5}, "'presence_penalty' is not supported"),
        ({"messages": P1, "stream": True, "n": 2}, "stream: true supports n = 1 only"),
        ({"messages": P1, "continue_final_message": True}, "needs a last message with role 'assistant'"),
        (
            {
                "messages": [*P1, {"role": "assistant", "content": "So"}],
                "continue_final_message": True,
                "add_generation_prompt": True,
            },
            "cannot both be true",
        ),
    ],
)
def test_bad_requests_get_400_naming_the_field(scripted_client, body, needle):
    r = post(scripted_client, **body)
    assert r.status_code == 400
    assert needle in r.json()["error"]["message"]


def test_malformed_json_unknown_model_and_engine_limits(scripted_client):
    r = scripted_client.post(
        "/v1/chat/completions", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and "Invalid JSON" in r.json()["error"]["message"]
    r = post(scripted_client, model="gpt-9", messages=P1)
    assert r.status_code == 404 and "'gpt-9' does not exist; this server serves 'scripted-model'" in r.text
    # a generic engine can continue a final assistant message, but not open a new turn after one
    ok = post(
        scripted_client, messages=[*P1, {"role": "assistant", "content": "Oh"}], continue_final_message=True
    )
    assert ok.status_code == 200
    r = post(scripted_client, messages=[*P1, {"role": "assistant", "content": "Oh"}])
    assert r.status_code == 400 and "can only continue a final assistant message" in r.text


def test_streaming_events_end_with_done(scripted_client):
    r = post(scripted_client, messages=P2, stream=True)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "scripted-model" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    pieces = [c["choices"][0]["delta"].get("content", "") for c in chunks[1:]]
    assert len([p for p in pieces if p]) == 13  # streamed word by word: 13 words
    assert "".join(pieces) == "I am so sorry to hear that. Is your cat at the vet?"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


class FailingEngine:
    """An engine that fails: in ``generate`` at once, in ``stream`` after its first piece."""

    name = "failing"
    supports_logprobs = False

    def generate(self, prompts: Sequence[Conversation], params: SamplingParams) -> list[list[Generation]]:
        raise EngineError("backend exploded")

    def choice_logprobs(self, prompts, options):
        raise EngineError("backend exploded")

    def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]:
        yield "Hel"
        raise EngineError("backend exploded mid-stream")


def test_engine_errors_are_reported():
    client = TestClient(serve.create_app(FailingEngine(), "f"))
    r = post(client, messages=P1)
    assert r.status_code == 500 and "engine error: backend exploded" in r.json()["error"]["message"]
    events = sse_events(post(client, messages=P1, stream=True).text)
    assert json.loads(events[1])["choices"][0]["delta"]["content"] == "Hel"
    assert "backend exploded mid-stream" in json.loads(events[2])["error"]["message"]
    assert events[-1] == "[DONE]"


class SlowEngine(ScriptedEngine):
    """Records how many calls overlap, to check the server's engine lock."""

    def __init__(self) -> None:
        super().__init__(default="ok")
        self.active = 0
        self.most = 0

    def generate(self, prompts, params):
        self.active += 1
        self.most = max(self.most, self.active)
        time.sleep(0.05)
        self.active -= 1
        return super().generate(prompts, params)


def test_one_engine_call_at_a_time():
    engine = SlowEngine()
    client = TestClient(serve.create_app(engine, "slow"))
    codes: list[int] = []
    threads = [
        threading.Thread(target=lambda: codes.append(post(client, messages=P1).status_code)) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert codes == [200] * 4 and engine.most == 1


def test_api_key_required_and_never_echoed():
    key = "serve-secret-" + uuid.uuid4().hex
    client = TestClient(serve.create_app(ScriptedEngine(), "s", api_key=key))
    assert client.get("/health").status_code == 200  # liveness needs no key
    for headers in ({}, {"Authorization": "Bearer wrong-key-123"}, {"Authorization": key}):
        r = client.get("/v1/models", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        assert key not in r.text and "wrong-key-123" not in r.text
    r = client.post("/v1/chat/completions", json={"messages": P1}, headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401
    good = {"Authorization": f"Bearer {key}"}
    assert client.get("/v1/models", headers=good).status_code == 200
    assert client.post("/v1/chat/completions", json={"messages": P1}, headers=good).status_code == 200


def test_missing_serve_extra_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "fastapi", None)  # makes ``import fastapi`` fail
    with pytest.raises(RapoEchoError, match=r"pip install 'rapo-echo\[serve\]'"):
        serve.create_app(ScriptedEngine(), "s")


# ---------------------------------------------------------------------- serving helpers of the hf engine
class PositionLogits(torch.nn.Module):
    """A fake causal LM over a 3-token vocabulary: the logits at each position are [input id, 0, 0]."""

    def __init__(self) -> None:
        super().__init__()
        self.unused = torch.nn.Parameter(torch.zeros(1))

    def forward(self, input_ids: torch.Tensor, logits_to_keep: int = 0, **_: object) -> SimpleNamespace:
        logits = torch.zeros(*input_ids.shape, 3)
        logits[..., 0] = input_ids.float()
        return SimpleNamespace(logits=logits[:, -logits_to_keep:] if logits_to_keep else logits)


def test_top_logprobs_ids_hand_values():
    engine = HFEngine(PositionLogits(), SimpleNamespace(pad_token_id=0, eos_token_id=2))
    # prompt [1], completion [2, 0]: the model reads [1, 2]; logits [1, 0, 0] at position 0, [2, 0, 0] at 1
    # T=1: log_softmax([1,0,0]) = [1,0,0] - log(e + 2) = [-0.55144, -1.55144, -1.55144]
    #      log_softmax([2,0,0]) = [2,0,0] - log(e^2 + 2) = [-0.23954, -2.23954, -2.23954]
    (out,) = engine.top_logprobs_ids([[1]], [[2, 0]], k=1)
    assert [(i, round(v, 5)) for (i, v) in (out[0][0], out[1][0])] == [(0, -0.55144), (0, -0.23954)]
    # T=2 at position 1: [2,0,0] / 2 = [1,0,0] -> -0.55144 and -1.55144; T=0 counts as T=1
    (out,) = engine.top_logprobs_ids([[1]], [[2, 0]], k=2, temperature=2.0)
    assert [round(v, 5) for _, v in out[1]] == [-0.55144, -1.55144]
    assert engine.top_logprobs_ids([[1]], [[2, 0]], k=1, temperature=0)[0][1][0][1] == pytest.approx(
        -0.23954, abs=1e-5
    )
    assert engine.top_logprobs_ids([[1]], [[]], k=1) == [[]]


def test_encode_chat_follows_openai_semantics(ref):
    cont = [*P1, {"role": "assistant", "content": "That sounds"}]
    assert ref.encode_chat(cont, continue_final_message=True) == ref.encode(cont)
    assert ref.encode_chat(P1) == ref.encode(P1)
    new_turn = ref.tokenizer.decode(ref.encode_chat([*P1, {"role": "assistant", "content": "Oh no."}]))
    assert new_turn.endswith("Oh no.<|im_end|>\n<|im_start|>assistant\n")
    assert ref.tokenizer.decode(ref.encode_chat(P1, add_generation_prompt=False)).endswith(
        "again.<|im_end|>\n"
    )
    with pytest.raises(ValueError, match="role 'assistant'"):
        ref.encode_chat(P1, continue_final_message=True)


def test_stream_generation_matches_generate(ref):
    items = list(ref.stream_generation(ref.encode(P1), GREEDY))
    final = items[-1]
    assert isinstance(final, Generation) and all(isinstance(i, str) for i in items[:-1])
    (expected,) = ref.generate([P1], GREEDY)[0]
    assert "".join(items[:-1]) == final.text == expected.text
    assert final.token_ids == expected.token_ids and final.finish_reason == expected.finish_reason


def test_token_text_bytes_are_exact_for_split_characters(smol_tokenizer):
    tokens = serve.TokenText(smol_tokenizer)
    ids = smol_tokenizer(" héllo 😀", add_special_tokens=False)["input_ids"]
    pieces = [tokens(i) for i in ids]
    assert b"".join(bytes(raw) for _, raw in pieces) == " héllo 😀".encode()
    assert any("\ufffd" in text for text, _ in pieces)  # the emoji is split over two tokens
    assert tokens(smol_tokenizer.eos_token_id) == ("<|im_end|>", list(b"<|im_end|>"))


# ---------------------------------------------------------------------- app with the tiny hf engine
@pytest.fixture(scope="module")
def tiny_client(ref) -> TestClient:
    return TestClient(serve.create_app(ref, "tiny"))


def test_logprobs_match_the_engine(tiny_client, ref):
    body = post(tiny_client, messages=P1, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3).json()
    (expected,) = ref.generate([P1], GREEDY)[0]
    choice = body["choices"][0]
    assert choice["message"]["content"] == expected.text
    content = choice["logprobs"]["content"]
    assert [e["logprob"] for e in content] == pytest.approx(expected.logprobs, abs=1e-6)
    for entry, token in zip(content, expected.token_ids):
        top = entry["top_logprobs"]
        assert len(top) == 3 and [t["logprob"] for t in top] == sorted(
            (t["logprob"] for t in top), reverse=True
        )
        assert top[0]["bytes"] == entry["bytes"]  # greedy: the chosen token is the most likely one
        assert top[0]["logprob"] == pytest.approx(entry["logprob"], abs=1e-4)
        assert entry["bytes"] == serve.TokenText(ref.tokenizer)(token)[1]
    assert body["usage"] == {
        "prompt_tokens": len(ref.encode(P1)),
        "completion_tokens": len(expected.token_ids),
        "total_tokens": len(ref.encode(P1)) + len(expected.token_ids),
    }


def test_sampled_logprobs_use_the_temperature_distribution(tiny_client, ref):
    params = SamplingParams(max_new_tokens=4, temperature=0.7, n=2, seed=5)
    body = post(
        tiny_client, messages=P1, max_tokens=4, temperature=0.7, n=2, seed=5, logprobs=True, top_logprobs=20
    ).json()
    expected = ref.generate([P1], params)[0]
    for choice, gen in zip(body["choices"], expected):
        assert choice["message"]["content"] == gen.text
        for entry in choice["logprobs"]["content"]:
            listed = {tuple(t["bytes"]): t["logprob"] for t in entry["top_logprobs"]}
            if tuple(entry["bytes"]) in listed:  # the same token in the top list has the same log-prob
                assert listed[tuple(entry["bytes"])] == pytest.approx(entry["logprob"], abs=1e-4)


def test_token_ids_continuation_and_new_turn(tiny_client, ref):
    body = post(
        tiny_client, messages=P1, max_tokens=3, temperature=0, logprobs=True, return_tokens_as_token_ids=True
    ).json()
    (expected,) = ref.generate([P1], SamplingParams(max_new_tokens=3, temperature=0))[0]
    assert [e["token"] for e in body["choices"][0]["logprobs"]["content"]] == [
        f"token_id:{t}" for t in expected.token_ids
    ]
    cont = [*P1, {"role": "assistant", "content": "That sounds"}]
    body = post(tiny_client, messages=cont, max_tokens=3, temperature=0, continue_final_message=True).json()
    assert (
        body["choices"][0]["message"]["content"]
        == ref.generate([cont], SamplingParams(max_new_tokens=3, temperature=0))[0][0].text
    )
    assert body["usage"]["prompt_tokens"] == len(ref.encode(cont))
    new_turn = [*P1, {"role": "assistant", "content": "Oh no."}]
    body = post(tiny_client, messages=new_turn, max_tokens=3, temperature=0).json()
    assert body["usage"]["prompt_tokens"] == len(ref.encode_chat(new_turn))


def test_context_length_is_checked(tiny_client, ref):
    ctx = ref.model.config.max_position_embeddings
    r = post(tiny_client, messages=P1, max_tokens=ctx)
    assert r.status_code == 400 and f"maximum context length is {ctx} tokens" in r.json()["error"]["message"]


def test_streaming_with_usage_from_the_hf_engine(tiny_client, ref):
    r = post(
        tiny_client,
        messages=P1,
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = [json.loads(e) for e in sse_events(r.text)[:-1]]
    (expected,) = ref.generate([P1], GREEDY)[0]
    assert (
        "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == expected.text
    )
    assert chunks[-2]["choices"][0]["finish_reason"] == expected.finish_reason
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == len(expected.token_ids)


# ---------------------------------------------------------------------- CLI parser and start-up errors
def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rapo-echo")
    serve.register(parser.add_subparsers(dest="command"))
    return parser.parse_args(list(argv))


def test_register_serve_subcommand():
    args = parse("serve", "--model", "runs/x", "--port", "0", "--served-name", "pol")
    assert args.func is serve.run
    cfg = section_from_args(serve.ServeConfig, args)
    assert (cfg.model, cfg.host, cfg.port, cfg.served_name) == ("runs/x", "127.0.0.1", 0, "pol")
    assert (cfg.api_key_env, cfg.dtype, cfg.device) == (None, "float32", "auto")
    assert section_from_args(serve.ServeConfig, parse("serve")).model == "default"


def test_run_rejects_bad_flags_before_loading(monkeypatch):
    monkeypatch.delenv("RAPO_ECHO_UNSET_KEY", raising=False)
    with pytest.raises(ConfigError, match="RAPO_ECHO_UNSET_KEY is not set"):
        serve.run(parse("serve", "--model", "/nonexistent", "--api-key-env", "RAPO_ECHO_UNSET_KEY"))
    with pytest.raises(ConfigError, match="flag --port: port: got 70000; Input should be less than"):
        serve.run(parse("serve", "--model", "/nonexistent", "--port", "70000"))
    with pytest.raises(ConfigError, match="flag --device: device: got 'gpu0'"):
        serve.run(parse("serve", "--model", "/nonexistent", "--device", "gpu0"))
    with pytest.raises(ConfigError, match="flag --max-body-mb: max_body_mb: got nan"):
        serve.run(parse("serve", "--model", "/nonexistent", "--max-body-mb", "nan"))


def test_bind_socket_reports_a_busy_port():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            serve.bind_socket("127.0.0.1", port)


# ---------------------------------------------------------------------- a real server process
@dataclass
class Served:
    url: str
    key: str


def server_command(args: list[str]) -> list[str]:
    if importlib.util.find_spec("rapo_echo.cli") is not None:
        return [sys.executable, "-m", "rapo_echo.cli", *args]
    launcher = (
        "import argparse, sys; from rapo_echo import serve; p = argparse.ArgumentParser(); "
        "serve.register(p.add_subparsers()); a = p.parse_args(sys.argv[1:]); sys.exit(a.func(a))"
    )
    return [sys.executable, "-c", launcher, *args]


@pytest.fixture(scope="module")
def served(tiny_module_folder, tmp_path_factory) -> Iterator[Served]:
    """``rapo-echo serve`` on the tiny model, on a free port, with an API key; stopped after the module."""
    key = "test-key-" + uuid.uuid4().hex
    log = tmp_path_factory.mktemp("serve-log") / "server.log"
    args = ["serve", "--model", str(tiny_module_folder), "--port", "0", "--served-name", "tiny"]
    args += ["--device", "cpu", "--api-key-env", KEY_ENV, "--log-level", "warning"]
    env = {**os.environ, KEY_ENV: key, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with served_process(server_command(args), log, env) as url:
        yield Served(url, key)


@pytest.fixture
def remote(served, monkeypatch) -> OpenAIEngine:
    monkeypatch.setenv(KEY_ENV, served.key)
    engine = OpenAIEngine(served.url, api_key_env=KEY_ENV, timeout_s=60, max_retries=1, backoff_s=0.05)
    yield engine
    engine.close()


def test_openai_engine_generates_like_the_model_in_process(remote, ref):
    assert remote.model == "tiny"
    params = SamplingParams(max_new_tokens=6, temperature=0, n=2)
    got, want = remote.generate([P1, P2], params), ref.generate([P1, P2], params)
    for gens_got, gens_want in zip(got, want):
        assert len(gens_got) == 2
        for g, w in zip(gens_got, gens_want):
            assert (g.text, g.finish_reason) == (w.text, w.finish_reason)
            assert g.logprobs == pytest.approx(w.logprobs, abs=1e-4) and g.token_ids == []
    sampled = SamplingParams(max_new_tokens=6, temperature=1.0, n=2, seed=3)
    assert [g.text for g in remote.generate([P1], sampled)[0]] == [
        g.text for g in ref.generate([P1], sampled)[0]
    ]
    assert remote.supports_logprobs is True


def test_openai_engine_continues_a_prefix_and_streams(remote, ref):
    cont = [*P1, {"role": "assistant", "content": "I understand how"}]
    assert remote.generate([cont], GREEDY)[0][0].text == ref.generate([cont], GREEDY)[0][0].text
    pieces = list(remote.stream(P1, GREEDY))
    assert len(pieces) >= 2 and "".join(pieces) == ref.generate([P1], GREEDY)[0][0].text


def test_openai_engine_choice_logprobs(remote, ref):
    ids = ref.encode(P2)
    top = [
        (serve.TokenText(ref.tokenizer)(i)[0], lp) for i, lp in ref.top_logprobs_ids([ids], [[0]], 20)[0][0]
    ]
    # options whose first token is unambiguous in the top list, plus one that is not listed at all
    options = [
        t.strip()
        for t, _ in top
        if t.strip().isalnum() and sum(t.strip().startswith(u.strip()) for u, _ in top if u.strip()) == 1
    ][:3]
    options.append("\u2603\u2603")
    (got,) = remote.choice_logprobs([P2], options)
    for option in options[:-1]:
        assert got[option] == pytest.approx(option_logprob(top, option), abs=1e-4)
        assert got[option] > -math.inf
    assert got["\u2603\u2603"] == -math.inf and len(options) >= 2


def test_official_openai_client(served, ref):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=served.url, api_key=served.key, max_retries=0)
    assert [m.id for m in client.models.list()] == ["tiny"]
    (expected,) = ref.generate([P1], GREEDY)[0]
    r = client.chat.completions.create(
        model="tiny", messages=P1, max_tokens=6, temperature=0, logprobs=True, top_logprobs=2
    )
    assert (
        r.choices[0].message.content == expected.text and r.choices[0].finish_reason == expected.finish_reason
    )
    assert [e.logprob for e in r.choices[0].logprobs.content] == pytest.approx(expected.logprobs, abs=1e-4)
    assert all(len(e.top_logprobs) == 2 for e in r.choices[0].logprobs.content)
    assert r.usage.prompt_tokens == len(ref.encode(P1))
    stream = client.chat.completions.create(
        model="tiny", messages=P1, max_tokens=6, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == expected.text
    bad = openai.OpenAI(base_url=served.url, api_key="wrong-key", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as info:
        bad.models.list()
    assert served.key not in str(info.value)


def test_missing_key_is_401_and_not_leaked(served, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    r = httpx.post(served.url + "/chat/completions", json={"messages": P1})
    assert r.status_code == 401 and served.key not in r.text
    engine = OpenAIEngine(served.url, model="tiny", api_key_env=KEY_ENV, max_retries=3)
    with pytest.raises(EngineError, match="HTTP 401") as info:
        engine.generate([P1], GREEDY)
    assert served.key not in str(info.value)


def test_chat_repl_over_the_served_endpoint(remote, ref):
    inputs = iter(["I failed my driving test again.", "/quit"])
    out = io.StringIO()
    repl(remote, GREEDY, input_fn=lambda prompt: next(inputs), out=out)
    assert "assistant> " + ref.generate([P1], GREEDY)[0][0].text + "\n" in out.getvalue()

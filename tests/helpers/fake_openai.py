"""A fake OpenAI-compatible HTTP server for the ``openai`` engine's tests: :class:`FakeAPI` answers from a
``respond(seen, index)`` function; :class:`StructuredAPI` is such a function for a server with structured
output, which checks the ``response_format`` / ``structured_outputs`` / ``guided_*`` fields it receives and
answers text that conforms to them (:func:`schema_value`)."""

from __future__ import annotations

import json
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0
    sse: list[str] | None = None  # raw ``data:`` payloads for a streaming reply


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


class FakeAPI:
    """A threaded HTTP server on 127.0.0.1 whose replies come from ``respond(seen, index)``."""

    def __init__(self, respond: Callable[[Seen, int], Reply]) -> None:
        self.respond = respond
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                seen = Seen(self.command, self.path, {k.lower(): v for k, v in self.headers.items()}, None)
                seen.body = json.loads(raw) if raw else None
                with api.lock:
                    api.seen.append(seen)
                    index = len(api.seen) - 1
                    api.in_flight += 1
                    api.max_in_flight = max(api.max_in_flight, api.in_flight)
                try:
                    reply = api.respond(seen, index)
                    time.sleep(reply.delay)
                    self._write(reply)
                except (BrokenPipeError, ConnectionResetError):
                    pass
                finally:
                    with api.lock:
                        api.in_flight -= 1

            def _write(self, reply: Reply) -> None:
                if reply.sse is not None:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for data in reply.sse:
                        self.wfile.write(f"data: {data}\n\n".encode())
                        self.wfile.flush()
                    return
                payload = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                data = payload.encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            do_GET = _serve
            do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def posts(self) -> list[Seen]:
        return [s for s in self.seen if s.method == "POST"]

    def __enter__(self) -> FakeAPI:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def completion(
    *texts: str, logprobs: list[list[float]] | None = None, finish: str = "stop"
) -> dict[str, Any]:
    choices = []
    for i, text in enumerate(texts):
        lp = None
        if logprobs is not None:
            lp = {
                "content": [
                    {"token": f"t{j}", "logprob": v, "bytes": None, "top_logprobs": []}
                    for j, v in enumerate(logprobs[i])
                ]
            }
        choices.append(
            {
                "index": i,
                "message": {"role": "assistant", "content": text},
                "logprobs": lp,
                "finish_reason": finish,
            }
        )
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": choices}




# ---------------------------------------------------------------------- structured output
FORMAT_KEYS = ("response_format", "structured_outputs", "guided_choice", "guided_regex", "guided_json")
SAMPLES = ("7", "4", "1", "yes", "calm", "B")  # answers tried, in order, for a regular expression


def sample_for(pattern: str, samples: Sequence[str] = SAMPLES) -> str:
    """The first sample that fully matches ``pattern`` (a test that needs another one names it)."""
    for text in samples:
        if re.fullmatch(pattern, text):
            return text
    raise AssertionError(f"no sample answer matches {pattern!r}; give one")


def check_strict(schema: dict[str, Any]) -> None:
    """Fail like a strict server on an object that is not closed or leaves a property optional."""
    if schema.get("type") == "object":
        props = schema.get("properties") or {}
        assert schema.get("additionalProperties") is False, f"strict: object not closed: {schema}"
        assert set(schema.get("required") or ()) == set(props), f"strict: optional properties: {schema}"
        for sub in props.values():
            check_strict(sub)
    if isinstance(schema.get("items"), dict):
        check_strict(schema["items"])


def schema_value(schema: dict[str, Any], samples: Sequence[str] = SAMPLES) -> Any:
    """A value that conforms to ``schema`` (our keyword subset plus ``pattern``): the last enum value, the
    maximum of a number, a string of the shortest allowed length, every property of an object."""
    if "enum" in schema:
        return schema["enum"][-1]
    kind = schema.get("type")
    if kind == "object":
        return {k: schema_value(v, samples) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        item = schema_value(schema.get("items") or {"type": "integer"}, samples)
        return [item] * max(schema.get("minItems", 1), 1)
    if kind == "string":
        if "pattern" in schema:
            return sample_for(schema["pattern"], samples)
        return "x" * max(schema.get("minLength", 1), 1)
    if kind in ("integer", "number"):
        return schema.get("maximum", schema.get("minimum", 3))
    if kind == "boolean":
        return True
    raise AssertionError(f"cannot make a value for {schema}")


@dataclass
class StructuredAPI:
    """``respond`` of a :class:`FakeAPI` that plays a server with structured output. ``GET /models`` says
    ``owned_by: owner``; ``GET /version`` answers ``version`` (404 when None). A chat request may carry
    one format field; fields outside ``accepts`` are refused with HTTP 400 as hosted APIs refuse unknown
    fields; an accepted field is checked (a ``response_format`` must be a json_schema with a valid name and,
    when ``strict``, a strict schema) and, with ``enforce``, answered with conforming text (else with
    ``free_text``, as a server that ignores the field). A request without a field gets ``free_text``.
    ``received`` holds the format fields of every chat request (``{}`` for none)."""

    owner: str = "vllm"
    version: str | None = "0.11.0"
    accepts: tuple[str, ...] = FORMAT_KEYS
    enforce: bool = True
    free_text: str = "Well, I think it is fine."
    samples: tuple[str, ...] = SAMPLES
    received: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, seen: Seen, index: int) -> Reply:
        if seen.method == "GET" and seen.path.endswith("/models"):
            return Reply(body={"object": "list", "data": [{"id": "m", "owned_by": self.owner}]})
        if seen.method == "GET" and seen.path == "/version":
            if self.version is None:
                return Reply(404, {"detail": "Not Found"})
            return Reply(body={"version": self.version})
        fields = {k: seen.body[k] for k in FORMAT_KEYS if k in seen.body}
        self.received.append(fields)
        refused = sorted(set(fields) - set(self.accepts))
        if refused:
            return Reply(400, {"error": {"message": f"Unrecognized request argument supplied: {refused[0]}"}})
        assert len(fields) <= 1, f"more than one format field: {fields}"
        if not fields or not self.enforce:
            return Reply(body=completion(*[self.free_text] * seen.body["n"]))
        (key, value), = fields.items()
        texts = [self.answer(key, value) for _ in range(seen.body["n"])]
        return Reply(body=completion(*texts))

    def answer(self, key: str, value: Any) -> str:
        """Conforming text for one format field (asserting the field's shape)."""
        if key == "response_format":
            assert value["type"] == "json_schema", value
            spec = value["json_schema"]
            assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", spec["name"]), spec["name"]
            assert isinstance(spec["schema"], dict) and isinstance(spec.get("strict", False), bool)
            if spec.get("strict"):
                check_strict(spec["schema"])
            return json.dumps(schema_value(spec["schema"], self.samples))
        if key == "structured_outputs":
            assert isinstance(value, dict) and len(value) == 1, value
            (key, value), = ((f"guided_{k}", v) for k, v in value.items())
        if key == "guided_choice":
            assert isinstance(value, list) and all(isinstance(c, str) for c in value), value
            return value[-1]
        if key == "guided_regex":
            re.compile(value)
            return sample_for(value, self.samples)
        if key == "guided_json":
            return json.dumps(schema_value(value, self.samples))
        raise AssertionError(f"unexpected format field {key}")


# ---------------------------------------------------------------------- a served simulator / judge
@dataclass
class ServedAPI:
    """``respond`` of a :class:`FakeAPI` that plays a vLLM server for any role: ``GET /models`` (``owned_by:
    owner``, ``vllm`` by default), ``GET /version``, and chat requests answered in the format they ask for,
    with vLLM-style log-probs and top lists (the benchmark's fake server's answers,
    :func:`rapo_echo.perf.fake_served.completion_body`). ``fail(seen)`` returns an HTTP status for
    a chat request that must fail (every time it is sent), or None. ``gate(seen)`` may block any request (to
    hold a stage until all of it is in flight, e.g. a :class:`Rendezvous`). ``failed`` counts the failures
    sent."""

    fail: Callable[[Seen], int | None] | None = None
    gate: Callable[[Seen], None] | None = None
    seed: int = 0
    failed: int = 0
    owner: str = "vllm"

    def __call__(self, seen: Seen, index: int) -> Reply:
        import random as _random

        from rapo_echo.perf.fake_served import MODEL_ID, VLLM_VERSION, completion_body

        if self.gate is not None:
            self.gate(seen)
        if seen.method == "GET" and seen.path.endswith("/models"):
            return Reply(body={"object": "list", "data": [{"id": MODEL_ID, "owned_by": self.owner}]})
        if seen.method == "GET" and seen.path == "/version":
            return Reply(body={"version": VLLM_VERSION})
        status = self.fail(seen) if self.fail is not None else None
        if status is not None:
            self.failed += 1
            return Reply(status, {"error": {"message": f"injected failure (HTTP {status})"}})
        return Reply(body=completion_body(seen.body, _random.Random(f"{self.seed}|{index}")))


def prompt_of(seen: Seen) -> str:
    """A chat request's messages as one text (for ``fail`` / ``gate`` predicates)."""
    return "\n".join(str(m.get("content", "")) for m in (seen.body or {}).get("messages", []))


class Rendezvous:
    """A ``gate`` that holds every matching request until ``want`` of them wait together (then lets all
    through, and every later one at once). ``peak`` is the most that waited together: it reaches ``want``
    only if the client had them in flight at the same time (else the wait times out, the requests go on,
    and the test's assertion on ``peak`` fails instead of the test hanging). No timing is asserted."""

    def __init__(self, want: int, match: Callable[[Seen], bool] = lambda s: True, timeout: float = 30.0):
        self.want, self.match, self.timeout = want, match, timeout
        self.lock = threading.Lock()
        self.waiting = self.peak = self.seen = 0

    def __call__(self, seen: Seen) -> None:
        if not self.match(seen):
            return
        with self.lock:
            self.seen += 1
            self.waiting += 1
            self.peak = max(self.peak, self.waiting)
        end = time.monotonic() + self.timeout
        while self.peak < self.want and time.monotonic() < end:
            time.sleep(0.005)
        with self.lock:
            self.waiting -= 1

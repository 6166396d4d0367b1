"""A fake OpenAI-compatible server for ``bench_served_roles.py``: it answers every request after a set
latency, in the format the client asks for, and records what it saw (start, end, kind, requests in flight).

* Loopback only (``127.0.0.1``), standard library only, one thread per request (``ThreadingHTTPServer``).
* ``GET /v1/models`` says ``owned_by: vllm``; ``GET /version`` answers a vLLM version; chat completions answer
  ``n`` choices. An answer format (vLLM's ``response_format`` json_schema, ``structured_outputs`` choice /
  regex / json, ``guided_*``) gets a valid instance (:func:`schema_instance`, :func:`regex_instance`); a
  request without one gets a short plain sentence. ``stop`` strings cut the text.
* Log-probs as vLLM gives them: each token of the reply (a word, a digit run, a sign or a space-led
  punctuation mark) with its log-prob and, when ``top_logprobs`` is asked, the top list holding the sampled
  token and the labels the library's judges and simulators read (:data:`LABEL_TOKENS`), so label
  probabilities are always readable.
* Latency: every request is answered ``latency`` seconds after it arrived, plus a uniform ``jitter`` in
  ``[-jitter, +jitter]``. Faults: a chat request fails with ``fault_status`` (500 by default) with probability
  ``fault_rate`` (``Retry-After: retry_after`` on 429 and 503), after the same latency.

Figures: :meth:`FakeServed.busy_seconds` is the time at least one request was in flight; divided by the
latency it is the number of latency rounds the client waited for (``rounds paid``).
"""

from __future__ import annotations

import json
import math
import random
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from re import _parser as sre
from typing import Any

MODEL_ID = "fake-served"
VLLM_VERSION = "0.11.0"
# tokens always in a top-log-prob list: the labels of the emotion scale, group ranks, comparisons, the
# humanlike verdict and SAGE's change options (their first tokens)
LABEL_TOKENS = (
    *"1234567", " A", " B", " C", " D", "A", "B", "tie", "human", "AI", " -", " +", " 0",
)
PLAIN_TEXT = "I hear you, and that sounds hard. What happened next?"
_TOKEN = re.compile(r"\s*[A-Za-z]+|\s*\d+|\s*[^\sA-Za-z\d]|\s+")
FORMAT_KEYS = ("response_format", "structured_outputs", "guided_choice", "guided_regex", "guided_json")


@dataclass
class Seen:
    """One request as the server saw it."""

    start: float
    end: float
    method: str
    path: str
    kind: str  # models | version | chat | choice (a 1-token label read) | other
    status: int
    in_flight: int  # requests in flight when it arrived, itself included
    detail: str = ""  # a chat request's answer format (its name, or the structured_outputs kind)


# ---------------------------------------------------------------------------- instances of formats
def regex_instance(pattern: str, rng: random.Random) -> str:
    """A short text that fully matches ``pattern`` (the constructs our formats use: literals, classes,
    negated classes, repeats, groups, alternatives, anchors)."""
    return _emit(sre.parse(pattern), rng)


def _emit(parsed: Any, rng: random.Random) -> str:
    out = []
    for op, av in parsed:
        name = str(op)
        if name == "LITERAL":
            out.append(chr(av))
        elif name == "NOT_LITERAL":
            out.append("a" if chr(av) != "a" else "b")
        elif name == "ANY":
            out.append("a")
        elif name == "IN":
            out.append(_class_member(av))
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            lo, hi, sub = av
            hi = lo + 12 if hi == sre.MAXREPEAT else hi
            count = min(hi, max(lo, 1 if lo == 0 and hi >= 1 and _is_text(sub) else lo))
            if _is_text(sub) and hi >= 12:  # free text: a few words rather than one letter
                piece = "I feel a bit better now"
                take = max(lo, min(hi, len(piece)))
                out.append((piece * (take // len(piece) + 1))[:take])
                continue
            out.extend(_emit(sub, rng) for _ in range(count))
        elif name == "SUBPATTERN":
            out.append(_emit(av[-1], rng))
        elif name == "BRANCH":
            out.append(_emit(rng.choice(av[1]), rng))
        elif name in ("AT", "GROUPREF"):
            continue
        else:
            raise ValueError(f"regex_instance: unsupported construct {name} in the pattern")
    return "".join(out)


def _is_text(sub: Any) -> bool:
    """Whether a repeated item is one character class that admits letters and spaces (free text)."""
    items = list(sub)
    if len(items) != 1:
        return False
    op, av = items[0]
    if str(op) in ("ANY", "NOT_LITERAL"):
        return True
    return str(op) == "IN" and any(str(o) == "NEGATE" for o, _ in av)


def _class_member(items: Any) -> str:
    negate = any(str(o) == "NEGATE" for o, _ in items)
    if negate:
        banned = {chr(v) for o, v in items if str(o) == "LITERAL"}
        return next(c for c in "abcxyz" if c not in banned)
    for o, v in items:
        if str(o) == "LITERAL":
            return chr(v)
        if str(o) == "RANGE":
            return chr(v[0])
        if str(o) == "CATEGORY":
            return {"CATEGORY_DIGIT": "1", "CATEGORY_SPACE": " "}.get(str(v), "a")
    return "a"


def schema_instance(schema: dict[str, Any], rng: random.Random) -> Any:
    """A value valid under ``schema`` (our keyword subset): an enum member, an in-range integer, a string of
    allowed length (or matching ``pattern``), every property of an object, an array whose items are a
    permutation of an enum when the array must hold each label once (a ranking)."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    kind = schema.get("type")
    if kind == "object":
        return {k: schema_instance(v, rng) for k, v in (schema.get("properties") or {}).items()}
    if kind == "array":
        items = schema.get("items") or {"type": "integer"}
        lo = max(int(schema.get("minItems", 1)), 1)
        if "enum" in items and schema.get("maxItems") == lo == len(items["enum"]):
            return rng.sample(list(items["enum"]), lo)
        return [schema_instance(items, rng) for _ in range(lo)]
    if kind == "string":
        if "pattern" in schema:
            return regex_instance(schema["pattern"], rng)
        lo, hi = int(schema.get("minLength", 1)), int(schema.get("maxLength", 60))
        text = "it helped a little"
        return (text * (lo // len(text) + 1))[: max(lo, min(hi, len(text)))]
    if kind == "integer":
        lo, hi = int(schema.get("minimum", 0)), int(schema.get("maximum", 10))
        return rng.randint(lo, hi)
    if kind == "number":
        return float(schema.get("minimum", 0.0))
    if kind == "boolean":
        return True
    return "ok"


def formatted_text(body: dict[str, Any], rng: random.Random) -> tuple[str, bool]:
    """The reply text for a chat request and whether it was formatted (an answer format was asked)."""
    if "response_format" in body:
        spec = body["response_format"].get("json_schema") or {}
        return json.dumps(schema_instance(spec.get("schema") or {}, rng)), True
    so = body.get("structured_outputs") or {}
    choice = so.get("choice", body.get("guided_choice"))
    if choice:
        return rng.choice(list(choice)), True
    regex = so.get("regex", body.get("guided_regex"))
    if regex:
        return regex_instance(regex, rng), True
    schema = so.get("json", body.get("guided_json"))
    if schema:
        return json.dumps(schema_instance(schema, rng)), True
    return PLAIN_TEXT, False


def format_name(body: dict[str, Any]) -> str:
    """What a chat request asks for: its json_schema's name, ``kind:value`` of a vLLM field, or ``""``."""
    if "response_format" in body:
        return str((body["response_format"].get("json_schema") or {}).get("name", "json"))
    fields = dict((body.get("structured_outputs") or {}).items())
    fields.update({k[len("guided_") :]: v for k, v in body.items() if k.startswith("guided_")})
    for key, value in fields.items():
        return f"{key}:{str(value)[:24]}"
    return ""


def tokens_of(text: str) -> list[str]:
    """The reply cut into tokens: words, digit runs, punctuation marks, each with its leading spaces."""
    return _TOKEN.findall(text) or [text]


def logprob_entries(tokens: list[str], top: int, rng: random.Random) -> list[dict[str, Any]]:
    """vLLM's ``logprobs.content``: per token its log-prob and, with ``top``, a top list that holds it and the
    label tokens (their probabilities drawn at random, summing below 1)."""
    entries = []
    for tok in tokens:
        entry: dict[str, Any] = {"token": tok, "logprob": -0.1, "bytes": None, "top_logprobs": []}
        if top:
            names = list(dict.fromkeys([tok, *LABEL_TOKENS]))[: max(top, 1)]
            weights = [rng.uniform(0.5, 1.5) for _ in names]
            total = sum(weights) * 1.25
            entry["top_logprobs"] = [
                {"token": t, "logprob": math.log(w / total), "bytes": None} for t, w in zip(names, weights)
            ]
            entry["logprob"] = entry["top_logprobs"][0]["logprob"]
        entries.append(entry)
    return entries


def completion_body(body: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """The answer to one chat request: ``n`` choices in the asked format, cut at stop strings and at
    ``max_tokens`` tokens, with log-probs when asked."""
    choices = []
    for i in range(int(body.get("n") or 1)):
        text, _ = formatted_text(body, rng)
        for stop in body.get("stop") or []:
            if stop and stop in text:
                text = text[: text.index(stop)]
        tokens = tokens_of(text)[: int(body.get("max_tokens") or 10**6)]
        text = "".join(tokens)
        lp = None
        if body.get("logprobs"):
            lp = {"content": logprob_entries(tokens, int(body.get("top_logprobs") or 0), rng)}
        choices.append({"index": i, "message": {"role": "assistant", "content": text}, "logprobs": lp,
                        "finish_reason": "stop"})  # fmt: skip
    prompt = sum(len(str(m.get("content", ""))) for m in body.get("messages") or []) // 4
    done = sum(len(tokens_of(c["message"]["content"])) for c in choices)
    usage = {"prompt_tokens": prompt, "completion_tokens": done, "total_tokens": prompt + done}
    return {"id": "fake", "object": "chat.completion", "created": 0, "model": MODEL_ID, "choices": choices,
            "usage": usage}  # fmt: skip


# ---------------------------------------------------------------------------- the server
class FakeServed:
    """The server: ``with FakeServed(latency=1.0) as s: ... s.url ... s.log``."""

    def __init__(
        self,
        latency: float = 1.0,
        jitter: float = 0.0,
        fault_rate: float = 0.0,
        fault_status: int = 500,
        retry_after: float = 1.0,
        seed: int = 0,
    ) -> None:
        if latency < 0 or jitter < 0 or jitter > latency or not 0 <= fault_rate <= 1:
            raise ValueError("need latency >= jitter >= 0 and 0 <= fault_rate <= 1")
        self.latency, self.jitter = latency, jitter
        self.fault_rate, self.fault_status, self.retry_after = fault_rate, fault_status, retry_after
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.log: list[Seen] = []
        self.in_flight = 0
        self.faults = 0
        served = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self) -> None:
                start = time.monotonic()
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                with served.lock:
                    served.in_flight += 1
                    flight = served.in_flight
                    delay = served.latency + served.rng.uniform(-served.jitter, served.jitter)
                    fault = self.command == "POST" and served.rng.random() < served.fault_rate
                    rng = random.Random(served.rng.random())
                status, payload, headers, kind, detail = 200, {}, {}, "other", ""
                try:
                    path = self.path.split("?")[0]
                    if self.command == "GET" and path.endswith("/models"):
                        kind = "models"
                        payload = {"object": "list", "data": [{"id": MODEL_ID, "object": "model",
                                                               "owned_by": "vllm"}]}  # fmt: skip
                    elif self.command == "GET" and path == "/version":
                        kind, payload = "version", {"version": VLLM_VERSION}
                    elif self.command == "POST" and path.endswith("/chat/completions"):
                        body = json.loads(raw or b"{}")
                        kind = "choice" if body.get("max_tokens") == 1 else "chat"
                        detail = format_name(body)
                        if fault:
                            status = served.fault_status
                            payload = {"error": {"message": f"injected fault (HTTP {status})"}}
                            if status in (429, 503):
                                headers["Retry-After"] = f"{served.retry_after:g}"
                        else:
                            payload = completion_body(body, rng)
                    else:
                        status, payload = 404, {"detail": "Not Found"}
                    time.sleep(max(0.0, start + delay - time.monotonic()))
                    data = json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("Connection", "close")
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                    self.close_connection = True
                except (BrokenPipeError, ConnectionResetError):
                    status = 499
                finally:
                    end = time.monotonic()
                    with served.lock:
                        served.in_flight -= 1
                        served.faults += int(fault and status == served.fault_status)
                        seen = Seen(start, end, self.command, self.path, kind, status, flight, detail)
                        served.log.append(seen)

            do_GET = _serve
            do_POST = _serve

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.request_queue_size = 1024
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self) -> FakeServed:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def reset(self) -> None:
        with self.lock:
            self.log, self.faults = [], 0

    # ------------------------------------------------------------------ figures
    def busy_seconds(self) -> float:
        """Seconds during which at least one request was in flight (the union of request intervals)."""
        spans = sorted((s.start, s.end) for s in self.log)
        total, cur_a, cur_b = 0.0, None, None
        for a, b in spans:
            if cur_b is None or a > cur_b:
                if cur_b is not None:
                    total += cur_b - cur_a  # type: ignore[operator]  # cur_a is set with cur_b
                cur_a, cur_b = a, b
            else:
                cur_b = max(cur_b, b)
        if cur_b is not None:
            total += cur_b - cur_a  # type: ignore[operator]  # cur_a is set with cur_b
        return total

    def max_in_flight(self) -> int:
        return max((s.in_flight for s in self.log), default=0)

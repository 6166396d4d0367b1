"""``rapo-echo serve``: any chat engine behind an OpenAI-compatible API (``/v1/chat/completions``).

``GET /v1/models`` lists the one served model; ``POST /v1/chat/completions`` answers in the OpenAI
schema (``stream: true``: server-sent events ending in ``data: [DONE]``), with vLLM's
``continue_final_message`` / ``add_generation_prompt`` / ``top_k`` / ``return_tokens_as_token_ids``
extensions, so the ``openai`` engine continues prompts as it does against vLLM.

Log-probs (engines with a tokenizer) are those of :func:`rapo_echo.engines.hf.sample_next`, the value the
``hf`` engine returns in-process; ``top_logprobs`` come from one teacher-forced pass over the reply; other
engines answer ``logprobs: null``. A model is not thread-safe, so one lock serialises engine calls.

Structured output: ``response_format`` json_schema, vLLM's ``structured_outputs`` and its older
``guided_*`` fields become the call's :attr:`~rapo_echo.types.SamplingParams.answer_format`
(:func:`answer_format_of`); an engine that enforces nothing answers them with HTTP 400, so a client falls
back to parsing. Refusals (400 for formats the grammar compiler cannot take or keys in the URL, 413 for
an oversized body, 499 for a dropped client): docs/models.md.

fastapi and uvicorn come with the ``serve`` extra and are imported only when a server is built.
"""

import argparse
import asyncio
import contextlib
import hmac
import importlib
import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import parse_qsl, quote, unquote, urlencode

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from rapo_echo.config import Device, Dtype, Flag, Strict, add_flags, section_from_args
from rapo_echo.config.secrets import secret_value
from rapo_echo.engines.base import ChatEngine, format_enforcement
from rapo_echo.engines.constrained import GRAMMAR_FAILED
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.scrub import MASK, SECRET_KEY, register_secret
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, Generation, Message, SamplingParams

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fastapi import FastAPI

SERVE_INSTALL = "pip install 'rapo-echo[serve]'"
MAX_TOP_LOGPROBS = 20
LOGPROB_FLOOR = -9999.0  # JSON has no -inf; vLLM uses the same floor
UNSUPPORTED_FIELDS = ("tools", "functions", "logit_bias", "audio", "prediction")
DEFAULT_MAX_BODY_MB = 4.0  # a whole context of a long-context model is well under 1 MB of text


def require_serve_extra(module: str) -> Any:
    """Import ``module`` (fastapi / uvicorn); a clear error with the install command when it is missing."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise RapoEchoError(
            f"the OpenAI-compatible server needs the package '{module}', which is not installed. "
            f"Install it with:\n    {SERVE_INSTALL}"
        ) from exc


# ---------------------------------------------------------------------- structured output
FORMAT_FIELDS = ("response_format", "structured_outputs", "guided_json", "guided_choice", "guided_regex")
_UNSUPPORTED_FORMATS = ("guided_grammar", "structural_tag")


def _format_from(kind: str, value: Any, name: str, where: str) -> AnswerFormat:
    """An answer format of ``kind`` (json, choice, regex) from a request value; ``ValueError`` naming
    ``where`` when the value does not fit."""
    if kind == "json":
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except RecursionError:
                raise ValueError(f"{where}: the schema is nested too deeply to read") from None
            except ValueError as exc:
                raise ValueError(f"{where}: the schema is not JSON ({exc})") from exc
        return AnswerFormat.json_schema(value, name=name)
    if kind == "choice":
        if not (isinstance(value, list) and value and all(isinstance(c, str) and c for c in value)):
            raise ValueError(f"{where}: a choice is a non-empty list of non-empty strings")
        return AnswerFormat.choice(value, name=name)
    if not isinstance(value, str):
        raise ValueError(f"{where}: a regex is a string")
    try:
        return AnswerFormat.regex(value, name=name)
    except ValueError as exc:  # it does not compile, or uses look-around or a back-reference
        raise ValueError(f"{where}: {exc}") from None


def answer_format_of(fields: dict[str, Any]) -> AnswerFormat | None:
    """The answer format a request's extra fields ask for (see the module doc), None when none;
    ``ValueError`` for more than one, an unsupported kind, or a schema outside our keyword subset."""
    for name in _UNSUPPORTED_FORMATS:
        if fields.get(name):
            raise ValueError(f"'{name}' is not supported by this server (use a JSON schema, choice or regex)")
    given = {k: fields[k] for k in FORMAT_FIELDS if fields.get(k)}
    response_format = given.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") == "text":
        del given["response_format"]
    if len(given) > 1:
        raise ValueError(f"give one structured-output field, not {sorted(given)}")
    if not given:
        return None
    ((key, value),) = given.items()
    if key == "response_format":
        kind = value.get("type") if isinstance(value, dict) else None
        if kind != "json_schema":
            raise ValueError(
                f"response_format: type {kind!r} is not supported; use 'json_schema' (or 'text')"
            )
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or "schema" not in spec:
            raise ValueError("response_format.json_schema needs a 'schema'")
        return _format_from("json", spec["schema"], str(spec.get("name") or "answer"), key)
    if key == "structured_outputs":
        if not isinstance(value, dict):
            raise ValueError("structured_outputs must be an object such as {'choice': [...]}")
        kinds = [k for k in ("json", "choice", "regex") if value.get(k) is not None]
        others = sorted(k for k, v in value.items() if v and k not in ("json", "choice", "regex"))
        if others:
            raise ValueError(f"structured_outputs: {others} not supported (json, choice or regex)")
        if len(kinds) != 1:
            raise ValueError("structured_outputs: give exactly one of json, choice, regex")
        return _format_from(kinds[0], value[kinds[0]], "answer", f"structured_outputs.{kinds[0]}")
    return _format_from(key.removeprefix("guided_"), value, "answer", key)


# ---------------------------------------------------------------------- request schema
class TextPart(BaseModel):
    """A text part of a multi-part message content."""

    model_config = ConfigDict(extra="ignore")
    type: Literal["text"]
    text: str


class ChatMessageIn(BaseModel):
    """One request message (``developer`` is read as ``system``)."""

    model_config = ConfigDict(extra="ignore")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]

    def to_message(self) -> Message:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="ignore")
    include_usage: bool = False


class ChatCompletionRequest(BaseModel):
    """The fields of an OpenAI chat-completions request this server understands. Other fields are
    ignored, except those that would change the answer and are not supported (tools, logit_bias,
    penalties, grammars), which are rejected. Structured output: :func:`answer_format_of`."""

    model_config = ConfigDict(extra="allow")
    model: str | None = None
    messages: list[ChatMessageIn] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=-1)
    n: int = Field(1, ge=1, le=128)
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=-(2**63), le=2**63 - 1)  # a 64-bit integer, as OpenAI and vLLM take
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    continue_final_message: bool = False
    add_generation_prompt: bool = True
    return_tokens_as_token_ids: bool = False
    _answer_format: AnswerFormat | None = PrivateAttr(None)

    @property
    def answer_format(self) -> AnswerFormat | None:
        """The structured output the request asks for (:func:`answer_format_of`), None when none."""
        return self._answer_format

    @model_validator(mode="after")
    def _consistent(self) -> "ChatCompletionRequest":
        extra = self.model_extra or {}
        for name in UNSUPPORTED_FIELDS:
            if extra.get(name):
                raise ValueError(f"'{name}' is not supported by this server")
        for name in ("frequency_penalty", "presence_penalty"):
            if extra.get(name):
                raise ValueError(f"'{name}' is not supported by this server (only 0 is accepted)")
        self._answer_format = answer_format_of(extra)
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        if any(not s for s in self.stop_list):
            raise ValueError("stop strings must not be empty")
        if self.continue_final_message:
            if self.add_generation_prompt and "add_generation_prompt" in self.model_fields_set:
                raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
            self.add_generation_prompt = False
            if self.messages[-1].role != "assistant":
                raise ValueError("continue_final_message needs a last message with role 'assistant'")
        if self.stream and self.n > 1:
            raise ValueError("stream: true supports n = 1 only")
        if self.stream and self.logprobs:
            raise ValueError("stream: true does not return logprobs on this server; drop one of them")
        return self

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class RequestCancelled(Exception):
    """The client of a non-streaming request went away; its generation was stopped."""


class APIError(Exception):
    """An error answered to the client as ``{"error": {...}}`` with an HTTP status."""

    def __init__(
        self, status: int, message: str, type_: str = "invalid_request_error", code: str | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.code = status, message, type_, code

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": None, "code": self.code}}


def validation_message(exc: ValidationError | Any) -> str:
    """One line per problem: ``field.path: what is wrong`` (the request body is never echoed)."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err.get("loc", ()) if p != "body"]
        where = ".".join(loc) or "request"
        lines.append(f"{where}: {err.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(lines)


# ---------------------------------------------------------------------- token text
class TokenText:
    """Text and UTF-8 bytes of single tokens, as OpenAI log-prob entries show them. For byte-level BPE
    tokenizers the bytes are exact even when a token holds part of a multi-byte character."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.byte_decoder: dict[str, int] | None = None
        decoder = getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None)
        if type(decoder).__name__ == "ByteLevel":
            from transformers.convert_slow_tokenizer import bytes_to_unicode

            self.byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        if token_id not in self._cache:
            raw: bytes | None = None
            if self.byte_decoder is not None:
                piece = self.tokenizer.convert_ids_to_tokens(token_id)
                if piece and all(c in self.byte_decoder for c in piece):
                    raw = bytes(self.byte_decoder[c] for c in piece)
            if raw is None:
                text = self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)
                raw = text.encode("utf-8")
            else:
                text = raw.decode("utf-8", errors="replace")
            self._cache[token_id] = (text, list(raw))
        return self._cache[token_id]

    def entry(self, token_id: int, logprob: float, as_id: bool) -> dict[str, Any]:
        text, raw = self(token_id)
        return {
            "token": f"token_id:{token_id}" if as_id else text,
            "logprob": max(logprob, LOGPROB_FLOOR),
            "bytes": raw,
        }


# ---------------------------------------------------------------------- the service
def _is_token_engine(engine: Any) -> bool:
    """Engines that expose their tokenizer and work on token ids (the ``hf`` engine)."""
    return all(hasattr(engine, a) for a in ("tokenizer", "encode_chat", "generate_ids", "stream_generation"))


class ChatService:
    """The engine side of the server: turns a validated request into a response body or a stream."""

    def __init__(self, engine: ChatEngine, model_name: str, default_max_tokens: int = 512) -> None:
        self.engine = engine
        self.model_name = model_name
        self.default_max_tokens = default_max_tokens
        self.lock = threading.Lock()
        self.token_engine = _is_token_engine(engine)
        self.tokens = TokenText(engine.tokenizer) if self.token_engine else None  # type: ignore[attr-defined]  # a token engine, checked by _is_token_engine
        self.created = int(time.time())

    def models(self) -> dict[str, Any]:
        card = {"id": self.model_name, "object": "model", "created": self.created, "owned_by": "rapo-echo"}
        return {"object": "list", "data": [card]}

    def _context_length(self) -> int | None:
        from rapo_echo.engines.hf import context_length

        return context_length(getattr(self.engine, "model", None))

    def prepare(self, req: ChatCompletionRequest) -> tuple[Conversation | list[int], SamplingParams]:
        """The prompt (token ids for token engines, else a conversation) and sampling params; checks
        the model name, prompt rendering and context length. Call with the lock held."""
        if req.model is not None and req.model != self.model_name:
            raise APIError(
                404,
                f"model {req.model!r} does not exist; this server serves {self.model_name!r}",
                code="model_not_found",
            )
        messages = [m.to_message() for m in req.messages]
        asked = req.max_completion_tokens or req.max_tokens
        max_tokens = asked or self.default_max_tokens
        prompt: Conversation | list[int]
        if self.token_engine:
            try:
                prompt = self.engine.encode_chat(  # type: ignore[attr-defined]  # a token engine, checked by _is_token_engine
                    messages,
                    add_generation_prompt=req.add_generation_prompt,
                    continue_final_message=req.continue_final_message,
                )
            except ValueError as exc:
                raise APIError(400, str(exc)) from exc
            ctx = self._context_length()
            if ctx is not None and len(prompt) + max_tokens > ctx:
                if asked or len(prompt) >= ctx:
                    raise APIError(
                        400,
                        f"this model's maximum context length is {ctx} tokens; the prompt has {len(prompt)} "
                        f"and max_tokens asks for {max_tokens}",
                    )
                max_tokens = ctx - len(prompt)
        else:
            last = messages[-1]["role"]
            if not req.continue_final_message and (last == "assistant" or not req.add_generation_prompt):
                raise APIError(
                    400,
                    f"engine {self.engine.name!r} can only continue a final assistant message "
                    "(continue_final_message: true) or answer after a user/system message",
                )
            prompt = messages
        try:
            params = SamplingParams(
                max_new_tokens=max_tokens,
                temperature=req.temperature,
                top_p=req.top_p,
                top_k=max(0, req.top_k),
                n=req.n,
                stop=tuple(req.stop_list),
                seed=req.seed,
                answer_format=req.answer_format,
            )
        except ValueError as exc:
            raise APIError(400, str(exc)) from exc
        if req.answer_format is not None and format_enforcement(self.engine) == "none":
            raise APIError(
                400,
                f"structured output (response_format json_schema, structured_outputs, guided_*) is not "
                f"supported: engine {self.engine.name!r} cannot enforce answer formats",
            )
        check = getattr(self.engine, "check_format", None)
        if req.answer_format is not None and callable(check):
            try:  # compiled now (and cached): a format the compiler rejects is the request's fault
                check(req.answer_format)
            except ValueError as exc:
                raise APIError(400, f"the structured-output format cannot be used: {exc}") from None
        return prompt, params

    def _chunk_base(self, rid: str, created: int) -> dict[str, Any]:
        return {"id": rid, "object": "chat.completion.chunk", "created": created, "model": self.model_name}

    def complete(self, req: ChatCompletionRequest, cancel: threading.Event | None = None) -> dict[str, Any]:
        """A whole (non-streaming) response body. Setting ``cancel`` (the client went away) stops the
        generation at its next model forward with :class:`RequestCancelled`, freeing the lock."""
        with self.lock, self._cancellable(cancel):
            prompt, params = self.prepare(req)
            tops = None
            if self.token_engine:
                gens = self.engine.generate_ids([prompt], params)[0]  # type: ignore[attr-defined]  # a token engine, checked by _is_token_engine
                if req.logprobs and req.top_logprobs:
                    tops = self.engine.top_logprobs_ids(  # type: ignore[attr-defined]  # a token engine, checked by _is_token_engine
                        [prompt] * len(gens),
                        [g.token_ids for g in gens],
                        req.top_logprobs,
                        params.temperature,
                    )
            else:
                gens = self.engine.generate([prompt], params)[0]  # type: ignore[list-item]  # a chat engine: a conversation prompt
            failed = next((g for g in gens if g.finish_reason == GRAMMAR_FAILED), None)
            if failed is not None:
                raise APIError(
                    400,
                    f"the structured-output format could not be followed: its grammar gave up after "
                    f"{len(failed.token_ids)} tokens ({failed.error}); use a simpler schema or regex",
                    code=GRAMMAR_FAILED,
                )
            choices = [  # built under the lock too: it uses the tokenizer
                {
                    "index": i,
                    "message": {"role": "assistant", "content": g.text},
                    "logprobs": self._logprobs(g, tops[i] if tops else None, req) if req.logprobs else None,
                    "finish_reason": g.finish_reason,
                }
                for i, g in enumerate(gens)
            ]
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": self._usage(prompt, gens),
        }

    @contextlib.contextmanager
    def _cancellable(self, cancel: threading.Event | None) -> Iterator[None]:
        """Make ``cancel`` stop the engine's model forwards in this thread (token engines only)."""
        if cancel is not None and cancel.is_set():
            raise RequestCancelled()
        model = getattr(self.engine, "model", None)
        if cancel is None or not hasattr(model, "register_forward_pre_hook"):
            yield
            return

        def check(*_: Any) -> None:
            if cancel.is_set():
                raise RequestCancelled()

        handle = model.register_forward_pre_hook(check)  # type: ignore[union-attr]  # an HF engine has its model
        try:
            yield
        finally:
            handle.remove()

    def _logprobs(
        self, gen: Generation, top: list[list[tuple[int, float]]] | None, req: ChatCompletionRequest
    ) -> dict[str, Any] | None:
        if self.tokens is None or gen.logprobs is None:
            return None
        as_id = req.return_tokens_as_token_ids
        content = []
        for pos, (tid, lp) in enumerate(zip(gen.token_ids, gen.logprobs)):
            entry = self.tokens.entry(tid, lp, as_id)
            entry["top_logprobs"] = [self.tokens.entry(t, v, as_id) for t, v in top[pos]] if top else []
            content.append(entry)
        return {"content": content}

    def _usage(self, prompt: Conversation | list[int], gens: list[Generation]) -> dict[str, int] | None:
        if self.token_engine:
            n_prompt = len(prompt)
        elif gens and gens[0].prompt_ids is not None:
            n_prompt = len(gens[0].prompt_ids)
        else:
            return None  # the engine does not say how many tokens it used
        done = sum(len(g.token_ids) for g in gens)
        return {"prompt_tokens": n_prompt, "completion_tokens": done, "total_tokens": n_prompt + done}

    def _stream_items(
        self, prompt: Conversation | list[int], params: SamplingParams
    ) -> Iterator[str | Generation]:
        if self.token_engine:
            return self.engine.stream_generation(prompt, params)  # type: ignore[attr-defined]  # a token engine, checked by _is_token_engine
        return self.engine.stream(prompt, params)  # type: ignore[arg-type]  # a chat engine: a conversation prompt

    async def stream(self, req: ChatCompletionRequest) -> AsyncIterator[str]:
        """Server-sent events of one reply. The engine runs in one worker thread (holding the lock for
        the whole reply), its pieces cross to the event loop through a queue; a client that goes away
        stops the generation at the next piece."""
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        base = self._chunk_base(rid, created)
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()
        cancel = threading.Event()
        prepared: dict[str, Any] = {}

        def put(kind: str, item: Any) -> None:
            try:
                loop.call_soon_threadsafe(queue.put_nowait, (kind, item))
            except RuntimeError:  # the event loop is gone (server shutting down)
                cancel.set()

        def worker() -> None:
            try:
                with self.lock:
                    prompt, params = self.prepare(req)
                    prepared["prompt"] = prompt
                    put("ready", None)
                    items = self._stream_items(prompt, params)
                    try:
                        for item in items:
                            if cancel.is_set():
                                break
                            put("item", item)
                    finally:
                        close = getattr(items, "close", None)
                        if close is not None:
                            close()
                put("end", None)
            except Exception as exc:  # reported to the client as an error event
                put("error", exc)

        threading.Thread(target=worker, name="rapo-echo-stream", daemon=True).start()
        kind, item = await queue.get()
        if kind == "error":
            raise item  # before the first byte: answered as a normal HTTP error
        return self._events(base, queue, cancel, prepared, req)

    async def _events(
        self,
        base: dict[str, Any],
        queue: "asyncio.Queue[tuple[str, Any]]",
        cancel: threading.Event,
        prepared: dict[str, Any],
        req: ChatCompletionRequest,
    ) -> AsyncIterator[str]:
        def event(payload: dict[str, Any]) -> str:
            return f"data: {json.dumps(payload)}\n\n"

        def choice(delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}

        try:
            yield event({**base, "choices": [choice({"role": "assistant", "content": ""}, None)]})
            final: Generation | None = None
            while True:
                kind, item = await queue.get()
                if kind == "item" and isinstance(item, Generation):
                    final = item
                elif kind == "item" and item:
                    yield event({**base, "choices": [choice({"content": item}, None)]})
                elif kind == "end":
                    finish = final.finish_reason if final is not None else "stop"
                    yield event({**base, "choices": [choice({}, finish)]})
                    include_usage = req.stream_options is not None and req.stream_options.include_usage
                    usage = self._usage(prepared["prompt"], [final]) if final is not None else None
                    if include_usage and usage is not None:
                        yield event({**base, "choices": [], "usage": usage})
                    break
                elif kind == "error":
                    err = APIError(500, f"generation failed: {item}", "server_error")
                    yield event(err.body())
                    break
            yield "data: [DONE]\n\n"
        finally:
            cancel.set()


# ---------------------------------------------------------------------- the app
def error_response(err: APIError) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse(err.body(), status_code=err.status)


class RequestGuard:
    """What the server refuses before a request reaches a route: a key in the URL (400, masked first, as
    the access log writes the request line after the answer), a ``/v1`` request without the API key
    (401) and a declared body over the limit (413)."""

    def __init__(self, api_key: str | None, max_body_bytes: int) -> None:
        if max_body_bytes < 1:
            raise ConfigError(f"max_body_bytes must be >= 1, got {max_body_bytes}")
        self.api_key, self.max_body_bytes = api_key, max_body_bytes
        self.expected = api_key.encode() if api_key else None
        self.too_large = APIError(
            413,
            f"the request body is larger than this server's limit of {max_body_bytes} bytes "
            "(rapo-echo serve --max-body-mb)",
            code="request_too_large",
        )

    def key_in_query(self, scope: dict[str, Any]) -> APIError | None:
        """400 for a key in the URL query, whose value is masked in the request line first."""
        query = scope.get("query_string") or b""
        if not query:
            return None
        pairs = parse_qsl(query.decode("latin-1"), keep_blank_values=True)
        key = self.api_key
        named = {k for k, v in pairs if SECRET_KEY.search(k) or k.lower() == "key" or (key and key in v)}
        if not named:
            return None
        scope["query_string"] = urlencode([(k, MASK if k in named else v) for k, v in pairs]).encode()
        return APIError(
            400,
            f"an API key does not belong in the URL (query parameter {', '.join(sorted(named))}): "
            "URLs are logged; send it in the header 'Authorization: Bearer <key>'",
            code="key_in_url",
        )

    def key_in_path(self, scope: dict[str, Any]) -> APIError | None:
        """400 for a key in the URL path (the server's key, or a segment that looks like one: a provider
        key, a long random token), masked in the path first."""
        path = scope.get("path") or ""
        parts = path.split("/")
        key = self.api_key
        masked = [
            MASK if part and ((key and key in unquote(part)) or secret_value(unquote(part))) else part
            for part in parts
        ]
        if masked == parts:
            return None
        scope["path"] = "/".join(masked)
        scope["raw_path"] = quote(scope["path"]).encode()
        return APIError(
            400,
            "an API key does not belong in the URL path: URLs are logged; send it in the header "
            "'Authorization: Bearer <key>'",
            code="key_in_url",
        )

    def refusal(self, scope: dict[str, Any], path: str, headers: Any) -> APIError | None:
        """The first reason to refuse this request, or None."""
        refused = self.key_in_query(scope) or self.key_in_path(scope)
        if refused is not None:
            return refused
        if self.expected is not None and path.startswith("/v1"):
            scheme, _, token = headers.get("authorization", "").strip().partition(" ")
            # the scheme is case-insensitive (RFC 9110): "bearer KEY" is as good as "Bearer KEY"
            given = token.strip().encode() if scheme.lower() == "bearer" else b""
            if not hmac.compare_digest(given, self.expected):
                return APIError(
                    401,
                    "missing or invalid API key: send the header 'Authorization: Bearer <key>'",
                    code="invalid_api_key",
                )
        length = headers.get("content-length", "")
        if length.strip().isdigit() and int(length) > self.max_body_bytes:
            return self.too_large
        return None

    async def bounded_body(self, request: Any) -> bytes:
        """The request body, read up to ``max_body_bytes`` (a chunked body that goes on is refused 413)."""
        parts, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise self.too_large
            parts.append(chunk)
        return b"".join(parts)


async def complete_unless_abandoned(service: ChatService, request: Any, req: ChatCompletionRequest) -> Any:
    """Run a non-streaming request; if its client disconnects first, cancel the generation (which
    frees the model for the next request) instead of finishing a reply nobody reads."""
    from fastapi.responses import Response
    from starlette.concurrency import run_in_threadpool

    cancel = threading.Event()
    task = asyncio.ensure_future(run_in_threadpool(service.complete, req, cancel))
    # With the body read, the next ASGI message is the disconnect (polling is_disconnected() does
    # not work behind the key middleware, which wraps receive()).
    gone = asyncio.ensure_future(request.receive())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
        if not task.done() and gone.result().get("type") == "http.disconnect":
            cancel.set()
            with contextlib.suppress(RequestCancelled):
                await task
            return Response(status_code=499)  # nobody reads it
        return await task
    finally:
        gone.cancel()


def create_app(
    engine: ChatEngine,
    model_name: str,
    api_key: str | None = None,
    *,
    default_max_tokens: int = 512,
    max_body_bytes: int = int(DEFAULT_MAX_BODY_MB * 2**20),
) -> "FastAPI":
    """A FastAPI app serving ``engine`` as ``model_name``. With ``api_key`` every ``/v1`` request
    needs ``Authorization: Bearer <api_key>`` (401 otherwise). ``default_max_tokens`` applies when a
    request gives neither ``max_tokens`` nor ``max_completion_tokens``; a body over ``max_body_bytes`` is
    answered 413; a key in the URL query 400 (see the module doc)."""
    fastapi = require_serve_extra("fastapi")
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse, Response, StreamingResponse
    from starlette.requests import ClientDisconnect

    service = ChatService(engine, model_name, default_max_tokens)
    guard = RequestGuard(api_key, max_body_bytes)
    # With a key the API description is not served either (it would answer without the key).
    hidden = {"docs_url": None, "redoc_url": None, "openapi_url": None} if api_key else {}
    app = fastapi.FastAPI(
        title="rapo-echo", description=f"OpenAI-compatible chat completions for {model_name}", **hidden
    )
    app.state.service = service
    register_secret(api_key)  # scrubbed from every log line

    @app.middleware("http")
    async def check_key(request: Request, call_next: Callable) -> Any:
        refused = guard.refusal(request.scope, request.url.path, request.headers)
        return error_response(refused) if refused is not None else await call_next(request)

    @app.exception_handler(APIError)
    async def api_error(_: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def bad_request(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(APIError(400, validation_message(exc)))

    @app.exception_handler(RapoEchoError)
    async def engine_error(_: Request, exc: RapoEchoError) -> JSONResponse:
        return error_response(APIError(500, f"engine error: {exc}", "server_error"))

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return service.models()

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        try:
            raw = await guard.bounded_body(request)
        except ClientDisconnect:  # a client that dropped its connection mid-body: nobody to answer
            log.info("serve: a client disconnected before its request body was complete")
            return Response(status_code=499)
        try:
            req = ChatCompletionRequest.model_validate_json(raw)
        except ValidationError as exc:
            raise APIError(400, validation_message(exc)) from None
        if req.stream:
            events = await service.stream(req)
            return StreamingResponse(
                events, media_type="text/event-stream", headers={"Cache-Control": "no-cache"}
            )
        return await complete_unless_abandoned(service, request, req)

    return app


# ---------------------------------------------------------------------- CLI
class ServeConfig(Strict):
    """`rapo-echo serve`: the model served, where, and the server's limits."""

    model: Annotated[str, Flag(metavar="SPEC")] = Field(
        "default",
        description="`default` (embedded SmolLM2-135M-Instruct), a model folder, a training run or "
        "checkpoint folder, a .gguf file, or a hub id.",
    )
    host: str = Field("127.0.0.1", description="Interface to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port; 0 picks a free one.")
    served_name: Annotated[str | None, Flag(metavar="NAME")] = Field(
        None, description="Model id clients send (unset: the model's spec)."
    )
    api_key_env: Annotated[str | None, Flag(metavar="VAR")] = Field(
        None,
        description="Require 'Authorization: Bearer <key>' where the key is read from this environment "
        "variable.",
    )
    dtype: Dtype = Field("float32", description="The weights' dtype.")
    device: Device = Field("auto", description="`auto`, `cpu`, `cuda`, `cuda:N` or `mps`.")
    default_max_tokens: Annotated[int, Flag(metavar="N")] = Field(
        512, ge=1, description="Reply length limit when a request sets none."
    )
    max_body_mb: Annotated[float, Flag(metavar="MB")] = Field(
        DEFAULT_MAX_BODY_MB,
        gt=0,
        description="Refuse request bodies larger than this with HTTP 413, before tokenising.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="uvicorn's log level."
    )


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``serve`` subcommand to an argparse sub-parsers object."""
    p = subparsers.add_parser(
        "serve",
        help="serve a model behind an OpenAI-compatible API",
        description="Serve a model behind an OpenAI-compatible API (/v1/chat/completions, /v1/models), "
        "e.g. for the 'openai' engine of a simulator or judge, or for any OpenAI client.",
    )
    add_flags(p, ServeConfig)
    p.set_defaults(func=run)
    return p


def bind_socket(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0: a free port); a clear error when that fails."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        raise ConfigError(f"--host/--port: cannot listen on {host}:{port}: {exc}") from exc
    return sock


def run(args: argparse.Namespace) -> int:
    """Load the model, bind the socket, print the URL and serve until Ctrl-C / SIGTERM."""
    cfg = section_from_args(ServeConfig, args)
    api_key = None
    if cfg.api_key_env:
        api_key = os.environ.get(cfg.api_key_env)
        if not api_key:
            raise ConfigError(
                f"--api-key-env: the environment variable {cfg.api_key_env} is not set or empty"
            )
    require_serve_extra("fastapi")
    uvicorn = require_serve_extra("uvicorn")
    from rapo_echo.engines.hf import HFEngine

    engine = HFEngine.from_spec(cfg.model, dtype=cfg.dtype, device=cfg.device, name="serve")
    name = cfg.served_name or cfg.model
    app = create_app(
        engine,
        name,
        api_key,
        default_max_tokens=cfg.default_max_tokens,
        max_body_bytes=max(1, int(cfg.max_body_mb * 2**20)),
    )
    sock = bind_socket(cfg.host, cfg.port)
    port = sock.getsockname()[1]
    shown = f"[{cfg.host}]" if ":" in cfg.host else cfg.host
    print(
        f"rapo-echo serve: model {name!r} at http://{shown}:{port}/v1 (OpenAI-compatible; Ctrl-C stops)",
        flush=True,
    )
    if api_key is None and cfg.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"warning: listening on {cfg.host} without --api-key-env; anyone who can reach it can use it",
            flush=True,
        )
    server = uvicorn.Server(uvicorn.Config(app, log_level=cfg.log_level))
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises the Ctrl-C it handled; stopping is the normal end
        pass
    print("rapo-echo serve: stopped", flush=True)
    return 0

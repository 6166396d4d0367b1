"""``openai`` engine: any OpenAI-compatible chat-completions server (vLLM, SGLang, llama.cpp, hosted
APIs, ``rapo-echo serve``) as a :class:`~rapo_echo.engines.base.ChatEngine`, over ``httpx``.

* ``base_url`` is the API root (a URL without a path gets ``/v1``); ``model=None`` takes the first id of
  ``GET /models``. A prompt ending in an assistant message is continued (vLLM's
  ``continue_final_message``). ``top_k`` is sent only when > 0: hosted APIs reject unknown fields.
* ``supports_logprobs`` is False until known; reading it while unknown sends one 1-token probe (HTTP
  400 / 422 to the ``logprobs`` fields counts as False). On Python < 3.12, ``isinstance(engine,
  ChatEngine)`` reads every protocol attribute, so it can trigger that probe.
* Every request of a call is sent at once, bounded by the engine's shared
  :class:`~rapo_echo.engines.concurrency.RequestLimits`; setup (model list, version, probe) runs once.
* A request that fails for good costs its item (a ``FAILED`` answer, counted in ``failed_items``); a
  call raises :class:`EndpointError` only when the endpoint is down. Each request has a whole-request
  deadline (:class:`~rapo_echo.engines.deadline.Deadline`); connection errors, timeouts, 429 and 5xx are
  retried with backoff, jitter and ``Retry-After``. The API key (from ``api_key_env``) is scrubbed from
  every message and never shown in ``repr``. Limits, retries and failures: docs/models.md.
* Answer formats are sent in the dialect ``structured`` names (:data:`STRUCTURED_MODES`; ``auto``
  detects it and steps down when the server refuses or ignores it); streams never carry a format:
  docs/structured-output.md.
"""

from __future__ import annotations

import contextlib
import email.utils
import json
import logging
import math
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import httpx

from rapo_echo import progress
from rapo_echo.engines.concurrency import RequestLimits, together
from rapo_echo.engines.deadline import Deadline
from rapo_echo.engines.vllm_engine import version_tuple
from rapo_echo.errors import CapabilityError, ConfigError, EngineError
from rapo_echo.scrub import register_secret, scrub
from rapo_echo.structured import AnswerFormat, object_schema
from rapo_echo.text import is_blank
from rapo_echo.types import FAILED, Conversation, Generation, SamplingParams

log = logging.getLogger(__name__)
# A reply longer than this many characters a requested token is cut (no tokenizer writes tokens that long;
# a server that ignores max_tokens does)
MAX_CHARS_PER_TOKEN = 64

TOP_LOGPROBS = 20  # the most OpenAI and vLLM (default max_logprobs) return per position
_TOKEN_ID = re.compile(r"token_id:(\d+)")
STRUCTURED_MODES = ("auto", "json_schema", "vllm", "none")
VLLM_LIKE_OWNERS = ("vllm", "rapo-echo")  # ``owned_by`` of servers that read vLLM's structured_outputs
VLLM_STRUCTURED_OUTPUTS_SINCE = (0, 10, 2)  # older vLLM servers read guided_choice / guided_regex
WRAP_KEY = "answer"  # the one field of the object a json_schema-only server is asked for
DEFAULT_MAX_CONCURRENCY = 256  # requests in flight per engine: a vLLM server batches hundreds at once


class EndpointError(EngineError):
    """A request to an endpoint failed for good; ``status`` is the last HTTP status (None when there was
    no response: connection error or timeout)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class FormatRefused(EndpointError):
    """The server refused the answer format of an explicit ``structured`` mode: a setting to fix, so it
    stops the call (not one item)."""


class _Secret:
    """Holds the API key so that ``repr``/``vars`` of the engine never show it."""

    __slots__ = ("value",)

    def __init__(self, value: str | None) -> None:
        self.value = value or None

    def __repr__(self) -> str:
        return "<secret>" if self.value else "<none>"


def backoff_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random | Any = random) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): ``d = min(cap, base * 2**attempt)``, then
    "equal jitter" ``d/2 + U(0, d/2)`` so that clients retrying together spread out."""
    delay = min(cap_s, base_s * 2**attempt)
    return delay / 2 + rng.random() * delay / 2


def option_logprob(top: Sequence[tuple[str, float]], option: str) -> float:
    """Log-prob that a reply starts with ``option``, read from one position's top list.

    Tokens and the option are compared after stripping leading whitespace. The option's first token
    is taken to be the longest non-empty listed token that begins the option; the log-probs of all
    listed spellings of that token (e.g. ``"A"`` and ``" A"``) are summed in probability space.
    ``-inf`` when no listed token begins the option. For an option longer than one token this is the
    probability of its first token only (an upper bound of the option's probability).
    """
    want = option.lstrip()
    if not want:
        raise ValueError("an option must contain a non-space character")
    best = 0
    for token, _ in top:
        t = token.lstrip()
        if t and want.startswith(t):
            best = max(best, len(t))
    if best == 0:
        return -math.inf
    picked = [lp for token, lp in top if len(token.lstrip()) == best and want.startswith(token.lstrip())]
    hi = max(picked)
    if hi == -math.inf:
        return hi
    return hi + math.log(sum(math.exp(lp - hi) for lp in picked))


def content_text(content: Any) -> str | None:
    """A reply's ``message.content`` as text: a string as is, null as ``""``, a list of text parts
    joined; None for anything else."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
    ):
        return "".join(p["text"] for p in content)
    return None


def _normalize_base_url(base_url: str) -> str:
    from rapo_echo.config import url_secret

    url = base_url.strip().rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"base_url: got {base_url!r}; expected an http(s) URL of an OpenAI-compatible API, "
            "e.g. http://127.0.0.1:8000/v1"
        )
    if url_secret(url) or parts.username:  # never shown, logged (httpx logs URLs) or saved
        raise ConfigError(
            f"base_url: {parts.scheme}://{parts.hostname}...: credentials inside the URL are refused; put "
            "the key in an environment variable and name it with api_key_env (sent as a Bearer token)"
        )
    return url if parts.path else url + "/v1"


# ---------------------------------------------------------------------- structured output
def schema_name(name: str) -> str:
    """``name`` as OpenAI's ``json_schema.name`` allows it: letters, digits, ``_`` and ``-``, at most 64."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64] or "answer"


def strict_compatible(schema: Any) -> bool:
    """Whether ``schema`` meets OpenAI's ``strict`` rules as far as our keyword subset goes: every object
    lists all its properties as required and sets ``additionalProperties: false``."""
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object":
        props = schema.get("properties") or {}
        if schema.get("additionalProperties") is not False or set(schema.get("required") or ()) != set(props):
            return False
        if not all(strict_compatible(sub) for sub in props.values()):
            return False
    return strict_compatible(schema.get("items")) if "items" in schema else True


def wrapped_value_schema(fmt: AnswerFormat) -> dict[str, Any] | None:
    """The schema of the ``answer`` field a json_schema-only server is asked for, or None when ``fmt`` is
    a JSON format whose root is an object (sent as it is)."""
    if fmt.kind == "json":
        schema = fmt.schema
        return None if schema.get("type") == "object" else schema
    if fmt.kind == "choice":
        return {"type": "string", "enum": list(fmt.choices)}
    if fmt.kind == "integer":
        return {"type": "integer", "minimum": fmt.lo, "maximum": fmt.hi}
    return {"type": "string", "pattern": f"^(?:{fmt.pattern})$"}  # JSON-schema patterns are unanchored


def response_format_field(fmt: AnswerFormat) -> dict[str, Any]:
    """``response_format`` (type ``json_schema``) asking for ``fmt``; ``strict`` where the schema allows."""
    value = wrapped_value_schema(fmt)
    schema = fmt.schema
    if value is not None:
        schema = object_schema({WRAP_KEY: value})
    spec = {"name": schema_name(fmt.name), "schema": schema, "strict": strict_compatible(schema)}
    return {"response_format": {"type": "json_schema", "json_schema": spec}}


def format_fields(fmt: AnswerFormat, dialect: str) -> dict[str, Any]:
    """The request fields asking a server to enforce ``fmt`` in ``dialect``. ``json_schema``: always
    ``response_format`` (see :func:`wraps_answer`); ``vllm`` / ``vllm_guided``: an object-rooted JSON
    format as ``response_format``, anything else as ``structured_outputs`` / ``guided_*`` (choice, regex,
    json; an integer as its regex); ``none``: no field."""
    if dialect == "none":
        return {}
    if dialect == "json_schema" or (fmt.kind == "json" and wrapped_value_schema(fmt) is None):
        return response_format_field(fmt)
    if dialect not in ("vllm", "vllm_guided"):
        raise ValueError(f"unknown structured-output dialect {dialect!r}")
    if fmt.kind == "json":  # a non-object root: vLLM takes any JSON schema here
        key, value = "json", fmt.schema
    elif fmt.kind == "choice":
        key, value = "choice", list(fmt.choices)
    else:  # integer and regex: a regular expression
        key, value = "regex", fmt.as_regex()
    return {f"guided_{key}": value} if dialect == "vllm_guided" else {"structured_outputs": {key: value}}


def wraps_answer(fmt: AnswerFormat, dialect: str) -> bool:
    """Whether a reply to ``fmt`` in ``dialect`` comes as ``{"answer": ...}`` and must be unwrapped."""
    return dialect == "json_schema" and wrapped_value_schema(fmt) is not None


def unwrap_answer(text: str, fmt: AnswerFormat) -> str | None:
    """The format's own text inside a wrapped reply ``{"answer": ...}`` (a choice's label, an integer's
    digits, a regex's match, a JSON value's canonical text), or None when the reply is not such an object."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    if not isinstance(value, dict) or WRAP_KEY not in value:
        return None
    answer = value[WRAP_KEY]
    if fmt.kind == "json":
        return json.dumps(answer)
    if fmt.kind == "integer":
        return str(answer) if isinstance(answer, int) and not isinstance(answer, bool) else None
    return answer if isinstance(answer, str) else None


class OpenAIEngine(contextlib.AbstractContextManager):
    """A chat engine that calls an OpenAI-compatible ``/chat/completions`` endpoint (``with`` closes it)."""

    concurrent_calls = True  # roles may call it from several threads at once (one shared RequestLimits)

    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        *,
        api_key_env: str | None = "OPENAI_API_KEY",
        timeout_s: float = 120.0,
        max_retries: int = 3,
        name: str = "openai",
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        max_rpm: float | None = None,
        max_tpm: float | None = None,
        return_token_ids: bool = False,
        http_client: httpx.Client | None = None,
        structured: str = "auto",
    ) -> None:
        """``return_token_ids`` sends vLLM's ``return_tokens_as_token_ids`` so that generations carry
        token ids (only for servers that know the field); ``http_client`` replaces the default client
        (custom TLS, proxies, or an in-process test client) and then its own timeout applies;
        ``structured`` is how answer formats are sent (:data:`STRUCTURED_MODES`, see the module doc);
        ``max_concurrency``, ``max_rpm`` and ``max_tpm`` are the request limits (see the module doc)."""
        if structured not in STRUCTURED_MODES:
            raise ConfigError(
                f"openai engine: structured must be one of {STRUCTURED_MODES}, got {structured!r}"
            )
        if timeout_s <= 0 or max_retries < 0 or max_concurrency < 1 or backoff_s < 0:
            raise ConfigError(
                "openai engine: need timeout_s > 0, max_retries >= 0, max_concurrency >= 1, backoff_s >= 0; "
                f"got timeout_s={timeout_s}, max_retries={max_retries}, max_concurrency={max_concurrency}, "
                f"backoff_s={backoff_s}"
            )
        for key, value in (("max_rpm", max_rpm), ("max_tpm", max_tpm)):
            if value is not None and value <= 0:
                raise ConfigError(f"openai engine: {key} must be > 0 (or unset for no limit), got {value}")
        self.base_url = _normalize_base_url(base_url)
        self.name = name
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self.max_concurrency = int(max_concurrency)
        self.limits = RequestLimits(self.max_concurrency, max_rpm, max_tpm)
        self.failed_items = 0  # requests that failed for good; their items are invalid (module doc)
        self._count_lock = threading.Lock()
        self._last_answer = -math.inf  # time.monotonic() of the last item (or setup request) answered
        self._setup_lock = threading.Lock()
        self._version_body: dict[str, Any] | None = None  # GET /version, once asked ({} when it failed)
        self.return_token_ids = return_token_ids
        self.api_key_env = api_key_env
        self._api_key = _Secret(os.environ.get(api_key_env) if api_key_env else None)
        register_secret(self._api_key.value)  # scrubbed from every stored or logged text
        self._model = model
        self._models_body: dict[str, Any] | None = None
        self.structured = structured
        self._ladder: list[str] | None = None  # dialects to try, best first (resolved at the first format)
        self._step = 0  # index of the dialect in use
        self._format_lock = threading.Lock()
        self._supports_logprobs: bool | None = None
        self._warned_long = False
        self._rng = random.Random()
        self._own_client = http_client is None
        self._http = http_client or httpx.Client(
            timeout=httpx.Timeout(self.timeout_s),
            # no keep-alive: each request's connection is its own, so its deadline can shut it down
            limits=httpx.Limits(max_connections=self.max_concurrency + 4, max_keepalive_connections=0),
        )

    def __repr__(self) -> str:
        key = "set" if self._api_key.value else "none"
        fields = f"base_url={self.base_url!r}, model={self._model!r}, name={self.name!r}, api_key={key}"
        return f"OpenAIEngine({fields})"

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ HTTP
    def _headers(self) -> dict[str, str]:
        headers = {"Accept": "application/json"}
        if self._api_key.value:
            headers["Authorization"] = f"Bearer {self._api_key.value}"
        return headers

    def _scrub(self, text: str) -> str:
        """``text`` with the API key and any ``Bearer`` token replaced (servers sometimes echo the key, in
        an error or in a reply)."""
        key = self._api_key.value
        return scrub(text.replace(key, "***") if key else text)

    def _fail(self, where: str, what: str, status: int | None = None) -> EndpointError:
        return EndpointError(self._scrub(f"{self.name}: {where}: {what}"), status)

    def _server_message(self, resp: httpx.Response) -> str:
        try:
            body = resp.json()
        except ValueError:
            return resp.text.strip()[:500] or resp.reason_phrase
        err = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(err, dict):
            return str(err.get("message") or err.get("detail") or err)[:500]
        return str(err)[:500]

    def _with_retries(
        self, method: str, url: str, attempt_fn: Callable[[], Any], retries: int | None = None
    ) -> Any:
        """Run ``attempt_fn`` (which sends one request and returns a value or raises) with retries
        (``max_retries`` unless ``retries`` is given). ``attempt_fn`` raises ``_Retryable`` for a failure
        worth retrying."""
        retries = self.max_retries if retries is None else retries
        last, status = "", None
        for attempt in range(retries + 1):
            retry_after: float | None = None
            try:
                return attempt_fn()
            except _Retryable as exc:
                last, status, retry_after = exc.what, exc.status, exc.retry_after
            except httpx.TimeoutException as exc:
                last, status = f"timed out after {self.timeout_s:g} s ({type(exc).__name__})", None
            except httpx.TransportError as exc:
                last, status = f"connection failed ({type(exc).__name__}: {exc})", None
            patience = self.max_backoff_s * (retries - attempt)  # the most the retries left would wait
            if retry_after is not None and retry_after > patience:  # no retry could come in time: stop now
                last += f" (Retry-After {retry_after:g} s: longer than the retries left wait, {patience:g} s)"
                retries = attempt
                break
            if attempt < retries:
                delay = backoff_delay(attempt, self.backoff_s, self.max_backoff_s, self._rng)
                if retry_after is not None:
                    delay = max(delay, min(retry_after, self.max_backoff_s))
                    if status in (429, 503):  # the server is overloaded: nothing new goes out meanwhile
                        self.limits.pause_until(time.monotonic() + min(retry_after, self.max_backoff_s))
                time.sleep(delay)
        raise self._fail(f"{method} {url}", f"{last} (gave up after {retries + 1} attempts)", status)

    def _check(self, method: str, url: str, resp: httpx.Response) -> None:
        """Raise ``_Retryable`` for 429 / 5xx and :class:`EndpointError` for other error statuses."""
        if resp.status_code < 400:
            return
        what = f"HTTP {resp.status_code}: {self._server_message(resp)}"
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Retryable(what, resp.status_code, _retry_after(resp))
        raise self._fail(f"{method} {url}", what, resp.status_code)

    def _request_json(
        self,
        method: str,
        path: str,
        payload: dict[str, Any] | None = None,
        *,
        url: str | None = None,
        retries: int | None = None,
    ) -> dict[str, Any]:
        """One JSON request to ``base_url + path`` (or to ``url``), with retries (``max_retries`` unless
        ``retries`` is given)."""
        url = url or self.base_url + path
        tokens = request_tokens(payload)

        def attempt() -> dict[str, Any]:
            with self.limits.slot(tokens), Deadline(self.timeout_s) as deadline:
                try:
                    resp = self._http.request(
                        method,
                        url,
                        json=payload,
                        headers=self._headers(),
                        timeout=deadline.timeout() if self._own_client else httpx.USE_CLIENT_DEFAULT,
                        extensions=deadline.extensions(),
                    )
                except httpx.TransportError as exc:
                    if deadline.expired:  # the deadline shut the connection down
                        raise httpx.ReadTimeout("whole-request deadline") from exc
                    raise
            self._check(method, url, resp)
            try:
                body = resp.json()
            except ValueError as exc:
                raise self._fail(f"{method} {url}", f"response is not JSON: {resp.text[:200]!r}") from exc
            if not isinstance(body, dict):
                raise self._fail(f"{method} {url}", f"expected a JSON object, got {type(body).__name__}")
            usage = body.get("usage")
            used = usage.get("total_tokens") if isinstance(usage, dict) else None
            self.limits.settle_tokens(tokens, float(used) if isinstance(used, (int, float)) else None)
            return body

        return self._with_retries(method, url, attempt, retries)

    # ------------------------------------------------------------------ setup
    def _setup(self, *, probe: bool = False, version: bool = False) -> None:
        """Ask the server, once, what the engine needs, in as few rounds as the answers allow. Round one: the
        model list (the model id when none was given; ``owned_by`` for ``structured: auto``), ``GET /version``
        when ``version`` (vLLM's field names; asked on speculation while the server's kind is unknown: one
        that has none answers 404) and, when the model is given, the log-prob probe. A vLLM or rapo-echo
        server (``owned_by``) returns log-probs (vLLM's default ``--max-logprobs`` is 20), so it needs no
        probe; any other server with the model unknown is probed in round two."""
        if self._model is not None and not self._setup_needed(probe, version):
            return
        with self._setup_lock:
            want_list = self._models_body is None and (
                self._model is None or (self.structured == "auto" and version)
            )
            want_version = version and self._wants_version()
            owner_known = not want_list and self.structured == "auto"
            if want_version and owner_known and self._server_owner() != "vllm":
                want_version = False  # only vLLM reads guided_* / structured_outputs by version
            if want_version and self._model is not None and want_list and not probe:
                want_version = False  # a generation's own setup: the list first (no speculative request)
            want_probe = probe and self._supports_logprobs is None
            first: list[Callable[[], Any]] = [self._list_models] * want_list
            first += [self._ask_version] * want_version
            if self._model is not None and want_probe:  # the probe waits for nothing
                first.append(self._probe)
                want_probe = False
            together(first, concurrent=True)
            if self._model is None:
                self._model = self._listed_model()
            owner = self._server_owner()
            if want_probe and owner in VLLM_LIKE_OWNERS:
                self._supports_logprobs, want_probe = True, False
            again = not want_version and version and self._wants_version() and owner == "vllm"
            together([self._ask_version] * again + [self._probe] * want_probe, concurrent=True)

    def _wants_version(self) -> bool:
        return (
            self._version_body is None
            and self.structured in ("auto", "vllm")
            and self.base_url.endswith("/v1")
        )

    def _setup_needed(self, probe: bool, version: bool) -> bool:
        listing = self._models_body is None and self.structured == "auto" and version
        return listing or (version and self._wants_version()) or (probe and self._supports_logprobs is None)

    def _list_models(self) -> None:
        """``GET /models`` into ``_models_body``; a failure is kept as ``{}`` when the model was given."""
        try:
            self._models_body = self._request_json("GET", "/models")
            self._last_answer = time.monotonic()
        except EndpointError:
            if self._model is None:
                raise
            self._models_body = {}

    def _listed_model(self) -> str:
        body = self._models_body or {}
        data = body.get("data")
        if not isinstance(data, list) or not data or not isinstance(data[0], dict) or "id" not in data[0]:
            raise self._fail(f"GET {self.base_url}/models", f"no model listed; got {json.dumps(body)[:200]}")
        return str(data[0]["id"])

    def _ask_version(self) -> None:
        """``GET /version`` (next to ``/v1``) into ``_version_body``; ``{}`` when the server has none."""
        try:
            self._version_body = self._request_json("GET", "", url=self.base_url[: -len("/v1")] + "/version")
        except EndpointError:
            self._version_body = {}

    def _answers(self) -> bool:
        """Whether the endpoint answers a 1-token chat request (one attempt): the health check after a call
        whose every request got an error status (are those items the problem, or the endpoint?). HTTP 429
        is an answer: the server is up and limits the rate (a storm of them costs items, not the run)."""
        payload = self._payload([{"role": "user", "content": "Hi"}], SamplingParams(max_new_tokens=1))
        try:
            body = self._request_json("POST", "/chat/completions", payload, retries=0)
            return bool(self._parse_choices(self.base_url + "/chat/completions", body))
        except EndpointError as exc:
            return exc.status == 429

    def _probe(self) -> None:
        """One 1-token request with ``top_logprobs``: whether the server returns log-probs (a server that
        rejects the fields with HTTP 400 / 422 does not). A probe the server answered with another error
        (HTTP 429 in a rate-limit storm, a 5xx) leaves it unknown: this call goes without log-probs and the
        next one asks again (a busy endpoint costs items, never the run); no answer at all raises."""
        payload = self._payload([{"role": "user", "content": "Hi"}], SamplingParams(max_new_tokens=1))
        payload.update(top_logprobs=1, temperature=1.0)
        try:
            body = self._request_json("POST", "/chat/completions", payload)
        except EndpointError as exc:
            if exc.status in (400, 422):  # the server rejects the logprobs fields
                self._supports_logprobs, self._last_answer = False, time.monotonic()
                return
            if exc.status is not None and not isinstance(exc, FormatRefused):  # it answered: not down
                self._last_answer = time.monotonic()
                log.warning(
                    "%s: the log-prob probe got HTTP %d after its retries; this call goes without "
                    "log-probs and the next one asks again",
                    self.base_url,
                    exc.status,
                )
                return
            raise
        self._last_answer = time.monotonic()
        self._supports_logprobs = bool(_top_lists(body))

    # ------------------------------------------------------------------ model
    @property
    def model(self) -> str:
        """The model id sent with each request (asked from ``GET /models`` once when not given)."""
        if self._model is None:
            self._setup()
        assert self._model is not None
        return self._model

    def served_identity(self) -> dict[str, Any]:
        """The served model as the server reports it (a benchmark card's record): the fields of its
        ``GET /models`` entry that name it (``id``, ``root``, ``parent``, ``owned_by``,
        ``max_model_len``; not ``created``, which changes per start) and ``server_version`` from
        ``GET /version`` (vLLM answers it; None where the server has none). Asked once, then kept."""
        model = self.model
        with self._setup_lock:
            if self._models_body is None:
                self._list_models()
            if self._version_body is None and self.base_url.endswith("/v1"):
                self._ask_version()
        data = (self._models_body or {}).get("data")
        cards = [c for c in data if isinstance(c, dict)] if isinstance(data, list) else []
        card = next((c for c in cards if c.get("id") == model), {"id": model})
        fields = ("id", "root", "parent", "owned_by", "max_model_len")
        out: dict[str, Any] = {k: card[k] for k in fields if card.get(k) is not None}
        out["server_version"] = (self._version_body or {}).get("version")
        return out

    @property
    def supports_logprobs(self) -> bool:
        """Whether the server returns log-probs (probes once with a 1-token request while unknown, in the
        engine's setup round)."""
        if self._supports_logprobs is None:
            self._setup(probe=True, version=True)
        return bool(self._supports_logprobs)

    # ------------------------------------------------------------------ requests
    def _payload(
        self, prompt: Conversation, params: SamplingParams, *, logprobs: bool = True
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m["role"], "content": m["content"]} for m in prompt],
            "n": params.n,
            "max_tokens": params.max_new_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        if logprobs:
            payload["logprobs"] = True
        if params.top_k > 0:
            payload["top_k"] = params.top_k
        if params.stop:
            payload["stop"] = list(params.stop)
        if params.seed is not None:
            payload["seed"] = params.seed
        if prompt and prompt[-1]["role"] == "assistant":
            payload["continue_final_message"] = True
            payload["add_generation_prompt"] = False
        return payload

    def _map(
        self, fn: Callable[[Any], Any], items: Sequence[Any], failed: Callable[[EndpointError], Any]
    ) -> list[Any]:
        """``fn`` over ``items``, every request in flight at once (bounded by the engine's limits), results
        in order; the requests done, in flight and failed go to the progress display. An item whose request
        fails for good gets ``failed(error)`` and is counted (``failed_items``); when every item failed and
        the endpoint looks down (module doc), the first error is raised instead. Errors that are not the
        endpoint's (e.g. a capability error) propagate."""
        calls = progress.RemoteCalls(len(items))

        def one(x: Any) -> tuple[Any, EndpointError | None, bool]:
            started = time.monotonic()
            calls.start()
            try:
                out = fn(x)
            except EndpointError as exc:  # alone: nothing was answered while this item was tried
                calls.end(ok=False)
                if isinstance(exc, FormatRefused):
                    raise
                return None, exc, self._last_answer < started
            except BaseException:
                calls.end(ok=False)
                raise
            calls.end()
            self._last_answer = time.monotonic()
            return out, None, False

        with progress.task(progress.label(self.name, "requests"), total=len(items), unit="req"):
            if len(items) <= 1:
                done = [one(x) for x in items]
            else:
                pool = ThreadPoolExecutor(
                    max_workers=min(self.max_concurrency, len(items)), thread_name_prefix=self.name
                )
                try:
                    done = list(pool.map(one, items))
                finally:
                    pool.shutdown(wait=True, cancel_futures=True)
        errors = [e for _, e, _ in done if e is not None]
        if not errors:
            return [r for r, _, _ in done]
        if all(e is not None and alone for _, e, alone in done) and (
            all(e.status is None for e in errors) or not self._answers()
        ):
            first = errors[0]
            raise EndpointError(
                f"{first} -- every request of this call failed, and the endpoint answered nothing meanwhile "
                "nor a 1-token health request after: it is down",
                first.status,
            ) from first
        with self._count_lock:
            self.failed_items += len(errors)
        log.warning(
            self._scrub(
                f"{self.name} at {self.base_url}: {len(errors)} of {len(items)} requests failed for good; "
                f"their items are invalid, the other answers are kept (first: {errors[0]})"
            )
        )
        return [failed(e) if e is not None else r for r, e, _ in done]

    def generate(self, prompts: Sequence[Conversation], params: SamplingParams) -> list[list[Generation]]:
        """``params.n`` replies per prompt; one request per prompt, sent concurrently. A call with an
        answer format asks the server to enforce it (see the module doc)."""
        if prompts:
            self._setup(version=params.answer_format is not None)  # once, before the threads start
            if params.answer_format is not None:
                self._structured_ladder()
        failed = [Generation(text="", finish_reason=FAILED)] * params.n
        return self._map(lambda p: self._generate_one(p, params), list(prompts), lambda _: list(failed))

    # ------------------------------------------------------------------ structured output
    @property
    def structured_output(self) -> str:
        """``server`` while answer formats are sent to the server, ``none`` with ``structured: none`` or
        after the server refused them (:func:`~rapo_echo.engines.base.format_enforcement`)."""
        if self.structured == "none":
            return "none"
        ladder = self._ladder
        return "none" if ladder is not None and ladder[self._step] == "none" else "server"

    def _server_owner(self) -> str:
        """``owned_by`` of the served model in ``GET /models`` (vLLM says ``vllm``), or ``""``."""
        data = (self._models_body or {}).get("data")
        if not isinstance(data, list):
            return ""
        cards = [c for c in data if isinstance(c, dict)]
        card = next((c for c in cards if c.get("id") == self._model), cards[0] if cards else {})
        return str(card.get("owned_by") or "").lower()

    def _vllm_dialect(self) -> str:
        """``vllm_guided`` for a vLLM server older than 0.10.2 (its ``GET /version``), else ``vllm``."""
        version = version_tuple(str((self._version_body or {}).get("version", "")))
        return "vllm_guided" if version and version < VLLM_STRUCTURED_OUTPUTS_SINCE else "vllm"

    def _structured_ladder(self) -> list[str]:
        """The dialects to try, best first; resolved once (``auto`` asks the server what it is)."""
        if self._ladder is None:
            self._setup(version=True)
        with self._format_lock:
            if self._ladder is None:
                if self.structured == "none":
                    self._ladder = ["none"]
                elif self.structured == "json_schema":
                    self._ladder = ["json_schema"]
                elif self.structured == "vllm":
                    self._ladder = [self._vllm_dialect()]
                else:
                    owner = self._server_owner()
                    first: list[str] = []
                    if owner in VLLM_LIKE_OWNERS:  # rapo-echo serve reads both generations of fields
                        first = [self._vllm_dialect() if owner == "vllm" else "vllm"]
                    self._ladder = [*first, "json_schema", "none"]
                    log.debug("%s: structured output as %s (owned_by %r)", self.name, self._ladder, owner)
            return self._ladder

    def _step_down(self, past: int, why: str) -> None:
        """Stop using dialects up to index ``past`` (the server refused or ignored them); one warning when
        this ends structured output for the engine."""
        ladder = self._structured_ladder()
        with self._format_lock:
            if past < self._step or past + 1 >= len(ladder):
                return
            self._step = past + 1
            now = ladder[self._step]
        where = f"{self.name} at {self.base_url}"
        if now == "none":
            log.warning(
                self._scrub(
                    f"{where}: the server does not enforce answer formats ({why}); they are no longer sent, "
                    "so replies are parsed and retried, and those that never parse count as invalid "
                    "(set structured: none to skip this check, or serve the model with vLLM, SGLang or "
                    "llama.cpp to have formats enforced)"
                )
            )
        else:
            log.info(self._scrub(f"{where}: {why}; trying structured output as {now!r}"))

    def _generate_one(self, prompt: Conversation, params: SamplingParams) -> list[Generation]:
        url = self.base_url + "/chat/completions"
        fmt = params.answer_format
        gens: list[Generation] = []
        while len(gens) < params.n:  # servers that ignore ``n`` (llama.cpp) are asked again for the rest
            missing = params.n - len(gens)
            seed = None if params.seed is None else params.seed + len(gens)
            payload = self._payload(prompt, SamplingParams(**{**params.__dict__, "n": missing, "seed": seed}))
            if self.return_token_ids:
                payload["return_tokens_as_token_ids"] = True
            if params.top_logprobs:
                payload["top_logprobs"] = params.top_logprobs
            if fmt is None:
                body, step = self._request_json("POST", "/chat/completions", payload), -1
            else:
                body, step = self._post_formatted(payload, fmt)
            got = self._parse_choices(url, body)
            if not got:
                raise self._fail(f"POST {url}", f"response has no choices: {json.dumps(body)[:200]}")
            if fmt is not None and step >= 0:
                got = self._read_formatted(got, fmt, step, params)
            gens.extend(self._bounded(g, params.max_new_tokens) for g in got[:missing])
        return gens

    def _bounded(self, gen: Generation, max_tokens: int) -> Generation:
        """``gen`` cut to :data:`MAX_CHARS_PER_TOKEN` characters a token of ``max_tokens`` (finish reason
        ``length``): a server that ignores ``max_tokens`` cannot fill a run's files with megabytes."""
        limit = max(1, max_tokens) * MAX_CHARS_PER_TOKEN
        if len(gen.text) <= limit:
            return gen
        if not self._warned_long:
            self._warned_long = True
            log.warning(
                "%s: a reply of %d characters to max_tokens %d (the server ignores max_tokens?); replies are "
                "cut to %d characters",
                self.base_url,
                len(gen.text),
                max_tokens,
                limit,
            )
        return Generation(text=gen.text[:limit], finish_reason="length")

    def _post_formatted(self, payload: dict[str, Any], fmt: AnswerFormat) -> tuple[dict[str, Any], int]:
        """Send ``payload`` with the fields of the dialect in use; returns the body and the dialect's index.
        In ``auto`` mode a refusal (HTTP 400 / 422) tries the next dialect, down to none, and the dialects
        are given up for good once a later one is answered; a request refused even without any format
        fails as before."""
        ladder = self._structured_ladder()
        step = self._step
        first_refusal = ""
        while True:
            dialect = ladder[step]
            try:
                fields = format_fields(fmt, dialect)
                body = self._request_json("POST", "/chat/completions", {**payload, **fields})
            except EndpointError as exc:
                if dialect == "none" or exc.status not in (400, 422):
                    raise
                if self.structured != "auto":
                    raise FormatRefused(
                        f"{exc} (the request carried answer format {fmt.name!r} as structured: "
                        f"{self.structured}; use structured: auto to fall back to parsing when the server "
                        "refuses it, or structured: none)",
                        exc.status,
                    ) from exc
                first_refusal = first_refusal or f"it refused {dialect} fields: {exc}"
                step += 1
                continue
            if first_refusal:
                self._step_down(step - 1, first_refusal)
            return body, step

    def _read_formatted(
        self, gens: list[Generation], fmt: AnswerFormat, step: int, params: SamplingParams
    ) -> list[Generation]:
        """Unwrap ``{"answer": ...}`` replies; in ``auto`` mode, a reply that ended normally yet does not
        conform shows a server that accepted the fields without enforcing them: step down."""
        dialect = self._structured_ladder()[step]
        if dialect == "none":
            return gens
        out = []
        for g in gens:
            if wraps_answer(fmt, dialect):
                inner = unwrap_answer(g.text, fmt)
                if inner is not None:  # the token ids and log-probs were those of the wrapper: dropped
                    g = Generation(text=inner, finish_reason=g.finish_reason)
            out.append(g)
        if self.structured == "auto" and not params.stop:
            bad = next((g for g in out if g.finish_reason == "stop" and fmt.problem(g.text)), None)
            if bad is not None:
                why = f"it accepted {dialect} fields but replied {bad.text[:60]!r}: {fmt.problem(bad.text)}"
                self._step_down(step, why)
        return out

    def _parse_choices(self, url: str, body: dict[str, Any]) -> list[Generation]:
        choices = body.get("choices")
        if not isinstance(choices, list):
            raise self._fail(f"POST {url}", f"response has no 'choices' list: {json.dumps(body)[:200]}")
        out = []
        for choice in sorted(choices, key=lambda c: c.get("index", 0) if isinstance(c, dict) else 0):
            try:
                content = choice["message"].get("content")
            except (KeyError, TypeError, AttributeError) as exc:
                raise self._fail(
                    f"POST {url}", f"malformed choice (no message.content): {json.dumps(choice)[:200]}"
                ) from exc
            text = content_text(content)
            if text is None:  # bad output, not a broken endpoint: the reply is empty, so unparseable
                log.warning(
                    self._scrub(
                        f"{self.name}: POST {url}: message.content is {type(content).__name__}, not text; "
                        "the reply counts as empty (a judge or simulator marks it invalid)"
                    )
                )
                text = ""
            try:
                entries = (choice.get("logprobs") or {}).get("content") or []
                logprobs = [float(e["logprob"]) for e in entries] if entries else None
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise self._fail(f"POST {url}", f"malformed logprobs: {json.dumps(choice)[:200]}") from exc
            ids = [_TOKEN_ID.fullmatch(str(e.get("token", ""))) for e in entries]
            token_ids = [int(m.group(1)) for m in ids] if ids and all(ids) else []  # type: ignore[union-attr]  # all(ids): every match is found
            if logprobs is not None:
                self._supports_logprobs = True
            finish = choice.get("finish_reason") or "stop"
            tops = _positions(entries) if not token_ids else None
            text = self._scrub(text)  # a reply that echoes the key never leaves the engine with it
            out.append(
                Generation(
                    text=text,
                    token_ids=token_ids,
                    logprobs=logprobs,
                    finish_reason=str(finish),
                    top_logprobs=tops,
                )
            )
        return out

    def choice_logprobs(
        self, prompts: Sequence[Conversation], options: Sequence[str]
    ) -> list[dict[str, float]]:
        """Log-prob of each option as the reply's beginning, from the first position's top-20 list
        (see :func:`option_logprob`); ``-inf`` for options not in the list; an empty row for a prompt whose
        request failed for good."""
        for o in options:
            if is_blank(o):
                raise ValueError(f"choice_logprobs: option {o!r} is blank")
        if prompts:
            self._setup()
        return self._map(lambda p: self._choice_one(p, options), list(prompts), lambda _: {})

    def _choice_one(self, prompt: Conversation, options: Sequence[str]) -> dict[str, float]:
        url = self.base_url + "/chat/completions"
        payload = self._payload(prompt, SamplingParams(max_new_tokens=1, temperature=1.0))
        payload["top_logprobs"] = TOP_LOGPROBS
        body = self._request_json("POST", "/chat/completions", payload)
        tops = _top_lists(body)
        if not tops:
            self._supports_logprobs = False
            raise CapabilityError(
                self._scrub(f"{self.name}: POST {url} returned no top log-probs, so options cannot be scored")
            )
        self._supports_logprobs = True
        return {o: option_logprob(tops[0], o) for o in options}

    def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]:
        """Yield the content deltas of one reply (server-sent events; ``params.n`` is ignored)."""
        url = self.base_url + "/chat/completions"
        payload = self._payload(prompt, SamplingParams(**{**params.__dict__, "n": 1}), logprobs=False)
        payload["stream"] = True

        def open_stream() -> httpx.Response:
            req = self._http.build_request(
                "POST",
                url,
                json=payload,
                headers={**self._headers(), "Accept": "text/event-stream"},
            )
            resp = self._http.send(req, stream=True)
            if resp.status_code >= 400:
                resp.read()
                resp.close()
                self._check("POST", url, resp)
            return resp

        resp = self._with_retries("POST", url, open_stream)
        try:
            yield from self._read_events(url, resp)
        except httpx.TimeoutException as exc:
            raise self._fail(f"POST {url}", f"stream stalled: no data for {self.timeout_s:g} s") from exc
        except httpx.TransportError as exc:
            raise self._fail(f"POST {url}", f"stream broken ({type(exc).__name__}: {exc})") from exc
        finally:
            resp.close()

    def _read_events(self, url: str, resp: httpx.Response) -> Iterator[str]:
        for line in resp.iter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                event = json.loads(data)
            except ValueError as exc:
                raise self._fail(f"POST {url}", f"bad stream event {data[:200]!r}") from exc
            if not isinstance(event, dict):
                raise self._fail(f"POST {url}", f"bad stream event {data[:200]!r}")
            if "error" in event:
                err = event["error"]
                raise self._fail(
                    f"POST {url}",
                    f"server error in stream: {err.get('message', err) if isinstance(err, dict) else err}",
                )
            for choice in event.get("choices") or []:
                piece = (choice.get("delta") or {}).get("content")
                if piece:
                    yield piece


class _Retryable(Exception):
    def __init__(self, what: str, status: int, retry_after: float | None = None) -> None:
        super().__init__(what)
        self.what, self.status, self.retry_after = what, status, retry_after


def _retry_after(resp: httpx.Response) -> float | None:
    return retry_after_seconds(resp.headers.get("retry-after"))


def retry_after_seconds(value: str | None, now: float | None = None) -> float | None:
    """Seconds a ``Retry-After`` header asks to wait: delay-seconds, or an HTTP date (``now``: Unix time,
    default the current time); None when absent or unreadable, 0 for a past date."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:  # an HTTP date is GMT
        return None
    return max(0.0, when.timestamp() - (time.time() if now is None else now))


def request_tokens(payload: dict[str, Any] | None) -> float:
    """The tokens a chat request is charged up front under ``max_tpm``: its messages' characters / 4 plus
    ``max_tokens x n`` (0 for a request without messages)."""
    if not payload or "messages" not in payload:
        return 0.0
    chars = sum(len(str(m.get("content", ""))) for m in payload["messages"])
    return chars / 4 + float(payload.get("max_tokens") or 0) * float(payload.get("n") or 1)


def _positions(entries: list[Any]) -> list[tuple[str, list[tuple[str, float]]]] | None:
    """Per sampled token its text and its top list, when every position has a non-empty top list."""
    try:
        out = [
            (str(e["token"]), [(str(t["token"]), float(t["logprob"])) for t in e.get("top_logprobs") or []])
            for e in entries
        ]
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return out if out and all(top for _, top in out) else None


def _top_lists(body: dict[str, Any]) -> list[list[tuple[str, float]]]:
    """The top log-prob lists of the first choice, one per position ([] when the response has none)."""
    try:
        entries = (body["choices"][0].get("logprobs") or {}).get("content") or []
        tops = [
            [(str(t["token"]), float(t["logprob"])) for t in e.get("top_logprobs") or []] for e in entries
        ]
    except (KeyError, IndexError, TypeError, ValueError, AttributeError):
        return []
    return tops if tops and all(tops) else []

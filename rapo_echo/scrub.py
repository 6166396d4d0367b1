"""Secret values kept out of every text the library stores or logs (issue 39 item 2).

A server can echo the ``Authorization`` header inside a reply; the reply then travels into a sample's
info, a run's ``samples.jsonl``, a benchmark's transcripts. :func:`scrub` replaces, in any text,

* the value of every registered secret (:func:`register_secret`: the ``openai`` engine registers its API
  key, ``serve`` its own) and of every environment variable named like a secret (:data:`SECRET_KEY`, at
  least :data:`MIN_ENV_SECRET` characters), also in its JSON-escaped form;
* the token after ``Bearer`` (any case), whoever's it is;

by ``***``. The engines scrub the replies they return, the run files are scrubbed as they are written
(:func:`rapo_echo.jsonl.append_jsonl`, :func:`rapo_echo.atomic.write_text_atomic`) and the CLI's log
handlers carry :class:`ScrubFilter`. The lowest layer of the package: everything may use it.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import Any

MASK = "***"
SECRET_KEY = re.compile(
    r"(api[_-]?key|access[_-]?key|secret[_-]?key|private[_-]?key|token|secret|password|passwd|authorization"
    r"|bearer|credentials?)$",
    re.I,
)
MIN_ENV_SECRET = 8  # shorter values of secret-named variables are too likely to be ordinary words
MIN_REGISTERED = 4
_BEARER = re.compile(r"(?i)\b(bearer)([ \t]+|%20|\+)(?!\*\*\*)[A-Za-z0-9._~+/=:-]+")
_registered: set[str] = set()


def register_secret(value: str | None) -> None:
    """Scrub ``value`` from every text from now on (ignored when shorter than :data:`MIN_REGISTERED`)."""
    if isinstance(value, str) and len(value.strip()) >= MIN_REGISTERED:
        _registered.add(value.strip())


def secret_values() -> list[str]:
    """The values :func:`scrub` replaces, longest first: the registered ones and those of environment
    variables named like secrets."""
    env = {v for k, v in os.environ.items() if SECRET_KEY.search(k) and v and len(v) >= MIN_ENV_SECRET}
    return sorted(_registered | env, key=len, reverse=True)


def scrub(text: str) -> str:
    """``text`` with every secret value and ``Bearer`` token replaced by :data:`MASK`."""
    if not isinstance(text, str) or not text:
        return text
    for value in secret_values():
        if value in text:
            text = text.replace(value, MASK)
        escaped = json.dumps(value)[1:-1]
        if escaped != value and escaped in text:
            text = text.replace(escaped, MASK)
    return _BEARER.sub(rf"\g<1>\g<2>{MASK}", text) if "earer" in text or "EARER" in text else text


def scrub_data(value: Any) -> Any:
    """``value`` (JSON-like: dicts, lists, strings) with every string :func:`scrub`-bed; keys too."""
    if isinstance(value, str):
        return scrub(value)
    if isinstance(value, dict):
        return {scrub_data(k): scrub_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [scrub_data(v) for v in value]
    return value


class ScrubFilter(logging.Filter):
    """A logging filter that scrubs each record's message (put it on a handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: leave it to the handler's own error path
            return True
        clean = scrub(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True

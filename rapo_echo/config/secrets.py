"""Secrets never enter a config: literal secrets are refused, and values written out are scrubbed."""

from __future__ import annotations

import os
import re
from typing import Any

from rapo_echo.scrub import SECRET_KEY, scrub

ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# Values that look like a credential whatever their key is called: provider key prefixes, a private key
# block, ``user:password@host`` without a scheme, and a long random-looking token (letters of both cases
# and digits, no spaces: a hex digest or a path does not match).
_SECRET_VALUE = re.compile(
    r"\b(sk-[A-Za-z0-9_-]{16,}|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}"
    r"|github_pat_[A-Za-z0-9_]{30,}|hf_[A-Za-z0-9]{30,}|xox[abprs]-[A-Za-z0-9-]{10,}|AIza[0-9A-Za-z_-]{35})"
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"
)
_USER_PASSWORD = re.compile(r"[^\s:/@]+:[^\s/@]+@[^\s@]+")
_RANDOM_TOKEN = re.compile(r"(?=[^\s]*[a-z])(?=[^\s]*[A-Z])(?=[^\s]*\d)[A-Za-z0-9_+=-]{32,}")
# query parameters that carry a credential in URLs besides the secret-named ones: Google-style ``key``,
# signed-URL ``sig`` / ``signature``, ``auth``
_URL_KEY_PARAM = re.compile(r"(key|sig|signature|auth)$", re.I)


def secret_value(text: str) -> str | None:
    """Why ``text`` looks like a credential by its value alone (a provider key, ``user:pw@host``, a long
    random token), else None."""
    stripped = text.strip()
    if _SECRET_VALUE.search(text):
        return "a value that looks like an API key or private key"
    if _USER_PASSWORD.fullmatch(stripped):
        return "a value that looks like user:password@host"
    if _RANDOM_TOKEN.fullmatch(stripped):
        return "a long random-looking value (a token?)"
    return url_secret(text)


def _secret_env_values() -> dict[str, str]:
    """Values of environment variables named like secrets (long enough to be told apart from words)."""
    return {v: k for k, v in os.environ.items() if SECRET_KEY.search(k) and v and len(v) >= 8}


def url_secret(text: str) -> str | None:
    """Why ``text`` is a URL carrying credentials (a password in it, or a secret-named query
    parameter), else None."""
    from urllib.parse import parse_qsl, urlsplit

    if "://" not in text:
        return None
    try:
        parts = urlsplit(text.strip())
        has_password = parts.password is not None
    except ValueError:
        return None
    if has_password:
        return "a URL with a password in it (user:password@host)"
    for name, value in parse_qsl(parts.query):
        if (SECRET_KEY.search(name) or _URL_KEY_PARAM.match(name)) and value:
            return f"a URL whose query parameter {name!r} holds a secret"
    return None


def literal_secrets(tree: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted key, why)`` for every literal secret in a config tree: a value under a secret-named key,
    a ``*_env`` value that is not a variable's name, a credential-looking value (:func:`secret_value`),
    or the value of a secret-named environment variable."""
    env = _secret_env_values()
    found: list[tuple[str, str]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                key = f"{path}.{k}" if path else str(k)
                if isinstance(k, str) and SECRET_KEY.search(k) and isinstance(v, str) and v:
                    found.append((key, "holds a literal secret"))
                elif isinstance(k, str) and SECRET_KEY.search(k) and v not in (None, "", [], {}):
                    found.append(
                        (key, f"holds a literal {type(v).__name__} where no value belongs (a secret-named "
                         f"field); give the name of an environment variable in {k}_env instead")
                    )
                elif isinstance(k, str) and k.endswith("_env") and isinstance(v, str) and v:
                    if not ENV_NAME.fullmatch(v):
                        why = secret_value(v)
                        found.append(
                            (key, "is not the name of an environment variable (letters, digits and _, not "
                             f"starting with a digit){'; it holds ' + why if why else ''}: put the value "
                             "in a variable and give the variable's name here")
                        )
                else:
                    walk(v, key)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}.{i}" if path else str(i))
        elif isinstance(node, str):
            for value, name in env.items():
                if value in node:
                    found.append((path, f"holds the value of the environment variable {name}"))
                    return
            why = secret_value(node)
            if why:
                found.append((path, f"holds {why}"))

    walk(tree, prefix)
    return found


def redacted(data: Any) -> Any:
    """A copy with secret-looking values replaced by ``***`` (``*_env`` names of variables are kept)."""
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if isinstance(k, str) and SECRET_KEY.search(k) and not k.endswith("_env") and v:
                out[k] = "***"
            else:
                out[k] = redacted(v)
        return out
    if isinstance(data, list):
        return [redacted(v) for v in data]
    if isinstance(data, str):
        return scrub(data)
    return data

"""Secrets never enter a config: literal secrets are refused, and values written out are scrubbed."""

from __future__ import annotations

import os
import re
from typing import Any

SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|authorization)$", re.I)


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
        if SECRET_KEY.search(name) and value:
            return f"a URL whose query parameter {name!r} holds a secret"
    return None


def literal_secrets(tree: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted key, why)`` for every literal secret in a config tree: a non-empty string under a key
    named like a secret (``*_env`` names of variables are fine), credentials inside a URL, or the value
    of an environment variable named like a secret."""
    env = _secret_env_values()
    found: list[tuple[str, str]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                key = f"{path}.{k}" if path else str(k)
                if isinstance(k, str) and SECRET_KEY.search(k) and isinstance(v, str) and v:
                    found.append((key, "holds a literal secret"))
                else:
                    walk(v, key)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}.{i}" if path else str(i))
        elif isinstance(node, str):
            why = url_secret(node)
            if why:
                found.append((path, f"holds {why}"))
                return
            for value, name in env.items():
                if value in node:
                    found.append((path, f"holds the value of the environment variable {name}"))
                    return

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
        for name, value in os.environ.items():
            if SECRET_KEY.search(name) and value and len(value) >= 8 and value in data:
                data = data.replace(value, "***")
    return data

"""Secrets on disk (issue 31 item 2): values that look like credentials are refused whatever their key
is called, secret-looking names include access_key / bearer / credentials, and a ``*_env`` field holds a
variable's name, never a key pasted in its place. Messages name the key, never the value."""

from __future__ import annotations

import pytest

from rapo_echo.config import literal_secrets
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import load_config

KEY = "sk-live-" + "a1B2c3D4e5F6g7H8"


def test_a_key_pasted_into_an_env_field_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigError, match=r"judge\.api_key_env: is not the name of an environment") as e:
        load_config(overrides=[f"judge.api_key_env={KEY}"])
    assert KEY not in str(e.value) and "looks like an API key" in str(e.value)
    with pytest.raises(ConfigError, match=r"simulator\.api_key_env: is not the name"):
        load_config(overrides=["simulator.api_key_env=my key"])
    assert load_config(overrides=["judge.api_key_env=MY_KEY_2"]).judge.api_key_env == "MY_KEY_2"


@pytest.mark.parametrize("name", ["access_key", "bearer", "credentials", "secret_key", "private_key"])
def test_secret_looking_names(name: str) -> None:
    with pytest.raises(ConfigError, match=rf"rewards\.0\.args\.{name}: holds a literal secret"):
        load_config(overrides=[f"rewards=[{{name: judge, args: {{{name}: plain-words}}}}]"])


@pytest.mark.parametrize(
    ("value", "why"),
    [
        ("AKIAIOSFODNN7EXAMPLE", "looks like an API key"),
        (KEY, "looks like an API key"),
        ("ghp_" + "A1b2C3d4" * 5, "looks like an API key"),
        ("alice:hunter22@db.example.com", "user:password@host"),
        ("Zx81Qw72Er63Ty54Ui45Op36As27Df18Gh", "long random-looking value"),
    ],
)
def test_secret_looking_values_under_any_name(value: str, why: str) -> None:
    with pytest.raises(ConfigError, match=rf"rewards\.0\.args\.note: holds a .*{why}") as e:
        load_config(overrides=[f"rewards=[{{name: judge, args: {{note: '{value}'}}}}]"])
    assert value not in str(e.value)


@pytest.mark.parametrize(
    "value",
    [
        "HuggingFaceTB/SmolLM2-135M-Instruct",
        "0123456789abcdef0123456789abcdef01234567",  # a commit hash
        "Be kind: always. Write to me at a@b.c",
        "../shared/data/esconv/ESConv.json",
        "sk-short",
    ],
)
def test_ordinary_values_are_not_secrets(value: str) -> None:
    assert literal_secrets({"rewards": [{"name": "judge", "args": {"note": value}}]}) == []


@pytest.mark.parametrize("param", ["key", "KEY", "sig", "signature", "auth"])
def test_a_key_in_a_url_query_under_a_plain_name_is_refused(param: str) -> None:
    # issue 46: Google-style ``?key=...`` whose value is in no environment variable was written to
    # config.json / config.yaml and printed by --dry-run
    url = f"https://llm.example.com/v1?{param}=plainvalue123"
    why = rf"judge\.base_url: .*query parameter '{param}' holds a secret"
    with pytest.raises(ConfigError, match=why) as e:
        load_config(overrides=[f"judge.base_url={url}"])
    assert "plainvalue123" not in str(e.value)
    assert load_config(overrides=["judge.base_url=https://llm.example.com/v1?keyboard=1"]) is not None

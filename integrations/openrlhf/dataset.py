"""Prompt datasets for OpenRLHF: one JSON line per scenario, ``{"prompt": [messages], "label": "..."}``.

``prompt`` is the conversation the policy replies to (the run's system prompt, then the visible
dialogue), which OpenRLHF renders with ``--data.apply_chat_template``; ``label`` (read with
``--data.label_key label``) is the whole scenario as JSON, so that the reward function sees the exact
dialogue, hidden profile and reference without re-parsing rendered text.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rapo_echo.errors import DataError
from rapo_echo.prompting import fit_turns, policy_conversation
from rapo_echo.types import Conversation, Scenario, msg

PROMPT_KEY = "prompt"
LABEL_KEY = "label"
LABEL_MARK = "rapo_echo_scenario"


def fit_conversation(conv: Conversation, tokenizer: Any, max_tokens: int) -> Conversation:
    """The turns of ``conv`` that fit ``max_tokens`` once rendered, by the policy's rule
    (:func:`rapo_echo.prompting.fit_turns`)."""

    def encode(c: Conversation) -> list[int]:
        text = tokenizer.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    return fit_turns(conv, encode, max_tokens)[0]


def scenario_label(scenario: Scenario) -> str:
    """A scenario as an OpenRLHF label string."""
    return json.dumps({LABEL_MARK: 1, **asdict(scenario)}, ensure_ascii=False)


def scenario_from_label(label: Any) -> Scenario | None:
    """The scenario carried by a label written by :func:`scenario_label`; None for any other label."""
    if not isinstance(label, str) or LABEL_MARK not in label:
        return None
    try:
        data = json.loads(label)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.pop(LABEL_MARK, None) != 1:
        return None
    try:
        return Scenario(**data)
    except TypeError as exc:
        raise DataError(f"label: a rapo-echo scenario label with unexpected fields: {exc}") from exc


def write_prompts(
    scenarios: list[Scenario],
    path: str | Path,
    *,
    system_prompt: str | None,
    tokenizer: Any = None,
    max_prompt_tokens: int | None = None,
) -> int:
    """Write the dataset (JSON lines); prompts are trimmed to ``max_prompt_tokens`` when a tokenizer is
    given. Returns the number of rows."""
    if not scenarios:
        raise DataError(f"{path}: no scenarios to write")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        for s in scenarios:
            conv = policy_conversation(s, system_prompt)
            if tokenizer is not None and max_prompt_tokens:
                conv = fit_conversation(conv, tokenizer, max_prompt_tokens)
            fh.write(json.dumps({PROMPT_KEY: conv, LABEL_KEY: scenario_label(s)}, ensure_ascii=False) + "\n")
    return len(scenarios)


def write_profiles(profiles: list[dict[str, Any]], path: str | Path, *, system_prompt: str | None) -> int:
    """Write an RLVER agent dataset from simulated-user profiles (RLVER / SAGE rows or our scenario
    profiles): the label is the profile JSON; the prompt is the system prompt plus the preset first
    talk when the profile has one (the agent builds the real first observation itself)."""
    from rapo_echo.data.sage_profiles import SageProfile

    if not profiles:
        raise DataError(f"{path}: no profiles to write")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as fh:
        for i, row in enumerate(profiles):
            profile = SageProfile.from_mapping(row, f"{path}: profile {i + 1}")
            conv: Conversation = [msg("system", system_prompt)] if system_prompt else []
            if profile.first_talk:
                conv.append(msg("user", profile.first_talk))
            if not conv:
                raise DataError(
                    f"{path}: profile {i + 1} has no first_talk and the run has no system prompt, so its "
                    "prompt would be empty; set rollout.system_prompt"
                )
            fh.write(json.dumps({PROMPT_KEY: conv, LABEL_KEY: json.dumps(row, ensure_ascii=False)}) + "\n")
    return len(profiles)


def count_rows(path: str | Path) -> int:
    """Number of non-empty lines of a JSON-lines file."""
    with open(path, encoding="utf-8") as fh:
        return sum(1 for line in fh if line.strip())

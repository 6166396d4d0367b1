"""What a simulated person's reaction is, and how a hidden profile is shown in a prompt.

:class:`Reaction` is what user simulators return and what judges read; :func:`render_profile` writes
the hidden profile for the reaction simulator's and the judges' prompts. Both live here, below the
simulators and the judges, so neither has to import the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rapo_echo.llm.addressing import addresses_judge, strip_addressing
from rapo_echo.text import is_blank


@dataclass
class Reaction:
    """The simulated person's reaction to one supporter reply."""

    message: str  # what the person says next (the "echo")
    emotion_delta: float | None  # change of the person's emotional state, in [-scale, +scale]
    thought: str = ""  # a short inner thought the person would not say aloud (optional)
    valid: bool = True
    raw: str = ""  # raw text(s) for logging
    attempts: int = 1
    scale: float = 10.0  # the range of ``emotion_delta``, so readers can interpret it


PROFILE_FIELDS = {
    "persona": "Who you are",
    "emotion_type": "Main emotion",
    "problem_type": "Problem",
    "situation": "Situation",
    "need": "What you need from the supporter (unspoken)",
}


def render_profile(
    profile: Mapping[str, Any], labels: Mapping[str, str] | None = None, *, strip_addressed: bool = True
) -> str:
    """The hidden profile as ``- Label: value`` lines: known fields first (in a fixed order, with readable
    labels), then any other non-empty field under its own name; '' when nothing is set. Words aimed at a
    judge in a value (:mod:`rapo_echo.llm.addressing`) are left out (``strip_addressed``): a profile is shown
    to the reaction simulator, whose reaction a judge reads. The judges pass False: they have screened
    the profile under their own policy already (:mod:`rapo_echo.llm.judge_screen`)."""
    labels = PROFILE_FIELDS if labels is None else labels
    keys = [k for k in labels if k in profile] + [k for k in profile if k not in labels]
    lines = []
    for key in keys:
        value = profile[key]
        text = "" if value is None else str(value)
        if strip_addressed and addresses_judge(text):
            text = strip_addressing(text)
        if is_blank(text):
            continue
        lines.append(f"- {labels.get(key, key)}: {text.strip()}")
    return "\n".join(lines)

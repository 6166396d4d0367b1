"""Emotional state tracking in SAGE: does the policy perceive how the simulated user feels?
(docs/reading-results.md, Hard-to-help seekers)

The policy is asked, beside the dialogue and before each of its replies, how the person feels right now
on the simulator's hidden 0-100 scale (:func:`probe_prompt`: the dialogue fenced, the answer a bare
integer, :data:`PROBE_FORMAT`); its answer never enters the dialogue. Per dialogue, against the hidden
emotion the user's last message was written from: ``tracking_error``, the mean absolute difference (in
emotion points), and ``tracking_direction``, the share of consecutive probes where the estimate moved
the way the hidden emotion did (both up, both down, or both unchanged; 0.5 about chance).

Ours, after the question "Can You Break RLVER?" (arXiv 2605.07138) asks with its Emotional Consistency
Score, whose formula was not available to us: the two are not the same number."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from rapo_echo.llm.dialogue import render_dialogue
from rapo_echo.llm.fencing import Fence
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, msg

PROBE_FORMAT = AnswerFormat.integer(0, 100, name="sage_state_probe")
PROBE_TOKENS = 6  # an integer of at most three digits, and room for a stray space
PROBE_SYSTEM = (
    "You are the supporter in the conversation below. Before your next reply, you note for yourself how "
    "the other person feels right now. This note is never shown to them."
)


def probe_prompt(history: Sequence[Mapping[str, str]], fence: Fence) -> Conversation:
    """The state probe: the dialogue so far (``user``: the person, ``assistant``: the policy) fenced,
    then the question; the answer is one integer from 0 to 100."""
    dialogue = render_dialogue(history, "Person", "You", "(nothing yet)")
    body = (
        f"{fence.rules()}\n\nThe conversation so far:\n{fence.block('DIALOGUE', dialogue)}\n\n"
        "How does the person feel right now, from 0 (very bad: distressed, hostile or about to leave) to "
        "100 (very good: at ease, helped, glad they talked)? 40 is uneasy but willing to go on. Answer with "
        "the number only."
    )
    return [msg("system", PROBE_SYSTEM), msg("user", body)]


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def tracking_metrics(probes: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """``tracking_error`` and ``tracking_direction`` of one dialogue's probes (``estimate`` None where the
    answer was unreadable; left out); a figure without the probes it needs is left out."""
    read = [(float(p["estimate"]), float(p["hidden"])) for p in probes if p.get("estimate") is not None]
    out: dict[str, float] = {}
    if read:
        out["tracking_error"] = sum(abs(e - h) for e, h in read) / len(read)
    if len(read) >= 2:
        pairs = list(itertools.pairwise(read))
        same = sum(_sign(e2 - e1) == _sign(h2 - h1) for (e1, h1), (e2, h2) in pairs)
        out["tracking_direction"] = same / len(pairs)
    return out

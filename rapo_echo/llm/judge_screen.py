"""What a judge does with text that addresses it (:mod:`.addressing`): the ``addressed`` policies.

Every judge path (the ``judge`` reward, ``humanlike``, ``empathy``, RAPO's group judge) screens the texts
it is about to show its model through one :class:`JudgeScreen` before it builds a prompt:

* a **reply** being judged (the policy's text, and what a comparison sets beside it) under ``addressed``
  (:data:`POLICIES`):

  - ``floor`` (the default): the reply is not shown to the model; it gets the judge's worst outcome (score
    0, P(human) 0, a lost comparison, the group's last rank). Addressing the judge then costs the policy
    the most it can lose, whatever the judge would have said: in GRPO a masked (invalid) sample is neutral
    (no gradient, so nothing to unlearn) and a stripped one is at best neutral too, while the floor gives
    the sample the group's lowest reward and so a negative advantage whenever another reply of its group
    scores higher;
  - ``invalid``: the reply is scored ``None`` (masked out of the loss and counted);
  - ``strip``: the parts that address the judge are removed (:func:`.addressing.strip_addressing`)
    and the rest is judged;
  - ``flag``: judged as written; only counted and marked in the sample's info.

* a **context** text (the dialogue's turns, the profile, the persona, a reaction) under
  ``addressed_context`` (:data:`CONTEXT_POLICIES`): ``strip`` (the default: the policy did not write it,
  so its replies are judged against the context without the instruction), ``invalid`` (every reply
  judged in that context is invalid) or ``flag``.

Each screened text is counted: :meth:`JudgeScreen.step_metrics` gives ``judge/addressed`` (replies that
addressed the judge since the last call), ``judge/addressed/n`` (replies screened) and
``judge/addressed/context`` (context texts that did), logged every training step. A judged sample's info
says what was found (``addressed``: the kinds, ``addressed_action``: what was done).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rapo_echo.llm.addressing import Finding, findings, strip_addressing
from rapo_echo.types import Conversation, Scenario

POLICIES = ("floor", "invalid", "strip", "flag")
CONTEXT_POLICIES = ("strip", "invalid", "flag")
METRIC = "judge/addressed"


def check_policies(owner: str, addressed: str, addressed_context: str) -> None:
    """Raise ``ValueError`` naming ``owner`` for an unknown policy."""
    if addressed not in POLICIES:
        raise ValueError(f"{owner}: addressed must be one of {', '.join(POLICIES)}, got {addressed!r}")
    if addressed_context not in CONTEXT_POLICIES:
        raise ValueError(
            f"{owner}: addressed_context must be one of {', '.join(CONTEXT_POLICIES)}, "
            f"got {addressed_context!r}"
        )


@dataclass
class Screened:
    """A reply after screening: ``text`` is what the judge's model is shown; ``action`` is None (nothing
    found) or the policy applied; ``kinds`` what was found."""

    text: str
    action: str | None = None
    kinds: list[str] = field(default_factory=list)

    @property
    def floored(self) -> bool:
        return self.action == "floor"

    @property
    def invalid(self) -> bool:
        return self.action == "invalid"

    @property
    def judged(self) -> bool:
        """Whether the judge's model sees this reply (not floored, not invalid)."""
        return self.action not in ("floor", "invalid")

    def info(self) -> dict[str, Any]:
        """What a sample's info records (empty when nothing was found)."""
        return {"addressed": self.kinds, "addressed_action": self.action} if self.action else {}


def _kinds(found: list[Finding]) -> list[str]:
    return sorted({f.kind for f in found})


class JudgeScreen:
    """One judge's screen: applies the policies and counts what it found (see the module doc)."""

    def __init__(
        self, addressed: str = "floor", addressed_context: str = "strip", owner: str = "judge"
    ) -> None:
        check_policies(owner, addressed, addressed_context)
        self.policy = addressed
        self.context_policy = addressed_context
        self.counts: Counter[str] = Counter()
        self._reported: Counter[str] = Counter()

    # ------------------------------------------------------------------ replies
    def reply(self, text: str, count: bool = True) -> Screened:
        """A reply under :attr:`policy` (counted unless ``count`` is False)."""
        self.counts["replies"] += count
        found = findings(text)
        if not found:
            return Screened(text)
        self.counts["addressed"] += count
        shown = strip_addressing(text) if self.policy == "strip" else text
        return Screened(shown, self.policy, _kinds(found))

    # ------------------------------------------------------------------ context
    def context_text(self, text: str, count: bool = True) -> tuple[str, bool]:
        """A context text under :attr:`context_policy`: (the text to show, whether it addressed the judge);
        counted when it did (unless ``count`` is False)."""
        if not isinstance(text, str) or not findings(text):
            return text, False
        self.counts["context"] += count
        return (strip_addressing(text) if self.context_policy == "strip" else text), True

    def messages(self, messages: Conversation, count: bool = True) -> tuple[Conversation, bool]:
        """A dialogue with each turn's text screened as context."""
        out, hit = [], False
        for m in messages:
            text, found = self.context_text(m.get("content", ""), count)
            hit = hit or found
            out.append({**m, "content": text} if found else m)
        return out, hit  # type: ignore[return-value]

    def mapping(self, values: Mapping[str, Any], count: bool = True) -> tuple[dict[str, Any], bool]:
        """A profile (or meta) with each text value screened as context."""
        out, hit = {}, False
        for key, value in values.items():
            text, found = self.context_text(value, count) if isinstance(value, str) else (value, False)
            hit = hit or found
            out[key] = text
        return out, hit

    def scenario(self, scenario: Scenario, count: bool = True) -> tuple[Scenario, bool]:
        """``scenario`` with its turns, profile, reference and meta texts screened as context: (the scenario
        to show, whether any text addressed the judge). Under ``invalid`` the caller marks the replies
        judged in it invalid (:meth:`context_invalid`)."""
        messages, m_hit = self.messages(scenario.messages, count)
        profile, p_hit = self.mapping(scenario.profile, count)
        meta, x_hit = self.mapping(scenario.meta, count)
        reference, r_hit = (
            self.context_text(scenario.reference, count)
            if scenario.reference
            else (scenario.reference, False)
        )
        hit = m_hit or p_hit or x_hit or r_hit
        if not hit:
            return scenario, False
        return replace(scenario, messages=messages, profile=profile, meta=meta, reference=reference), True

    def context_invalid(self, hit: bool) -> bool:
        """Whether a context that addressed the judge (``hit``) makes its replies invalid."""
        return hit and self.context_policy == "invalid"

    # ------------------------------------------------------------------ metrics
    def step_metrics(self) -> dict[str, float]:
        """Counts since the last call: ``judge/addressed``, ``.../n`` (replies screened) and
        ``.../context``; empty when nothing was screened."""
        new = self.counts - self._reported
        self._reported = Counter(self.counts)
        if not new:
            return {}
        return {
            METRIC: float(new["addressed"]),
            METRIC + "/n": float(new["replies"]),
            METRIC + "/context": float(new["context"]),
        }


def merge_counts(parts: list[Mapping[str, float]]) -> dict[str, float]:
    """The ``judge/addressed*`` counts of several judges' step metrics, summed."""
    out: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            if key == METRIC or key.startswith(METRIC + "/"):
                out[key] = out.get(key, 0.0) + float(value)
    return out

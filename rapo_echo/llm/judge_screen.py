"""What a judge does with text that addresses it (:mod:`.addressing`): the ``addressed`` policies
(docs/judges.md has the policies, their defaults, why ``lower`` and the metrics).

Every judge path (the ``judge`` reward, ``humanlike``, ``empathy``, RAPO's group judge, the held-out judge)
screens the texts it is about to show its model through one :class:`JudgeScreen`: a judged reply under
``addressed`` (:data:`POLICIES`), a context text (dialogue turns, profile, persona, reaction) under
``addressed_context`` (:data:`CONTEXT_POLICIES`). Under ``lower`` an item is judged as written and with its
suspect spans set aside, in the same batch, and keeps the lower outcome (:func:`lower_verdict` for a
comparison). :meth:`JudgeScreen.step_metrics` gives the ``judge/addressed*`` counts.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rapo_echo.llm.addressing import Finding, findings, set_aside
from rapo_echo.types import Conversation, Scenario

POLICIES = ("lower", "floor", "invalid", "strip", "flag")
CONTEXT_POLICIES = ("lower", "strip", "invalid", "flag")
DEFAULT_POLICY = "lower"
DEFAULT_CONTEXT_POLICY = "lower"
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
    found) or the policy applied; ``kinds`` what was found; ``aside`` the reply with its suspect spans set
    aside, judged beside it under ``lower`` (None otherwise)."""

    text: str
    action: str | None = None
    kinds: list[str] = field(default_factory=list)
    aside: str | None = None

    @property
    def floored(self) -> bool:
        """Whether the reply gets the judge's worst outcome without the model: under ``floor``, or under
        ``lower`` when nothing is left once its suspect spans are set aside."""
        return self.action == "floor" or (self.aside is not None and not self.aside.strip())

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


@dataclass
class Views:
    """What a judge shows for one item under :class:`JudgeScreen`: the ``scenario`` and whether its context
    addressed the judge (``hit``), and under ``lower`` the ``aside`` scenario (its suspect spans set aside;
    None when there is nothing to set aside or another policy)."""

    scenario: Scenario
    hit: bool
    aside: Scenario | None = None


def _kinds(found: list[Finding]) -> list[str]:
    return sorted({f.kind for f in found})


def lower_of(full: float | None, aside: float | None) -> float | None:
    """The lower of an item's outcome as written and set aside. The set-aside reading alone when the one as
    written is invalid (its answer read out of the suspect text it quoted, say): it holds no suspect text,
    so nothing in a suspect span raises it. None (invalid) when the set-aside reading is."""
    if aside is None:
        return None
    return aside if full is None else min(full, aside)


def side_outcome(verdict: Any, side: str, labels: Sequence[str]) -> float:
    """A comparison's outcome for ``side`` (A or B): P(side) + P(tie) / 2, from the verdict's
    probabilities, or from its label (1, 0.5, 0) without them."""
    probs = verdict.probs or {label: float(label == verdict.label) for label in labels}
    return probs.get(side, 0.0) + 0.5 * probs.get("tie", 0.0)


def lower_verdict(full: Any, aside: Any, suspect: tuple[bool, bool], labels: Sequence[str]) -> Any:
    """One comparison's verdict from its verdicts as written (``full``) and set aside (``aside``): each side
    (A, B) whose own text or context was ``suspect`` gets the lower of its two outcomes (P(win) + P(tie)/2,
    from the probabilities or the label), the other side its outcome in the set-aside view. The result's
    probabilities are those outcomes (A, B; tie 0, the rest of the mass lost) and its label the better side
    (``tie`` when equal and ties are allowed). The set-aside verdict alone when the one as written is
    invalid; invalid when the set-aside one is."""
    if not aside.valid:
        return aside
    out = {}
    for side, lowered in zip(("A", "B"), suspect):
        mine = side_outcome(aside, side, labels)
        out[side] = min(side_outcome(full, side, labels), mine) if lowered and full.valid else mine
    label = "A" if out["A"] > out["B"] else "B" if out["B"] > out["A"] else "tie"
    if label not in labels:
        label = aside.label
    probs = {**dict.fromkeys(labels, 0.0), **out}
    return replace(aside, label=label, probs=probs, raw=f"{full.raw}\n--- set aside ---\n{aside.raw}")


class JudgeScreen:
    """One judge's screen: applies the policies and counts what it found (see the module doc)."""

    def __init__(
        self,
        addressed: str = DEFAULT_POLICY,
        addressed_context: str = DEFAULT_CONTEXT_POLICY,
        owner: str = "judge",
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
        if self.policy == "lower":
            return Screened(text, "lower", _kinds(found), set_aside(text))
        shown = set_aside(text) if self.policy == "strip" else text
        return Screened(shown, self.policy, _kinds(found))

    def lowered(self, full: float | None, aside: float | None) -> float | None:
        """:func:`lower_of`, counting the items whose set-aside outcome was the lower one."""
        if full is not None and aside is not None and aside < full:
            self.counts["lowered"] += 1
        return lower_of(full, aside)

    # ------------------------------------------------------------------ context
    def context_text(self, text: str, count: bool = True) -> tuple[str, bool]:
        """A context text under :attr:`context_policy`: (the text to show, whether it addressed the judge);
        counted when it did (unless ``count`` is False). Under ``lower`` and ``flag`` it is shown as written
        (:meth:`aside_text` gives its set-aside copy)."""
        if not isinstance(text, str) or not findings(text):
            return text, False
        self.counts["context"] += count
        return (set_aside(text) if self.context_policy == "strip" else text), True

    @staticmethod
    def aside_text(text: Any) -> Any:
        """A context text with its suspect spans set aside (anything else as it is)."""
        return set_aside(text) if isinstance(text, str) and findings(text) else text

    def messages(self, messages: Conversation, count: bool = True) -> tuple[Conversation, bool]:
        """A dialogue with each turn's text screened as context."""
        out, hit = [], False
        for m in messages:
            text, found = self.context_text(m.get("content", ""), count)
            hit = hit or found
            out.append({**m, "content": text} if found else m)
        return out, hit

    def aside_messages(self, messages: Conversation) -> Conversation:
        """A dialogue with each turn's suspect spans set aside (a turn left empty is dropped)."""
        out = []
        for m in messages:
            text = self.aside_text(m.get("content", ""))
            if text != m.get("content", "") and not str(text).strip():
                continue
            out.append({**m, "content": text})
        return out  # type: ignore[return-value]  # messages keep their TypedDict keys

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

    def aside_scenario(self, scenario: Scenario) -> Scenario:
        """``scenario`` with the suspect spans of its turns, profile, reference and meta set aside (a
        profile or meta value left empty is dropped)."""

        def values(mapping: Mapping[str, Any]) -> dict[str, Any]:
            out = {k: self.aside_text(v) for k, v in mapping.items()}
            return {
                k: v for k, v in out.items() if not (isinstance(v, str) and v != mapping[k] and not v.strip())
            }

        return replace(
            scenario,
            messages=self.aside_messages(scenario.messages),
            profile=values(scenario.profile),
            meta=values(scenario.meta),
            reference=self.aside_text(scenario.reference),
        )

    def views(self, scenario: Scenario, count: bool = True) -> Views:
        """The scenario to show and, under a ``lower`` context policy, its set-aside copy when anything in
        it addressed the judge."""
        shown, hit = self.scenario(scenario, count)
        aside = self.aside_scenario(scenario) if hit and self.context_policy == "lower" else None
        return Views(shown, hit, aside)

    def context_invalid(self, hit: bool) -> bool:
        """Whether a context that addressed the judge (``hit``) makes its replies invalid."""
        return hit and self.context_policy == "invalid"

    # ------------------------------------------------------------------ metrics
    def step_metrics(self) -> dict[str, float]:
        """Counts since the last call: ``judge/addressed``, ``.../n`` (replies screened), ``.../context``
        and ``.../lowered``; empty when nothing was screened."""
        new = self.counts - self._reported
        self._reported = Counter(self.counts)
        if not new:
            return {}
        return {
            METRIC: float(new["addressed"]),
            METRIC + "/n": float(new["replies"]),
            METRIC + "/context": float(new["context"]),
            METRIC + "/lowered": float(new["lowered"]),
        }


def merge_counts(parts: list[Mapping[str, float]]) -> dict[str, float]:
    """The ``judge/addressed*`` counts of several judges' step metrics, summed."""
    out: dict[str, float] = {}
    for part in parts:
        for key, value in part.items():
            if key == METRIC or key.startswith(METRIC + "/"):
                out[key] = out.get(key, 0.0) + float(value)
    return out

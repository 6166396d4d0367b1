"""A judge without a model that ranks a group by the person's reactions and critiques from them
(``rapo.judge.kind: reactions``; the interface is :class:`~rapo_echo.judges.group.GroupJudge`'s).

Each candidate ranks by its reaction's emotion change (larger is better; changes closer than ``tie_eps *
scale`` tie; one without a valid reaction ranks below every one with a reaction; a group where none has
one is invalid). Its critique quotes what the reaction revealed and contrasts it with the best-ranked
reply's. With a deterministic user (``simulators/hidden_preference.py``) the ranking follows the hidden
rule exactly and the critique carries only what a person would reveal.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rapo_echo.judges.group import (
    CRITIQUE_PREFIX,
    Candidate,
    CritiqueJob,
    GroupJudgement,
    GroupRanker,
    Groups,
)
from rapo_echo.llm.ranks import average_ranks
from rapo_echo.types import Scenario


def _feeling(delta: float) -> str:
    return "better" if delta > 0 else "worse" if delta < 0 else "no different"


def _said(candidate: Candidate, said: str = "they said", thought: str = "thought") -> str:
    r = candidate.reaction
    assert r is not None
    text = f'{said} "{r.message}"'
    return text + (f' and {thought} "{r.thought}"' if r.thought else "")


class ReactionJudge(GroupRanker):
    """Ranks by the reactions' emotion change; critiques quote the reactions (see the module doc)."""

    def __init__(self, *, tie_eps: float = 0.02) -> None:
        if tie_eps < 0:
            raise ValueError(f"ReactionJudge: tie_eps must be >= 0, got {tie_eps}")
        self.tie_eps = tie_eps
        self.stats: Counter[str] = Counter()

    @staticmethod
    def _delta(candidate: Candidate) -> float | None:
        r = candidate.reaction
        return r.emotion_delta if r is not None and r.valid else None

    def _judge(self, scenarios: Sequence[Scenario], groups: Groups) -> list[GroupJudgement]:
        out = []
        for group in groups:
            deltas = [self._delta(c) for c in group]
            known = [d for d in deltas if d is not None]
            if not known:
                out.append(GroupJudgement(None, [None] * len(group), None, False, ["no valid reaction"]))
                continue
            scale = max((c.reaction.scale for c in group if c.reaction is not None), default=1.0)
            floor = min(known) - 2 * scale  # no reaction: below every reaction, tied together
            scores = [floor if d is None else d for d in deltas]
            ranks = average_ranks(scores, tie_eps=self.tie_eps * scale)
            out.append(GroupJudgement(ranks, [None] * len(group), scores, True, [], attempts=0))
        return out

    def _critiques(
        self, scenarios: Sequence[Scenario], groups: Groups, jobs: Sequence[CritiqueJob]
    ) -> list[str | None]:
        return [self.critique_one(groups[k], ranks, i) for k, i, ranks in jobs]

    def critique_one(self, group: Sequence[Candidate], ranks: Sequence[float], index: int) -> str | None:
        """The critique of candidate ``index``; None when it had no valid reaction."""
        own = group[index]
        delta = self._delta(own)
        if delta is None or own.reaction is None:
            return None
        scale = f"{own.reaction.scale:g}"
        text = (
            f"{CRITIQUE_PREFIX} they felt {_feeling(delta)} ({delta:+.1f} on a -{scale}..+{scale} scale): "
            f"{_said(own)}."
        )
        best = min(range(len(group)), key=lambda i: ranks[i])
        if ranks[index] > ranks[best] and self._delta(group[best]) is not None:
            reaction = _said(group[best], "them say", "think")
            text += (
                f' The best-ranked reply, "{group[best].reply}", made {reaction}. '
                "Do what that reply did and avoid what upset them."
            )
        else:
            text += " Keep doing what made them open up."
        return text

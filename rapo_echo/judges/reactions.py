"""A judge without a model that ranks a group by the person's reactions and critiques from them.

``rapo.judge.kind: reactions``. It reads only what the simulated user showed: each candidate ranks by
the emotion change of its reaction (larger is better; changes closer than ``tie_eps * scale`` tie;
a candidate without a valid reaction ranks below every one with a reaction, tied with the others
like it; a group where none has one is invalid). Its critique names what the reaction reveals, in
the person's own words, and contrasts it with the best-ranked reply and its reaction (as the LLM
judge's critique prompt shows the best reply for contrast):

    The person's reaction shows they felt worse (-10.0 on a -10..+10 scale): they said "I didn't ask
    what to do. I just wanted someone to listen." and thought "They jumped straight to telling me what
    to do.". The best-ranked reply, "...", made them say "..." and think "...". Do what that reply did
    and avoid what upset them.

With a deterministic simulated user (``simulators/hidden_preference.py``) this is a RAPO setting whose
ground truth is known: the ranking follows the hidden rule exactly, and the critique carries only
what a person would reveal. The interface is :class:`~rapo_echo.judges.group.GroupJudge`'s.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from rapo_echo.judges.group import CRITIQUE_PREFIX, Candidate, GroupJudgement
from rapo_echo.llm.ranks import average_ranks
from rapo_echo.types import Scenario


def _feeling(delta: float) -> str:
    return "better" if delta > 0 else "worse" if delta < 0 else "no different"


def _said(candidate: Candidate, said: str = "they said", thought: str = "thought") -> str:
    r = candidate.reaction
    assert r is not None
    text = f'{said} "{r.message}"'
    return text + (f' and {thought} "{r.thought}"' if r.thought else "")


class ReactionJudge:
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

    def rank(
        self,
        scenarios: Sequence[Scenario],
        groups: Sequence[Sequence[Candidate]],
        *,
        with_critiques: bool = True,
    ) -> list[GroupJudgement]:
        """Judge each group (``groups[k]`` answers ``scenarios[k]``); results in the caller's order."""
        if len(scenarios) != len(groups):
            raise ValueError(f"ReactionJudge.rank: {len(scenarios)} scenarios but {len(groups)} groups")
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
        self.stats["groups"] += len(groups)
        self.stats["invalid_groups"] += sum(not j.valid for j in out)
        if with_critiques:
            self.critique(scenarios, groups, out)
        return out

    def critique(
        self,
        scenarios: Sequence[Scenario],
        groups: Sequence[Sequence[Candidate]],
        judged: Sequence[GroupJudgement],
        which: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        """Fill ``critiques`` in place for the ``(group, candidate)`` pairs in ``which`` (default: all)."""
        if which is None:
            which = [(k, i) for k in range(len(groups)) for i in range(len(groups[k]))]
        for k, i in which:
            ranks = judged[k].ranks
            if ranks is None:
                continue
            judged[k].critiques[i] = self.critique_one(groups[k], ranks, i)

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

"""Built-in rule rewards: ``length``, ``format``, ``question`` and ``think_format``."""

from __future__ import annotations

import re
from collections.abc import Sequence

from rapo_echo.rewards import RewardOutput
from rapo_echo.text import is_blank, repeated_ngram_fraction
from rapo_echo.types import Sample

# Markers of a reply that speaks for the other person or leaks the chat format.
ROLE_LEAK = re.compile(
    r"(<\|im_(start|end)\|>|^\s*(user|seeker|human|client|patient|me|you)\s*:|\n\s*(user|seeker|human)\s*[:\n])",
    re.IGNORECASE | re.MULTILINE,
)


class LengthReward:
    """Peaks at 1 for ``target`` words and falls linearly: ``1 - |words - target| / target``, floor -1."""

    name = "length"

    def __init__(self, target: int = 40) -> None:
        if target < 1:
            raise ValueError("target must be >= 1 word")
        self.target = target

    def __call__(self, samples: Sequence[Sample]) -> list[float]:
        return [max(-1.0, 1.0 - abs(len(s.text.split()) - self.target) / self.target) for s in samples]


class FormatReward:
    """1 for a clean reply, minus penalties: an empty reply scores 0; a reply that leaks the chat
    format or speaks for the user loses ``leak_penalty``; a reply whose word 3-grams repeat loses
    their repeated fraction times ``repeat_weight``; a reply cut off by the length limit loses
    ``truncation_penalty``. Clamped to [0, 1]. The reasons are returned as info and critique."""

    name = "format"

    def __init__(
        self, leak_penalty: float = 0.5, repeat_weight: float = 1.0, truncation_penalty: float = 0.0
    ) -> None:
        self.leak_penalty = leak_penalty
        self.repeat_weight = repeat_weight
        self.truncation_penalty = truncation_penalty

    def __call__(self, samples: Sequence[Sample]) -> list[RewardOutput]:
        return [self.score_one(s.text, s.finish_reason) for s in samples]

    def score_one(self, text: str, finish_reason: str = "stop") -> RewardOutput:
        """Score one reply text."""
        if is_blank(text):
            return RewardOutput(0.0, "The reply is empty.", {"empty": True})
        score, reasons, info = 1.0, [], {}
        if ROLE_LEAK.search(text):
            score -= self.leak_penalty
            reasons.append("The reply writes the other person's lines or leaks chat markup.")
            info["role_leak"] = True
        rep = repeated_ngram_fraction(text.lower().split())
        if rep > 0:
            score -= self.repeat_weight * rep
            info["repeat_fraction"] = rep
            if rep >= 0.2:
                reasons.append("The reply repeats itself.")
        if finish_reason == "length" and self.truncation_penalty:
            score -= self.truncation_penalty
            reasons.append("The reply was cut off.")
            info["truncated"] = True
        return RewardOutput(min(1.0, max(0.0, score)), " ".join(reasons) or None, info)


class QuestionReward:
    """1 when the reply asks the person something (contains '?'), else 0: a simple verifiable reward."""

    name = "question"

    def __call__(self, samples: Sequence[Sample]) -> list[float]:
        return [1.0 if "?" in s.text else 0.0 for s in samples]


class ThinkFormatReward:
    """Thinking mode's format reward: 1 when the reply is ``<think>thought</think> reply`` (one pair of
    tags, opening the reply, with a non-empty thought and reply), else 0 (missing or malformed tags).
    RLVER's paper zeroes the reward of such replies; with ``--algo rlver`` it is scored per policy turn
    and the dialogue gets the weighted mean over its turns."""

    name = "think_format"

    def __call__(self, samples: Sequence[Sample]) -> list[RewardOutput]:
        from rapo_echo.prompting import split_thinking

        out = []
        for s in samples:
            well = split_thinking(s.text).well_formed
            out.append(
                RewardOutput(
                    1.0 if well else 0.0, None if well else "The thinking tags are missing or malformed."
                )
            )
        return out

"""Small text measures shared by rewards and simulators (pure functions on words)."""

from __future__ import annotations

from collections.abc import Sequence


def repeated_ngram_fraction(words: Sequence[str], n: int = 3) -> float:
    """Fraction of the word n-grams that repeat an earlier n-gram of the same text."""
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)

"""Small text measures shared across the package (pure functions on text and words): blankness, the
characters that show nothing, word n-gram repetition."""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

# characters that show nothing but are neither whitespace nor format characters: the Hangul fillers,
# the braille blank, the combining grapheme joiner and the Khmer inherent vowels
_SHOWS_NOTHING = frozenset("\u115f\u1160\u3164\uffa0\u2800\u034f\u17b4\u17b5")


def invisible(ch: str) -> bool:
    """Whether ``ch`` shows nothing and is not whitespace: a format or control character, a blank letter."""
    return ch in _SHOWS_NOTHING or (unicodedata.category(ch) in ("Cf", "Cc") and not ch.isspace())


def is_blank(text: object) -> bool:
    """Whether ``text`` shows nothing: not a string, or only Unicode whitespace and :func:`invisible`
    characters. The one blankness check wherever a text must say something."""
    return not isinstance(text, str) or all(ch.isspace() or invisible(ch) for ch in text)


def visible_strip(text: str) -> str:
    """``text`` without the whitespace and :func:`invisible` characters at its ends."""
    start, end = 0, len(text)
    while start < end and (text[start].isspace() or invisible(text[start])):
        start += 1
    while end > start and (text[end - 1].isspace() or invisible(text[end - 1])):
        end -= 1
    return text[start:end]


def repeated_ngram_fraction(words: Sequence[str], n: int = 3) -> float:
    """Fraction of the word n-grams that repeat an earlier n-gram of the same text."""
    grams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
    if not grams:
        return 0.0
    return 1.0 - len(set(grams)) / len(grams)

"""Variety of replies: Distinct-n, and a paired comparison of two policies' Distinct-n over contexts.

Distinct-n is the number of distinct n-grams over the number of all n-grams, counted over all replies
together (Li et al., 2016): a policy that says the same few things everywhere, or loops within a reply,
scores low. Tokens here are lower-cased runs of word characters and single punctuation marks
(:func:`words`), so the library needs no tokenizer package; the benchmarks count with sacrebleu's 13a
tokenizer instead (``benchmarks/text_metrics.py``), which splits English text nearly the same way.

Distinct-n is a statistic of the whole corpus, not a mean over contexts, so the paired comparison takes
its standard error by the jackknife over contexts (:func:`paired_distinct_gain`): the difference is
recomputed with each context's replies left out of both corpora, and ``se = sqrt((m - 1) / m * sum((d_i
- mean(d))^2))`` over the ``m`` paired contexts.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence

TOKEN = re.compile(r"\w+(?:'\w+)*|[^\w\s]")


def words(text: str) -> list[str]:
    """Lower-cased tokens: runs of word characters and single punctuation marks."""
    return TOKEN.findall(text.lower())


def ngrams(tokens: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """The ``n``-grams of ``tokens`` in order (none when fewer than ``n`` tokens)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]


def distinct_n(texts: Sequence[str], n: int, tokenize: Callable[[str], list[str]] = words) -> float:
    """Distinct-n as a fraction: distinct ``n``-grams / all ``n``-grams over all ``texts`` (0.0 when none)."""
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return _Corpus([texts], n, tokenize).distinct()


class _Corpus:
    """Per-context n-gram sets and counts, for Distinct-n of the whole and of the whole less one context."""

    def __init__(
        self, contexts: Sequence[Sequence[str]], n: int, tokenize: Callable[[str], list[str]] = words
    ) -> None:
        grams = [[g for text in replies for g in ngrams(tokenize(text), n)] for replies in contexts]
        self.sets = [set(g) for g in grams]
        self.totals = [len(g) for g in grams]
        self.holders = Counter(g for s in self.sets for g in s)  # how many contexts hold each n-gram
        self.total = sum(self.totals)

    def distinct(self) -> float:
        return len(self.holders) / self.total if self.total else 0.0

    def distinct_without(self, i: int) -> float:
        total = self.total - self.totals[i]
        only_here = sum(1 for g in self.sets[i] if self.holders[g] == 1)
        return (len(self.holders) - only_here) / total if total else 0.0


def paired_distinct_gain(
    new: Sequence[Sequence[str]], best: Sequence[Sequence[str]], n: int = 2
) -> tuple[float, float, int]:
    """Distinct-``n`` of ``new``'s replies minus that of ``best``'s (in percent, 0..100), over the
    contexts where both have replies (``new[i]``, ``best[i]``: one context's replies), its jackknife
    standard error and how many contexts were paired: ``(nan, nan, 0)`` when none, standard error
    ``nan`` for one."""
    if len(new) != len(best):
        raise ValueError(f"paired_distinct_gain: replies to {len(new)} contexts against {len(best)}")
    both = [i for i, (a, b) in enumerate(zip(new, best)) if a and b]
    m = len(both)
    if not m:
        return float("nan"), float("nan"), 0
    a = _Corpus([new[i] for i in both], n)
    b = _Corpus([best[i] for i in both], n)
    gain = 100.0 * (a.distinct() - b.distinct())
    if m < 2:
        return gain, float("nan"), 1
    loo = [100.0 * (a.distinct_without(i) - b.distinct_without(i)) for i in range(m)]
    mean = sum(loo) / m
    se = math.sqrt((m - 1) / m * sum((d - mean) ** 2 for d in loo))
    return gain, se, m

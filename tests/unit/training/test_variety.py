"""Distinct-n and the paired jackknife comparison of two policies' replies (values worked by hand)."""

from __future__ import annotations

import math

import pytest

from rapo_echo.variety import distinct_n, ngrams, paired_distinct_gain, words


def test_words_keep_apostrophes_inside_words_and_split_punctuation() -> None:
    assert words("I'm FINE, thanks! 'ok'") == ["i'm", "fine", ",", "thanks", "!", "'", "ok", "'"]
    assert words("") == []


def test_ngrams_and_distinct_n_by_hand() -> None:
    assert ngrams(["a", "b", "c"], 2) == [("a", "b"), ("b", "c")]
    assert ngrams(["a"], 2) == []
    # "a b a b": bigrams ab, ba, ab; "c d": cd -> 3 distinct of 4; unigrams a, b, c, d of 6
    assert distinct_n(["a b a b", "c d"], 2) == pytest.approx(0.75)
    assert distinct_n(["a b a b", "c d"], 1) == pytest.approx(4 / 6)
    assert distinct_n(["x"], 2) == 0.0 and distinct_n([], 1) == 0.0
    with pytest.raises(ValueError, match="n must be >= 1"):
        distinct_n(["a"], 0)


def test_paired_distinct_gain_by_hand() -> None:
    # new: context 0 {ab, ba} of 3 bigrams, context 1 {cd} of 1 -> 3/4; best: {ab} twice -> 1/2
    # gain 100 * (0.75 - 0.5) = 25. Leaving context 0 out: new 1/1, best 1/1 -> 0; leaving 1 out: new
    # 2/3, best 1/1 -> -33.33. Mean -16.67; jackknife se = sqrt(1/2 * 2 * 16.67^2) = 16.67
    gain, se, n = paired_distinct_gain([["a b a b"], ["c d"]], [["a b"], ["a b"]])
    assert (gain, se, n) == (pytest.approx(25.0), pytest.approx(50 / 3), 2)
    # a context's replies count together; a context without replies on either side is not paired
    gain, se, n = paired_distinct_gain([["a b", "a b"], ["c d"], []], [["a b"], ["e f"], ["g h"]])
    assert n == 2 and gain == pytest.approx(100 * (2 / 3 - 1))
    # leaving 0 out: 1/1 - 1/1 = 0; leaving 1 out: 1/2 - 1/1 = -50 -> mean -25, se sqrt(1/2 * 2 * 625)
    assert se == pytest.approx(25.0)


def test_paired_distinct_gain_edges() -> None:
    gain, se, n = paired_distinct_gain([["a b c"]], [["a b a b"]])
    assert n == 1 and gain == pytest.approx(100 * (1 - 2 / 3)) and math.isnan(se)
    gain, se, n = paired_distinct_gain([[]], [["a b"]])
    assert n == 0 and math.isnan(gain) and math.isnan(se)
    with pytest.raises(ValueError, match="replies to 1 contexts against 2"):
        paired_distinct_gain([["a"]], [["a"], ["b"]])

"""Reference-based text metrics against values worked out by hand."""

from __future__ import annotations

import math
import sys

import pytest

from rapo_echo.benchmarks.text_metrics import (
    corpus_bleu,
    distinct_n,
    reference_metrics,
    rouge_l,
    tokenize,
)
from rapo_echo.errors import RapoEchoError


def test_tokenize_is_lowercased_13a():
    # 13a splits punctuation off words; everything is lower-cased.
    assert tokenize("Hi, you.") == ["hi", ",", "you", "."]


def test_distinct_n_by_hand():
    texts = ["a b a b", "a c"]
    # unigrams: a b a b a c -> 6 in all, distinct {a, b, c} = 3 -> 3/6
    assert distinct_n(texts, 1) == pytest.approx(0.5)
    # bigrams: (a b) (b a) (a b) from the first, (a c) from the second -> 4 in all, 3 distinct -> 3/4
    assert distinct_n(texts, 2) == pytest.approx(0.75)
    # trigrams: (a b a) (b a b); "a c" has none -> 2 in all, 2 distinct -> 1
    assert distinct_n(texts, 3) == pytest.approx(1.0)
    # n-grams never cross reply boundaries: "x" + "x" has 0 bigrams -> 0 by convention
    assert distinct_n(["x", "x"], 2) == 0.0
    # punctuation counts as tokens: "hi , you ." + "hi" -> 5 unigrams, 4 distinct
    assert distinct_n(["Hi, you.", "HI"], 1) == pytest.approx(4 / 5)
    assert distinct_n([], 1) == 0.0
    with pytest.raises(ValueError, match="n must be >= 1"):
        distinct_n(["a"], 0)


def test_bleu_brevity_penalty_by_hand():
    # hyp 3 tokens, ref 6: every n-gram precision is 1, BP = exp(1 - 6/3) = exp(-1)
    hyp, ref = ["the cat sat"], ["the cat sat on the mat"]
    assert corpus_bleu(hyp, ref, 1) == pytest.approx(100 * math.exp(-1), abs=1e-6)
    assert corpus_bleu(hyp, ref, 2) == pytest.approx(100 * math.exp(-1), abs=1e-6)


def test_bleu_clipping_and_bigrams_by_hand():
    # "the" x4 against "the cat": clipped unigram matches 1 of 4, hyp longer so BP = 1 -> 25
    assert corpus_bleu(["the the the the"], ["the cat"], 1) == pytest.approx(25.0, abs=1e-6)
    # "a b c d" vs "a b x d": p1 = 3/4, p2 = 1/3 (only "a b"), BP = 1 -> sqrt(3/4 * 1/3) = 1/2 -> 50
    assert corpus_bleu(["a b c d"], ["a b x d"], 2) == pytest.approx(50.0, abs=1e-6)
    # lower-casing: identical up to case -> 100
    assert corpus_bleu(["The Cat sat"], ["the cat SAT"], 3) == pytest.approx(100.0)


def test_bleu_is_corpus_level_not_a_mean_of_sentences():
    # pooled unigram precision (3 + 1) / (3 + 2) = 0.8 and pooled length 5 = 5 -> 80;
    # the mean of sentence scores would be (100 + 50) / 2 = 75
    assert corpus_bleu(["a b c", "d e"], ["a b c", "d f"], 1) == pytest.approx(80.0, abs=1e-6)


def test_rouge_l_by_hand():
    # LCS("the cat sat on the mat", "the cat is on the mat") = "the cat on the mat" = 5
    # P = 5/6, R = 5/6 -> F1 = 5/6
    # LCS("a b c d", "a c") = 2: P = 2/4, R = 2/2 -> F1 = 2 * 0.5 * 1 / 1.5 = 2/3
    got = rouge_l(["the cat sat on the mat", "a b c d"], ["the cat is on the mat", "a c"])
    assert got == pytest.approx([100 * 5 / 6, 100 * 2 / 3])


def test_reference_metrics_collects_everything():
    hyps, refs = ["a b c d", "a b"], ["a b x d", "a b"]
    out = reference_metrics(hyps, refs)
    assert set(out) == {
        "bleu_1",
        "bleu_2",
        "bleu_3",
        "bleu_4",
        "rouge_l",
        "distinct_1",
        "distinct_2",
        "distinct_3",
    }
    # BLEU-1 pooled: matches 3 + 2 of 4 + 2 tokens -> 5/6, equal lengths -> BP 1
    assert out["bleu_1"] == pytest.approx(100 * 5 / 6, abs=1e-6)
    # ROUGE-L: pair 1 LCS 3 of 4/4 -> 0.75; pair 2 identical -> 1; mean 0.875
    assert out["rouge_l"] == pytest.approx(87.5)
    # Distinct-1: tokens a b c d a b -> 4 distinct of 6
    assert out["distinct_1"] == pytest.approx(100 * 4 / 6)
    with pytest.raises(ValueError, match="2 replies but 1 references"):
        reference_metrics(hyps, refs[:1])
    with pytest.raises(ValueError, match="no replies"):
        reference_metrics([], [])


def test_missing_metric_package_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "sacrebleu", None)
    monkeypatch.setitem(sys.modules, "sacrebleu.metrics", None)
    with pytest.raises(RapoEchoError, match=r"pip install 'rapo-echo\[bench\]'"):
        corpus_bleu(["a"], ["a"], 1)
    monkeypatch.setitem(sys.modules, "rouge_score", None)
    with pytest.raises(RapoEchoError, match="rouge-score"):
        rouge_l(["a"], ["a"])

"""Reference-based text metrics: corpus BLEU-1..4 (sacrebleu), ROUGE-L F (rouge-score), Distinct-1/2/3.

Tokenisation (one choice for all metrics, documented so numbers are comparable):

* BLEU: sacrebleu's standard ``13a`` tokenizer (the mteval-v13a rules) on lower-cased text; BLEU-n is
  the cumulative corpus BLEU with ``max_ngram_order=n`` (uniform weights over 1..n-grams, brevity
  penalty, sacrebleu's default ``exp`` smoothing), one reference per reply.
* ROUGE-L: rouge-score's default tokenizer (lower-cases, keeps ``[a-z0-9]`` runs), no stemming; the
  F-measure with beta = 1 per pair, averaged over pairs. (thu-coai's ESConv script weighs recall with
  beta = 1.2; ours is the standard F1.)
* Distinct-n: the 13a tokenizer on lower-cased text, like BLEU; distinct n-grams / all n-grams counted
  over all replies together.

All are returned on a 0..100 scale (percent).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from rapo_echo import variety
from rapo_echo.errors import RapoEchoError

BENCH_INSTALL = "pip install 'rapo-echo[bench]'"


def _need(module: str) -> NoReturn:
    raise RapoEchoError(f"this metric needs the package {module!r}, which is not installed: {BENCH_INSTALL}")


def tokenize(text: str) -> list[str]:
    """Lower-cased 13a tokens (the tokenisation BLEU and Distinct use)."""
    try:
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a
    except ImportError:
        _need("sacrebleu")
    return Tokenizer13a()(text.lower()).split()


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct-n as a fraction: distinct n-grams / total n-grams over all texts (0.0 when no n-grams),
    counted on 13a tokens (:func:`rapo_echo.variety.distinct_n`)."""
    return variety.distinct_n(texts, n, tokenize)


def corpus_bleu(hypotheses: Sequence[str], references: Sequence[str], max_order: int) -> float:
    """Cumulative corpus BLEU-``max_order`` in percent (sacrebleu, 13a tokens, lower-cased)."""
    try:
        from sacrebleu.metrics import BLEU
    except ImportError:
        _need("sacrebleu")
    bleu = BLEU(max_ngram_order=max_order, lowercase=True, tokenize="13a", effective_order=False)
    return float(bleu.corpus_score(list(hypotheses), [list(references)]).score)


def rouge_l(hypotheses: Sequence[str], references: Sequence[str]) -> list[float]:
    """ROUGE-L F1 in percent for each (hypothesis, reference) pair."""
    try:
        from rouge_score import rouge_scorer
    except ImportError:
        _need("rouge-score")
    scorer = rouge_scorer.RougeScorer(["rougeL"], use_stemmer=False)
    return [100.0 * scorer.score(ref, hyp)["rougeL"].fmeasure for hyp, ref in zip(hypotheses, references)]


def reference_metrics(hypotheses: Sequence[str], references: Sequence[str]) -> dict[str, float]:
    """BLEU-1..4, ROUGE-L and Distinct-1..3 (all percent) of replies against their references."""
    if len(hypotheses) != len(references):
        raise ValueError(f"{len(hypotheses)} replies but {len(references)} references")
    if not hypotheses:
        raise ValueError("no replies to score")
    out = {f"bleu_{n}": corpus_bleu(hypotheses, references, n) for n in range(1, 5)}
    scores = rouge_l(hypotheses, references)
    out["rouge_l"] = sum(scores) / len(scores)
    out.update({f"distinct_{n}": 100.0 * distinct_n(hypotheses, n) for n in range(1, 4)})
    return out

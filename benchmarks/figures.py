"""An evaluation's figures with their uncertainty: for every headline figure its mean over repeats, a
bootstrap interval over cases and the spread across repeats (the keys: docs/reading-results.md, Repeats,
intervals and spread).

A benchmark names its figures (``figures``: summary key -> :class:`Figure`), each an aggregate of one
value per case record; the records of repeat ``k > 0`` carry ``case`` and ``repeat`` (:func:`case_of`,
:func:`repeat_of`). Judges that re-answered a question (``info.judge_recheck``) add
:data:`JUDGE_FIGURES`."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from rapo_echo.benchmarks.stats import LEVEL, N_BOOT, percentile_interval, resample_weights

Record = dict[str, Any]
METHOD = {
    "interval": f"{LEVEL:.0%} percentile bootstrap over cases (the repeats of a case resampled together)",
    "resamples": N_BOOT,
    "seed": 0,
    "spread": "standard deviation, minimum and maximum of the figure across repeats",
}


@dataclass(frozen=True)
class Figure:
    """A summary figure as an aggregate of one value per valid case record: their mean, or their sum
    (``count``). ``value`` is a key of the record's ``metrics`` or a function of the record; ``where``
    (a function of the record) keeps only some records (SOTOPIA's hard subset)."""

    value: str | Callable[[Record], Any]
    count: bool = False
    where: Callable[[Record], bool] | None = None

    def of(self, record: Record) -> float | None:
        """This record's value (None when invalid, left out by ``where``, missing or not finite)."""
        if not record.get("valid") or (self.where is not None and not self.where(record)):
            return None
        raw = self.value(record) if callable(self.value) else record.get("metrics", {}).get(self.value)
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            return None
        return float(raw)


def recheck_value(key: str) -> Callable[[Record], Any]:
    """A record's judge recheck figure ``key`` (``agree`` or ``abs_diff``), None without a recheck."""
    return lambda r: (r.get("info", {}).get("judge_recheck") or {}).get(key)


JUDGE_FIGURES: dict[str, Figure] = {
    "judge/self_agreement": Figure(recheck_value("agree")),
    "judge/abs_diff": Figure(recheck_value("abs_diff")),
    "judge/rechecks": Figure(lambda r: 1.0 if (r.get("info", {}).get("judge_recheck")) else None, count=True),
}


def case_of(record: Record) -> str:
    """The case a record belongs to (its own id for the first repeat)."""
    return str(record.get("case", record["id"]))


def repeat_of(record: Record) -> int:
    """The repeat a record belongs to (0 = the first)."""
    return int(record.get("repeat", 0))


def by_repeat(records: Sequence[Record]) -> dict[int, list[Record]]:
    """The records of each repeat, by repeat index in order."""
    out: dict[int, list[Record]] = {}
    for r in records:
        out.setdefault(repeat_of(r), []).append(r)
    return dict(sorted(out.items()))


def figures_of(benchmark: Any, records: Sequence[Record]) -> dict[str, Figure]:
    """The benchmark's figures, and the judge's when some record has a recheck."""
    figures = dict(getattr(benchmark, "figures", None) or {})
    if figures and any((r.get("info") or {}).get("judge_recheck") for r in records):
        figures.update(JUDGE_FIGURES)
    return figures


class CaseGrid:
    """The records laid out as cases x repeats (``cell[(case, repeat)]``), repeats that hold no record
    left out, cases in the order first met."""

    def __init__(self, records: Sequence[Record]) -> None:
        self.cases = list(dict.fromkeys(case_of(r) for r in records))
        self.repeats = sorted({repeat_of(r) for r in records})
        self.cell = {(case_of(r), repeat_of(r)): r for r in records}

    def values(self, figure: Figure) -> np.ndarray:
        """The figure's value per case (rows) and repeat (columns); NaN where there is none."""
        out = np.full((len(self.cases), len(self.repeats)), np.nan)
        for i, c in enumerate(self.cases):
            for j, k in enumerate(self.repeats):
                record = self.cell.get((c, k))
                v = None if record is None else figure.of(record)
                if v is not None:
                    out[i, j] = v
        return out


def aggregate(weights: np.ndarray, values: np.ndarray, count: bool) -> np.ndarray:
    """Per resample (rows of ``weights``) and repeat (columns of ``values``) the weighted mean of the
    cases' values, or their weighted sum (``count``); NaN where a repeat has no value."""
    present = ~np.isnan(values)
    total = weights @ np.where(present, values, 0.0)
    if count:
        return total
    n = weights @ present.astype(float)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / np.where(n > 0, n, 1.0), np.nan)


def _mean_over_repeats(per_repeat: np.ndarray) -> np.ndarray:
    """Each row's mean over its defined repeats (NaN when none)."""
    defined = ~np.isnan(per_repeat)
    n = defined.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, np.where(defined, per_repeat, 0.0).sum(axis=1) / np.maximum(n, 1), np.nan)


def _number(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def figure_stats(values: np.ndarray, count: bool, weights: np.ndarray | None) -> dict[str, Any] | None:
    """One figure's mean, spread across repeats and interval (``weights``: the bootstrap resamples of
    the cases, or None for no interval); None when no case has a value."""
    has_value = ~np.all(np.isnan(values), axis=1)
    if not has_value.any():
        return None
    per_repeat = aggregate(np.ones((1, values.shape[0])), values, count)[0]
    defined = per_repeat[~np.isnan(per_repeat)]
    out: dict[str, Any] = {
        "mean": _number(float(defined.mean())) if len(defined) else None,
        "repeats": [_number(v) for v in per_repeat],
        "sd": float(np.std(defined, ddof=1)) if len(defined) > 1 else None,
        "min": float(defined.min()) if len(defined) > 1 else None,
        "max": float(defined.max()) if len(defined) > 1 else None,
        "cases": int(has_value.sum()),
        "lo": None,
        "hi": None,
    }
    if weights is not None:
        boots = _mean_over_repeats(aggregate(weights, values, count))
        interval = percentile_interval(list(boots), len(boots))
        if interval is not None:
            out["lo"], out["hi"] = interval
    return out


def run_figures(
    records: Sequence[Record], figures: Mapping[str, Figure], *, n_boot: int = N_BOOT, seed: int = 0
) -> dict[str, dict[str, Any]]:
    """Every figure's statistics over ``records`` (see the module doc); figures no record has are left
    out. The same resamples of the cases serve every figure."""
    if not figures or not records:
        return {}
    grid = CaseGrid(records)
    weights = resample_weights(len(grid.cases), n_boot, seed) if len(grid.cases) >= 2 else None
    out = {}
    for key, figure in figures.items():
        stats = figure_stats(grid.values(figure), figure.count, weights)
        if stats is not None:
            out[key] = stats
    return out


def mean_metrics(per_repeat: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The metrics of several repeats as one: a number is the mean over the repeats that have it (a count
    becomes a mean count per repeat), anything else is the first repeat's."""
    if len(per_repeat) == 1:
        return dict(per_repeat[0])
    out: dict[str, Any] = {}
    for key in dict.fromkeys(k for m in per_repeat for k in m):
        values = [m.get(key) for m in per_repeat]
        numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if numbers and len(numbers) == sum(v is not None for v in values):
            out[key] = sum(numbers) / len(numbers)
        else:
            out[key] = next((v for v in values if v is not None), None)
    return out

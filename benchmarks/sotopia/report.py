"""The SOTOPIA part of ``rapo-echo report``: one bar chart of the seven SOTOPIA-Eval dimensions and the
overall score, a group of bars per evaluated policy."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rapo_echo.benchmarks.plots import bars_figure, png_base64
from rapo_echo.benchmarks.sotopia.evaluator import DIMENSIONS


def dimensions_figure(evals: Sequence[Any], img: Callable[[str, str], str]) -> str | None:
    """The dimension bars of the SOTOPIA evaluations among ``evals`` (``img`` turns a base64 PNG and its
    alt text into HTML); None when there are none with metrics."""
    sotopia = [e for e in evals if e.benchmark == "sotopia" and e.summary["metrics"]]
    if not sotopia:
        return None
    dims = [*DIMENSIONS, "overall"]
    series = {e.label: [e.summary["metrics"].get(d) for d in dims] for e in sotopia}
    figure = bars_figure("SOTOPIA: score per dimension", dims, series)
    return img(png_base64(figure), "SOTOPIA dimensions")

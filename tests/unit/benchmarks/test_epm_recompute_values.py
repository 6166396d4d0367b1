"""EPM ``--recompute`` on malformed or out-of-range per-case files (issue 31 items 8 and 12): a wrong type
in any field read is a DataError naming the file and field (never a traceback); NaN, infinite, boolean,
huge or negative values make the case invalid, counted and named, and the scores come from the valid
cases only."""

from __future__ import annotations

import copy
import json
import math
import re
from pathlib import Path

import pytest

from rapo_echo.benchmarks.epm.recompute import recompute
from rapo_echo.benchmarks.results import read_records
from rapo_echo.errors import DataError
from tests.unit.benchmarks.test_epm_bench import synthetic_results


def base(tmp_path: Path) -> dict:
    synthetic_results(tmp_path / "good")
    return json.loads((tmp_path / "good" / "script_a_result.json").read_text())


def with_case(tmp_path: Path, change, name: str = "script_z") -> Path:
    """The good folder plus one case changed by ``change(data)``."""
    folder = tmp_path / name
    synthetic_results(folder)
    data = copy.deepcopy(base(tmp_path))
    data["script_id"] = name
    change(data)
    (folder / f"{name}_result.json").write_text(json.dumps(data), encoding="utf-8")
    return folder


def traj(d: dict) -> list:
    return d["epj"]["trajectory"]


MALFORMED = {
    "turn_text": (
        lambda d: traj(d)[1].__setitem__("turn", "one"),
        r"trajectory\[1\]\.turn: expected a whole",
    ),
    "delta_E_text": (
        lambda d: traj(d)[1]["epm"].__setitem__("delta_E", "big"),
        r"trajectory\[1\]\.epm\.delta_E: expected a number",
    ),
    "epm_list": (
        lambda d: traj(d)[1].__setitem__("epm", [1, 2]),
        r"trajectory\[1\]\.epm: expected an object",
    ),
    "mdep_text": (
        lambda d: traj(d)[1].__setitem__("mdep_analysis", "high"),
        r"trajectory\[1\]\.mdep_analysis: expected an object",
    ),
    "epj_list": (lambda d: d.__setitem__("epj", [1]), r"epj: expected an object"),
    "victory_text": (
        lambda d: d["epj"].__setitem__("epm_victory_analysis", "won"),
        r"epj\.epm_victory_analysis: expected an object",
    ),
    "short_v_star": (
        lambda d: d["epj"]["epm_params"].__setitem__("v_star_0", [0.6]),
        r"epm_params\.v_star_0: expected three numbers",
    ),
    "alpha_text": (
        lambda d: d["epj"]["epm_params"].__setitem__("alpha", "0.1"),
        r"epm_params\.alpha: expected a number",
    ),
    "history_int": (lambda d: d.__setitem__("history", 7), r"history: expected a list"),
}


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_field_is_a_clear_error(tmp_path: Path, kind: str) -> None:
    change, match = MALFORMED[kind]
    folder = with_case(tmp_path, change)
    with pytest.raises(DataError, match=r"script_z_result\.json: (epj\.)?" + match):
        recompute(folder, tmp_path / "out")


def test_a_file_that_is_not_utf8_is_a_clear_error(tmp_path: Path) -> None:
    synthetic_results(tmp_path / "run")
    (tmp_path / "run" / "script_z_result.json").write_bytes(b'{"total_turns": 3, "x": "\\xff\xff"}')
    with pytest.raises(DataError, match=r"script_z_result\.json: not UTF-8"):
        recompute(tmp_path / "run", tmp_path / "out")


OUT_OF_RANGE = {
    "nan_P": (
        lambda d: traj(d)[1]["P_t"].__setitem__(0, math.nan),
        r"trajectory\[1\]\.P_t\[0\]: nan is not finite",
    ),
    "bool_P": (lambda d: traj(d)[1]["P_t"].__setitem__(0, True), r"P_t\[0\]: True is a boolean"),
    "neg_turns": (lambda d: d.__setitem__("total_turns", -5), r"total_turns: -5 is negative"),
    "inf_dE": (
        lambda d: traj(d)[2]["epm"].__setitem__("delta_E", math.inf),
        r"epm\.delta_E: inf is not finite",
    ),
    "huge_P": (lambda d: traj(d)[0]["P_t"].__setitem__(1, 1e308), r"P_t\[1\]: 1e\+308 is beyond"),
}


@pytest.mark.parametrize("kind", sorted(OUT_OF_RANGE))
def test_values_out_of_range_make_the_case_invalid_and_counted(tmp_path: Path, kind: str) -> None:
    change, match = OUT_OF_RANGE[kind]
    clean = recompute(with_case(tmp_path, lambda d: None, "script_clean"), tmp_path / "clean")
    summary = recompute(with_case(tmp_path, change), tmp_path / "out")
    assert (summary["n_cases"], summary["n_invalid"]) == (3, 1)
    bad = {r["id"]: r for r in read_records(tmp_path / "out" / "results.jsonl")}["script_z"]
    assert bad["valid"] is False and re.search(match, bad["info"]["invalid"])
    two = recompute(tmp_path / "good", tmp_path / "two")  # the scores are over the two valid cases
    assert summary["metrics"]["epmq"] == pytest.approx(two["metrics"]["epmq"])
    assert all(math.isfinite(v) for v in summary["metrics"].values() if isinstance(v, float))
    assert clean["n_invalid"] == 0


def test_the_epmq_table_never_shows_nan_or_inf() -> None:
    from types import SimpleNamespace

    from rapo_echo.benchmarks.epm.report import epmq_table

    metrics = {"epmq": math.nan, "success_rate": math.inf}
    e = SimpleNamespace(label="m", summary={"metrics": metrics, "n_valid": 1})
    _, rows = epmq_table([e])
    assert "nan" not in " ".join(rows[0]).lower() and "inf" not in " ".join(rows[0]).lower()

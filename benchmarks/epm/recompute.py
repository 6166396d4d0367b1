"""``rapo-echo eval --benchmark epm --recompute DIR``: success and EPM-Q recomputed from published
per-case result files (the EMPA benchmark's ``script_NNN_result.json``).

What is read from each file (the rest, e.g. the judge's reasoning, is ignored): ``total_turns``,
``termination_reason``, ``history`` (the dialogue), ``test_model_name``, and under ``epj``:
``trajectory`` (per point ``turn``, ``P_t``, ``v_t``, ``distance``, the ``epm`` block with
``delta_E``, ``alignment``, ``E_total``, ``P_norm``, ``projection``, and ``mdep_analysis`` with the
six ``{C,A,P}_{Prog,Neg}_level``), ``epm_params`` (alpha and the thresholds) and
``epm_victory_analysis``.

``epm.recompute_from`` chooses the per-step quantities:

* ``stored`` (default): the file's own per-step values (rounded as stored) and thresholds, which is
  what the published EPM-Q tables were computed from;
* ``levels``: everything again from P0 and the MDEP levels with the formulas of
  :mod:`rapo_echo.benchmarks.epm.vectors` (v_t from the levels, dE, alignment, E_total, |P_t|,
  projection, thresholds from the file's alpha);
  each record's ``info.checks`` counts where that disagrees with what the file stores.

Either way the success/failure rules are replayed along the trajectory (``metrics.success``) and the
file's own verdict is kept beside it (``info.published``; read as the published code reads it: the
victory conditions when present, else the termination reason). The output folder has the same files as
a live evaluation, so ``rapo-echo report`` draws it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from rapo_echo.atomic import write_text_atomic
from rapo_echo.benchmarks.base import Case, Record, make_record
from rapo_echo.benchmarks.epm.run import Epm, case_labels, case_metrics
from rapo_echo.benchmarks.epm.vectors import (
    MDEP_KEYS,
    EpmConfig,
    Point,
    Thresholds,
    advance,
    epm_config,
    first_verdict,
    norm,
    start_point,
    step_vector,
    thresholds,
)
from rapo_echo.benchmarks.results import CONFIG_FILE, RESULTS_FILE, write_json_atomic
from rapo_echo.benchmarks.runner import write_summary
from rapo_echo.errors import DataError


def result_files(folder: str | Path) -> list[Path]:
    """The per-case result files of a folder (``*_result.json``, else every ``*.json``)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise DataError(f"{folder}: not a folder of per-case result files")
    files = sorted(folder.glob("*_result.json")) or sorted(folder.glob("*.json"))
    if not files:
        raise DataError(f"{folder}: no *_result.json files")
    return files


def read_result(path: Path) -> dict[str, Any]:
    """One result file, checked for the fields the recompute needs."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object (an EMPA per-case result)")
    traj = (data.get("epj") or {}).get("trajectory")
    if not isinstance(traj, list) or not traj:
        raise DataError(f"{path}: epj.trajectory: missing or empty; is this an EMPA result file?")
    for i, point in enumerate(traj):
        if not isinstance(point, dict):
            raise DataError(f"{path}: epj.trajectory[{i}]: expected an object")
        for key in ("turn", "P_t", "v_t"):
            if key not in point:
                raise DataError(f"{path}: epj.trajectory[{i}].{key}: missing")
        for key in ("P_t", "v_t"):
            vec = point[key]
            if (
                not isinstance(vec, list)
                or len(vec) != 3
                or not all(isinstance(x, (int, float)) for x in vec)
            ):
                raise DataError(
                    f"{path}: epj.trajectory[{i}].{key}: expected three numbers (C, A, P), got {vec!r}"
                )
    if not isinstance(data.get("total_turns"), int):
        raise DataError(f"{path}: total_turns: missing or not an integer")
    return data


def published_success(result: dict[str, Any]) -> bool:
    """The file's own verdict, read as the published code reads it."""
    victory = result.get("epm_victory_analysis", (result.get("epj") or {}).get("epm_victory_analysis"))
    if victory:
        cond = victory.get("conditions", {})
        spatial = cond.get("geometric", {}).get("achieved", False) or cond.get("positional", {}).get(
            "achieved", False
        )
        return bool(spatial and cond.get("energetic", {}).get("achieved", False))
    reason = str(result.get("termination_reason", ""))
    return "成功" in reason or "SUCCESS" in reason.upper()


def _levels(point: dict[str, Any]) -> dict[str, int]:
    analysis = point.get("mdep_analysis") or {}
    out = {}
    for key in MDEP_KEYS:
        value = analysis.get(f"{key.replace('.', '_')}_level")
        if isinstance(value, int) and not isinstance(value, bool):
            out[key] = value
    return out


def stored_points(
    traj: list[dict[str, Any]], params: dict[str, Any], cfg: EpmConfig
) -> tuple[list[Point], Thresholds]:
    """The trajectory as the file stores it, with the file's thresholds."""
    points = []
    for raw in traj:
        epm = raw.get("epm") or {}
        p = tuple(float(x) for x in raw["P_t"])
        points.append(
            Point(
                int(raw["turn"]),
                (p[0], p[1], p[2]),
                (float(raw["v_t"][0]), float(raw["v_t"][1]), float(raw["v_t"][2])),
                float(raw.get("distance", 0.0)),
                float(epm["delta_E"]) if "delta_E" in epm else None,
                float(epm.get("alignment", 0.0)),
                float(epm.get("E_total", 0.0)),
                float(epm.get("P_norm", norm(p))),
                float(epm.get("projection", 0.0)),
                _levels(raw),
            )
        )
    p0 = points[0].p
    th = thresholds(p0, cfg, params.get("alpha"))
    if {"v_star_0", "epsilon_energy", "epsilon_distance", "epsilon_direction"} <= set(params):
        v = params["v_star_0"]
        th = Thresholds(
            points[0].p_norm,
            (float(v[0]), float(v[1]), float(v[2])),
            float(params["epsilon_energy"]),
            float(params["epsilon_distance"]),
            float(params["epsilon_direction"]),
        )
    return points, th


def recomputed_points(
    traj: list[dict[str, Any]], params: dict[str, Any], cfg: EpmConfig
) -> tuple[list[Point], Thresholds, dict[str, Any]]:
    """The trajectory recomputed from P0 and the MDEP levels (the stored v_t where levels are missing),
    with counts of where the file's stored values differ."""
    p0 = tuple(float(x) for x in traj[0]["P_t"])
    th = thresholds(p0, cfg, params.get("alpha"))
    points = [start_point(p0, th, cfg)]
    checks = {"v_from_levels": 0, "v_stored": 0, "v_mismatch": 0, "p_mismatch": 0, "max_abs_dE_diff": 0.0}
    for raw in traj[1:]:
        levels = _levels(raw)
        stored_v = tuple(float(x) for x in raw["v_t"])
        if len(levels) == len(MDEP_KEYS):
            v = step_vector(levels, cfg)
            checks["v_from_levels"] += 1
            checks["v_mismatch"] += v != stored_v
        else:
            v, levels = stored_v, {**dict.fromkeys(MDEP_KEYS, 0), **levels}
            checks["v_stored"] += 1
        point = advance(points, v, int(raw["turn"]), th, cfg, levels)
        checks["p_mismatch"] += point.p != tuple(float(x) for x in raw["P_t"])
        stored_de = (raw.get("epm") or {}).get("delta_E")
        if stored_de is not None and point.d_e is not None:
            checks["max_abs_dE_diff"] = max(checks["max_abs_dE_diff"], abs(point.d_e - float(stored_de)))
    return points, th, checks


def recompute_record(path: Path, cfg: EpmConfig) -> Record:
    """One result file -> a record in the live benchmark's shape."""
    result = read_result(path)
    epj = result["epj"]
    traj = epj["trajectory"]
    params = (
        epj.get("epm_params") or ((epj.get("iedr_details") or {}).get("filled_iedr") or {}).get("epm") or {}
    )
    if cfg.recompute_from == "stored":
        points, th = stored_points(traj, params, cfg)
        checks: dict[str, Any] = {}
    else:
        points, th, checks = recomputed_points(traj, params, cfg)
    turns = int(result["total_turns"])
    found = first_verdict(points, th, cfg)
    success = found is not None and found.outcome == "success"
    if found is not None:
        end = f"{found.outcome}: {found.reason}"
    elif turns >= cfg.max_turns:
        end = "timeout"
    else:
        end = "ended without a verdict"
    case_id = str(result.get("script_id") or path.stem.removesuffix("_result"))
    info: dict[str, Any] = {
        "source_file": str(path),
        "end": end,
        "verdict_turn": found.turn if found else None,
        "turns": turns,
        "published": {
            "success": published_success(result),
            "turns": turns,
            "termination_reason": result.get("termination_reason"),
        },
        "alpha": params.get("alpha", cfg.alpha),
        "recompute_from": cfg.recompute_from,
        "epmq_weights": list(cfg.weights),
        "p0": list(points[0].p),
        "thresholds": {
            "eps_energy": th.eps_energy,
            "eps_distance": th.eps_distance,
            "eps_direction": th.eps_direction,
        },
        "trajectory": [p.to_json() for p in points],
        **case_labels(points[0].p, cfg),
    }
    if checks:
        info["checks"] = checks
    names = {"actor": "user", "test_model": "companion"}
    transcript = [
        {"role": names.get(str(m.get("role")), str(m.get("role"))), "content": str(m.get("content", ""))}
        for m in result.get("history", [])
        if isinstance(m, dict)
    ]
    metrics = case_metrics(points, turns, success, cfg)
    return make_record(Case(case_id, None), valid=True, metrics=metrics, transcript=transcript, info=info)


def recompute(
    folder: str | Path, output: str | Path, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Recompute every result file of ``folder`` into the eval folder ``output``; returns the summary."""
    cfg = epm_config(overrides or {})
    files = result_files(folder)
    records = [recompute_record(p, cfg) for p in files]
    model = next(
        (str(json.loads(p.read_text(encoding="utf-8")).get("test_model_name")) for p in files[:1]), "?"
    )
    out = Path(output)
    out.mkdir(parents=True, exist_ok=True)
    config = {
        "benchmark": "epm",
        "models": {"policy": model},
        "data": str(folder),
        "settings": {"recompute": str(folder), "epm": dict(overrides or {})},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json_atomic(out / CONFIG_FILE, config)
    write_text_atomic(out / RESULTS_FILE, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return write_summary(out, Epm(), expected=len(records))

"""``rapo-echo eval --benchmark epm --recompute DIR``: success and EPM-Q recomputed from published
per-case result files (the EMPA benchmark's ``script_NNN_result.json``; docs/benchmarks.md, EPM).

What is read from each file (the rest, e.g. the judge's reasoning, is ignored): ``total_turns``,
``termination_reason``, ``history``, ``test_model_name``, and under ``epj``: ``trajectory`` (per point
``turn``, ``P_t``, ``v_t``, ``distance``, the ``epm`` block and ``mdep_analysis``), ``epm_params`` and
``epm_victory_analysis``. ``epm.recompute_from`` takes the per-step values as ``stored`` or recomputes
them from the MDEP ``levels`` (each record's ``info.checks`` counts where that disagrees with the file).
Either way the success/failure rules are replayed along the trajectory (``metrics.success``) and the
file's own verdict is kept beside it (``info.published``: the victory conditions when present, else the
termination reason)."""

from __future__ import annotations

import json
import math
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
from rapo_echo.benchmarks.runner import claim_output, write_summary
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


# Largest magnitude a stored EPM quantity may have: the axes run over tens, the energies over hundreds;
# beyond this a value is corrupt (and 1e308 overflows every norm to inf).
MAX_MAGNITUDE = 1e6
_EPM_FIELDS = ("delta_E", "alignment", "E_total", "P_norm", "projection")
_PARAM_FIELDS = ("alpha", "epsilon_energy", "epsilon_distance", "epsilon_direction")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float))  # booleans pass here as JSON numbers; value_problem refuses them


def _is_vector(x: Any) -> bool:
    return isinstance(x, list) and len(x) == 3 and all(_is_number(v) for v in x)


def _mapping(data: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key)
    if value is not None and not isinstance(value, dict):
        raise DataError(f"{where}{key}: expected an object, got {type(value).__name__} {value!r:.60}")
    return value or {}


def read_result(path: Path) -> dict[str, Any]:
    """One result file, checked for the fields the recompute needs: every malformed field (a wrong type,
    a short vector) is a DataError naming the file and the field."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not UTF-8 text (byte {exc.start}); save the file as UTF-8") from None
    if not isinstance(data, dict):
        raise DataError(f"{path}: expected a JSON object (an EMPA per-case result)")
    epj = _mapping(data, "epj", f"{path}: ")
    traj = epj.get("trajectory")
    if not isinstance(traj, list) or not traj:
        raise DataError(f"{path}: epj.trajectory: missing or empty; is this an EMPA result file?")
    for i, point in enumerate(traj):
        where = f"{path}: epj.trajectory[{i}]."
        if not isinstance(point, dict):
            raise DataError(f"{path}: epj.trajectory[{i}]: expected an object")
        for key in ("turn", "P_t", "v_t"):
            if key not in point:
                raise DataError(f"{where}{key}: missing")
        if not isinstance(point["turn"], int) or isinstance(point["turn"], bool):
            raise DataError(f"{where}turn: expected a whole number, got {point['turn']!r:.60}")
        for key in ("P_t", "v_t"):
            vec = point[key]
            if not _is_vector(vec):
                raise DataError(f"{where}{key}: expected three numbers (C, A, P), got {vec!r:.80}")
        if "distance" in point and not _is_number(point["distance"]):
            raise DataError(f"{where}distance: expected a number, got {point['distance']!r:.60}")
        for key in _EPM_FIELDS:
            value = _mapping(point, "epm", where).get(key)
            if value is not None and not _is_number(value):
                raise DataError(f"{where}epm.{key}: expected a number, got {value!r:.60}")
        _mapping(point, "mdep_analysis", where)
    params = _mapping(epj, "epm_params", f"{path}: epj.")
    for key in _PARAM_FIELDS:
        if key in params and not _is_number(params[key]):
            raise DataError(f"{path}: epj.epm_params.{key}: expected a number, got {params[key]!r:.60}")
    if "v_star_0" in params:
        v = params["v_star_0"]
        if not _is_vector(v):
            raise DataError(f"{path}: epj.epm_params.v_star_0: expected three numbers, got {v!r:.80}")
    for holder, where in ((data, ""), (epj, "epj.")):
        victory = _mapping(holder, "epm_victory_analysis", f"{path}: {where}")
        if not isinstance(victory.get("conditions", {}), dict):
            raise DataError(f"{path}: {where}epm_victory_analysis.conditions: expected an object")
    if not isinstance(data.get("total_turns"), int) or isinstance(data.get("total_turns"), bool):
        raise DataError(f"{path}: total_turns: missing or not an integer")
    if "history" in data and not isinstance(data["history"], list):
        raise DataError(f"{path}: history: expected a list of messages, got {type(data['history']).__name__}")
    return data


def value_problem(data: dict[str, Any]) -> str | None:
    """Why a well-formed result file's values cannot be scored (NaN or infinite numbers, booleans where
    numbers belong, magnitudes beyond :data:`MAX_MAGNITUDE`, negative turns), naming the field; else
    None. Such a case is invalid: counted and named, never averaged."""
    if data["total_turns"] < 0:
        return f"total_turns: {data['total_turns']} is negative"
    epj = data["epj"]
    fields: list[tuple[str, Any]] = []
    for i, point in enumerate(epj["trajectory"]):
        at = f"epj.trajectory[{i}]."
        fields += [(f"{at}{k}[{j}]", x) for k in ("P_t", "v_t") for j, x in enumerate(point[k])]
        fields += [(f"{at}distance", point["distance"])] if "distance" in point else []
        epm = point.get("epm") or {}
        fields += [(f"{at}epm.{k}", epm[k]) for k in _EPM_FIELDS if epm.get(k) is not None]
    params = epj.get("epm_params") or {}
    fields += [(f"epj.epm_params.{k}", params[k]) for k in _PARAM_FIELDS if k in params]
    fields += [(f"epj.epm_params.v_star_0[{j}]", x) for j, x in enumerate(params.get("v_star_0") or [])]
    for name, x in fields:
        if isinstance(x, bool):
            return f"{name}: {x!r} is a boolean, not a number"
        if not math.isfinite(x):
            return f"{name}: {x!r} is not finite"
        if abs(x) > MAX_MAGNITUDE:
            return f"{name}: {x!r} is beyond any EPM value (|x| > {MAX_MAGNITUDE:g})"
    return None


def published_success(result: dict[str, Any]) -> bool:
    """The file's own verdict, read as the published code reads it."""
    victory = result.get("epm_victory_analysis", (result.get("epj") or {}).get("epm_victory_analysis"))
    if isinstance(victory, dict) and victory:
        cond = victory.get("conditions")
        cond = cond if isinstance(cond, dict) else {}

        def achieved(name: str) -> bool:
            part = cond.get(name)
            return bool(part.get("achieved", False)) if isinstance(part, dict) else False

        return (achieved("geometric") or achieved("positional")) and achieved("energetic")
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
    case_id = str(result.get("script_id") or path.stem.removesuffix("_result"))
    problem = value_problem(result)
    if problem:
        info = {"source_file": str(path), "invalid": problem, "end": "invalid"}
        return make_record(Case(case_id, None), valid=False, metrics={}, transcript=[], info=info)
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
    model = str(read_result(files[0]).get("test_model_name"))
    out = Path(output)
    config = {
        "benchmark": "epm",
        "models": {"policy": model},
        "data": str(folder),
        "settings": {"recompute": str(folder), "epm": dict(overrides or {})},
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    with claim_output(out, {out: config}):  # never over another evaluation; one process at a time
        write_json_atomic(out / CONFIG_FILE, config)
        text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
        write_text_atomic(out / RESULTS_FILE, text)
        return write_summary(out, Epm(), expected=len(records))

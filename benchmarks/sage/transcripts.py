"""SAGE's released result files scored as our evaluations: ``eval --benchmark sage --transcripts DIR``
reads ``SAGE/dataset/<simulator>_based_simulator/<model>_result.jsonl`` (one dialogue a line, the final
``emo_point`` the score) into one eval folder per file, which ``rapo-echo report`` and ``compare`` read;
no model is loaded."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.base import Record
from rapo_echo.benchmarks.sage.run import Sage, outcome
from rapo_echo.errors import ConfigError, DataError

RESULT_SUFFIX = "_result.jsonl"


def emotion_problem(value: Any) -> str | None:
    """Why ``value`` is not an emotion on SAGE's 0-100 scale (missing, not a number, a boolean, NaN or
    infinite, out of range), else None."""
    if value is None:
        return "emo_point is missing"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"emo_point {value!r} is not a number"
    if not math.isfinite(value):
        return f"emo_point {value!r} is not finite"
    if not 0 <= value <= 100:
        return f"emo_point {value!r} is outside SAGE's 0-100 scale"
    return None


def released_record(obj: Any, where: str, model: str) -> Record:
    """One dialogue of SAGE's released result format as our record: the final ``emo_point`` is the
    score; a dialogue whose ``emo_point`` is not a finite number in 0-100 is invalid (counted, named in
    ``info['invalid']``, never read as 0)."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
    ident = obj.get("id")
    if not isinstance(ident, str) or not ident:
        raise DataError(f"{where}: id: missing or not a string; SAGE result lines have a string 'id'")
    history = obj.get("history")
    if not isinstance(history, list):
        raise DataError(f"{where}: history: expected a list of messages, got {type(history).__name__}")
    transcript = []
    for i, m in enumerate(history):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise DataError(
                f"{where}: history[{i}]: expected {{'role': 'user' | 'assistant', 'content': ...}}"
            )
        entry: dict[str, Any] = {"role": m["role"], "content": str(m.get("content", ""))}
        if m["role"] == "user":
            entry["emotion"] = m.get("emotion-point")
            if isinstance(m.get("planning"), dict):
                entry["inner"] = m["planning"]
            if m.get("thinking"):
                entry["thinking"] = m["thinking"]
        transcript.append(entry)
    final = obj.get("emo_point")
    problem = emotion_problem(final)
    valid = problem is None
    user_points = [t["emotion"] for t in transcript if t["role"] == "user" and t.get("emotion") is not None]
    info = {
        "model": model,
        "emo_state": obj.get("emo_state"),
        "hidden_intention": obj.get("task"),
        "emotions": user_points,
        "source": where,
    }
    if problem:
        info["invalid"] = problem
    if valid and user_points and user_points[-1] != final:
        info["mismatch"] = f"emo_point {final} but the last user turn has emotion-point {user_points[-1]}"
    turns = sum(t["role"] == "assistant" for t in transcript)
    metrics = outcome(float(final), turns) if valid else {}
    return {"id": ident, "valid": valid, "metrics": metrics, "transcript": transcript, "info": info}


def result_files(path: str | Path) -> list[Path]:
    """``*_result.jsonl`` files under ``path`` (a folder, searched recursively), or ``path`` itself."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise DataError(f"{p}: no such file or folder of SAGE result files")
    files = sorted(p.rglob(f"*{RESULT_SUFFIX}"))
    if not files:
        raise DataError(f"{p}: holds no *{RESULT_SUFFIX} files (SAGE/dataset/<simulator>_based_simulator/)")
    return files


def model_name(path: Path) -> str:
    """The policy model and simulator a result file belongs to, from SAGE's naming scheme."""
    model = path.name[: -len(RESULT_SUFFIX)] if path.name.endswith(RESULT_SUFFIX) else path.stem
    folder = path.parent.name
    return f"{model} ({folder})" if folder.endswith("_based_simulator") else model


def score_transcripts(path: str | Path, output: str | Path) -> list[dict[str, Any]]:
    """Score every SAGE result file under ``path``; writes one eval folder per file under ``output``
    (``results.jsonl``, ``config.json``, ``summary.json``, readable by ``rapo-echo report``) and returns
    the summaries."""
    from rapo_echo.benchmarks.results import CONFIG_FILE
    from rapo_echo.benchmarks.runner import claim_output

    out_root = Path(output)
    files = result_files(path)
    targets: dict[Path, tuple[Path, dict[str, Any]]] = {}
    for f in files:
        folder = out_root
        if len(files) > 1:  # one folder per result file, at its path under the input folder (no two alike)
            folder = out_root / f.relative_to(path).parent / f.stem
        config = {
            "benchmark": Sage.name,
            "mode": "transcripts",
            "models": {"policy": model_name(f), "simulator": f.parent.name},
            "data": str(f),
        }
        targets[folder] = (f, config)
    if len(files) > 1 and (out_root / CONFIG_FILE).exists():
        raise ConfigError(
            f"--output {out_root} holds an evaluation ({CONFIG_FILE}); choose an empty --output"
        )
    with claim_output(out_root, {folder: config for folder, (_, config) in targets.items()}):
        return [_score_file(f, folder, config) for folder, (f, config) in targets.items()]


def _score_file(f: Path, folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Score one SAGE result file into ``folder``; its summary with the folder."""
    from rapo_echo.benchmarks.results import CONFIG_FILE, RESULTS_FILE, SUMMARY_FILE, write_json_atomic
    from rapo_echo.benchmarks.runner import compute_summary
    from rapo_echo.data.files import open_source, read_records

    name = config["models"]["policy"]
    records = [released_record(r.data, r.where, name) for r in read_records(open_source(f))]
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise DataError(f"{f}: dialogue ids are not unique")
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / CONFIG_FILE, config)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    (folder / RESULTS_FILE).write_text(text, encoding="utf-8")
    summary = {  # the figures with their intervals over dialogues, as for a live run
        **compute_summary(folder, Sage(), expected=len(records)),
        "mode": "transcripts",
        "invalid_cases": {r["id"]: r["info"]["invalid"] for r in records if "invalid" in r["info"]},
        "mismatches": sum("mismatch" in r["info"] for r in records),
    }
    write_json_atomic(folder / SUMMARY_FILE, summary)
    return {**summary, "output": str(folder)}

"""The training-run part of the report: a summary table of key metrics and browsable samples
(prompt, replies with rewards, the simulated reactions and the judge's critiques)."""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapo_echo.jsonl import read_jsonl
from rapo_echo.monitor import flagged_steps

SAMPLES_FILE = "samples.jsonl"
# Shown in the summary table when the run logged them: (key, label). What a run is for leads (for RAPO:
# the hidden-rule score where the simulated user has one, the emotion change, rewrites vs originals);
# a reward that never changes (RAPO's rank rewards average 0.5 by construction) is left out.
SUMMARY_KEYS = (
    ("sim/hidden_rule_score", "hidden-rule score"),
    ("sim/emotion_delta", "emotion change"),
    ("sd/rank_vs_original", "rewrite rank vs original"),
    ("sd/beat_original", "rewrites beat original"),
    ("reward/mean", "reward"),
    ("heldout/agreement", "held-out judge agreement"),
    ("loss/grpo", "GRPO loss"),
    ("loss/sd", "SD loss"),
    ("kl", "KL"),
    ("entropy", "entropy"),
    ("reply_len/mean", "reply tokens"),
    ("invalid", "invalid samples"),
    ("time/step", "s/step"),
)


def _num(v: Any) -> str:
    if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
        return f"{v:.3g}"
    return "–"


def first_last(rows: Sequence[dict[str, Any]], key: str) -> tuple[Any, Any]:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
    return (vals[0], vals[-1]) if vals else (None, None)


def _spans(steps: Sequence[int]) -> str:
    """``[2, 3, 4, 7]`` -> ``'2-4, 7'``."""
    spans: list[list[int]] = []
    for s in sorted(steps):
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def monitor_summary(rows: Sequence[dict[str, Any]]) -> str:
    """The reward-hacking monitor's flags of a run, e.g. ``'length_spike at 5-7; judge_text at 6'``."""
    by_signature: dict[str, list[int]] = {}
    for step, names in flagged_steps(rows).items():
        for name in names:
            by_signature.setdefault(name, []).append(step)
    return "; ".join(f"{name} at {_spans(steps)}" for name, steps in sorted(by_signature.items()))


def _absent(rows: Sequence[dict[str, Any]]) -> set[str]:
    return {k for k, _ in SUMMARY_KEYS if not any(k in r for r in rows)}


def summary_table(runs: Sequence[Any]) -> tuple[list[str], list[list[str]]]:
    """One row per run: steps, then first -> last value of each key metric it logged (a metric flat in
    every run is left out), and the steps the reward-hacking monitor flagged (when any run logged its
    flags)."""
    from rapo_echo.benchmarks.plots import flat_keys

    flat = set.intersection(*(flat_keys(run.rows) | _absent(run.rows) for run in runs)) if runs else set()
    keys = [
        (k, label)
        for k, label in SUMMARY_KEYS
        if k not in flat and any(k in r for run in runs for r in run.rows)
    ]
    monitored = any(k.startswith("monitor/") for run in runs for r in run.rows for k in r)
    header = ["run", "steps", *[f"{label} (first → last)" for _, label in keys]]
    if monitored:
        header.append("reward-hacking flags")
    rows = []
    for run in runs:
        cells = [run.path.name, str(len(run.rows))]
        for k, _ in keys:
            a, b = first_last(run.rows, k)
            cells.append(f"{_num(a)} → {_num(b)}")
        if monitored:
            cells.append(monitor_summary(run.rows) or "none")
        rows.append(cells)
    return header, rows


def validation_table(runs: Sequence[Any]) -> tuple[list[str], list[list[str]]] | None:
    """One row per run that validated on held-out scenarios (``validation.jsonl``): each validated step's
    score, its paired gain over the best before it (``val/gain`` ± ``val/gain_se``, and the files of
    ``validation.data``, rules and ``variety`` on which it lost beyond their floors), and the step ``final/``
    holds under ``validation.keep_best``; None when no run validated."""
    from rapo_echo.rundir import VALIDATION_FILE

    rows = []
    for run in runs:
        path = run.path / VALIDATION_FILE
        if not path.is_file():
            continue
        lines = [r for _, r in read_jsonl(path) if isinstance(r, dict)]
        keys = [
            k
            for k in ("val/emotion_delta", "val/reward", "val/hidden_rule_score", "val/distinct_2")
            if any(k in r for r in lines)
        ]
        scores = "; ".join(
            f"{k}: " + ", ".join(f"{r['step']}: {_num(r.get(k))}" for r in lines) for k in keys
        )
        gains = ", ".join(
            f"{r['step']}: {_num(r['val/gain'])} ± {_num(r.get('val/gain_se'))}"
            + (f" (loses on {', '.join(r['vetoed_by'])})" if r.get("vetoed_by") else "")
            for r in lines
            if "val/gain" in r
        )
        rows.append([run.path.name, scores, gains or "–", kept_step(run.path)])
    if not rows:
        return None
    header = ["run", "held-out score by step (step: value)", "gain over the best before it (step: gain ± se)"]
    return [*header, "final/ holds step"], rows


def kept_step(run_dir: Path) -> str:
    """Which step ``final/`` holds: the best-validated one (``final/best.json``), the last (no keep_best),
    or none yet where the run stopped before writing it (then the best so far, ``best/best.json``)."""
    from rapo_echo.rundir import BEST_DIR, BEST_FILE

    chosen, best = run_dir / "final" / BEST_FILE, run_dir / BEST_DIR / BEST_FILE
    if chosen.is_file():
        return str(json.loads(chosen.read_text())["step"])
    if (run_dir / "final").is_dir():
        return "last (keep_best off)"
    so_far = f"; the best so far is step {json.loads(best.read_text())['step']}" if best.is_file() else ""
    return f"no final/ yet (the run stopped before its end){so_far}"


def read_samples(run_dir: Path, *, last_steps: int = 1) -> list[dict[str, Any]]:
    """Sample records of the last ``last_steps`` logged steps (skips unreadable lines)."""
    path = run_dir / SAMPLES_FILE
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    steps = sorted({r.get("step", 0) for r in rows})[-last_steps:]
    return [r for r in rows if r.get("step", 0) in steps]


def samples_html(records: Sequence[dict[str, Any]], *, max_groups: int = 20) -> str:
    """One ``<details>`` per (step, scenario) group: the context, then each reply with its reward, rank,
    advantage, the person's simulated reaction and the judge's critique."""
    groups: dict[tuple[Any, Any, Any], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r.get("step"), r.get("scenario"), r.get("group")), []).append(r)
    out = []
    for (step, scenario, _), rows in list(groups.items())[:max_groups]:
        prompt = rows[0].get("prompt") or []
        turns = "".join(
            f'<div class="turn"><span class="role">{html.escape(m.get("role", ""))}</span> '
            f"{html.escape(m.get('content', ''))}</div>"
            for m in prompt
            if m.get("role") != "system"
        )
        replies = []
        for r in sorted(
            rows, key=lambda x: -(x.get("reward") if isinstance(x.get("reward"), (int, float)) else -1e9)
        ):
            info = r.get("info") or {}
            reaction = info.get("reaction") or {}
            meta = [f"reward {_num(r.get('reward'))}", f"advantage {_num(r.get('advantage'))}"]
            if info.get("rank") is not None:
                meta.append(f"rank {_num(info['rank'])}")
            block = (
                f'<div class="turn"><span class="role">reply</span> {html.escape(str(r.get("reply", "")))}'
                f'<div class="meta">{html.escape(", ".join(meta))}</div>'
            )
            if reaction.get("message"):
                delta = reaction.get("emotion_delta")
                block += (
                    f'<div class="meta">reaction: {html.escape(str(reaction["message"]))}'
                    + (f" (emotion {delta:+.1f})" if isinstance(delta, (int, float)) else "")
                    + "</div>"
                )
            if r.get("critique"):
                block += f'<div class="meta">critique: {html.escape(str(r["critique"]))}</div>'
            replies.append(block + "</div>")
        out.append(
            f"<details><summary>step {step} — {html.escape(str(scenario))}</summary>{turns}"
            f"{''.join(replies)}</details>"
        )
    return "".join(out)


JUDGE_BIAS_NOTE = (
    "Position bias: the share of a comparing judge's decisions that went to the reply shown first (A/B: "
    "1 for A, 0.5 for a tie; groups: rank 1 to the first-shown reply), against what chance gives (0.5, or "
    "1 / group size); a share far from chance means the judge judges the slot rather than the reply, "
    "which both orders (the default) cancel out of the reward. Instruction bias: how far a note asking the "
    "judge to prefer a reply moved that reply's score (0: ignored; +1: from a sure loss to a sure win)."
)


def judge_bias_table(runs: Sequence[Any]) -> tuple[list[str], list[list[str]]] | None:
    """One row per run that logged its judge's bias (``judge/position_bias/*``, ``judge/injection_bias/*``):
    the first-shown reply's share of the decisions against chance, and the instruction shift; None when
    no run logged either."""
    from rapo_echo.judges.bias import run_first_share, run_injection_shift

    rows = []
    for run in runs:
        position, injection = run_first_share(run.rows), run_injection_shift(run.rows)
        if position is None and injection is None:
            continue
        share = "-" if position is None else f"{position[0]:.3f} (chance {position[1]:.3f}, n {position[2]})"
        shift = "-" if injection is None else f"{injection[0]:+.3f} (n {injection[1]})"
        rows.append([run.path.name, share, shift])
    if not rows:
        return None
    return ["run", "first-shown share of decisions", "instruction shift"], rows

#!/usr/bin/env python3
"""The long-run study (issue 47): RAPO's self-distillation modes with guards off and on, GRPO on the same
ranks beside them, and RLVER with final versus per-turn rewards, each run for hundreds of steps on the
embedded model, with the curves that show a run going bad.

Every run is a plain ``rapo-echo train`` run folder under ``--root`` (one process at a time, ``nice``,
one thread); the driver trains each run in chunks of ``--chunk`` steps, continuing it from its last
checkpoint with ``--resume`` (the count of resumes is kept in ``study.json`` and shown), so it can be
stopped at any time (Ctrl-C, a kill, a reboot) and started again with the same command: it goes on
where the runs stopped. While a run trains, a progress line every ``--every`` steps shows the step, the
hidden-rule score, entropy, KL to the reference, reply length, Distinct-2, the SD/GRPO pull ratio and the
seconds per step.

    python studies/long_run.py --root runs/long --arms nll-off token_kl-off --steps 300
    python studies/long_run.py --root runs/long --arms nll-on grpo --seeds 0 1 2 --steps 300
    python studies/long_run.py --root runs/long --table          # the study's tables (markdown)
    rapo-echo report runs/long --output report/                  # the curves (one figure per metric)

Arms (``--arms``): ``grpo`` (RAPO with ``rapo.sd.enabled: false``: GRPO on the same ranks), ``MODE-off``
and ``MODE-on`` for MODE in nll, adv_nll, in_group, token_kl (the library's defaults for self-distillation,
then the same with the guards of :data:`GUARDS_ON`), ``rlver-final`` and ``rlver-turn`` (RLVER against the
scripted SAGE user, the final emotion or the per-turn emotion changes as the reward). Sizes: see
:data:`SIZES` (the smallest that learned here at a few seconds a step).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: the checkout's root

STATE_FILE = "study.json"
STUDY_FILE = "long_run.json"  # the report finds a study by it
MODES = ("nll", "adv_nll", "in_group", "token_kl")
# What every RAPO arm shares: the hidden-preference user and the reactions judge (no model judge), the
# embedded model with LoRA in bfloat16 (4x the float32 speed on this CPU), 2 contexts x 4 replies of at
# most 16 tokens, the bundled scenarios that are one opening message (short prompts), the KL to the
# reference watched (not in the loss), a checkpoint every 10 steps.
SIZES = [
    "model.lora.enabled=true",
    "model.dtype=bfloat16",
    "rollout.batch_size=2",
    "rollout.group_size=4",
    "rollout.max_new_tokens=16",
    "rollout.temperature=1.0",
    "train.lr=1e-3",
    "loss.advantage=grpo",
    "loss.beta=0",
    "monitor.reference_kl=true",
    "train.save_every=10",
    "train.keep_checkpoints=1",
    "logging.progress=false",
    "logging.tensorboard=false",
]
RAPO_COMMON = [
    "rapo.simulator.name=hidden_preference",
    "rapo.judge.kind=reactions",
    "rapo.sd.rewrite_prompt=system",  # the embedded model answers a follow-up request with talk about it
]
# The guards (docs/algorithms/rapo.md, "Guards"), off and on; passed again at every resume, so a run keeps
# its arm's guards whatever the library's defaults are when it resumes.
GUARDS_OFF = [
    "rapo.sd.verify=false",
    "rapo.sd.only_failed=false",
    "rapo.sd.ref_kl=0",
    "rapo.sd.max_ref_logratio=null",
    "rapo.sd.min_beat=null",
]
GUARDS_ON = [
    "rapo.sd.verify=true",  # ILF / Critique-GRPO: only rewrites that beat their original
    "rapo.sd.only_failed=true",  # SRPO: only failed replies go to self-distillation
    "rapo.sd.ref_kl=0.1",  # SDPG: a reference KL on the distilled tokens
    "rapo.sd.max_ref_logratio=2.0",  # a trust region around the reference
    "rapo.sd.min_beat=0.2",  # SD fades when the rewrites stop beating their originals
]


def _analysis(shift: int) -> str:
    """The SAGE user's text-mode analysis with emotion change ``shift``, as a scripted reply (a format
    string: braces doubled)."""
    body = {"content": "c", "fit": "t", "mind": "a", "reaction": "fine", "shift": shift}
    return json.dumps(body).replace("{", "{{").replace("}", "}}")


# RLVER's user for the study: the scripted SAGE engine, warmer (+10) when the supporter's newest reply asks
# a question, colder (-10) otherwise, starting at 10, so the dialogue ends (emotion 0) at the first reply
# without one: the policy's replies decide how many turns a dialogue lasts, the case per-turn rewards must
# not be biased by.
NEWEST_ASKS = r"emotion right now.*Supporter:(?:(?!Supporter:).)*\?(?:(?!Supporter:).)*<<<END DIALOGUE"
QUESTION_USER = json.dumps(
    {
        "rules": [
            [NEWEST_ASKS, _analysis(10)],
            ["emotion right now", _analysis(-10)],
            ["the final message you say", "Response: hm, go on"],
        ]
    }
)
RLVER_COMMON = [
    "simulator.engine=scripted",
    f"simulator.script={QUESTION_USER}",
    "rlver.simulator.emotion_readout=text",
    "rlver.simulator.max_turns=3",
    "rlver.simulator.initial_emotion=10",
    "loss.advantage=dr_grpo",  # mean-centred, as the per-turn advantages (no std for either)
]
CURVES = (
    ("sim/hidden_rule_score", "hidden"),
    ("entropy", "H"),
    ("kl", "kl"),
    ("reply_len/mean", "len"),
    ("reply/distinct_2", "d2"),
    ("sd/pg_ratio", "sd/pg"),
    ("reward/mean", "reward"),
)


def arm_config(arm: str) -> tuple[str, list[str]]:
    """(algo, overrides) of an arm."""
    if arm == "grpo":
        return "rapo", [*RAPO_COMMON, "rapo.sd.enabled=false"]
    if arm in ("rlver-final", "rlver-turn"):
        reward = "final" if arm == "rlver-final" else "per_turn"
        return "rlver", [*RLVER_COMMON, f"rlver.reward={reward}"]
    mode, _, guards = arm.rpartition("-")
    if mode not in MODES or guards not in ("off", "on"):
        raise SystemExit(
            f"unknown arm {arm!r}: grpo, rlver-final, rlver-turn or MODE-off/MODE-on, MODE in {MODES}"
        )
    sd = [*RAPO_COMMON, "rapo.sd.enabled=true", f"rapo.sd.loss={mode}"]
    return "rapo", sd + (GUARDS_ON if guards == "on" else GUARDS_OFF)


def openings_file(root: Path) -> Path:
    """The bundled scenarios that are one opening message (shorter prompts, the same people), written once."""
    from rapo_echo.data import bundled_file

    out = root / "openings.jsonl"
    if not out.is_file():
        rows = [
            json.loads(x) for x in bundled_file("scenarios_en.jsonl").read_text().splitlines() if x.strip()
        ]
        out.write_text("".join(json.dumps(r) + "\n" for r in rows if "opening" in r))
    return out


def read_rows(run: Path) -> list[dict[str, Any]]:
    path = run / "metrics.jsonl"
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill
    return [r for r in rows if isinstance(r.get("step"), int)]


def done_steps(run: Path) -> int:
    rows = read_rows(run)
    return max((r["step"] for r in rows), default=0)


def has_checkpoint(run: Path) -> bool:
    return any((run / "checkpoints").glob("step-*")) if (run / "checkpoints").is_dir() else False


def load_state(root: Path) -> dict[str, Any]:
    path = root / STATE_FILE
    return json.loads(path.read_text()) if path.is_file() else {"runs": {}}


def save_state(root: Path, state: dict[str, Any]) -> None:
    tmp = root / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1))
    tmp.replace(root / STATE_FILE)


def _fmt(v: Any, nd: int = 3) -> str:
    return "-" if v is None or (isinstance(v, float) and not math.isfinite(v)) else f"{v:.{nd}g}"


def progress_line(name: str, rows: list[dict[str, Any]], target: int, sec_per_step: float | None) -> str:
    last = rows[-1]
    parts = [f"{time.strftime('%H:%M')} [{name}] step {last['step']}/{target}"]
    for key, short in CURVES:
        if key in last:
            parts.append(f"{short} {_fmt(last[key])}")
    if sec_per_step:
        eta = (target - last["step"]) * sec_per_step
        parts.append(f"| {sec_per_step:.1f} s/step, eta {int(eta // 3600)}:{int(eta % 3600 // 60):02d}")
    return " ".join(parts)


def train_chunk(
    root: Path, name: str, arm: str, seed: int, until: int, extra: Sequence[str], every: int, python: str
) -> int:
    """Train run ``name`` up to step ``until`` in a child process of ``python`` (from its last checkpoint when
    it has one), in ``root`` (not the checkout: its source folders would shadow a frozen snapshot's);
    returns the child's exit status."""
    run = root / name
    algo, overrides = arm_config(arm)
    sets = [*SIZES, *overrides, f"train.seed={seed}", *extra]
    resume = has_checkpoint(run)
    if run.exists() and not resume:
        shutil.rmtree(run)  # started but never checkpointed: start again
    if algo == "rapo":
        sets.append(f"data.path={openings_file(root)}")
    cmd = ["nice", "-n", "10", python, "-m", "rapo_echo.cli", "train", "--max-steps", str(until)]
    cmd += ["--resume", str(run)] if resume else ["--algo", algo, "--output", str(run)]
    cmd += [
        f"--set={s}" for s in (sets if not resume else [o for o in overrides if o.startswith("rapo.sd.")])
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    cmd += ["--set=train.threads=1"]
    state = load_state(root)
    info = state["runs"].setdefault(name, {"arm": arm, "seed": seed, "resumes": 0, "wall_s": 0.0})
    info["resumes"] += int(resume)
    info["overrides"] = sets
    save_state(root, state)
    print(f"{time.strftime('%H:%M')} [{name}] {'resume' if resume else 'start'} to step {until}"
          f" (resumes so far: {info['resumes']})", flush=True)  # fmt: skip
    t0 = time.time()
    with open(root / f"{name}.log", "a") as log:
        child = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root)
        t_shown = time.time()
        shown = step_shown = done_steps(run)
        while child.poll() is None:
            time.sleep(10)
            rows = read_rows(run)
            if rows and rows[-1]["step"] >= shown + every:
                now = time.time()
                rate = (now - t_shown) / max(1, rows[-1]["step"] - step_shown)
                print(progress_line(name, rows, until, rate), flush=True)
                shown, t_shown, step_shown = rows[-1]["step"], now, rows[-1]["step"]
    state = load_state(root)
    state["runs"][name]["wall_s"] += time.time() - t0
    state["runs"][name]["steps"] = done_steps(run)
    save_state(root, state)
    shutil.rmtree(run / "final", ignore_errors=True)  # the merged model: not needed by the study
    return child.returncode


def snapshot(folder: Path) -> Path:
    """A frozen copy of this checkout's code, laid out as installed, and an interpreter that imports it
    (a venv whose path lists the copy, then this environment's site-packages, without the editable
    install's finder): a long study keeps running the code it started with while the checkout changes.
    Returns the interpreter."""
    import site

    import tomllib

    code = folder / "code"
    shutil.rmtree(code, ignore_errors=True)
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    for package, source in sorted(mapping.items(), key=lambda kv: kv[0].count(".")):  # rapo_echo first
        shutil.copytree(
            ROOT / source, code / package.replace(".", "/"), ignore=shutil.ignore_patterns("__pycache__")
        )
    venv = folder / "venv"
    if not (venv / "bin" / "python").exists():
        subprocess.run(
            [Path(sys.base_prefix) / "bin" / "python3", "-m", "venv", "--without-pip", venv], check=True
        )
    [packages] = [p for p in site.getsitepackages() if p.endswith("site-packages")][:1]
    sp = next((venv / "lib").glob("python*/site-packages"))
    (sp / "snapshot.pth").write_text(f"{code}\n{packages}\n")
    return venv / "bin" / "python"


def run_study(args: argparse.Namespace) -> None:
    root = Path(args.root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    (root / STUDY_FILE).write_text(json.dumps({"study": "long_run", "curves": [k for k, _ in CURVES]}))
    runs = [(f"{arm}-s{seed}", arm, seed) for arm in args.arms for seed in args.seeds]
    for _, arm, _ in runs:
        arm_config(arm)  # unknown arms fail before anything runs
    while todo := [(n, a, s) for n, a, s in runs if done_steps(root / n) < args.steps]:
        for name, arm, seed in todo[:1] if args.sequential else todo:  # round-robin: one chunk each
            done = done_steps(root / name)
            until = args.steps if not args.chunk else min(args.steps, done + args.chunk)
            rc = train_chunk(root, name, arm, seed, until, args.set, args.every, args.python)
            if rc != 0:
                raise SystemExit(f"[{name}] the run failed (exit {rc}); see {root / (name + '.log')}")
    print(study_tables(root))


# ---------------------------------------------------------------------------- tables


def _window_mean(rows: list[dict[str, Any]], key: str, first: bool, n: int) -> float | None:
    vals = [r[key] for r in rows if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
    if not vals:
        return None
    part = vals[:n] if first else vals[-n:]
    return statistics.fmean(part)


def replayed(run: Path, rows: list[dict[str, Any]]) -> dict[str, int]:
    """Each monitor signature's first step, replayed over the run's metrics with today's default
    thresholds (the flags a run logged used the thresholds of its day)."""
    import yaml

    from rapo_echo.config import MonitorConfig
    from rapo_echo.monitor import replay

    config = yaml.safe_load((run / "config.yaml").read_text()) if (run / "config.yaml").is_file() else {}
    max_new = int((config.get("rollout") or {}).get("max_new_tokens", 16))
    return replay(rows, MonitorConfig(), max_new)


def alarms_raised(run: Path, rows: list[dict[str, Any]]) -> str:
    """``name@step`` of each monitor signature's first firing (:func:`replayed`)."""
    first = replayed(run, rows)
    return ", ".join(f"{k}@{s}" for k, s in sorted(first.items(), key=lambda x: (x[1], x[0]))) or "none"


def score_key(arm: str) -> str:
    """The score a run's first and last windows average: the hidden-rule score, RLVER's final emotion."""
    return "emotion/final" if arm.startswith("rlver") else "sim/hidden_rule_score"


def run_summary(
    root: Path, name: str, info: dict[str, Any], window: int, upto: int | None = None
) -> dict[str, Any]:
    run = root / name
    rows = [r for r in read_rows(run) if upto is None or r["step"] <= upto]
    ent = [r["entropy"] for r in rows if isinstance(r.get("entropy"), (int, float))]
    step_s = [r["time/step"] for r in rows if isinstance(r.get("time/step"), (int, float))]
    cpu_s = [r["time/cpu_step"] for r in rows if isinstance(r.get("time/cpu_step"), (int, float))]
    return {
        "name": name,
        "arm": info["arm"],
        "seed": info["seed"],
        "steps": rows[-1]["step"] if rows else 0,
        "resumes": info.get("resumes", 0),
        "first": _window_mean(rows, score_key(info["arm"]), True, window),
        "last": _window_mean(rows, score_key(info["arm"]), False, window),
        "min_entropy": min(ent) if ent else None,
        "alarms": alarms_raised(run, rows),
        "s_per_step": statistics.median(step_s) if step_s else None,
        "cpu_per_step": statistics.median(cpu_s) if cpu_s else None,
    }


def t_interval(xs: Sequence[float], level: float = 0.95) -> tuple[float, float, float]:
    """(mean, low, high) of a Student-t interval over ``xs`` (n >= 2)."""
    from scipy import stats

    n = len(xs)
    m = statistics.fmean(xs)
    half = stats.t.ppf(0.5 + level / 2, n - 1) * statistics.stdev(xs) / math.sqrt(n)
    return m, m - half, m + half


def study_tables(root: Path, window: int = 20, upto: int | None = None) -> str:
    """The study table (one row per run) and the RAPO-vs-GRPO table, as markdown; with ``upto``, each run
    as it was at that step."""
    state = load_state(root)
    rows = [run_summary(root, n, info, window, upto) for n, info in sorted(state["runs"].items())]
    out = [
        f"first / last = mean hidden-rule score (RLVER: final emotion) of the first / last {window} steps"
        + (f", up to step {upto}" if upto else "")
        + "; s/step: median wall seconds, cpu s/step: median CPU seconds of the process (one thread)",
        "",
        "| run | mode | guards | seed | steps | resumes | first | last | min entropy | s/step | cpu s/step "
        "| alarms raised |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        mode, _, guards = r["arm"].rpartition("-") if r["arm"] != "grpo" else ("grpo (SD off)", "", "-")
        out.append(
            f"| {r['name']} | {mode} | {guards} | {r['seed']} | {r['steps']} | {r['resumes']} "
            f"| {_fmt(r['first'])} | {_fmt(r['last'])} | {_fmt(r['min_entropy'])} | {_fmt(r['s_per_step'])} "
            f"| {_fmt(r['cpu_per_step'])} | {r['alarms']} |"
        )
    # the gain table compares each arm's seeds, and the arms, at the same step: the fewest any run reached
    common = min((r["steps"] for r in rows if r["steps"]), default=0)
    at = [run_summary(root, n, info, window, upto or common) for n, info in sorted(state["runs"].items())]
    out += ["", f"gains at step {upto or common} (every run's first and last {window} steps up to it)", ""]
    out += [gain_table([r for r in at if r["steps"] == (upto or common)])]
    return "\n".join(out)


def gain_table(rows: list[dict[str, Any]]) -> str:
    """Per arm with >= 2 seeds run to the same steps: the gain (last - first window) over seeds with its 95%
    t-interval and the median seconds per step; then each arm against ``grpo``, paired by seed."""
    by_arm: dict[str, dict[int, dict[str, Any]]] = {}
    for r in rows:
        if r["first"] is not None and r["last"] is not None:
            by_arm.setdefault(r["arm"], {})[r["seed"]] = r
    lines = [
        "| arm | seeds | steps | gain (mean [95% CI]) | s/step | cpu s/step | vs grpo, paired by seed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    base = by_arm.get("grpo", {})
    for arm, seeds in sorted(by_arm.items()):
        if len(seeds) < 2:
            continue
        gains = [s["last"] - s["first"] for s in seeds.values()]
        m, lo, hi = t_interval(gains)
        sps = statistics.median(s["s_per_step"] for s in seeds.values() if s["s_per_step"])
        cpu = [s["cpu_per_step"] for s in seeds.values() if s["cpu_per_step"]]
        steps = min(s["steps"] for s in seeds.values())
        vs = "-"
        common = sorted(set(seeds) & set(base))
        if arm != "grpo" and len(common) >= 2:
            diffs = [
                (seeds[k]["last"] - seeds[k]["first"]) - (base[k]["last"] - base[k]["first"]) for k in common
            ]
            dm, dlo, dhi = t_interval(diffs)
            vs = f"{dm:+.3f} [{dlo:+.3f}, {dhi:+.3f}] over {len(common)} seeds"
        lines.append(
            f"| {arm} | {len(seeds)} | {steps} | {m:+.3f} [{lo:+.3f}, {hi:+.3f}] | {sps:.1f} "
            f"| {_fmt(statistics.median(cpu) if cpu else None)} | {vs} |"
        )
    return "\n".join(lines)


def write_figures(root: Path, out: Path, upto: int | None = None) -> list[Path]:
    """One PNG per metric of :data:`rapo_echo.benchmarks.plots.LONG_RUN_CURVES`, every run of ``root`` on it
    (the report's figures), named after the metric."""
    import base64

    from rapo_echo.benchmarks.plots import metric_figures

    state = load_state(root)
    runs = {
        name: [r for r in read_rows(root / name) if upto is None or r["step"] <= upto]
        for name in sorted(state["runs"])
    }
    runs = {k: v for k, v in runs.items() if v}
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for key, png in metric_figures(runs, alarms={k: replayed(root / k, v) for k, v in runs.items()}):
        path = out / f"{root.name}-{key.replace('/', '_')}.png"
        path.write_bytes(base64.b64decode(png))
        paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--root", default="runs/long", help="the study folder (run folders, logs, study.json)")
    ap.add_argument("--arms", nargs="+", default=["nll-off", "token_kl-off"])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--steps", type=int, default=300, help="steps per run")
    ap.add_argument("--chunk", type=int, default=50, help="steps per turn of a run (0: each run whole)")
    ap.add_argument(
        "--sequential", action="store_true", help="finish each run before the next (else round-robin)"
    )
    ap.add_argument("--every", type=int, default=5, help="a progress line every this many steps")
    ap.add_argument("--set", action="append", default=[], help="extra key=value for every run")
    ap.add_argument("--table", action="store_true", help="print the tables of --root and exit")
    ap.add_argument("--window", type=int, default=20, help="--table: steps of the first / last means")
    ap.add_argument("--upto", type=int, help="--table: each run as it was at this step")
    ap.add_argument(
        "--figures", metavar="DIR", help="write the curves of --root (one PNG per metric) and exit"
    )
    ap.add_argument("--python", default=sys.executable, help="the interpreter of the runs")
    ap.add_argument(
        "--snapshot", metavar="DIR", help="freeze this checkout's code into DIR and run the study with it"
    )
    args = ap.parse_args()
    if args.snapshot:
        args.python = str(snapshot(Path(args.snapshot).resolve()))
    if args.figures:
        for path in write_figures(Path(args.root), Path(args.figures), args.upto):
            print(path)
        return
    if args.table:
        print(study_tables(Path(args.root), args.window, args.upto))
        return
    run_study(args)


if __name__ == "__main__":
    main()

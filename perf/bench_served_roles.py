#!/usr/bin/env python3
"""How many latency rounds a run pays when its simulator and judge are served: each path of issue 37's table
(``train --algo rapo``, ``train --algo rlver``, ``train --algo grpo --reward echo_n1``, ``eval --benchmark
fidelity``) runs as the CLI runs it, with the default settings, against this benchmark's own fake
OpenAI-compatible server (:mod:`fake_served`: loopback only, a set latency, jitter and fault rate, every
answer format honoured, vLLM-style log-probs). The policy is the embedded model on the CPU.

Per path it prints: requests, the most in flight at once, the rounds paid (the time the server had at
least one request in flight, divided by the latency: the rounds the run waited for), the floor (the
dependent remote rounds the path needs, one setup round included; see :data:`FLOORS`), their ratio, the
wall time, the command's exit status, and the failed items the run counted (``remote/failed`` of a
training step, ``remote_failed`` of an eval summary, where the checkout reports them). JSON lines go to
``--output``.

    python perf/bench_served_roles.py                         # all paths, 1 s latency
    python perf/bench_served_roles.py --paths fidelity,rlver --fault-rate 0.25
    python perf/bench_served_roles.py --latency 2 --jitter 0.5

Floors (the review's definition, ``../shared/reviews/2026-11-27-served-roles.md``: data dependencies only,
SAGE's change label counted as its own round, plus one setup round):

* rapo (4 contexts x 4): setup, reaction message + emotion read, thought, group rank, critiques = 5;
* rlver (3 profiles x 4 dialogues, T turns): setup, then per turn analysis, change label, reply, the last
  turn without its reply (training writes no closing message) = 3 T (9 at 3 turns);
* echo_n1 (weighted, 4 contexts x 4): setup, references + need analysis + humanlike, comparison = 3;
* fidelity (3 conversations; users reaction and sage, reward humanlike): setup, then the longest
  predictor: SAGE's analysis, change label, reply = 4.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from rapo_echo.perf.fake_served import FakeServed

REPO = Path(__file__).resolve().parents[1]
PATHS = ("rapo", "rlver", "echo_n1", "fidelity")
FIDELITY_DATA = "/work/shared/data/esconv/FailedESConv.json"


def floor_rounds(path: str, turns: int) -> int:
    """The floor of a path (see the module doc)."""
    return {"rapo": 5, "rlver": 3 * turns, "echo_n1": 3, "fidelity": 4}[path]


def remote(url: str) -> dict[str, Any]:
    return {"engine": "openai", "base_url": url, "model": "default"}


def train_config(path: str, url: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(the config file under configs/, the keys this benchmark sets on top)."""
    common = {
        "train": {"max_steps": 1, "save_every": 1, "threads": args.threads},
        "logging": {"progress": False},
    }
    if path == "rapo":
        return "rapo.yaml", {
            **common,
            "simulator": remote(url),
            "judge": remote(url),
            "rollout": {"batch_size": 4, "group_size": 4, "max_new_tokens": args.policy_tokens},
        }
    if path == "rlver":
        return "rlver.yaml", {
            **common,
            "simulator": remote(url),
            "rollout": {"batch_size": 3, "group_size": 4, "max_new_tokens": args.policy_tokens},
            "rlver": {"simulator": {"max_turns": args.turns}},
        }
    return "echo_n1.yaml", {
        **common,
        "judge": remote(url),
        "rollout": {"batch_size": 4, "group_size": 4, "max_new_tokens": args.policy_tokens},
    }


def merged(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        out[k] = merged(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def command(path: str, url: str, work: Path, args: argparse.Namespace) -> list[str]:
    cli = [sys.executable, "-m", "rapo_echo.cli"]
    out = work / path
    if path == "fidelity":
        return [
            *cli, "eval", "--benchmark", "fidelity", "--data", args.fidelity_data, "--limit", "3",
            "--user", "reaction", "--user", "sage", "--reward", "humanlike",
            "--simulator", url, "--judge", url, "--max-new-tokens", "48", "--output", str(out),
        ]  # fmt: skip
    import yaml

    name, extra = train_config(path, url, args)
    cfg = merged(yaml.safe_load((REPO / "configs" / name).read_text()), extra)
    if path == "echo_n1":
        cfg["rewards"][0]["args"]["mode"] = "weighted"
    cfg_file = work / f"{path}.yaml"
    cfg_file.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return [*cli, "train", "--config", str(cfg_file), "--output", str(out)]


def failed_counts(path: str, work: Path) -> dict[str, Any]:
    """What the run itself counted: failed remote items and invalid samples (keys absent in checkouts that
    do not report them)."""
    out: dict[str, Any] = {}
    run = work / path
    if path == "fidelity":
        summary = run / "summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text())
            out["remote_failed"] = s.get("remote_failed")
            out["invalid"] = s.get("n_invalid")
            out["missing"] = {k: v for k, v in s.get("metrics", {}).items() if k.endswith("/missing")}
        return out
    metrics = run / "metrics.jsonl"
    if metrics.is_file():
        lines = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()]
        if lines:
            last = lines[-1]
            out["remote_failed"] = last.get("remote/failed")
            out["invalid"] = last.get("invalid")
    return out


def run_path(path: str, server: FakeServed, work: Path, args: argparse.Namespace) -> dict[str, Any]:
    server.reset()
    cmd = command(path, server.url, work, args)
    t0 = time.monotonic()
    env = os.environ.copy()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout, env=env)
        rc, out, err = done.returncode, done.stdout, done.stderr
    except subprocess.TimeoutExpired as exc:  # reported, and the other paths still run
        rc, out, err = "timeout", str(exc.stdout or ""), str(exc.stderr or "")
    wall = time.monotonic() - t0
    (work / f"{path}.log").write_text(out + "\n" + err)
    floor = floor_rounds(path, args.turns)
    paid = server.busy_seconds() / args.latency if args.latency > 0 else float("nan")
    return {
        "path": path,
        "requests": len(server.log),
        "max_in_flight": server.max_in_flight(),
        "rounds_paid": round(paid, 2),
        "floor_rounds": floor,
        "ratio": round(paid / floor, 2),
        "wall_s": round(wall, 1),
        "remote_busy_s": round(server.busy_seconds(), 2),
        "rc": rc,
        "faults_injected": server.faults,
        **failed_counts(path, work),
        "stderr_tail": err.strip().splitlines()[-3:] if rc != 0 else [],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--paths", default=",".join(PATHS), help=f"comma-separated, of {', '.join(PATHS)}")
    ap.add_argument("--latency", type=float, default=1.0, help="seconds per request")
    ap.add_argument("--jitter", type=float, default=0.0, help="uniform +- seconds on each request's latency")
    ap.add_argument("--fault-rate", type=float, default=0.0, help="share of chat requests that fail")
    ap.add_argument("--fault-status", type=int, default=500, help="the failing requests' HTTP status")
    ap.add_argument("--retry-after", type=float, default=1.0, help="Retry-After seconds on 429 / 503")
    ap.add_argument("--turns", type=int, default=3, help="rlver: turns per dialogue")
    ap.add_argument("--policy-tokens", type=int, default=16, help="the policy's reply length (local time)")
    ap.add_argument("--fidelity-data", default=FIDELITY_DATA)
    ap.add_argument("--timeout", type=float, default=3 * 3600.0, help="seconds per path")
    ap.add_argument("--threads", type=int, default=1, help="training paths: torch threads (train.threads)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--output", help="JSON lines file (default: stdout only)")
    args = ap.parse_args()
    paths = [p.strip() for p in args.paths.split(",") if p.strip()]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        ap.error(f"unknown paths {unknown}; choose from {', '.join(PATHS)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-served-") as tmp, FakeServed(
        args.latency, args.jitter, args.fault_rate, args.fault_status, args.retry_after, args.seed
    ) as server:
        work = Path(tmp)
        for path in paths:
            row = run_path(path, server, work, args)
            rows.append(row)
            print(json.dumps(row), flush=True)
            if args.output:
                with open(args.output, "a", encoding="utf-8") as f:
                    f.write(json.dumps({**row, "latency": args.latency, "jitter": args.jitter,
                                        "fault_rate": args.fault_rate}) + "\n")  # fmt: skip
    print(
        "\n| path | requests | most in flight | rounds paid | floor | paid / floor | wall s | rc "
        "| failed items |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        failed = r.get("remote_failed")
        print(
            f"| {r['path']} | {r['requests']} | {r['max_in_flight']} | {r['rounds_paid']:.1f} | "
            f"{r['floor_rounds']} | {r['ratio']:.2f} | {r['wall_s']:.0f} | {r['rc']} | "
            f"{'-' if failed is None else failed} |"
        )


if __name__ == "__main__":
    main()

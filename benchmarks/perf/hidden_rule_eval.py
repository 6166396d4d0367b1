#!/usr/bin/env python3
"""Does what a policy learnt from the hidden-preference user carry over to contexts it never trained on?

Scores the policy replies of finished evaluations (``rapo-echo eval --benchmark esconv-ref``, or any
benchmark whose ``results.jsonl`` rows keep the reply in ``info.reply``) with the hidden-preference
user's rules: per evaluation folder one JSON line with the mean hidden-rule score (the default rules,
or ``--rules FILE``: a YAML list of rules as in ``rapo.simulator.args.rules``), the share of replies
that repeat a run of four words (``repeats_itself``) and the mean reply length in words.

    python benchmarks/perf/hidden_rule_eval.py evals/ref-default evals/ref-quickstart
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.results import RESULTS_FILE, read_records
from rapo_echo.simulators.hidden_preference import HiddenPreferenceUser, repeats_itself


def replies_of(folder: Path) -> list[str]:
    """The valid policy replies of one evaluation folder's ``results.jsonl``."""
    rows = read_records(folder / RESULTS_FILE)
    return [str(r["info"]["reply"]) for r in rows if r.get("valid") and "reply" in (r.get("info") or {})]


def score_folder(folder: Path, user: HiddenPreferenceUser) -> dict[str, Any]:
    """The hidden-rule score, repeat share and length of one evaluation's replies."""
    replies = replies_of(folder)
    if not replies:
        raise SystemExit(f"{folder / RESULTS_FILE}: no valid row with info.reply")
    return {
        "eval": str(folder),
        "replies": len(replies),
        "hidden_rule_score": round(statistics.fmean(map(user.hidden_rule_score, replies)), 4),
        "repeats_itself": round(sum(map(repeats_itself, replies)) / len(replies), 4),
        "words": round(statistics.fmean(len(r.split()) for r in replies), 2),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evals", nargs="+", type=Path, help="evaluation output folders")
    ap.add_argument("--rules", type=Path, help="a YAML list of rules (default: the built-in rules)")
    args = ap.parse_args(argv)
    rules = None
    if args.rules:
        import yaml

        rules = yaml.safe_load(args.rules.read_text())
    user = HiddenPreferenceUser(rules=rules)
    for folder in args.evals:
        print(json.dumps(score_folder(folder, user)), flush=True)


if __name__ == "__main__":
    main()

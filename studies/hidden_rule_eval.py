#!/usr/bin/env python3
"""Does what a policy learnt from the hidden-preference user carry over to contexts it never trained on?

Scores the policy replies of finished evaluations (``rapo-echo eval --benchmark esconv-ref``, or any
benchmark whose ``results.jsonl`` rows keep the reply in ``info.reply``) with the hidden-preference
user's rules: per evaluation folder one JSON line with the mean hidden-rule score (the default rules,
or ``--rules FILE``: a YAML list of rules as in ``rapo.simulator.args.rules``; ``--extra-rules FILE``
adds rules as ``extra_rules`` does; ``--config FILE``: the rules of a training config's hidden-preference
user, e.g. ``configs/quickstart.yaml``), the share of replies that repeat a run of four words
(``repeats_itself``), the share that take up a word of the seeker's last message
(``picks_up_details``), the share that copy five of its words in a row (``parrots``), the share that
tell the seeker's message back (``restates``: two content words theirs, half of all words), the
share that talk about the text or the task instead of to the person (``meta_talk``) and the mean reply
length in words. Each reply is scored with the seeker's last message only: a rule that reads the
supporter's earlier turns (``repeats_earlier``) never fires here.

    python studies/hidden_rule_eval.py evals/ref-default evals/ref-quickstart
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from rapo_echo.benchmarks.results import RESULTS_FILE, read_records
from rapo_echo.simulators.hidden_preference import (
    HiddenPreferenceUser,
    meta_talk,
    parrots,
    picks_up_details,
    repeats_itself,
    restates,
)

PERSON_ROLES = ("seeker", "user")


def replies_of(folder: Path) -> list[tuple[str, str]]:
    """The valid policy replies of one evaluation folder's ``results.jsonl``, each with what the person
    said last before it (the last seeker / user turn of its transcript, '' when there is none)."""
    rows = read_records(folder / RESULTS_FILE)
    out = []
    for r in rows:
        if r.get("valid") and "reply" in (r.get("info") or {}):
            turns = r.get("transcript") or []
            said = [str(m.get("content", "")) for m in turns if m.get("role") in PERSON_ROLES]
            out.append((str(r["info"]["reply"]), said[-1] if said else ""))
    return out


def score_folder(folder: Path, user: HiddenPreferenceUser) -> dict[str, Any]:
    """The hidden-rule score, repeat and pick-up shares and length of one evaluation's replies."""
    pairs = replies_of(folder)
    if not pairs:
        raise SystemExit(f"{folder / RESULTS_FILE}: no valid row with info.reply")
    n = len(pairs)
    return {
        "eval": str(folder),
        "replies": n,
        "hidden_rule_score": round(statistics.fmean(user.hidden_rule_score(r, h) for r, h in pairs), 4),
        "repeats_itself": round(sum(repeats_itself(r) for r, _ in pairs) / n, 4),
        "picks_up_details": round(sum(picks_up_details(r, h) for r, h in pairs) / n, 4),
        "parrots": round(sum(parrots(r, h) for r, h in pairs) / n, 4),
        "restates": round(sum(restates(r, h) for r, h in pairs) / n, 4),
        "meta_talk": round(sum(meta_talk(r) for r, _ in pairs) / n, 4),
        "words": round(statistics.fmean(len(r.split()) for r, _ in pairs), 2),
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("evals", nargs="+", type=Path, help="evaluation output folders")
    ap.add_argument("--rules", type=Path, help="a YAML list of rules (default: the built-in rules)")
    ap.add_argument("--extra-rules", type=Path, help="a YAML list of rules added to them (as extra_rules)")
    ap.add_argument("--config", type=Path, help="score by a training config's hidden-preference user")
    args = ap.parse_args(argv)
    if args.config:
        if args.rules or args.extra_rules:
            ap.error("--config takes the rules from the config: leave out --rules / --extra-rules")
        from rapo_echo.simulators.base import build_simulator
        from rapo_echo.training.run_config import load_config

        sim = load_config(args.config).rapo.simulator
        user = build_simulator(sim.name, sim.args)
        if not isinstance(user, HiddenPreferenceUser):
            ap.error(f"{args.config}: rapo.simulator.name is {sim.name!r}, not a hidden-preference user")
    else:
        from rapo_echo.config.yaml_files import load_yaml_text

        rules = load_yaml_text(args.rules.read_text(), str(args.rules)) if args.rules else None
        extra = (
            load_yaml_text(args.extra_rules.read_text(), str(args.extra_rules)) if args.extra_rules else []
        )
        user = HiddenPreferenceUser(rules=rules, extra_rules=extra)
    for folder in args.evals:
        print(json.dumps(score_folder(folder, user)), flush=True)


if __name__ == "__main__":
    main()

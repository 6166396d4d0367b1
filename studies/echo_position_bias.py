"""Position bias of an empathy judge: every example of an empathy example file is judged in both orders
(candidate as ``Reply A``, then as ``Reply B``); prints one JSON line with how often each label won and
the mean label probabilities. An unbiased judge's label counts do not depend on the order.

    python studies/echo_position_bias.py --judge default
"""

from __future__ import annotations

import argparse
import collections
import json
import statistics

from rapo_echo.data import bundled_file
from rapo_echo.engines.hf import HFEngine
from rapo_echo.judges.empathy import EmpathyJudge
from rapo_echo.judges.training_data import load_examples
from rapo_echo.models import resolve
from rapo_echo.types import Scenario


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--judge", default="default", help="judge model spec")
    parser.add_argument(
        "--data", default=str(bundled_file("judge_empathy_en.jsonl")), help="empathy examples"
    )
    args = parser.parse_args()
    engine = HFEngine.from_spec(resolve(args.judge).path, device="cpu")
    judge = EmpathyJudge(engine)
    examples = [e for e in load_examples([args.data]) if e.task == "empathy"]
    items = []
    for e in examples:
        scenario = Scenario("example", e.messages)
        items += [(scenario, e.needs, e.reply, e.reference), (scenario, e.needs, e.reference, e.reply)]
    verdicts = [v for v in judge.compare(items) if v.probs is not None]
    labels = judge.labels
    print(
        json.dumps(
            {
                "judge": args.judge,
                "presentations": len(items),
                "label_counts": dict(collections.Counter(v.label for v in verdicts)),
                "mean_probs": {k: round(statistics.fmean(v.probs[k] for v in verdicts), 4) for k in labels},  # type: ignore[index]  # log-prob verdicts have probs
            }
        )
    )


if __name__ == "__main__":
    main()

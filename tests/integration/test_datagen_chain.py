"""Echo-N1's data chain on the embedded model, at the smallest sizes (docs/algorithms/echo_n1.md, "Data
pipelines"): contexts -> ``data critique-rewrite`` -> ``train-judge`` -> ``data references`` ->
``data hard-prompts`` -> ``train --reward echo_n1``, each stage reading the previous one's file as it is.
Its figures mean nothing: the 135M grader gives every reply the same grade, so Critique-Rewrite runs with
``--min-gap 0`` and open thresholds (every rewrite against its original), references take the closest
grade, and hard prompts keep every scored prompt. The test proves the files connect."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from rapo_echo.cli import main
from rapo_echo.datagen.contexts import load_contexts

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TINY = shlex.split("--no-progress --max-new-tokens 8 --seed 0")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_chain_connects(tmp_path: Path) -> None:
    cr, judge, refs, hard, run = (tmp_path / n for n in ("cr", "judge", "refs", "hard", "run"))
    # 1. Critique-Rewrite on two bundled contexts, one candidate each, every rewrite against its original
    flags = shlex.split(
        "--limit 2 --select all --safety off --candidates 1 --rounds 1 --rewrite-max 5 --golden-min 1 "
        "--low-max 5 --min-gap 0 --pairing own --grade-tokens 4"
    )
    args = ["data", "critique-rewrite", *flags, "--output", str(cr), *TINY]
    assert main(args) == 0
    summary = json.loads((cr / "summary.json").read_text())
    records = _rows(cr / "results.jsonl")
    ids = [sc.id for sc in load_contexts(None, limit=2)]
    assert summary["complete"] and [r["id"] for r in records] == ids
    graded = [v["score"] for r in records for c in r["candidates"] for v in c["versions"]]
    assert all(s in (1, 2, 3, 4, 5) for s in graded), graded
    pairs = _rows(cr / "pairs.jsonl")
    assert pairs, f"no rewrite survived (grades {graded}): {records}"
    assert all(p["task"] == "empathy" and p["label"] == "win" for p in pairs)
    # a resume does nothing more; a changed switch is refused before any model loads
    assert main(args) == 0 and _rows(cr / "results.jsonl") == records
    assert main([*args, "--rounds", "2"]) == 2

    # 2. train-judge on the pairs (one step); the trained judge is a model folder
    train_judge = shlex.split("--max-steps 1 --batch-size 2 --no-reasoning --device cpu --eval-fraction 0.5")
    assert main(["train-judge", "--data", str(cr / "pairs.jsonl"), "--output", str(judge), *train_judge]) == 0
    assert (judge / "judge_training.json").is_file()

    # 3. references graded by the trained judge; closest: a 135M grader may never say 3
    flags = shlex.split("--limit 2 --candidates 1 --rounds 1 --fallback closest --grade-tokens 4")
    assert main(["data", "references", *flags, "--judge", str(judge), "--output", str(refs), *TINY]) == 0
    scenarios = _rows(refs / "scenarios.jsonl")
    assert len(scenarios) == 2 and all(s["reference"] and s["meta"]["reference_score"] for s in scenarios)

    # 4. hard prompts: threshold 1 keeps every scored prompt (the file must feed the run)
    flags = ["--n", "2", "--threshold", "1.0", "--reward-args", '{"needs": false}']
    data = ["--data", str(refs / "scenarios.jsonl"), "--judge", str(judge)]
    assert main(["data", "hard-prompts", *data, *flags, "--output", str(hard), *TINY]) == 0
    prompts = _rows(hard / "prompts.jsonl")
    assert [p["id"] for p in prompts] == [s["id"] for s in scenarios]
    assert [p["reference"] for p in prompts] == [s["reference"] for s in scenarios]

    # 5. one GRPO step with echo_n1, the trained judge against those references
    sets = [
        f"data.path={hard / 'prompts.jsonl'}",
        "judge.engine=hf",
        f"judge.model={judge}",
        "rollout.batch_size=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=8",
        "logging.tensorboard=false",
        "logging.progress=false",
        "train.save_every=1",
        "rewards=[{name: echo_n1, args: {empathy: {needs: false, injection_probe: 0}}}]",
    ]
    train = ["train", "--algo", "grpo", "--max-steps", "1", "--output", str(run)]
    assert main([*train, *(x for s in sets for x in ("--set", s))]) == 0
    samples = _rows(run / "samples.jsonl")
    assert {s["info"]["echo_n1"]["reference_source"] for s in samples} == {"scenario"}

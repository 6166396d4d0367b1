"""``rapo-echo train --algo sft`` and ``--algo grpo --reward scalar_rm`` on the embedded model, two steps
each through the command line, with few tokens."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapo_echo.cli import main
from tests.helpers.runs import metrics

pytestmark = pytest.mark.integration

QUIET = [
    "logging.progress=false",
    "logging.tensorboard=false",
    "rollout.batch_size=2",
    "model.lora.enabled=true",
]

ROWS = [
    {"messages": [{"role": "user", "content": "I failed my exam."}], "reference": "I'm sorry, that hurts."},
    {"messages": [{"role": "user", "content": "My cat is ill."}], "reference": "Oh no, poor thing."},
]


def train(*argv: str, sets: list[str]) -> int:
    args = ["train", *argv]
    for s in sets:
        args += ["--set", s]
    return main(args)


def test_sft_two_steps_lower_the_loss(tmp_path: Path) -> None:
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    run = tmp_path / "run"
    sets = [*QUIET, f"data.path={data}", "rollout.max_new_tokens=8", "train.lr=2e-3", "data.shuffle=false"]
    assert train("--algo", "sft", "--max-steps", "2", "--output", str(run), sets=sets) == 0
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2] and all(r["sft/rows"] == 2 for r in rows)
    # the same two rows both steps: one update on them lowers their loss
    assert rows[1]["loss/nll"] < rows[0]["loss/nll"], [r["loss/nll"] for r in rows]
    assert (run / "final" / "config.json").is_file()  # the merged model


def test_grpo_with_a_scalar_reward_model(tmp_path: Path, smol_path: str) -> None:
    run = tmp_path / "run"
    rm = f"rewards=[{{name: scalar_rm, args: {{model: '{smol_path}', device: cpu, batch_size: 2}}}}]"
    sets = [*QUIET, rm, "rollout.group_size=2", "rollout.max_new_tokens=4"]
    assert train("--algo", "grpo", "--max-steps", "2", "--output", str(run), sets=sets) == 0
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2]
    scores = [
        json.loads(line)["rewards"]["scalar_rm"] for line in (run / "samples.jsonl").read_text().splitlines()
    ]
    assert len(scores) == 8 and all(0.0 < s < 1.0 for s in scores)  # sigmoid of the head's logits
    assert (run / "final").is_dir()

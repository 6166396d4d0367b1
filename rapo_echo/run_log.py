"""What a training run logs besides its metrics: the samples of every process into ``samples.jsonl``, and
Weights & Biases (the config, the metrics, and the samples as a table).

Each process samples its own contexts, so ``samples.jsonl`` gathers the records of every rank (each with
its ``rank``) onto the main process, which writes them; the gather is a collective, so every rank calls
:func:`gather_samples` on the same steps. ``logging.wandb`` sends the run's config (secrets redacted, as in
``config.yaml``) with ``wandb.init``, every step's metrics, and on sample steps a ``samples`` table
(``wandb.Table``) of the step's replies across ranks.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rapo_echo.config import redacted

# the columns of the wandb samples table (a samples.jsonl record holds more: the full prompt and info)
TABLE_COLUMNS = ("step", "rank", "scenario", "group", "context", "reply", "reward", "advantage", "critique")


def sample_records(samples: Sequence[Any], step: int, rank: int) -> list[dict[str, Any]]:
    """One ``samples.jsonl`` record per sample of this process's rollout."""
    return [
        {
            "step": step,
            "rank": rank,
            "scenario": s.scenario.id,
            "group": s.group,
            "prompt": s.scenario.messages,
            "reply": s.text,
            "reward": s.reward,
            "rewards": s.rewards,
            "advantage": s.info.get("advantage"),
            "critique": s.critique,
            "finish_reason": s.finish_reason,
            "info": {k: v for k, v in s.info.items() if k != "advantage"},
        }
        for s in samples
    ]


def gather_samples(records: list[dict[str, Any]], accelerator: Any) -> list[dict[str, Any]]:
    """Every rank's records, rank by rank, on every process (one object gather; a collective)."""
    if accelerator.num_processes == 1:
        return records
    from accelerate.utils import gather_object

    return [r for part in gather_object([records]) for r in part]


class WandbLog:
    """A Weights & Biases run: the config at start, metrics each step, samples as a table."""

    def __init__(self, project: str, run_dir: str | Path, config: dict[str, Any], resume: bool) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=project,
            dir=str(run_dir),
            name=Path(run_dir).name,
            resume="allow" if resume else None,
            config=json.loads(json.dumps(redacted(config), default=str)),
        )

    def metrics(self, record: dict[str, Any], step: int) -> None:
        self.run.log(record, step=step)

    def samples(self, records: list[dict[str, Any]], step: int) -> None:
        """The step's samples as a ``samples`` table (the context is the last user message)."""
        rows = []
        for r in records:
            users = [m["content"] for m in r["prompt"] if m.get("role") == "user"]
            context = users[-1] if users else ""
            rows.append([r["step"], r["rank"], r["scenario"], r["group"], context, r["reply"], r["reward"],
                         r["advantage"], r["critique"] or ""])  # fmt: skip
        self.run.log({"samples": self.wandb.Table(columns=list(TABLE_COLUMNS), data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()

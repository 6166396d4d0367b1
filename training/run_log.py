"""What a run writes as it goes (docs/run-directory.md): its resolved config, ``metrics.jsonl`` (one
line per step), ``samples.jsonl`` (every ``logging.samples_every`` steps), the step hooks' records
(``hooks/<name>.jsonl``), TensorBoard and Weights & Biases, and the progress bar. A write that fails (a
full disk) names the way on: free space, then resume from the last checkpoint.

The main process writes. Each process samples its own contexts, so ``samples.jsonl`` gathers the records
of every rank (each with its ``rank``) onto the main process; the gather is a collective, so every rank
calls :meth:`RunLog.samples` on the same steps. ``logging.wandb`` sends the run's config (secrets redacted,
as in ``config.yaml``) with ``wandb.init``, every step's metrics, and on sample steps a ``samples`` table
(``wandb.Table``) of the step's replies across ranks."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapo_echo import progress
from rapo_echo.atomic import write_text_atomic
from rapo_echo.checkpoint import latest_checkpoint
from rapo_echo.config import dump_config, redacted
from rapo_echo.jsonl import append_jsonl, keep_jsonl
from rapo_echo.scrub import scrub_data

if TYPE_CHECKING:
    from rapo_echo.algorithms.base import Rollout

    from .run_config import RunConfig

# the columns of the wandb samples table (a samples.jsonl record holds more: the full prompt and info)
TABLE_COLUMNS = ("step", "rank", "scenario", "group", "context", "reply", "reward", "advantage", "critique")


class RunLog:
    """The run's logs in ``run_dir``; every method but :meth:`samples` (a collective) does nothing on a
    process other than the main one. ``accelerator``: the run's (its rank and the gather of samples)."""

    def __init__(self, cfg: RunConfig, run_dir: Path, accelerator: Any, resume: bool = False) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.accelerator = accelerator
        self.is_main = accelerator.is_main_process
        self.resume = resume
        self.metrics_file = run_dir / "metrics.jsonl"
        self.samples_file = run_dir / "samples.jsonl"
        self.hooks_dir = run_dir / "hooks"  # a step hook's records: hooks/<name>.jsonl
        self.tb: Any = None
        self.wandb: WandbLog | None = None

    def open(self, resolved: dict[str, Any]) -> None:
        """Write ``config.yaml`` and ``resolved.json`` (what the ``auto`` settings became) and open the
        metric sinks."""
        if not self.is_main:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(self.cfg, self.run_dir / "config.yaml")
        write_text_atomic(self.run_dir / "resolved.json", json.dumps(resolved, indent=2) + "\n")
        if self.cfg.logging.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(self.run_dir / "tensorboard"))
        if self.cfg.logging.wandb:
            config = self.cfg.model_dump(mode="json")
            self.wandb = WandbLog(self.cfg.logging.wandb_project, self.run_dir, config, self.resume)

    def resumed_at(self, step: int) -> None:
        """Drop the lines written after the checkpoint a run resumes from (they will be written again)."""
        if self.is_main:
            for f in (self.metrics_file, self.samples_file, *sorted(self.hooks_dir.glob("*.jsonl"))):
                keep_jsonl(f, lambda r: not isinstance(r, dict) or r.get("step", 0) <= step)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """One step's metrics line (non-finite numbers as null), and the same to TensorBoard and W&B."""
        if not self.is_main:
            return
        record = {"step": step, **{k: _num(v) for k, v in metrics.items()}}
        append_jsonl(self.metrics_file, [record], fix=self._write_fix())
        self.scalars(step, metrics)
        if self.wandb is not None:
            self.wandb.metrics(record, step)

    def scalars(self, step: int, metrics: dict[str, float]) -> None:
        """Finite numbers to TensorBoard (e.g. a validation's ``val/*``)."""
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def samples(self, step: int, rollout: Rollout) -> None:
        """Step ``step``'s samples of every rank (prompt, reply, rewards, advantage, critique, the
        algorithm's info) into ``samples.jsonl`` and the wandb table, every ``logging.samples_every``
        steps; a collective on those steps: every rank calls it."""
        if step % self.cfg.logging.samples_every:
            return
        mine = sample_records(rollout.samples, step, self.accelerator.process_index)
        records = gather_samples(mine, self.accelerator)
        if not self.is_main:
            return
        append_jsonl(self.samples_file, records, fix=self._write_fix())
        if self.wandb is not None:
            self.wandb.samples(records, step)

    def records(self, name: str, step: int, rows: Sequence[dict[str, Any]]) -> None:
        """A step hook's records of step ``step`` into ``hooks/<name>.jsonl``, each with the step."""
        if not (self.is_main and rows):
            return
        self.hooks_dir.mkdir(exist_ok=True)
        append_jsonl(
            self.hooks_dir / f"{name}.jsonl", [{"step": step, **r} for r in rows], fix=self._write_fix()
        )

    def progress(self, initial: int) -> progress.Task | None:
        """The run's bar over its steps (None: off, or not the main process); engine calls nest their own
        bars under it (:mod:`rapo_echo.progress`)."""
        if not (self.is_main and self.cfg.logging.progress):
            return None
        progress.enable()
        return progress.start(self.cfg.algo, total=self.cfg.train.max_steps, initial=initial, unit="step")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
        if self.wandb is not None:
            self.wandb.close()

    def _write_fix(self) -> str:
        ckpt = latest_checkpoint(self.run_dir)
        return (
            f"Free space, then continue with: rapo-echo train --resume {self.run_dir} "
            f"(last checkpoint: {ckpt or 'none yet'})"
        )


def _num(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


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
        self.run.log(scrub_data(record), step=step)

    def samples(self, records: list[dict[str, Any]], step: int) -> None:
        """The step's samples as a ``samples`` table (the context is the last user message)."""
        rows = []
        for r in records:
            users = [m["content"] for m in r["prompt"] if m.get("role") == "user"]
            context = users[-1] if users else ""
            rows.append([r["step"], r["rank"], r["scenario"], r["group"], context, r["reply"], r["reward"],
                         r["advantage"], r["critique"] or ""])  # fmt: skip
        table = self.wandb.Table(columns=list(TABLE_COLUMNS), data=scrub_data(rows))  # as samples.jsonl
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()

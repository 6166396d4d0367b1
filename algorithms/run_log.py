"""What a run writes as it goes (main process only; docs/run-directory.md): its resolved config,
``metrics.jsonl`` (one line per step), ``samples.jsonl`` (every ``logging.samples_every`` steps),
TensorBoard and Weights & Biases, and the progress bar. A write that fails (a full disk) names the way
on: free space, then resume from the last checkpoint."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rapo_echo.atomic import write_text_atomic
from rapo_echo.checkpoint import latest_checkpoint
from rapo_echo.config import dump_config
from rapo_echo.jsonl import append_jsonl, keep_jsonl

if TYPE_CHECKING:
    from .base import Rollout
    from .run_config import RunConfig


class RunLog:
    """The run's logs in ``run_dir``; every method does nothing on a process other than the main one."""

    def __init__(self, cfg: RunConfig, run_dir: Path, is_main: bool) -> None:
        self.cfg = cfg
        self.run_dir = run_dir
        self.is_main = is_main
        self.metrics_file = run_dir / "metrics.jsonl"
        self.samples_file = run_dir / "samples.jsonl"
        self.tb: Any = None

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
            import wandb

            wandb.init(
                project=self.cfg.logging.wandb_project,
                dir=str(self.run_dir),
                resume="allow",
                config=json.loads(json.dumps(self.cfg.model_dump(mode="json"))),
            )

    def resumed_at(self, step: int) -> None:
        """Drop the lines written after the checkpoint a run resumes from (they will be written again)."""
        if self.is_main:
            for f in (self.metrics_file, self.samples_file):
                keep_jsonl(f, lambda r: not isinstance(r, dict) or r.get("step", 0) <= step)

    def step(self, step: int, metrics: dict[str, float]) -> None:
        """One step's metrics line (non-finite numbers as null), and the same to TensorBoard and W&B."""
        if not self.is_main:
            return
        record = {"step": step, **{k: _num(v) for k, v in metrics.items()}}
        append_jsonl(self.metrics_file, [record], fix=self._write_fix())
        self.scalars(step, metrics)
        if self.cfg.logging.wandb:
            import wandb

            wandb.log(record, step=step)

    def scalars(self, step: int, metrics: dict[str, float]) -> None:
        """Finite numbers to TensorBoard (e.g. a validation's ``val/*``)."""
        if self.tb is not None:
            for k, v in metrics.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    self.tb.add_scalar(k, v, step)

    def samples(self, step: int, rollout: Rollout) -> None:
        """Step ``step``'s samples (prompt, reply, rewards, advantage, critique, the algorithm's info),
        every ``logging.samples_every`` steps."""
        if not self.is_main or step % self.cfg.logging.samples_every:
            return
        records = [
            {
                "step": step,
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
            for s in rollout.samples
        ]
        append_jsonl(self.samples_file, records, fix=self._write_fix())

    def progress(self, initial: int) -> Any:
        """A progress bar over the run's steps (None: off, or not the main process)."""
        if not (self.is_main and self.cfg.logging.progress):
            return None
        from tqdm.auto import tqdm

        return tqdm(total=self.cfg.train.max_steps, initial=initial, desc=f"{self.cfg.algo}", unit="step")

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()

    def _write_fix(self) -> str:
        ckpt = latest_checkpoint(self.run_dir)
        return (
            f"Free space, then continue with: rapo-echo train --resume {self.run_dir} "
            f"(last checkpoint: {ckpt or 'none yet'})"
        )


def _num(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v

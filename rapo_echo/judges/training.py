"""``rapo-echo train-judge``: supervised fine-tuning (LoRA or full) of a generative judge on reasoning +
verdict examples (:mod:`rapo_echo.judges.training_data`), with the held-out accuracy before and after.

The judge learns exactly the prompts it sees at training time of the policy (the humanlike and
empathy judges' own prompt builders, with fresh fence markers per example), and the answer lines it
must write. Accuracy is measured the way the reward reads the judge: the label with the highest
probability after ``Verdict:`` (or the parsed verdict for an engine without log-probs); a verdict that
cannot be read counts as wrong and is reported as invalid. The output folder is a plain Hugging Face
model (LoRA merged) that ``--judge`` / ``judge.model`` accept, plus ``judge_training.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import shutil
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field

from rapo_echo import progress
from rapo_echo.config import Device, Flag, Strict, add_flags, section_from_args
from rapo_echo.errors import ConfigError
from rapo_echo.judges.training_data import (
    NEGATIVES,
    TASKS,
    JudgePair,
    dedupe,
    load_examples,
    negatives,
    pairs,
    split,
)
from rapo_echo.rundir import DirLock, check_writable, held_files

log = logging.getLogger(__name__)
REPORT = "judge_training.json"


class JudgeTrainingConfig(Strict):
    """`rapo-echo train-judge`: one judge-training run."""

    data: Annotated[list[str], Flag(metavar="FILE")] = Field(
        min_length=1, description="Examples (JSONL); repeatable."
    )
    output: str = Field(description="Folder for the trained judge (must not exist or be empty).")
    model: str = Field("default", description="The judge to start from (a model spec).")
    eval_data: Annotated[list[str], Flag(metavar="FILE")] = Field(
        default_factory=list, description="Held-out examples (unset: a split of `data`); repeatable."
    )
    eval_fraction: float = Field(0.25, gt=0.0, lt=1.0, description="Held-out share of each task.")
    task: Literal[TASKS] | None = Field(None, description="The task of rows that name none.")  # type: ignore[valid-type]  # TASKS is a tuple of names
    lora: Annotated[bool, Flag(off="--full")] = Field(True, description="LoRA (`--full`: full fine-tuning).")
    lora_r: int = Field(16, ge=1, description="LoRA rank.")
    lr: float = Field(2e-4, gt=0.0, le=1.0, description="Learning rate (AdamW).")
    epochs: int = Field(3, ge=1, description="Passes over the examples.")
    max_steps: int | None = Field(None, ge=1, description="Optimizer steps (overrides `epochs`).")
    batch_size: int = Field(8, ge=1, description="Sequences per optimizer step.")
    micro_batch_size: int = Field(2, ge=1, description="Sequences per forward (memory).")
    negatives: Annotated[list[Literal[NEGATIVES]], Flag(sep=",")] = Field(  # type: ignore[valid-type]  # NEGATIVES is a tuple of names
        default_factory=lambda: list(NEGATIVES),
        description="Humanlike negatives: shuffle,swap (`none`: no negatives).",
    )
    reasoning: bool = Field(True, description="Train the Reasoning: line before the verdict.")
    context_aware: Annotated[bool, Flag(off="--context-free")] = Field(
        True, description="Train a context-aware humanlike judge (`--context-free`: without the context)."
    )
    seed: int = Field(0, ge=0, description="Seed of the split, the negatives and the order.")
    max_tokens: int = Field(1024, ge=1, description="Skip examples longer than this.")
    eval_tokens: int = Field(48, ge=1, description="Tokens of a held-out verdict.")
    device: Device = Field("auto", description="`auto`, `cpu`, `cuda`, `cuda:N` or `mps`.")


def accuracy(
    engine: Any, items: Sequence[JudgePair], *, reasoning: bool, max_new_tokens: int
) -> dict[str, Any]:
    """Held-out accuracy per task: the judge's verdict (label probabilities where the engine has them)
    against the gold label; invalid verdicts count as wrong."""
    from rapo_echo.judges.verdict import decide

    out: dict[str, Any] = {}
    for task in sorted({p.task for p in items if p.gold is not None}):
        rows = [p for p in items if p.task == task and p.gold is not None]
        verdicts = decide(
            engine,
            [p.prompt for p in rows],
            list(rows[0].labels),
            reasoning=reasoning,
            max_new_tokens=max_new_tokens,
        )
        right = sum(1 for p, v in zip(rows, verdicts) if v.label == p.gold)
        out[task] = {
            "accuracy": right / len(rows),
            "n": len(rows),
            "invalid": sum(1 for v in verdicts if not v.valid),
        }
    return out


def train_judge(cfg: JudgeTrainingConfig) -> dict[str, Any]:
    """Run the whole thing; returns the report written next to the model."""
    check_settings(cfg)
    with claim_output(Path(cfg.output)) as lock:
        return _train_judge(cfg, lock.folder)


def check_settings(cfg: JudgeTrainingConfig) -> None:
    """Refuse a device absent here before any model loads (the section checks the rest)."""
    from rapo_echo.config import check_device

    try:
        check_device(cfg.device, "--device")
    except ConfigError as exc:
        raise ConfigError(str(exc).removeprefix("invalid config:\n  ")) from None


def claim_output(out: Path) -> DirLock:
    """The output folder, writable, locked (one run at a time) and empty but for the lock file; errors
    name --output and what to do."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--output {out} is a file; give a folder for the trained judge")
    lock = DirLock(check_writable(out)).acquire()
    shown = held_files(out)
    if shown:
        lock.release()
        raise ConfigError(f"--output {out} is not empty ({shown}); pick another folder")
    return lock


def _train_judge(cfg: JudgeTrainingConfig, out: Path) -> dict[str, Any]:
    import torch

    from rapo_echo.config import LoraConfig, ModelConfig, RolloutConfig
    from rapo_echo.policy import Policy

    examples = load_examples(cfg.data, cfg.task)
    if not examples:
        raise ConfigError(f"--data {', '.join(cfg.data)}: no examples")
    examples, removed = dedupe(examples)
    if cfg.eval_data:
        train = examples
        held, removed_held = dedupe(load_examples(cfg.eval_data, cfg.task), seen=train)
        removed += removed_held
    else:
        train, held = split(examples, cfg.eval_fraction, cfg.seed)
    if removed:
        log.warning(
            "train-judge: %d repeated examples removed (identical to one kept, or held-out examples "
            "identical to training ones), so none is both trained on and held out",
            removed,
        )
    kinds = tuple(cfg.negatives) if cfg.context_aware else ()
    train = train + negatives(train, kinds, cfg.seed)
    held = held + negatives(held, kinds, cfg.seed + 1)
    rng = random.Random(cfg.seed)
    opts = {"reasoning": cfg.reasoning, "context_aware": cfg.context_aware, "rng": rng}
    train_pairs = [p for e in train for p in pairs(e, **opts)]
    held_pairs = [p for e in held for p in pairs(e, **opts)]

    torch.manual_seed(cfg.seed)
    lora = LoraConfig(enabled=cfg.lora, r=cfg.lora_r, alpha=2.0 * cfg.lora_r)
    policy = Policy(
        ModelConfig(name=cfg.model, lora=lora),
        RolloutConfig(max_prompt_tokens=cfg.max_tokens),
        need_reference=False,
        device=None if cfg.device == "auto" else cfg.device,
    )
    t0 = time.perf_counter()

    def held_out(when: str) -> dict[str, Any]:
        with progress.task(f"held-out accuracy {when} training"):
            kw = {"reasoning": cfg.reasoning, "max_new_tokens": cfg.eval_tokens}
            return accuracy(policy.engine, held_pairs, **kw) if held_pairs else {}

    before = held_out("before")
    encoded, skipped = _encode(policy, train_pairs, cfg.max_tokens)
    if not encoded:
        raise ConfigError(f"no training example fits --max-tokens {cfg.max_tokens}")
    losses = _sft(policy, encoded, cfg)
    after = held_out("after")
    report = {
        "model": cfg.model,
        "examples": {"train": len(train), "held_out": len(held), "duplicates_removed": removed},
        "negatives": {
            kind: {
                "train": sum(e.origin == kind for e in train),
                "held_out": sum(e.origin == kind for e in held),
            }
            for kind in NEGATIVES
        },
        "pairs": {"train": len(encoded), "held_out": len(held_pairs), "skipped_too_long": skipped},
        "steps": len(losses),
        "loss": {"first": losses[0], "last": losses[-1]} if losses else None,
        "held_out_accuracy": {"before": before, "after": after},
        "seconds": round(time.perf_counter() - t0, 1),
        "config": cfg.model_dump(exclude={"output"}),
    }
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        policy.save(staged, merged=True)
        (staged / REPORT).write_text(json.dumps(report, indent=2) + "\n")
        for item in sorted(staged.iterdir(), key=lambda p: p.name == REPORT):  # the report last
            item.rename(out / item.name)
    finally:
        if staged.exists():
            shutil.rmtree(staged, ignore_errors=True)
    return report


def sft_loss(logp: Any, mask: Any, total_tokens: float | None = None) -> Any:
    """Negative log-likelihood of the target tokens over ``total_tokens`` (default: this batch's):
    -sum(logp * mask) / total. With the whole batch's token count, micro-batch losses add up to the
    batch's token mean exactly."""
    return -(logp * mask).sum() / (mask.sum() if total_tokens is None else total_tokens)


def _encode(
    policy: Any, items: Sequence[JudgePair], max_tokens: int
) -> tuple[list[tuple[list[int], list[int]]], int]:
    """(prompt ids, target ids + end of turn) per pair; pairs longer than ``max_tokens`` are skipped."""
    engine, tok = policy.engine, policy.tokenizer
    eos = tok.eos_token_id
    out, skipped = [], 0
    for p in items:
        prompt = engine.encode(p.prompt)
        target = tok(p.target, add_special_tokens=False)["input_ids"] + ([eos] if eos is not None else [])
        if len(prompt) + len(target) > max_tokens:
            skipped += 1
            continue
        out.append((prompt, target))
    if skipped:
        log.warning("train-judge: %d examples longer than --max-tokens %d were skipped", skipped, max_tokens)
    return out, skipped


def _sft(policy: Any, encoded: list[tuple[list[int], list[int]]], cfg: JudgeTrainingConfig) -> list[float]:
    """Token-mean negative log-likelihood of the targets, AdamW, gradient norm clipped to 1; each batch
    runs in micro-batches of ``micro_batch_size`` sequences (gradients accumulated, exact token mean)."""
    import torch

    params = policy.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr)
    per_epoch = math.ceil(len(encoded) / cfg.batch_size)
    total = per_epoch * cfg.epochs if cfg.max_steps is None else cfg.max_steps
    rng = random.Random(cfg.seed)
    order: list[int] = []
    losses: list[float] = []
    policy.lm.train()
    bar = progress.start("train-judge", total=total, unit="step")
    for _ in range(total):
        if len(order) < cfg.batch_size:
            fresh = list(range(len(encoded)))
            rng.shuffle(fresh)
            order += fresh
        chosen, order = order[: cfg.batch_size], order[cfg.batch_size :]
        tokens = float(sum(len(encoded[i][1]) for i in chosen))
        opt.zero_grad(set_to_none=True)
        step_loss = 0.0
        for start in range(0, len(chosen), cfg.micro_batch_size):
            part = chosen[start : start + cfg.micro_batch_size]
            batch = policy.batch([encoded[i][0] for i in part], [encoded[i][1] for i in part])
            logp = policy.scorer(batch.to(policy.device), 1.0)[0]
            loss = sft_loss(logp, batch.target_mask.to(logp.device), tokens)
            loss.backward()
            step_loss += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        losses.append(step_loss)
        bar.update(1)
        bar.note(loss=f"{step_loss:.4f}")
        log.debug("train-judge: step %d/%d loss %.4f", len(losses), total, losses[-1])
    bar.close()
    policy.lm.eval()
    return losses


# ---------------------------------------------------------------------------- CLI
def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "train-judge",
        help="fine-tune a humanlike / empathy judge on reasoning + verdict examples (JSONL)",
        description="Supervised fine-tuning of a generative judge; held-out accuracy before and after.",
    )
    add_flags(p, JudgeTrainingConfig)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = section_from_args(JudgeTrainingConfig, args)
    progress.enable()
    report = train_judge(cfg)
    acc = report["held_out_accuracy"]
    for task in sorted(set(acc["before"]) | set(acc["after"])):
        b, a = acc["before"].get(task, {}), acc["after"].get(task, {})
        nan = float("nan")
        print(
            f"{task}: held-out accuracy {b.get('accuracy', nan):.3f} -> {a.get('accuracy', nan):.3f} "
            f"(n={a.get('n', b.get('n'))}, invalid {b.get('invalid')} -> {a.get('invalid')})"
        )
    if report["examples"]["duplicates_removed"]:
        print(f"repeated examples removed before the split: {report['examples']['duplicates_removed']}")
    loss = report["loss"]
    print(f"steps: {report['steps']}, loss {loss['first']:.4f} -> {loss['last']:.4f}; judge: {cfg.output}")
    return 0

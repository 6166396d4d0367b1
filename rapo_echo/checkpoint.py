"""Atomic training checkpoints: weights (safetensors), optimizer, scheduler, RNG states, data position
and step, written to a temporary folder and renamed, so a crash never leaves a half checkpoint."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rapo_echo.atomic import replace_dir
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.jsonl import write_failure

VALUE_HEAD_FILE = "value_head.safetensors"  # a policy's value head, beside its weights in model/

log = logging.getLogger(__name__)


class CheckpointError(RapoEchoError):
    """A checkpoint is missing or unreadable."""


def rng_state() -> dict[str, Any]:
    """Python, NumPy and torch RNG states in a JSON-safe form (torch's as a list of bytes)."""
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": _jsonable(random.getstate()),
        "numpy": [np_state[0], np_state[1].tolist(), *np_state[2:]],
        "torch": torch.get_rng_state().tolist(),
    }
    if torch.cuda.is_available():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what :func:`rng_state` returned."""
    random.setstate(_tupled(state["python"]))
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])


def _jsonable(x: Any) -> Any:
    return [_jsonable(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tupled(x: Any) -> Any:
    return tuple(_tupled(v) for v in x) if isinstance(x, list) else x


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / "checkpoints" / f"step-{step}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first."""
    root = Path(run_dir) / "checkpoints"
    found = []
    for p in root.glob("step-*"):
        if p.name[5:].isdigit() and (p / "trainer_state.json").is_file():
            found.append((int(p.name[5:]), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


def staging_path(run_dir: str | Path, step: int) -> Path:
    """Where checkpoint ``step`` is written before it is renamed into place (beside it, so the rename
    stays on one file system)."""
    return checkpoint_dir(run_dir, step).parent / f".tmp-step-{step}"


def staging_dir(run_dir: str | Path, step: int) -> Path:
    """A fresh, empty :func:`staging_path` folder."""
    tmp = staging_path(run_dir, step)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    return tmp


def _torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` through a Python file, so a failed write keeps its ``OSError`` (a full disk) in the
    exception chain; given a path, torch's own writer reports only ``unexpected pos``."""
    with open(path, "wb") as fh:
        torch.save(obj, fh)


def disk_error(exc: BaseException) -> OSError | None:
    """The operating-system error behind a failed write, or None: in ``exc``'s cause / context chain, or
    the ``os error N`` that safetensors writes into its message."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError):
            return cur
        found = re.search(r"\(os error (\d+)\)", str(cur))
        if found:
            code = int(found.group(1))
            return OSError(code, os.strerror(code))
        seen.add(id(cur))
        cur = cur.__cause__ or cur.__context__
    return None


def write_state_files(
    folder: Path,
    step: int,
    *,
    trainer_state: dict[str, Any],
    rank_rng: dict[int, dict[str, Any]],
    optimizer: torch.optim.Optimizer | None = None,
    scheduler: Any = None,
) -> None:
    """Optimizer and scheduler states (torch tensors), RNG states and the trainer state (JSON)."""
    if optimizer is not None:
        _torch_save(optimizer.state_dict(), folder / "optimizer.pt")
    if scheduler is not None:
        _torch_save(scheduler.state_dict(), folder / "scheduler.pt")
    for rank, state in rank_rng.items():
        (folder / f"rng_rank{rank}.json").write_text(json.dumps(state))
    (folder / "trainer_state.json").write_text(json.dumps({**trainer_state, "step": step}, indent=1))


def commit(tmp: Path, run_dir: str | Path, step: int, keep: int) -> Path:
    """Rename a staged checkpoint into place and keep only the newest ``keep`` checkpoints."""
    final = checkpoint_dir(run_dir, step)
    replace_dir(tmp, final)
    for _, old in list_checkpoints(run_dir)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    *,
    save_model: Any,
    optimizer: torch.optim.Optimizer | None,
    scheduler: Any,
    trainer_state: dict[str, Any],
    keep: int = 2,
    rank_rng: dict[int, dict[str, Any]] | None = None,
) -> Path:
    """Write ``checkpoints/step-N`` atomically (``save_model(folder)`` writes the weights) and keep the
    newest ``keep``."""
    tmp = staging_dir(run_dir, step)
    try:
        save_model(tmp / "model")
        write_state_files(
            tmp,
            step,
            trainer_state=trainer_state,
            rank_rng=rank_rng or {0: rng_state()},
            optimizer=optimizer,
            scheduler=scheduler,
        )
    except BaseException as exc:  # the partial checkpoint goes; the previous one is untouched
        shutil.rmtree(tmp, ignore_errors=True)
        os_error = disk_error(exc) if isinstance(exc, Exception) else None
        if os_error is None:
            raise
        last = latest_checkpoint(run_dir)  # disk full, read-only (safetensors, torch.save or our files)
        fix = (
            f"Nothing was lost: the last complete checkpoint is {last or 'none yet'}. Free space, then "
            f"continue with: rapo-echo train --resume {run_dir}"
        )
        raise write_failure(checkpoint_dir(run_dir, step), os_error, fix) from exc
    return commit(tmp, run_dir, step, keep)


def load_trainer_state(ckpt: Path) -> dict[str, Any]:
    try:
        return json.loads((ckpt / "trainer_state.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"cannot read {ckpt / 'trainer_state.json'}: {exc}") from exc


def load_rng(ckpt: Path, rank: int = 0, *, seed: int = 0, step: int = 0) -> bool:
    """Restore this rank's saved RNG states; True when they were there. A rank the checkpoint has none for
    gets states derived from (``seed``, ``step``, ``rank``), never a copy of rank 0's (two ranks sampling
    the same numbers would duplicate each other's rollouts)."""
    path = ckpt / f"rng_rank{rank}.json"
    if path.is_file():
        set_rng_state(json.loads(path.read_text()))
        return True
    derived = derived_seed(seed, step, rank)
    random.seed(derived)
    np.random.seed(derived % 2**32)
    torch.manual_seed(derived)
    log.warning(
        "%s holds no RNG state for rank %d (it was written by fewer processes): this rank's random state "
        "is derived from train.seed %d, step %d and the rank (seed %d)",
        ckpt,
        rank,
        seed,
        step,
        derived,
    )
    return False


def derived_seed(seed: int, step: int, rank: int) -> int:
    """A 63-bit seed for (``seed``, ``step``, ``rank``), by NumPy's SeedSequence (well mixed: nearby
    inputs give unrelated seeds)."""
    words = np.random.SeedSequence([seed % 2**32, step, rank]).generate_state(2, dtype=np.uint32)
    return (int(words[0]) << 31 | int(words[1]) >> 1) & (2**63 - 1)


def saved_processes(ckpt: Path, state: dict[str, Any]) -> int:
    """The process count that wrote ``ckpt``: recorded, or (older checkpoints) its ranks' RNG files."""
    if "processes" in state:
        return int(state["processes"])
    return max(1, len(list(ckpt.glob("rng_rank*.json"))))


def resume_batch_size(
    *, saved_processes: int, saved_batch: int, processes: int, batch: int, deepspeed: bool = False
) -> tuple[int, str]:
    """The per-process ``rollout.batch_size`` a run resumed with ``processes`` processes uses, and a line
    for the log ('' when nothing changes): the global batch (``batch_size x processes``) is kept unless
    the user changed ``batch``; a count that does not divide it, or any other count under DeepSpeed
    (its optimizer shards are partitioned), is refused."""
    if processes == saved_processes:
        return batch, ""
    counts = f"the checkpoint was written by {saved_processes} processes and this run has {processes}"
    if deepspeed:
        raise ConfigError(
            f"--resume: {counts}; DeepSpeed's checkpoint holds its optimizer state partitioned over "
            f"{saved_processes} processes: resume with {saved_processes} processes"
        )
    if batch != saved_batch:
        return batch, (
            f"{counts}; rollout.batch_size was changed to {batch}: the global batch goes from "
            f"{saved_batch * saved_processes} to {batch * processes} scenarios per step"
        )
    total = saved_batch * saved_processes
    if total % processes:
        raise ConfigError(
            f"--resume: {counts}; the global batch of {total} scenarios per step (rollout.batch_size "
            f"{saved_batch} x {saved_processes}) does not divide over {processes} processes: resume with a "
            f"process count that divides {total}, or set rollout.batch_size (--set rollout.batch_size=N) "
            "to change the global batch"
        )
    return total // processes, (
        f"{counts}; rollout.batch_size {saved_batch} -> {total // processes} per process keeps the global "
        f"batch of {total} scenarios per step"
    )


def load_torch(path: Path) -> Any:
    """``torch.load`` restricted to tensors and plain containers (``weights_only=True``)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (OSError, RuntimeError) as exc:
        raise CheckpointError(f"cannot load {path}: {exc}") from exc


def read_weights(path: Path) -> dict[str, Any]:
    """A checkpoint's safetensors file; a damaged one (cut short, overwritten) is a
    :class:`CheckpointError` naming it and the way on, the checkpoint before it."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path))
    except (SafetensorError, OSError) as exc:
        ckpt = path.parent.parent if path.parent.name == "model" else path.parent
        earlier = [p for _, p in list_checkpoints(ckpt.parent.parent) if p != ckpt]
        way = (
            f"move {ckpt} out of {ckpt.parent} so that --resume takes the one before it ({earlier[-1].name})"
            if earlier
            else "no earlier checkpoint exists: start the run again in a new --output"
        )
        raise CheckpointError(f"{path} cannot be read ({exc}): the file is damaged; {way}") from None


def check_heads(checkpoint: Path, value_head: bool) -> None:
    """Refuse, before anything loads, a checkpoint whose value head (or its absence) differs from this
    run's: its optimizer state would not fit."""
    recorded = load_trainer_state(checkpoint).get("value_head")
    had = bool(recorded) if recorded is not None else (checkpoint / "model" / VALUE_HEAD_FILE).is_file()
    if had == value_head:
        return
    held = "holds a value head" if had else "holds no value head"
    wants = "trains one" if value_head else "trains none"
    raise ConfigError(
        f"--resume: the checkpoint {checkpoint} {held} and this run {wants}, so its optimizer state does not "
        "fit; resume with the settings it was written with, or start a new run in another --output"
    )

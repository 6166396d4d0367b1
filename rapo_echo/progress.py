"""What a person sees while a long step runs: nested progress bars (tqdm) with elapsed time and ETA, and
third-party chatter kept quiet unless ``-v``.

One sink for the whole process. The outermost bar is the run's (training steps, benchmark cases);
inside it, each engine call opens a bar of its own (``policy: generate 12/32``, ``judge: choices``),
and a remote engine reports its requests done, in flight and failed:

    with progress.task("judge: generate", total=len(prompts), unit="req"):
        ...
        progress.remote(done=5, in_flight=8, failed=1)   # from any thread

Nothing is shown until :func:`enable` is called (the trainer's main process with ``logging.progress``,
``rapo-echo eval``); until then every call costs a few attribute lookups, so engines report always.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

# Loggers and warning sources that talk on every request or load unless the user asked for -v.
NOISY_LOGGERS = ("httpx", "httpcore", "urllib3", "filelock", "datasets", "huggingface_hub", "accelerate")
NOISY_WARNINGS = r"(transformers|torch|peft|accelerate|datasets|huggingface_hub|deepspeed|tensorboard)(\.|$)"

# read by huggingface_hub (and transformers' weight-loading bars), datasets and transformers at import
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}

_lock = threading.RLock()
_stack: list[Task] = []
_enabled = False
_file: IO[str] | None = None


class Task:
    """One bar. ``update(n)`` advances it; ``note(**values)`` shows values beside it; ``close()`` ends a
    bar opened with :func:`start`."""

    def __init__(self, bar: Any = None) -> None:
        self.bar = bar

    def close(self) -> None:
        if self.bar is not None:
            with _lock:
                if self in _stack:
                    _stack.remove(self)
                self.bar.close()

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            with _lock:
                self.bar.update(n)

    def note(self, **values: Any) -> None:
        if self.bar is not None:
            with _lock:
                self.bar.set_postfix(values, refresh=True)


_SILENT = Task()


def enable(on: bool = True, file: IO[str] | None = None) -> None:
    """Show bars from now on (``on=False``: stop showing them); ``file`` defaults to stderr."""
    global _enabled, _file
    with _lock:
        _enabled, _file = on, file


def enabled() -> bool:
    return _enabled


def start(desc: str, total: int | None = None, unit: str = "it", initial: int = 0) -> Task:
    """Open a bar nested under the bars open now (the outermost one stays on screen when closed); the
    caller closes it. :func:`task` is the same as a ``with`` block."""
    if not _enabled:
        return _SILENT
    from tqdm.auto import tqdm

    with _lock:
        depth = len(_stack)
        bar = tqdm(
            total=total,
            initial=initial,
            desc=desc,
            unit=unit,
            position=depth,
            leave=depth == 0,
            file=_file,
            dynamic_ncols=True,
        )
        current = Task(bar)
        _stack.append(current)
    return current


@contextmanager
def task(desc: str, total: int | None = None, unit: str = "it", initial: int = 0) -> Iterator[Task]:
    """A bar nested under the bars open now, closed when the block ends."""
    current = start(desc, total, unit, initial)
    try:
        yield current
    finally:
        current.close()


# what an engine's calls are, from the role its name starts with (``judge:hf``, ``policy``)
STAGES = {"policy": "generation", "simulator": "simulation", "judge": "judging"}


def label(engine_name: str, what: str) -> str:
    """A bar's name for an engine call: the stage its role stands for, and the engine."""
    stage = STAGES.get(engine_name.split(":", 1)[0])
    return f"{stage} ({engine_name})" if stage else f"{engine_name}: {what}"


def remote(*, done: int, in_flight: int, failed: int = 0, total: int | None = None) -> None:
    """Report remote calls of the innermost bar: how many are done, in flight and failed (counts so far,
    not increments; safe from any thread)."""
    if not _enabled:
        return
    with _lock:
        if not _stack:
            return
        bar = _stack[-1].bar
        bar.n = done + failed
        if total is not None:
            bar.total = total
        bar.set_postfix({"in flight": in_flight, "failed": failed}, refresh=True)


class RemoteCalls:
    """Counts an engine's concurrent requests and reports them (:func:`remote`) as they start and end."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.in_flight, self.failed = total, 0, 0, 0
        self._lock = threading.Lock()

    def _report(self) -> None:
        remote(done=self.done, in_flight=self.in_flight, failed=self.failed, total=self.total)

    def start(self) -> None:
        with self._lock:
            self.in_flight += 1
            self._report()

    def end(self, ok: bool = True) -> None:
        with self._lock:
            self.in_flight -= 1
            if ok:
                self.done += 1
            else:
                self.failed += 1
            self._report()


def quiet_third_party(verbose: bool) -> None:
    """Unless ``verbose``: no per-request log lines (httpx), no load chatter or progress bars from
    datasets / huggingface_hub / transformers, and no warnings raised inside those libraries (ours still
    show). Environment variables the user set win."""
    if verbose:
        return
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", module=NOISY_WARNINGS)
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    # libraries imported already read their settings at import: tell them directly
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    if "huggingface_hub" in sys.modules:
        sys.modules["huggingface_hub"].utils.disable_progress_bars()
    if "transformers" in sys.modules:
        sys.modules["transformers"].logging.set_verbosity_error()
        sys.modules["transformers"].logging.disable_progress_bar()

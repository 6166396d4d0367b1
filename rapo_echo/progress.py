"""What a person sees while a long step runs: nested progress bars (tqdm) with elapsed time and ETA, and
third-party chatter kept quiet unless ``-v``.

One sink for the whole process: the outermost bar is the run's, each engine call nests one of its own
(a remote engine reports its requests with :func:`remote`, from any thread). Nothing is shown until
:func:`enable`, so engines report always at the cost of a few lookups. Where the output is not a
terminal, every :data:`LINE_EVERY_S` seconds (and whenever the outermost bar moves) one line says where
every open bar stands instead.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import IO, Any

# Loggers and warning sources that talk on every request or load unless the user asked for -v.
NOISY_LOGGERS = ("httpx", "httpcore", "urllib3", "filelock", "datasets", "huggingface_hub", "accelerate")
NOISY_WARNINGS = r"(transformers|torch|peft|accelerate|datasets|huggingface_hub|deepspeed|tensorboard)(\.|$)"
# Loggers that set their own level and handler when their library loads (DeepSpeed's says "Setting
# accelerator to CPU" on every CPU run): below ERROR they are dropped by a filter, which their setup keeps.
SELF_CONFIGURED_LOGGERS = ("DeepSpeed",)

# read by huggingface_hub (and transformers' weight-loading bars), datasets and transformers at import
QUIET_ENV = {
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
}

REFRESH_S = 2.0  # a terminal's bars redraw at least this often (their elapsed time moves)
LINE_EVERY_S = 30.0  # without a terminal, a line on every open bar this often

_lock = threading.RLock()
_stack: list[Task] = []
_enabled = False
_file: IO[str] | None = None
_lines = False  # no terminal: lines instead of bars
_last_line = 0.0
_redirect = ExitStack()  # log lines written above the bars while any is open
_ticker: threading.Thread | None = None


class Task:
    """One bar (:func:`start`)."""

    def __init__(self, bar: Any = None) -> None:
        self.bar = bar

    def close(self) -> None:
        if self.bar is not None:
            with _lock:
                self.bar.close()
                if self in _stack:
                    _stack.remove(self)
                    _closed()

    def update(self, n: int = 1) -> None:
        if self.bar is not None:
            with _lock:
                self.bar.update(n)

    def note(self, refresh: bool = True, **values: Any) -> None:
        """Show ``values`` beside the bar (``refresh=False``: at its next redraw, for frequent notes)."""
        if self.bar is not None:
            with _lock:
                self.bar.set_postfix(values, refresh=refresh)


class Line:
    """A bar's state where there is no terminal to draw it on: the counts a line reports."""

    def __init__(self, desc: str, total: int | None, unit: str, initial: int, depth: int) -> None:
        self.desc, self.total, self.unit, self.n, self.pos = desc, total, unit, initial, depth
        self.postfix = ""
        self.start = time.monotonic()

    def update(self, n: int = 1) -> None:
        self.n += n
        if self.pos == 0:
            _write_line()

    def set_postfix(self, values: dict[str, Any], refresh: bool = True) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in values.items())

    def refresh(self) -> None:
        pass

    def close(self) -> None:
        if self.pos == 0:
            _write_line()

    def __str__(self) -> str:
        total = f"/{self.total}" if self.total is not None else ""
        seconds = int(time.monotonic() - self.start)
        extra = f" ({self.postfix})" if self.postfix else ""
        return f"{self.desc} {self.n}{total} {self.unit} [{seconds // 60}:{seconds % 60:02d}]{extra}"


_SILENT = Task()


def enable(on: bool = True, file: IO[str] | None = None, lines: bool | None = None) -> None:
    """Show progress from now on (``on=False``: stop); ``lines``: lines, not bars (None: off a terminal)."""
    global _enabled, _file, _lines
    with _lock:
        _enabled, _file = on, file
        if lines is None:
            isatty = getattr(file if file is not None else sys.stderr, "isatty", None)
            lines = not (callable(isatty) and isatty())
        _lines = lines
    if on:
        _start_ticker()


def enabled() -> bool:
    return _enabled


def start(desc: str, total: int | None = None, unit: str = "it", initial: int = 0) -> Task:
    """Open a bar nested under those open now; the caller closes it (:func:`task`: as a ``with`` block)."""
    if not _enabled:
        return _SILENT
    with _lock:
        depth = len(_stack)
        if _lines:
            bar: Any = Line(desc, total, unit, initial, depth)
        else:
            from tqdm.auto import tqdm
            from tqdm.contrib.logging import logging_redirect_tqdm

            if not _stack:
                _redirect.enter_context(logging_redirect_tqdm())
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


def _closed() -> None:
    """After a bar closed: log lines go straight to their handlers again once no bar is open."""
    if not _stack:
        _redirect.close()


def beat(now: float | None = None) -> None:
    """Redraw the open bars, or without a terminal write a line when :data:`LINE_EVERY_S` has passed (the
    ticker thread's beat)."""
    now = time.monotonic() if now is None else now
    with _lock:
        if not _enabled or not _stack:
            return
        if not _lines:
            for t in _stack:
                t.bar.refresh()
        elif now - _last_line >= LINE_EVERY_S:
            _write_line(now)


def _write_line(now: float | None = None) -> None:
    """One line on every open bar, outermost first."""
    global _last_line
    with _lock:
        if not _stack:
            return
        _last_line = time.monotonic() if now is None else now
        text = " | ".join(str(t.bar) for t in _stack)
        print(f"{time.strftime('%H:%M:%S')} progress: {text}", file=_file or sys.stderr, flush=True)


def _start_ticker() -> None:
    global _ticker
    with _lock:
        if _ticker is not None:
            return

        def run() -> None:
            while True:
                time.sleep(REFRESH_S)
                try:
                    beat()
                except Exception:  # a closed file must not kill the process's one ticker
                    logging.getLogger(__name__).debug("progress: a redraw failed", exc_info=True)

        _ticker = threading.Thread(target=run, name="rapo-echo-progress", daemon=True)
        _ticker.start()


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
    """A bar's name for an engine call: its roles' stages and the engine (``simulation or judging (...)``)."""
    roles = engine_name.split(":", 1)[0].split("+")
    stages = [STAGES[r] for r in roles if r in STAGES]
    return f"{' or '.join(stages)} ({engine_name})" if stages else f"{engine_name}: {what}"


def remote(*, done: int, in_flight: int, failed: int = 0, total: int | None = None) -> None:
    """Report the innermost bar's remote calls done, in flight and failed (totals so far; any thread)."""
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


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def quiet_third_party(verbose: bool) -> None:
    """Unless ``verbose``: no per-request log lines, load chatter, progress bars or warnings from third-party
    libraries (ours still show); environment variables the user set win."""
    if verbose:
        return
    for name in NOISY_LOGGERS:
        logging.getLogger(name).setLevel(logging.WARNING)
    for name in SELF_CONFIGURED_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _ErrorsOnly) for f in logger.filters):
            logger.addFilter(_ErrorsOnly())
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

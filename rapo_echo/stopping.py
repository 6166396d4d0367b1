"""SIGINT and SIGTERM for a command that saves as it goes (the data commands): the signal stops the work at
once (:class:`SignalStop`, a ``BaseException`` so no ``except Exception`` swallows it), and the command
says what it saved and how to resume (:class:`Stopped`). Training stops between steps instead."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from typing import Any

from rapo_echo.errors import RapoEchoError

EXIT_CODES = {"SIGINT": 130, "SIGTERM": 143}  # 128 + the signal's number, as a shell reports it


class SignalStop(BaseException):
    """Raised in the main thread by SIGINT or SIGTERM inside :func:`stop_on_signals`."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class Stopped(RapoEchoError):
    """A command stopped by a signal after saving what it had: the message says what and how to resume."""

    def __init__(self, message: str, signal_name: str) -> None:
        super().__init__(message)
        self.exit_code = EXIT_CODES.get(signal_name, 1)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """SIGINT and SIGTERM raise :class:`SignalStop` inside the block (main thread only; elsewhere the
    handlers stay as they are)."""

    def stop(signum: int, frame: Any) -> None:
        raise SignalStop(signal.Signals(signum).name)

    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            old[sig] = signal.signal(sig, stop)
        except ValueError:  # not the main thread
            pass
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)

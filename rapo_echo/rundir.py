"""Run and eval output folders: writable (checked before any model loads), used by one process at a time
(a lock file holding the owner's PID; a lock left by a process that is gone is taken over with a
warning), and never reused by a fresh run (a folder that is not empty needs ``--resume``)."""

from __future__ import annotations

import logging
import os
import socket
import tempfile
from pathlib import Path

from rapo_echo.errors import ConfigError

try:  # POSIX; elsewhere the PID in the lock file is checked instead
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]  # no fcntl off POSIX

log = logging.getLogger(__name__)

LOCK_NAME = ".rapo-echo.lock"
# Held-out validation's files in a run directory (written by the training loop's validator, read by the
# report): one line per validated step, and the best-validated weights with their record.
VALIDATION_FILE = "validation.jsonl"
BEST_DIR = "best"
BEST_FILE = "best.json"
# An evaluation's or a data command's output folder: its summary (what it wrote, with its figures).
SUMMARY_FILE = "summary.json"


def check_writable(folder: str | Path, flag: str = "--output") -> Path:
    """Create ``folder`` if needed and write a probe file into it; a :class:`ConfigError` naming the
    folder and the fix when either fails."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".write-probe-", dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            f"{flag} {folder}: cannot write there ({exc.strerror or exc}); choose a folder you can write to"
        ) from None
    return folder


def held_files(folder: str | Path) -> str:
    """What ``folder`` holds besides the lock file, as a short list for a message ('' when nothing)."""
    folder = Path(folder)
    found = sorted(p.name for p in folder.iterdir() if p.name != LOCK_NAME) if folder.is_dir() else []
    return ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")


def check_fresh(folder: str | Path) -> None:
    """Refuse a fresh run into a folder that already holds files (anything but the lock file)."""
    shown = held_files(folder)
    if shown:
        raise ConfigError(
            f"--output {folder} is not empty ({shown}); continue the run there with --resume {folder}, "
            "or choose another --output"
        )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _owner(text: str) -> tuple[int | None, str]:
    """(PID, host) written in a lock file (None when unreadable)."""
    fields = dict(part.split("=", 1) for part in text.split() if "=" in part)
    pid = fields.get("pid", "")
    return (int(pid) if pid.isdigit() else None), fields.get("host", "")


def _why_stale(pid: int, host: str) -> str:
    """Why a lock file naming ``pid`` on ``host`` was free to take, in words that are true."""
    if host != socket.gethostname():
        return "a process on another host, which does not hold the lock"
    if _alive(pid):
        return "that PID still runs but does not hold the lock: a PID reused, or a process that let go"
    return "no longer running"


class DirLock:
    """An exclusive lock on a folder: ``LOCK_NAME`` inside it holds ``pid=N host=NAME`` of the owner.

    The file is also ``flock``-ed where the file system allows, so a lock whose owner died (even by
    kill -9) is free at once; elsewhere a PID that no longer runs on this host marks the lock stale."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> DirLock:
        me = f"pid={os.getpid()} host={socket.gethostname()}\n"
        self.folder.mkdir(parents=True, exist_ok=True)
        for _ in range(10):  # retried only if another process replaced the file meanwhile
            fd = self._open()
            try:
                old = os.read(fd, 256).decode("utf-8", "replace")
                if not self._lock(fd, old):
                    continue
                if os.fstat(fd).st_ino != os.stat(self.path).st_ino:
                    continue  # the file was unlinked by its releasing owner: lock the new one
                pid, host = _owner(old)
                if pid is not None and pid != os.getpid():
                    log.warning("%s: took over a stale lock of PID %d on %s (%s)", self.path, pid, host,
                                _why_stale(pid, host))
                os.ftruncate(fd, 0)
                os.pwrite(fd, me.encode(), 0)
                self._fd, fd = fd, -1
                return self
            except FileNotFoundError:
                continue
            finally:
                if fd >= 0:
                    os.close(fd)
        raise ConfigError(f"{self.folder}: could not take the lock {self.path}; try again")

    def _open(self) -> int:
        """The lock file, opened (created if missing); a :class:`ConfigError` when it cannot be."""
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except IsADirectoryError:
            raise ConfigError(
                f"{self.path} is a folder, not a lock file: rapo-echo keeps its lock there; if nothing of "
                "yours is inside, remove it (rm -r) and run again, or choose another folder"
            ) from None
        except FileNotFoundError:
            raise
        except OSError as exc:
            raise ConfigError(
                f"{self.path}: cannot open the lock file ({exc.strerror or exc}); make it a writable file "
                "or remove it, or choose another folder"
            ) from None

    def _lock(self, fd: int, old: str) -> bool:
        """Lock ``fd``; raise when a live process holds it. False: retry with a fresh file."""
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                self._refuse(old)
            except OSError:  # the file system has no flock (some network mounts): check the PID
                pass
        pid, host = _owner(old)
        if pid is not None and pid != os.getpid() and (host != socket.gethostname() or _alive(pid)):
            self._refuse(old)
        return True

    def _refuse(self, old: str) -> None:
        pid, host = _owner(old)
        who = f"process {pid} on {host}" if pid is not None else "another process"
        raise ConfigError(
            f"{self.folder} is in use by {who} (lock file {self.path}); wait until it ends or stop it. "
            f"If no such process runs any more, delete {self.path}."
        )

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            os.unlink(self.path)
        except OSError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None

    def __enter__(self) -> DirLock:
        return self if self._fd is not None else self.acquire()  # a lock already taken is kept

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_run_dir(run_dir: str | Path, *, resume: bool) -> DirLock:
    """Lock a training run directory; a fresh run (not ``resume``) also needs it empty."""
    lock = DirLock(check_writable(run_dir)).acquire()
    if not resume:
        try:
            check_fresh(run_dir)
        except ConfigError:
            lock.release()
            raise
    return lock


def check_run_dir(run_dir: str | Path, *, resume: bool) -> None:
    """The checks of :func:`lock_run_dir` without taking the lock (done before any model loads, so a
    bad ``--output`` fails in a second): writable, not in use, empty for a fresh run."""
    run_dir = check_writable(run_dir)
    DirLock(run_dir).acquire().release()
    if not resume:
        check_fresh(run_dir)

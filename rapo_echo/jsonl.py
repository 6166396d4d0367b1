"""The JSON-lines files a run appends to (``metrics.jsonl``, ``samples.jsonl``, ...) and the text / JSON
reading every file reader shares. A record is appended with one ``write``, so a crash can leave at most
one torn last line, which readers drop with a warning; a rewrite goes through a temporary file.
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from rapo_echo.atomic import write_text_atomic
from rapo_echo.errors import DataError, RapoEchoError
from rapo_echo.scrub import scrub

log = logging.getLogger(__name__)

NO_SPACE = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


class FileWriteError(RapoEchoError):
    """Writing a run's file failed (disk full, read-only, no permission); the message names the file."""


def write_failure(path: str | Path, exc: OSError, fix: str) -> FileWriteError:
    """A :class:`FileWriteError` for ``exc`` raised while writing ``path``, ending with ``fix``."""
    if exc.errno in NO_SPACE:
        why = "the disk is full"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        why = "the file system refuses writes there"
    else:
        why = exc.strerror or type(exc).__name__
    return FileWriteError(f"cannot write {path}: {why} ({exc}). {fix}")


def read_utf8(path: str | Path, what: str = "file") -> str:
    """The text of ``path``; a file that is not UTF-8 is a :class:`DataError` naming the byte offset."""
    path = Path(path)
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise DataError(
            f"{path}:{line}: the {what} is not UTF-8 text (byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start}); save it as UTF-8"
        ) from None


def loads(text: str | bytes, where: str) -> Any:
    """``json.loads`` whose failures (syntax, or nesting too deep for Python) name ``where``."""
    try:
        return json.loads(text)
    except RecursionError:
        raise DataError(f"{where}: JSON nested too deeply to read; is the file corrupted?") from None
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc})") from None


def read_jsonl(path: str | Path, what: str = "JSON-lines file") -> list[tuple[int, Any]]:
    """``(line number, value)`` of every line of ``path`` ([] when it does not exist). A torn last line
    (a write cut short) is dropped with a warning; any other malformed line is a :class:`DataError`."""
    path = Path(path)
    if not path.exists():
        return []
    lines = read_utf8(path, what).split("\n")
    out: list[tuple[int, Any]] = []
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            out.append((lineno, loads(line, f"{path}:{lineno}")))
        except DataError:
            if lineno == len(lines):  # the last line, without its newline
                log.warning("%s:%d: dropped a half-written last line (a crash or a full disk)", path, lineno)
                break
            raise DataError(f"{path}:{lineno}: not valid JSON; fix or delete that line") from None
    return out


def append_jsonl(path: str | Path, records: Iterable[Any], *, sync: bool = False, fix: str = "") -> None:
    """Append one JSON line per record with a single ``write`` (``sync``: fsync it too); secret values
    are scrubbed first (:func:`rapo_echo.scrub.scrub`)."""
    data = scrub("".join(json.dumps(r, default=str) + "\n" for r in records)).encode()
    if not data:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            view = memoryview(data)
            while view:  # a regular file takes it in one write; loop only on a short write
                view = view[os.write(fd, view) :]
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise write_failure(path, exc, fix or "Free space or fix the folder, then run again.") from exc


def keep_jsonl(path: str | Path, keep: Callable[[Any], bool], what: str = "JSON-lines file") -> int:
    """Rewrite ``path`` atomically with only the records ``keep`` accepts (a torn last line goes too);
    returns how many records were dropped. Nothing happens when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return 0
    rows = read_jsonl(path, what)
    kept = [value for _, value in rows if keep(value)]
    text = "".join(json.dumps(v, default=str) + "\n" for v in kept)
    try:
        write_text_atomic(path, text)
    except OSError as exc:
        raise write_failure(path, exc, "Free space or fix the folder, then resume again.") from exc
    return len(rows) - len(kept)

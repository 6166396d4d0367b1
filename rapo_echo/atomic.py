"""Writing files and folders so that a crash never leaves a half-written one in place."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from rapo_echo.scrub import scrub


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a text file through a temporary file in the same folder, then rename it into place; secret
    values are scrubbed first (:func:`rapo_echo.scrub.scrub`)."""
    text = scrub(text)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def staging_for(final: Path) -> Path:
    """A fresh, empty folder beside ``final`` to write it in, then :func:`replace_dir` it into place
    (``.<name>.tmp``; a leftover of an interrupted write is cleared first)."""
    staged = final.with_name(f".{final.name}.tmp")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    return staged


def remove_leftovers(folder: Path, names: tuple[str, ...] = ("final",)) -> list[Path]:
    """Remove (and return) what an interrupted write can leave in ``folder`` for each of ``names``: the
    staging and set-aside folders (a set-aside one whose replacement never arrived is put back) and the
    ``.tmp*`` files a writer drops inside (safetensors writes ``.tmpXXXXXX`` and renames it)."""
    removed: list[Path] = []
    for name in names:
        old = folder / f".{name}.old"
        if old.is_dir() and not (folder / name).exists():  # killed between the two renames: put it back
            os.replace(old, folder / name)
        for path in (folder / f".{name}.tmp", old):
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
                removed.append(path)
        inside = folder / name
        if inside.is_dir():
            for path in inside.glob(".tmp*"):
                if path.is_dir():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def replace_dir(staged: Path, final: Path) -> None:
    """Move a fully written ``staged`` folder to ``final`` (same file system), replacing any folder
    there: the old one is moved aside first and deleted only once the new one is in place (put back if
    the move fails), so ``final`` is never left missing. ``staged`` never outlives the call."""
    old = final.with_name(f".{final.name}.old")
    try:
        shutil.rmtree(old, ignore_errors=True)
        if final.exists():
            os.replace(final, old)
        try:
            os.replace(staged, final)
        except OSError:
            if old.exists() and not final.exists():
                os.replace(old, final)
            raise
        shutil.rmtree(old, ignore_errors=True)
    finally:
        if staged.exists():
            shutil.rmtree(staged, ignore_errors=True)

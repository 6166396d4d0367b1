"""Writing files and folders so that a crash never leaves a half-written one in place."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write a text file through a temporary file in the same folder, then rename it into place."""
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

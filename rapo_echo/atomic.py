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
    there; ``staged`` never outlives the call, even when the move fails."""
    try:
        if final.exists():
            shutil.rmtree(final)
        os.replace(staged, final)
    finally:
        if staged.exists():
            shutil.rmtree(staged, ignore_errors=True)

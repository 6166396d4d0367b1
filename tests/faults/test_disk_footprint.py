"""The suite cleans up after itself: a passing test's tmp_path is deleted when the test ends.

A CI run filled its disk (``No space left on device``) when every tmp_path was kept: the integration
tests save models of 0.5 GB each, about 7 GB per run, and pytest kept the last three runs.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_a_passing_tests_tmp_path_is_deleted_and_a_failing_ones_kept(tmp_path: Path) -> None:
    (tmp_path / "test_inner.py").write_text(
        "def test_passes(tmp_path):\n"
        "    (tmp_path / 'weights.bin').write_bytes(bytes(1 << 20))\n\n"
        "def test_fails(tmp_path):\n"
        "    (tmp_path / 'weights.bin').write_bytes(bytes(1 << 20))\n"
        "    assert False\n"
    )
    base = tmp_path / "basetemp"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-c",
            str(ROOT / "pyproject.toml"),
            "--rootdir",
            str(tmp_path),
            "--basetemp",
            str(base),
            str(tmp_path / "test_inner.py"),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout + proc.stderr
    left = sorted(p.relative_to(base).as_posix() for p in base.rglob("*.bin"))
    assert left == ["test_fails0/weights.bin"]

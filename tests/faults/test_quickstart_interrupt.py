"""``make quickstart`` stopped with Ctrl-C still writes the report of the run it saved, and exits with the
run's code (issue 49, item 1: make stopped with the run, and no report was written).

The real Makefile runs against a stand-in ``rapo-echo`` in a stand-in venv: ``train`` waits until it is
interrupted and exits 130 as the real command does after saving, ``report`` writes its folder. Ctrl-C is
SIGINT to the whole foreground process group, as a terminal sends it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]
STAND_IN = """#!/usr/bin/env bash
case "$1" in
  train)
    trap 'echo "saved; stopped by SIGINT" > "$RUN/stopped"; exit 130' INT
    touch "$RUN/started"
    while true; do sleep 0.1; done ;;
  report)
    mkdir -p "$RUN/report" && echo "<html>report</html>" > "$RUN/report/report.html" ;;
esac
"""


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_ctrl_c_during_the_run_still_writes_its_report(tmp_path: Path) -> None:
    venv, run = tmp_path / "venv", tmp_path / "run"
    (venv / "bin").mkdir(parents=True)
    run.mkdir()
    cli = venv / "bin" / "rapo-echo"
    cli.write_text(STAND_IN)
    cli.chmod(0o755)
    (venv / ".rapo-echo-installed").touch()  # newer than pyproject.toml and the Makefile: no install
    make = subprocess.Popen(
        ["make", "-C", str(ROOT), "quickstart", f"VENV={venv}", f"QUICKSTART_RUN={run}"],
        env={**os.environ, "RUN": str(run)},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    try:
        deadline = time.monotonic() + 120
        while not (run / "started").exists():
            assert make.poll() is None, make.stdout.read()
            assert time.monotonic() < deadline, "the stand-in run never started"
            time.sleep(0.05)
        os.killpg(make.pid, signal.SIGINT)  # Ctrl-C
        out, _ = make.communicate(timeout=120)
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
    assert (run / "stopped").read_text().startswith("saved")
    assert (run / "report" / "report.html").is_file(), out
    assert make.returncode != 0, out  # make still says the run did not finish
    assert "resume it with:" in out and "report:" in out

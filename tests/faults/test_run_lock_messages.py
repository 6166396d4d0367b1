"""The run-folder lock's messages are true and clear (issue 31, item 16): a ``.rapo-echo.lock`` that is a
folder is a ConfigError naming it (it used to be ``IsADirectoryError``), and taking over a lock file
whose PID still runs (but holds no lock) does not say that process is "no longer running"."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys

import pytest

from rapo_echo.errors import ConfigError
from rapo_echo.rundir import LOCK_NAME, DirLock, check_run_dir, lock_run_dir


@pytest.mark.parametrize("check", [lock_run_dir, check_run_dir])
def test_a_lock_that_is_a_folder_is_a_clear_error(tmp_path, check):
    run = tmp_path / "run"
    (run / LOCK_NAME).mkdir(parents=True)
    with pytest.raises(ConfigError, match=rf"{LOCK_NAME} is a folder, not a lock file.*remove it"):
        check(run, resume=True)
    assert (run / LOCK_NAME).is_dir()  # nothing of the user's is removed


def write_lock(folder, pid: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / LOCK_NAME).write_text(f"pid={pid} host={socket.gethostname()}\n")


def test_taking_over_from_a_live_pid_says_it_runs_but_holds_no_lock(tmp_path, caplog):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        write_lock(tmp_path / "run", child.pid)
        with caplog.at_level(logging.WARNING, logger="rapo_echo.rundir"):
            DirLock(tmp_path / "run").acquire().release()
    finally:
        child.kill()
        child.wait()
    text = caplog.text
    assert f"PID {child.pid}" in text and "no longer running" not in text
    assert "still runs but does not hold the lock" in text


def test_taking_over_from_a_dead_pid_says_it_no_longer_runs(tmp_path, caplog):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    write_lock(tmp_path / "run", child.pid)
    with caplog.at_level(logging.WARNING, logger="rapo_echo.rundir"):
        DirLock(tmp_path / "run").acquire().release()
    assert f"PID {child.pid}" in caplog.text and "no longer running" in caplog.text

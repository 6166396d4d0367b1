"""Starting processes from a test: the launcher command lines (torchrun, ``accelerate launch``) on a free
port, a run that ends the whole process tree and fails clearly when it hangs (a rank that skips a
collective waits forever), and a ``rapo-echo serve`` server that stops with the test."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    """A TCP port nothing listens on now (several test runs share this machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(processes: int = 2) -> list[str]:
    return [str(BIN / "torchrun"), "--nproc_per_node", str(processes), "--master_port", str(free_port())]


def accelerate(config_file: Path, processes: int = 2) -> list[str]:
    """``accelerate launch`` with a launch config; the process count given here, as the configs ask."""
    return [
        str(BIN / "accelerate"),
        "launch",
        "--config_file",
        str(config_file),
        "--num_processes",
        str(processes),
        "--main_process_port",
        str(free_port()),
    ]


def run_processes(
    cmd: list[str], *, env: dict[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run a launcher command from the repository root with it on ``PYTHONPATH`` (so ``tests.*`` plugins
    import); on a timeout kill the launcher and its workers and fail saying the run hung."""
    env = {**os.environ, **(env or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        import psutil  # accelerate's dependency

        for child in psutil.Process(proc.pid).children(recursive=True):  # the launcher's workers
            child.kill()
        proc.kill()
        proc.communicate()
        raise AssertionError(f"the multi-process run hung for {timeout:.0f} s: {' '.join(cmd)}") from exc
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def stop(proc: subprocess.Popen, timeout: float) -> None:
    """Terminate ``proc``; kill it when it has not ended after ``timeout`` seconds."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def served_process(cmd: list[str], log: Path, env: dict[str, str]) -> Iterator[str]:
    """Start a ``rapo-echo serve`` command (its output into ``log``) and yield its base URL once its
    ``/health`` answers; the test fails with the log when the server exits or takes over 120 s."""
    import httpx
    import pytest

    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        deadline = time.monotonic() + 120
        url = None
        while url is None:
            text = log.read_text()
            match = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", text)
            url = match.group(1) if match else None
            if proc.poll() is not None:
                pytest.fail(f"the server exited with code {proc.returncode}:\n{text}")
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not start in 120 s:\n{text}")
            time.sleep(0.1)
        while (
            httpx.get(url.removesuffix("/v1") + "/health", timeout=2).status_code != 200
        ):  # pragma: no cover
            time.sleep(0.1)
        yield url
    finally:
        stop(proc, 15)

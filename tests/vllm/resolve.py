"""Resolver dry runs of our extras (``pip install --dry-run --ignore-installed --report``), started in the
background and read by the tests.

``openrlhf`` pulls ``flash-attn`` and ``deepspeed``, source distributions whose metadata is built by running
their ``setup.py``, which imports torch: the dry run uses this venv's torch (``--no-build-isolation``, as
their install instructions say) and tells flash-attn not to look for CUDA."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESOLVE_RUNS = {"vllm": ([f"{ROOT}[vllm]"], False), "openrlhf": ([f"{ROOT}[openrlhf]"], True)}
RESOLVE_TIMEOUT_S = 1800
_started: dict[str, tuple[subprocess.Popen, Path]] = {}


def start(name: str) -> None:
    """Start the dry run of ``name`` (once)."""
    if name in _started:
        return
    requirements, no_isolation = RESOLVE_RUNS[name]
    out = Path(tempfile.mkdtemp(prefix=f"rapo-resolve-{name}-"))
    cmd = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
        "--report", str(out / "report.json"), *(["--no-build-isolation"] if no_isolation else []),
        *requirements,
    ]  # fmt: skip
    env = {**os.environ, "FLASH_ATTENTION_SKIP_CUDA_BUILD": "TRUE"}
    with open(out / "pip.log", "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env=env)
    _started[name] = (proc, out)


def index_unreachable() -> str | None:
    """Why the package index cannot be asked (None when it can)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "pip"], capture_output=True, text=True, timeout=120
    )
    return None if done.returncode == 0 else f"pip cannot reach the package index: {done.stderr[-300:]}"


def result(name: str) -> dict[str, str]:
    """``{name: version}`` pip would install for extra ``name``; skips when the index is unreachable."""
    why = index_unreachable()
    if why:
        pytest.skip(why)
    start(name)
    proc, out = _started[name]
    try:
        code = proc.wait(timeout=RESOLVE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"the dry run of rapo-echo[{name}] took over {RESOLVE_TIMEOUT_S} s")
    log = "\n".join(x for x in (out / "pip.log").read_text().splitlines() if "is ignored" not in x)
    assert code == 0, f"rapo-echo[{name}] does not resolve:\n{log[-3000:]}"
    items = json.loads((out / "report.json").read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}


def stop_all() -> None:
    for proc, _ in _started.values():
        if proc.poll() is None:
            proc.kill()
            proc.wait()

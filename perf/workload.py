"""The fixed benchmark workload (``../shared/bench/workload.py``: prompts, reward, sizes), found where the
checkout's neighbours keep it; the speed benchmarks of the engines (``bench_decode.py``) and of the
training loop (``bench_grpo.py``) read the same one."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Where the shared workload folder is looked for, in order: $RAPO_SHARED_BENCH, ../shared/bench beside
# the checkout, .gpukit/ inside it (what ../shared/bench/gpu/README.md carries to a GPU machine).
SHARED_BENCH_CANDIDATES = [
    Path(p)
    for p in (os.environ.get("RAPO_SHARED_BENCH"), ROOT.parent / "shared" / "bench", ROOT / ".gpukit")
    if p
]
SHARED_BENCH = next((p for p in SHARED_BENCH_CANDIDATES if (p / "workload.py").is_file()), None)
WORKLOAD_ENV = "RAPO_BENCH_WORKLOAD"  # a folder holding workload.py (--workload); the reward reads it too

def set_workload_dir(folder: str | Path) -> None:
    """Use ``folder/workload.py`` (e.g. ../shared/bench/gpu/large) in this process and its children."""
    folder = Path(folder).resolve()
    if not (folder / "workload.py").is_file():
        sys.exit(f"--workload {folder}: no workload.py there")
    os.environ[WORKLOAD_ENV] = str(folder)
    if SHARED_BENCH is not None:  # gpu/large/workload.py imports the shared one from there
        os.environ.setdefault("SHARED_BENCH_DIR", str(SHARED_BENCH))


_WORKLOADS: dict[Path, Any] = {}


def workload() -> Any:
    """The workload module (prompts, reward, sizes): ``--workload``'s folder, else the shared one."""
    chosen = os.environ.get(WORKLOAD_ENV)
    folder = Path(chosen) if chosen else SHARED_BENCH
    if folder is None:
        tried = ", ".join(str(p) for p in SHARED_BENCH_CANDIDATES)
        sys.exit(
            f"the shared benchmark workload (workload.py) is in none of: {tried}. Point at it with "
            "--workload DIR or RAPO_SHARED_BENCH=DIR (the folder of ../shared/bench/README.md), or copy "
            "it into .gpukit/ on a machine without ../shared (../shared/bench/gpu/README.md)"
        )
    if folder not in _WORKLOADS:
        spec = importlib.util.spec_from_file_location(
            f"rapo_bench_workload_{len(_WORKLOADS)}", folder / "workload.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _WORKLOADS[folder] = module
    return _WORKLOADS[folder]

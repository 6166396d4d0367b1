"""``perf/gpu_check.sh --smoke``: the one-call GPU check runs on this CPU with a tiny model, every
part (models, our step, decode, the decode profile with its compile count) gives its row in the table
and its JSON lines; a part that fails costs its row only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA

ROOT = Path(__file__).resolve().parents[2]
BENCH = Path(os.environ.get("RAPO_SHARED_BENCH") or SHARED_DATA.parent / "bench")

pytestmark = pytest.mark.integration


def test_smoke_mode_prints_one_table_and_json_lines(tmp_path: Path) -> None:
    if not (BENCH / "workload.py").is_file():
        pytest.skip(f"the shared benchmark workload is not at {BENCH}")
    out = tmp_path / "check"
    env = {**os.environ, "RAPO_SHARED_BENCH": str(BENCH), "PYTHON": sys.executable}
    proc = subprocess.run(
        ["bash", str(ROOT / "perf" / "gpu_check.sh"), str(out), "--smoke"],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (out / "table.txt").read_text()
    assert table in proc.stdout
    rows = [json.loads(line) for line in (out / "gpu_check.jsonl").read_text().splitlines()]
    parts = {r["part"]: r for r in rows if "status" in r}
    assert list(parts) == ["models", "compare", "decode", "profile"]
    assert all(r["status"] == "ok" for r in parts.values())
    ours = next(r for r in rows if r["part"] == "compare" and str(r.get("bench", "")).startswith("rapo_echo"))
    assert ours["sec_per_step_median"] > 0 and len(ours["sec_per_step"]) == 1
    profile = next(r for r in rows if r["part"] == "profile" and "top_kernels" in r)
    # the pinned shape compiled once; rollouts of two prompt widths added no graph
    assert profile["unique_graphs_after_rollouts"] == profile["unique_graphs_after_pin"] >= 1
    assert profile["top_kernels"] and (out / "profile_kernels.txt").read_text().strip()
    assert any(r.get("method") == "rapo_echo_dynamic" for r in rows if r["part"] == "decode")


def test_a_failing_part_costs_its_row(tmp_path: Path) -> None:
    """The driver's row for a part whose command fails or runs out of time (no model needed)."""
    sys.path.insert(0, str(ROOT))
    from rapo_echo.perf.gpu_check import run_part, summary_of, table

    env = dict(os.environ)
    bad = run_part(
        "zero3", [sys.executable, "-c", "import sys; sys.exit('no deepspeed here')"], tmp_path, 60, env
    )
    slow = run_part("vllm", [sys.executable, "-c", "import time; time.sleep(30)"], tmp_path, 1, env)
    assert bad["status"] == "failed (exit 1)" and "no deepspeed here" in summary_of(bad)
    assert slow["status"] == "timeout"
    text = table([bad, slow])
    assert "zero3" in text and "vllm" in text and "timeout" in text

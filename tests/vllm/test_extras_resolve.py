"""The ``vllm`` and ``openrlhf`` extras resolve to a working set with our own requirements: pip's resolver
in a dry run (nothing is installed) against the package index. Skipped, with the reason, when the index
cannot be reached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[2]
OPENRLHF = "0.11.2"  # the OpenRLHF release our exporter targets (rapo_echo/openrlhf)


def index_reachable() -> str | None:
    """Why the package index cannot be asked (None when it can)."""
    done = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", "pip"], capture_output=True, text=True, timeout=120
    )
    return None if done.returncode == 0 else f"pip cannot reach the package index: {done.stderr[-300:]}"


def resolve(tmp_path: Path, *requirements: str) -> dict[str, str]:
    """``{name: version}`` pip would install for ``requirements`` into an empty environment."""
    why = index_reachable()
    if why:
        pytest.skip(why)
    report = tmp_path / "report.json"
    cmd = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet",
        "--report", str(report), *requirements,
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert done.returncode == 0, f"{' '.join(requirements)} does not resolve:\n{done.stderr[-3000:]}"
    items = json.loads(report.read_text())["install"]
    return {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in items}


def release(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in version.split("+")[0].split(".")[:3])


def test_the_vllm_extra_resolves_with_our_requirements(tmp_path) -> None:
    got = resolve(tmp_path, f"{ROOT}[vllm]")
    print("rapo-echo[vllm]:", {k: got[k] for k in ("vllm", "torch", "transformers")})
    assert release(got["vllm"]) >= (0, 10, 2) and release(got["transformers"]) >= (5, 0)


def test_the_openrlhf_extra_resolves_with_openrlhfs_own_vllm(tmp_path) -> None:
    """OpenRLHF pins transformers and (through its own ``[vllm]`` extra) vLLM; ours must take those pins."""
    got = resolve(tmp_path, f"{ROOT}[openrlhf]")
    print("rapo-echo[openrlhf]:", {k: got.get(k) for k in ("openrlhf", "vllm", "torch", "transformers")})
    assert got["openrlhf"] == OPENRLHF and "vllm" in got

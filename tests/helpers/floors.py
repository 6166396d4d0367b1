"""The dependency floors of pyproject.toml as pip constraints, for ``make test-floors``.

    python tests/helpers/floors.py [NAME ...]   # prints NAME==LOWER_BOUND lines (all without names)

Every ``NAME>=X`` of ``[project] dependencies`` becomes ``NAME==X``; torch is left out (the only CPU
build installable here is 2.13.0, which the Makefile installs first).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"
UNTESTABLE = {"torch"}  # no CPU wheel of the floor is reachable here


def lower_bounds(pyproject: Path = PYPROJECT) -> dict[str, str]:
    """``{name: lower bound}`` of the ``[project] dependencies`` list."""
    text = pyproject.read_text()
    block = re.search(r"^dependencies = \[(.*?)^\]", text, re.S | re.M)
    if block is None:
        raise SystemExit(f"{pyproject}: no [project] dependencies list")
    out: dict[str, str] = {}
    for spec in re.findall(r'"([^"]+)"', block.group(1)):
        match = re.match(r"([A-Za-z0-9_.\-]+)(?:\[[^\]]*\])?\s*>=\s*([0-9][^,;\s]*)", spec)
        if match is None:
            raise SystemExit(f"{pyproject}: dependency {spec!r} has no lower bound (NAME>=X)")
        out[match.group(1).lower()] = match.group(2)
    return out


def constraints(names: list[str] | None = None, pyproject: Path = PYPROJECT) -> list[str]:
    """``NAME==FLOOR`` lines for ``names`` (all dependencies but torch when None)."""
    bounds = lower_bounds(pyproject)
    wanted = names or [n for n in bounds if n not in UNTESTABLE]
    missing = [n for n in wanted if n not in bounds]
    if missing:
        raise SystemExit(f"{pyproject}: no dependency named {', '.join(missing)}")
    return [f"{n}=={bounds[n]}" for n in wanted]


if __name__ == "__main__":
    print("\n".join(constraints(sys.argv[1:] or None)))

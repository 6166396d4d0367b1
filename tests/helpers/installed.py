"""A distribution installed for a test: its metadata folder, as pip leaves it, registering entry points."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from rapo_echo import plugins


def install(site: Path, name: str, entry_points: str, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Install the distribution ``name`` whose ``entry_points.txt`` is ``entry_points`` into ``site`` and put
    ``site`` on the path (for the test only), as a ``pip install`` of a plugin package would."""
    meta = site / f"{name.replace('-', '_')}-0.1.dist-info"
    meta.mkdir(parents=True)
    (meta / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text(entry_points)
    monkeypatch.syspath_prepend(str(site))
    return site


def named_in_library(word: str) -> list[str]:
    """The files of the library (every folder it ships) and configs/ that name ``word``: a plugin that came
    in through the door is named by none."""
    root = Path(__file__).resolve().parents[2]
    folders = ("rapo_echo", "simulators", "benchmarks", "datagen", "algorithms", "training", "integrations")
    files = [p for f in (*folders, "perf", "configs") for p in (root / f).rglob("*.*")]
    pattern = re.compile(rf"\b{re.escape(word)}\b", re.I)
    return [
        str(p.relative_to(root))
        for p in files
        if p.suffix in (".py", ".yaml", ".toml") and pattern.search(p.read_text())
    ]


def two_packages_claim(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two installed packages register ``name`` in every entry-point group: ``a.x:One`` (pkg-a) and
    ``b.y:Two`` (pkg-b)."""

    def ep(value: str, dist: str) -> SimpleNamespace:
        return SimpleNamespace(name=name, value=value, dist=SimpleNamespace(name=dist), load=lambda: None)

    found = [ep("a.x:One", "pkg-a"), ep("b.y:Two", "pkg-b")]
    monkeypatch.setattr(plugins, "entry_points", lambda group: found)

"""The package import graph has no cycle, at any package level and between files.

Every module's imports (module level or inside functions) are read with :mod:`ast`, with the
``package-dir`` mapping of pyproject.toml applied (``algorithms/`` is ``rapo_echo.algorithms`` and so
on), so a new cycle fails the suite even where ``lint-imports`` (``make lint``, which also checks the
order of the layers) is not run.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[3]
# Package-level import cycles still known, each as (importer, imported) at the level of the package that
# holds both. Each must still exist (the test fails when one goes, so that it is taken off this list).
def package_dirs() -> dict[str, Path]:
    """Package name -> folder, from pyproject.toml's ``[tool.setuptools] package-dir``."""
    setup = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {name: ROOT / folder for name, folder in setup["package-dir"].items()}


def find_modules() -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, whether it is a package's ``__init__``), for every module the
    distribution ships."""
    out: dict[str, tuple[Path, bool]] = {}
    for package, folder in package_dirs().items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            out[".".join([package, *(parts[:-1] if is_init else parts)])] = (path, is_init)
    return out


def imported_names(name: str, path: Path, is_init: bool) -> Iterable[str]:
    """Every dotted name an ``import`` / ``from ... import`` of the module may refer to."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".") if is_init else name.split(".")[:-1]
                package = package[: len(package) - node.level + 1]
                base = ".".join([*package, *([node.module] if node.module else [])])
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph() -> dict[str, set[str]]:
    """Module -> the modules of the distribution it imports."""
    modules = find_modules()
    return {
        name: {t for t in imported_names(name, path, is_init) if t in modules and t != name}
        for name, (path, is_init) in modules.items()
    }


def cycles(graph: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(graph.get(start, ())))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph.get(child, ()))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def package_edges(graph: Mapping[str, set[str]]) -> dict[str, dict[tuple[str, str], list[str]]]:
    """For each package: the imports between its children (each child standing for itself and
    everything below it), as (importer child, imported child) -> the module-level imports behind it."""
    packages = {name for name, (_, is_init) in find_modules().items() if is_init}
    out: dict[str, dict[tuple[str, str], list[str]]] = {p: {} for p in packages}
    for source, targets in graph.items():
        for target in targets:
            for package in packages:
                prefix = package + "."
                if not (source.startswith(prefix) and target.startswith(prefix)):
                    continue
                a = prefix + source[len(prefix) :].split(".")[0]
                b = prefix + target[len(prefix) :].split(".")[0]
                if a != b:
                    out[package].setdefault((a, b), []).append(f"{source} -> {target}")
    return out


def test_the_graph_sees_the_mapped_packages():
    graph = import_graph()
    for package in package_dirs():
        assert package in graph, f"{package} was not found"
    assert "rapo_echo.algorithms.rapo" in graph and "rapo_echo.simulators.sage" in graph
    assert "rapo_echo.algorithms.base" in graph["rapo_echo.trainer"]  # an import across the mapping is seen


def test_no_file_level_cycle():
    assert cycles(import_graph()) == []


def test_no_package_level_cycle():
    problems = []
    for package, kept in sorted(package_edges(import_graph()).items()):
        graph: dict[str, set[str]] = {}
        for a, b in kept:
            graph.setdefault(a, set()).add(b)
        for component in cycles(graph):
            inside = [f"  {w}" for (a, b), why in kept.items() if {a, b} <= set(component) for w in why]
            problems.append(f"cycle among {component} in {package}:\n" + "\n".join(inside))
    assert not problems, "\n".join(problems)

"""The package import graph has no cycle, at any package level and between files, and the top-level
folders of the checkout are layers.

Every module's imports (module level or inside functions) are read with :mod:`ast`, with the
``package-dir`` mapping of pyproject.toml applied (``algorithms/`` is ``rapo_echo.algorithms`` and so
on), so a new cycle fails the suite even where ``lint-imports`` (``make lint``, which also checks the
order of the layers inside the package) is not run.
"""

from __future__ import annotations

import ast
import functools
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parents[3]
# Where the core still names a module of a higher folder as an import string, loaded only when used: the
# package's table of the Python API's names (``rapo_echo.train`` and the rest, imported on first access,
# so ``import rapo_echo`` stays light). The sub-commands and the algorithms are entry points instead.
NAMED_UPWARDS = {"rapo_echo/__init__.py": "LAZY_EXPORTS"}


def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def package_dirs() -> dict[str, Path]:
    """Package name -> folder, from pyproject.toml's ``[tool.setuptools] package-dir``."""
    return {name: ROOT / folder for name, folder in pyproject()["tool"]["setuptools"]["package-dir"].items()}


def folder_layers() -> list[set[str]]:
    """The top-level folders of the checkout, lowest first, each layer a set of siblings that must not
    import each other: the core (rapo_echo/), then the layers of pyproject.toml's first import-linter
    contract that are folders package-dir maps into rapo_echo, then studies/ (not shipped; it reads
    everything). The order lint-imports checks is the order the folder tree shows."""
    folders = {name.split(".", 1)[1]: folder.name for name, folder in package_dirs().items() if "." in name}
    layers = pyproject()["tool"]["importlinter"]["contracts"][0]["layers"]
    mapped = [[folders.get(n.strip()) for n in layer.split("|")] for layer in layers]
    assert all(all(m) or not any(m) for m in mapped), f"a layer mixes folders and core modules: {layers}"
    return [{"rapo_echo"}, *({f for f in m if f} for m in reversed(mapped) if all(m)), {"studies"}]


def folder_rank(folder: str) -> int:
    return next(i for i, layer in enumerate(folder_layers()) if folder in layer)


@functools.cache
def find_modules(with_studies: bool = False) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, whether it is a package's ``__init__``), for every module the
    distribution ships (and, ``with_studies``, the studies beside it)."""
    out: dict[str, tuple[Path, bool]] = {}
    folders = dict(package_dirs())
    if with_studies:
        folders["studies"] = ROOT / "studies"
    for package, folder in folders.items():
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            is_init = parts[-1] == "__init__"
            out[".".join([package, *(parts[:-1] if is_init else parts)])] = (path, is_init)
    return out


@functools.cache
def parsed(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), str(path))


def imported_names(name: str, path: Path, is_init: bool) -> Iterable[str]:
    """Every dotted name an ``import`` / ``from ... import`` of the module may refer to."""
    for node in ast.walk(parsed(path)):
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


@functools.cache
def import_graph(with_studies: bool = False) -> dict[str, set[str]]:
    """Module -> the modules of the distribution it imports."""
    modules = find_modules(with_studies)
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
    assert "rapo_echo.policy" in graph["rapo_echo.training.learner"]  # an import across the mapping is seen


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


def top_folder(path: Path) -> str:
    return path.relative_to(ROOT).parts[0]


def folder_edges() -> dict[tuple[str, str], list[str]]:
    """(importing folder, imported folder) -> the file-level imports behind it, between two different
    top-level folders of the checkout."""
    modules = find_modules(with_studies=True)
    out: dict[tuple[str, str], list[str]] = {}
    for source, targets in import_graph(with_studies=True).items():
        for target in targets:
            a, b = top_folder(modules[source][0]), top_folder(modules[target][0])
            if a != b:
                out.setdefault((a, b), []).append(f"{source} -> {target}")
    return out


def test_the_top_level_folders_are_layers():
    """No two top-level folders import each other, and every import between two of them points down
    folder_layers(): the tree on disk tells a reader the direction the code runs."""
    folders = {top_folder(path) for path, _ in find_modules(with_studies=True).values()}
    layered = set().union(*folder_layers())
    assert folders == layered, f"a folder without a layer: {folders ^ layered}"
    assert {"integrations", "perf"} in folder_layers()  # siblings: neither imports the other
    upward = [
        why
        for (a, b), whys in sorted(folder_edges().items())
        if folder_rank(a) <= folder_rank(b)
        for why in whys
    ]
    assert upward == [], "imports pointing up (or sideways) the folders:\n" + "\n".join(upward)
    assert ("algorithms", "simulators") in folder_edges()  # the remap is applied: such imports are seen


def _string_constants(tree: ast.AST) -> Iterable[tuple[str, str]]:
    """(enclosing assignment target or "", text) of every string constant that is not a docstring."""
    docstrings = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            target = node.targets[0].id if isinstance(node.targets[0], ast.Name) else ""
            for sub in ast.walk(node.value):
                if isinstance(sub, ast.Constant) and isinstance(sub.value, str):
                    docstrings.add(id(sub))
                    yield target, sub.value
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield "", node.value


def test_a_lower_folder_names_a_higher_ones_module_only_in_a_declared_table():
    """An import string (a registry entry, an ``import_module`` argument) is an import all the same:
    a lower folder names a module of a higher folder only in the tables of NAMED_UPWARDS."""
    mapped = {name: top_folder(f / "x") for name, f in package_dirs().items() if name != "rapo_echo"}
    found = []
    for path, _ in sorted(find_modules().values()):
        here = top_folder(path)
        rel = str(path.relative_to(ROOT))
        for target, text in _string_constants(parsed(path)):
            for package, folder in mapped.items():
                if not text.startswith(package + ".") and text != package:
                    continue
                upward = folder_rank(folder) > folder_rank(here)
                if upward and NAMED_UPWARDS.get(rel) != target:
                    found.append(f"{rel}: {text!r}")
    assert found == []


def test_a_checkout_imports_the_mapped_folders_from_where_they_lie():
    """``python -c "import rapo_echo.algorithms"`` from the checkout finds algorithms/ (the editable
    install's finder applies the remap), so tracebacks and tools point at the files a reader edits."""
    import subprocess

    code = "import rapo_echo.algorithms as a, rapo_echo.simulators as s; print(a.__file__); print(s.__file__)"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(ROOT / f / "__init__.py") for f in ("algorithms", "simulators")]


def test_every_package_is_shipped():
    """pyproject.toml lists every package (setuptools cannot discover them under a package-dir prefix):
    a folder with an ``__init__.py`` left out of the list would be missing from the wheel."""
    listed = set(pyproject()["tool"]["setuptools"]["packages"])
    packages = {name for name, (_, is_init) in find_modules().items() if is_init}
    assert packages - listed == set()
    assert listed - packages <= {"rapo_echo.examples"}  # data only (package-data), no __init__.py

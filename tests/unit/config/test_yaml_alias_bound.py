"""YAML alias bombs (issue 31 item 5): a document whose aliases expand past the bound is refused quickly,
naming the line, in a config file, a ``--set`` value (reward args, a scripted engine's script) and every
other YAML reader (they all go through rapo_echo.config.yaml_files.load_yaml_text)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rapo_echo.config.yaml_files import MAX_YAML_NODES, load_yaml_text
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import load_config


def bomb(levels: int = 9, width: int = 9) -> list[str]:
    """Flow-style anchors: level k is a list of ``width`` aliases of level k-1."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    for k in range(1, levels):
        lines.append(f"a{k}: &a{k} [{', '.join([f'*a{k - 1}'] * width)}]")
    return lines


@pytest.fixture
def never_expanded(monkeypatch):
    """Refused quickly: the bomb never reaches the loader that would expand it (9^9 nodes); its size is
    counted on the composed node graph, each anchored node once."""

    safe_load = yaml.safe_load

    def expand(stream, *args, **kwargs):
        if "*a" in str(stream):  # the bombs' aliases (*a0, *a1, ... and *a, *b0, ...)
            raise AssertionError("the alias bomb reached yaml.safe_load")
        return safe_load(stream, *args, **kwargs)

    monkeypatch.setattr(yaml, "safe_load", expand)


def test_a_config_file_bomb_is_refused_quickly_with_its_line(tmp_path: Path, never_expanded) -> None:
    p = tmp_path / "run.yaml"
    p.write_text("rewards:\n  - name: judge\n    args:\n" + "".join(f"      {line}\n" for line in bomb()))
    with pytest.raises(ConfigError, match=rf"{p}:\d+: with its aliases .* more than {MAX_YAML_NODES} nodes"):
        load_config(p)


def test_a_bomb_in_a_set_value_is_refused(never_expanded) -> None:
    script = "{a: &a [x,x,x,x,x,x,x,x,x], " + ", ".join(
        f"b{k}: &b{k} [{', '.join([('*a' if k == 0 else f'*b{k - 1}')] * 9)}]" for k in range(8)
    ) + "}"
    with pytest.raises(ConfigError, match=r"--set judge\.script:1: with its aliases"):
        load_config(overrides=["judge.engine=scripted", f"judge.script={script}"])


def test_modest_aliases_still_load() -> None:
    assert load_yaml_text("a: &x [1, 2]\nb: *x\n", "t.yaml") == {"a": [1, 2], "b": [1, 2]}
    with pytest.raises(ConfigError, match=r"t\.yaml:\d+: with its aliases"):
        load_yaml_text("\n".join(bomb(7)), "t.yaml")

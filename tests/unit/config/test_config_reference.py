"""The config reference (docs/config.md) is generated from the schema and kept current; every key has a
description; the config layer imports no algorithm."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

from rapo_echo.cli import main
from rapo_echo.config.reference import config_sections
from rapo_echo.training.config_cli import command_sections, reference

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "config.md"


def test_the_committed_reference_is_current() -> None:
    assert PAGE.read_text(encoding="utf-8") == reference(), (
        "docs/config.md is stale: run `rapo-echo config --reference --output docs/config.md`"
    )


def test_every_config_key_has_a_description() -> None:
    from rapo_echo.algorithms import get, names
    from rapo_echo.training.run_config import run_config_class

    roots = [run_config_class(get(name)) for name in names(builtin=True)] + list(command_sections().values())
    missing = [
        f"{model.__name__}.{key}"
        for root in roots
        for model in config_sections(root)
        for key, info in model.model_fields.items()
        if not info.description
    ]
    assert missing == []


def test_every_command_but_train_and_config_has_its_section_in_the_reference() -> None:
    """The settings of every command are generated into the reference (issue 45)."""
    commands = set(command_sections())
    expected = {"chat", "data critique-rewrite", "data hard-prompts", "data references", "data synthesize"}
    expected |= {"eval", "export", "openrlhf export", "openrlhf launch", "report", "serve", "train-judge"}
    expected |= {"train"}  # its plan flags (the run's keys are the sections above them)
    assert expected <= commands, expected - commands
    text = reference()
    for name in commands:
        assert f"## rapo-echo {name}\n" in text


def test_the_command_writes_the_reference(tmp_path: Path, capsys) -> None:
    out = tmp_path / "config.md"
    assert main(["config", "--reference", "--output", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text == reference()
    assert "## RapoConfig" in text and "| `rank_reward` | str | `linear` | `linear`, `gopo` |" in text
    assert "## Defaults of `--algo rapo`" in text and "advantage: dr_grpo" in text


def test_the_config_layer_imports_no_other_layer() -> None:
    """rapo_echo.config is the lowest layer: it imports only its own modules and the base utilities."""
    allowed = ("rapo_echo.config", "rapo_echo.errors", "rapo_echo.atomic", "rapo_echo.jsonl")
    allowed += ("rapo_echo.scrub",)  # the lowest layer (pyproject's contract): config.yaml is scrubbed
    for path in sorted((ROOT / "rapo_echo" / "config").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.startswith("rapo_echo"):
                    assert name.startswith(allowed), f"{path.name} imports {name}"
    code = "import sys, rapo_echo.config; print(sorted(m for m in sys.modules if m.startswith('rapo_echo.')))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "rapo_echo.algorithms" not in loaded

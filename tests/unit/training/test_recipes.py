"""configs/recipes/: every recipe loads, its stated ``Plan:`` command runs (here on the Qwen2.5-7B
config.json folder, no weights), the plan fits, and the memory per GPU its header states is the plan's."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from rapo_echo.cli import main
from rapo_echo.training.run_config import load_config
from tests.unit.training.test_plan import shape_folder

ROOT = Path(__file__).resolve().parents[3]
RECIPES = sorted((ROOT / "configs" / "recipes").glob("*.yaml"))


def header(path: Path, key: str) -> str:
    """The ``# key: ...`` line of a recipe's header, with its ``\\`` continuation lines."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"# {key}:"))
    text = lines[start].split(":", 1)[1]
    i = start
    while text.rstrip().endswith("\\"):
        i += 1
        text = text.rstrip()[:-1] + " " + lines[i].lstrip("# ")
    return text.strip()


def test_there_are_the_six_recipes() -> None:
    names = {p.stem for p in RECIPES}
    for algo in ("rapo", "rlver", "echo_n1"):
        assert f"qwen7b_{algo}_1gpu_lora" in names
        assert any(n.startswith(f"qwen7b_{algo}_8gpu_zero") for n in names)


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_plan_matches_its_stated_memory(recipe: Path, tmp_path, smol_path, capsys) -> None:
    cfg = load_config(recipe, check_devices=False)  # cuda: planned here on a CPU machine
    assert cfg.model.name == "Qwen/Qwen2.5-7B-Instruct" and cfg.model.device == "cuda"
    for role in ("simulator", "judge"):
        e = getattr(cfg, role)
        assert e.engine in ("openai", "policy")  # big roles are served, never on the training GPUs
    run = shlex.split(header(recipe, "Run"))
    assert str(recipe.relative_to(ROOT)) in run and "train" in run
    plan_args = shlex.split(header(recipe, "Plan"))
    assert plan_args[:2] == ["rapo-echo", "train"] and "--dry-run" in plan_args
    if "accelerate" in run:  # the plan names the same launch config and process count
        launch = run[run.index("--config_file") + 1]
        assert plan_args[plan_args.index("--accelerate-config") + 1] == launch
        assert plan_args[plan_args.index("--gpus") + 1] == run[run.index("--num_processes") + 1]
    folder = shape_folder(tmp_path, smol_path, "qwen2.5-7b")
    out = tmp_path / "plan.json"
    args = [a if not a.startswith("configs/") else str(ROOT / a) for a in plan_args[1:]]
    assert main([*args, "--model", str(folder), "--plan-json", str(out)]) == 0
    plan = json.loads(out.read_text())
    assert plan["fits"], plan["problems"]
    stated = float(re.match(r"([\d.]+) GB", header(recipe, "expected memory per GPU")).group(1))
    assert stated == pytest.approx(plan["total_bytes"] / 1e9, abs=0.05), capsys.readouterr().out


def test_a_recipe_plans_offline_from_its_shipped_config(capsys) -> None:
    """``--dry-run`` on a recipe retried the Hub five times, then failed, on a machine without it (issue 49,
    item 7): the recipes' model config ships with rapo-echo (HF_HUB_OFFLINE=1 here, tests/conftest.py)."""
    recipe = ROOT / "configs" / "recipes" / "qwen7b_rapo_1gpu_lora.yaml"
    assert main(["train", "--config", str(recipe), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "config.json: rapo-echo's copy of Qwen/Qwen2.5-7B-Instruct's" in out
    assert "(tokenizer not read)" in out


def test_the_dry_run_checks_that_the_data_file_is_there(tmp_path, capsys) -> None:
    """The real run failed on a missing data.path in 5 s; the dry run said nothing of it (issue 49)."""
    recipe = ROOT / "configs" / "recipes" / "qwen7b_rapo_1gpu_lora.yaml"
    missing = tmp_path / "ESConv.json"
    assert main(["train", "--config", str(recipe), "--dry-run", "--set", f"data.path={missing}"]) == 1
    assert f"{missing}: data file not found" in capsys.readouterr().err


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipes_run_the_held_out_judge_on_a_served_role(recipe: Path) -> None:
    cfg = load_config(recipe, check_devices=False)
    held = cfg.monitor.heldout
    assert held.enabled and getattr(cfg, held.engine).engine == "openai"

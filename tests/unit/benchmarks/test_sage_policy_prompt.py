"""The SAGE benchmark gives the policy SAGE's own kind of system prompt by default (so a SAGE score is
comparable with the leaderboard's), ours behind ``--sage-system-prompt ours``; config.json records
which (issue 31 item 22)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.runner import get_benchmark, run_eval
from rapo_echo.benchmarks.sage.run import SAGE_POLICY_PROMPT
from rapo_echo.config import DEFAULT_SYSTEM_PROMPT
from rapo_echo.engines.scripted import ScriptedEngine
from tests.unit.benchmarks.test_bench_sage import profiles_file, row, stepping_simulator


def policy_system(tmp_path: Path, **kw) -> tuple[str, dict]:
    data = profiles_file(tmp_path, [row("a", "+5")])
    policy = ScriptedEngine(default="I hear you.")
    out = tmp_path / "out"
    roles = Roles(policy, stepping_simulator())
    run_eval(get_benchmark("sage"), roles, EvalSettings(max_turns=2, **kw), out, data=data)
    first = policy.calls[0]["prompts"][0][0]
    assert first["role"] == "system"
    return first["content"], json.loads((out / "config.json").read_text())


def test_sage_gives_the_policy_sages_kind_of_system_prompt_by_default(tmp_path: Path) -> None:
    system, config = policy_system(tmp_path)
    assert system == SAGE_POLICY_PROMPT != DEFAULT_SYSTEM_PROMPT
    assert config["settings"]["sage_system_prompt"] == "sage"


def test_ours_is_a_switch_and_recorded(tmp_path: Path) -> None:
    system, config = policy_system(tmp_path, sage_system_prompt="ours")
    assert system == DEFAULT_SYSTEM_PROMPT
    assert config["settings"]["sage_system_prompt"] == "ours"
    with pytest.raises(ValueError, match="sage_system_prompt"):
        EvalSettings(sage_system_prompt="theirs")


def test_the_cli_flag(tmp_path: Path) -> None:
    from rapo_echo.benchmarks.eval_command import EvalCommand
    from rapo_echo.cli import build_parser
    from rapo_echo.config import section_from_args

    def settings(*flags: str) -> EvalSettings:
        argv = ["eval", "--benchmark", "sage", "--policy", "x", "--output", "o", *flags]
        return section_from_args(EvalCommand, build_parser().parse_args(argv)).settings()

    assert settings().sage_system_prompt == "sage"
    assert settings("--sage-system-prompt", "ours").sage_system_prompt == "ours"
    with pytest.raises(SystemExit):
        build_parser().parse_args(
            ["eval", "--benchmark", "sage", "--output", "o", "--sage-system-prompt", "x"]
        )

"""The roles a run builds (:func:`rapo_echo.training.run.roles_used`): those the algorithm declares in
``Needs.roles``, both when the config names reward plugins, and persona inference's; and the exit code
of ``rapo-echo train`` for each way a run ends."""

from __future__ import annotations

import pytest

from rapo_echo.algorithms import get
from rapo_echo.algorithms.base import Needs
from rapo_echo.training.run import roles_used
from rapo_echo.training.run_config import load_config

LENGTH = "rewards=[{name: length}]"


@pytest.mark.parametrize(
    ("algo", "overrides", "roles"),
    [
        ("sft", [], set()),
        ("sft", ["persona.enabled=true", "persona.engine=judge"], {"judge"}),
        ("grpo", [LENGTH], {"simulator", "judge"}),  # a reward may call either
        ("ppo", [LENGTH], {"simulator", "judge"}),
        ("rlver", [], {"simulator"}),
        ("rapo", ["rapo.judge.kind=reactions"], {"simulator"}),
        ("rapo", ["rapo.judge.kind=model"], {"simulator", "judge"}),
    ],
)
def test_the_roles_a_run_builds(algo: str, overrides: list[str], roles: set[str]) -> None:
    cfg = load_config(algo=algo, overrides=overrides)
    assert roles_used(cfg, get(algo).needs(cfg)) == roles


def test_needs_refuses_an_unknown_role() -> None:
    with pytest.raises(ValueError, match="Needs.roles"):
        Needs(roles=("critic",))


@pytest.mark.parametrize(
    ("stopped_by", "code"),
    [
        ("", 0),
        ("SIGTERM", 143),
        ("SIGINT", 130),
        ("short_replies: step 2 reached", 1),
        ("monitor: alarm kl_drift", 1),
    ],
)
def test_the_exit_code_says_how_the_run_ended(monkeypatch, tmp_path, stopped_by: str, code: int) -> None:
    """Finished: 0; by a signal: 128 + its number; by a step hook or an alarm: 1 (all resumable)."""
    from types import SimpleNamespace

    from rapo_echo.training import train_cli

    monkeypatch.setattr(train_cli, "build_config", lambda args: SimpleNamespace())
    monkeypatch.setattr(
        train_cli, "train_with", lambda cfg, resume: SimpleNamespace(run_dir=tmp_path, stopped_by=stopped_by)
    )
    assert train_cli.run(SimpleNamespace(dry_run=False, resume=None)) == code

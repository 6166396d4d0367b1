"""The roles a run builds (:func:`rapo_echo.training.run.roles_used`): those the algorithm declares in
``Needs.roles``, both when the config names reward plugins, and persona inference's."""

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

"""A third-party advantage estimator (tests/helpers/plugin_estimators.py) comes in through the door the
algorithms use: an entry point of ``rapo_echo.advantage_estimators`` or a ``module:function`` path, declared
with ``@advantage_estimator``; ``loss.advantage`` checks the name against the registry, plugins included,
and nothing of the library names it. (tests/integration/test_plugin_estimator.py trains with it.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rapo_echo.algorithms.loss_config import LossConfig
from rapo_echo.algorithms.registries import ADVANTAGE_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import load_config
from tests.helpers.installed import install, named_in_library, two_packages_claim
from tests.helpers.plugin_estimators import minmax_advantages

HELPER = "tests.helpers.plugin_estimators"


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    entry = f"[rapo_echo.advantage_estimators]\nminmax = {HELPER}:minmax_advantages\n"
    return install(tmp_path / "site", "rapo-echo-minmax", entry, monkeypatch)


def test_the_formula_by_hand() -> None:
    # group 7: rewards 1, 2, 4 (mean 7/3, range 3) -> -4/9, -1/9, 5/9; its invalid sample (nan) -> 0.
    # group 2: 3, 3 -> no spread -> 0. group 5: one valid sample -> 0.
    rewards = torch.tensor([1.0, 3.0, 2.0, float("nan"), 4.0, 3.0, 6.0], dtype=torch.float64)
    groups = torch.tensor([7, 2, 7, 7, 7, 2, 5])
    valid = torch.tensor([True, True, True, False, True, True, True])
    adv = minmax_advantages(rewards, groups, valid, eps=0.0)
    expected = torch.tensor([-4 / 9, 0, -1 / 9, 0, 5 / 9, 0, 0], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-12)
    # eps widens the range: 1 -> (1 - 7/3) / (3 + 1)
    assert minmax_advantages(rewards, groups, valid, eps=1.0)[0].item() == pytest.approx(-1 / 3)


def test_the_entry_point_finds_it(installed: Path) -> None:
    assert "minmax" in ADVANTAGE_ESTIMATORS.names()
    assert "minmax" not in ADVANTAGE_ESTIMATORS.names(builtin=True)
    assert ADVANTAGE_ESTIMATORS.get("minmax", "loss.advantage") is minmax_advantages
    assert load_config(overrides=["loss.advantage=minmax"]).loss.advantage == "minmax"


def test_a_path_names_it_without_installing() -> None:
    assert LossConfig(advantage=f"{HELPER}:minmax_advantages").advantage.endswith(":minmax_advantages")


def test_unknown_and_undeclared_names_are_refused_listing_what_is_available(installed: Path) -> None:
    with pytest.raises(ConfigError, match=r"loss.advantage: got 'mimnax'; unknown advantage estimator "
                       r"'mimnax'; known: dr_grpo, grpo, minmax, rloo"):
        load_config(overrides=["loss.advantage=mimnax"])
    with pytest.raises(ConfigError, match=r"'subprocess:Popen' is not a declared advantage estimator"):
        load_config(overrides=["loss.advantage=subprocess:Popen"])
    undeclared = f"{HELPER}:undeclared_advantages"
    with pytest.raises(ValueError, match=r"is not a declared advantage estimator: decorate the function with "
                       r"@rapo_echo.algorithms.registries.advantage_estimator"):
        LossConfig(advantage=undeclared)
    # a formula of one kind is not one of another
    with pytest.raises(ConfigError, match=r"^'[\w.]+:minmax_advantages' is not a declared policy loss"):
        POLICY_LOSSES.get(f"{HELPER}:minmax_advantages", "")
    with pytest.raises(ConfigError, match=r"kl_estimator: got 'k9'; unknown KL estimator 'k9'; known: k1"):
        load_config(overrides=["loss.kl_estimator=k9"])
    assert KL_ESTIMATORS.names(builtin=True) == ["k1", "k2", "k3"]


def test_a_name_two_packages_claim_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    two_packages_claim("twice", monkeypatch)
    twice = r"loss.advantage: the advantage estimator 'twice' is registered twice: a.x:One \(pkg-a\), b.y:Two"
    with pytest.raises(ConfigError, match=twice):
        ADVANTAGE_ESTIMATORS.get("twice", "loss.advantage")


def test_nothing_in_the_library_names_it() -> None:
    assert named_in_library("minmax") == []

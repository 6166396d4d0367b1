"""The checks a validated step must pass to replace the best (``validation.checks``): each check by
hand, building them from a config (built-ins and a check of one's own), and old spellings."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from rapo_echo.errors import ConfigError
from rapo_echo.simulators.hidden_preference import HiddenPreferenceUser
from rapo_echo.training.run_config import load_config
from rapo_echo.training.validation.checks import (
    Check,
    Comparison,
    MinGain,
    RuleFloor,
    SubsetFloor,
    VarietyFloor,
    build_checks,
)

NAN = float("nan")


def gains(**by_name: tuple[float, float]) -> dict[str, dict[str, float]]:
    return {name: {"gain": g, "gain_se": se, "n": 3} for name, (g, se) in by_name.items()}


class NeverCheck(Check):
    """A check of one's own (built by ``module:Class``): refuses every step whose gain is below ``bar``."""

    name = "never"

    def __init__(self, bar: float = 0.0) -> None:
        self.bar = bar

    def refuses(self, c: Comparison) -> list[str]:
        return ["never"] if c.gain < self.bar else []


def test_min_gain_is_a_gate_on_the_overall_gain() -> None:
    assert not MinGain.floor
    assert MinGain(0.0).refuses(Comparison(0.0, 0.5)) == []  # a tie goes to the later step
    assert MinGain(1.0).refuses(Comparison(0.4333, 0.7219)) == ["min_gain"]  # within one standard error
    assert MinGain(1.0).refuses(Comparison(0.8, 0.7219)) == []
    assert MinGain(1.5).refuses(Comparison(0.8, 0.7219)) == ["min_gain"]
    assert MinGain(1.0).refuses(Comparison(5.0, NAN)) == ["min_gain"]  # one paired scenario: no evidence


def test_subset_floor_refuses_the_files_lost_beyond_it() -> None:
    c = Comparison(1.0, 0.1, subsets=gains(a=(1.0, 0.577), b=(-1.5, 0.5), c=(-1.0, NAN)))
    assert SubsetFloor(1.0).refuses(c) == ["b", "c"]  # c: one pair, no standard error, vetoes at any loss
    assert SubsetFloor(3.0).refuses(c) == ["c"]
    assert SubsetFloor(1.0).refuses(Comparison(1.0, 0.1)) == []  # one file: no subsets


def test_rule_floor_refuses_the_watched_rules_that_rise_beyond_it() -> None:
    c = Comparison(1.0, 0.0, rule_gains=gains(meta_talk=(-0.5, 0.289), self_talk=(0.5, 0.289)))
    assert RuleFloor(1.0).refuses(c) == ["rule:meta_talk"]
    assert RuleFloor(2.0).refuses(c) == []  # -0.5 >= -2 * 0.289
    assert RuleFloor(1.0, rules=["self_talk"]).refuses(c) == []  # meta_talk not watched


def test_rule_floor_rules_must_be_negative_rules_of_the_person() -> None:
    from rapo_echo.algorithms.rapo import RAPO

    person = HiddenPreferenceUser(extra_rules=[{"detect": "meta_talk", "weight": -3.0}])
    algo = SimpleNamespace(simulator=person)
    algo.negative_rules = lambda: RAPO.negative_rules(algo)  # RAPO's own reading of its person
    RuleFloor(1.0, rules=["meta_talk", "self_talk"]).bind(algo)
    with pytest.raises(ConfigError, match=r"rule_floor rules: \['reflects_feeling'\] are not negative"):
        RuleFloor(1.0, rules=["meta_talk", "reflects_feeling"]).bind(algo)
    unknown = SimpleNamespace(negative_rules=lambda: None)  # a person without rules: nothing to check
    RuleFloor(1.0, rules=["anything"]).bind(unknown)


def test_variety_floor_refuses_replies_less_varied_beyond_it() -> None:
    c = Comparison(1.0, 0.0, variety={"gain": -50.0, "gain_se": 25.0, "n": 4})
    assert VarietyFloor(1.0).refuses(c) == ["variety"]
    assert VarietyFloor(2.0).refuses(c) == []
    assert VarietyFloor(1.0).refuses(Comparison(1.0, 0.0)) == []  # no replies to compare


def test_checks_are_built_from_the_config_in_order() -> None:
    cfg = load_config(
        overrides=[
            "validation.checks=[{name: variety_floor, se: 1}, {name: min_gain, se: 1.5}, "
            "{name: rule_floor, se: 2, rules: [meta_talk]}, {name: subset_floor, se: 0}, "
            "{name: 'tests.unit.training.test_validation_checks:NeverCheck', bar: 0.25}]"
        ]
    )
    checks = build_checks(cfg.validation.checks)
    assert [type(c) for c in checks] == [VarietyFloor, MinGain, RuleFloor, SubsetFloor, NeverCheck]
    assert (checks[1].se, checks[2].rules, checks[3].se, checks[4].bar) == (1.5, ["meta_talk"], 0.0, 0.25)
    assert checks[4].refuses(Comparison(0.0, NAN)) == ["never"]
    assert build_checks(load_config().validation.checks) == []


def test_check_specs_are_validated_up_front() -> None:
    with pytest.raises(ConfigError, match=r"validation.checks.0.name: got 'min_gian'; unknown check"):
        load_config(overrides=["validation.checks=[{name: min_gian, se: 1}]"])
    with pytest.raises(ConfigError, match=r"validation.checks.0.se: got \(missing\)"):
        load_config(overrides=["validation.checks=[{name: variety_floor}]"])
    with pytest.raises(ConfigError, match=r"checks.0.f: got 1; unknown key; allowed keys here: name, se$"):
        load_config(overrides=["validation.checks=[{name: subset_floor, f: 1}]"])
    with pytest.raises(ConfigError, match=r"validation.checks.0: 'math:pi' is not a validation check"):
        build_checks(load_config(overrides=["validation.checks=[{name: 'math:pi'}]"]).validation.checks)
    with pytest.raises(ConfigError, match=r"validation.checks.0: .*NeverCheck.*unexpected keyword"):
        spec = "{name: 'tests.unit.training.test_validation_checks:NeverCheck', floor: 1}"
        build_checks(load_config(overrides=[f"validation.checks=[{spec}]"]).validation.checks)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("min_gain=1", "validation.checks: [{name: min_gain, se: 1}]"),
        ("subset_floor=1.0", "validation.checks: [{name: subset_floor, se: 1.0}]"),
        ("rule_floor=2", "validation.checks: [{name: rule_floor, se: 2, rules: [...]}]"),
        ("floor_rules=[meta_talk]", "validation.checks: [{name: rule_floor, se: F, rules: ['meta_talk']}]"),
        ("variety_floor=1", "validation.checks: [{name: variety_floor, se: 1}]"),
    ],
)
def test_old_spellings_name_the_new_one(old: str, new: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=[f"validation.{old}"])
    assert f"no longer a key; write it as {new}" in str(err.value)

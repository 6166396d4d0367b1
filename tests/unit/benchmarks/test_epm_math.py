"""EPM and EPM-Q formulas against numbers worked out by hand (benchmarks/epm/vectors.py)."""

from __future__ import annotations

import math

import pytest

from rapo_echo.benchmarks.epm.vectors import (
    EpmConfig,
    Point,
    advance,
    case_indices,
    case_quantities,
    difficulty,
    directional_collapse,
    distance_to_zone,
    dominant_axis,
    epm_config,
    epmq,
    first_verdict,
    initial_deficit,
    regression,
    stagnation,
    start_point,
    step_vector,
    success_kind,
    thresholds,
    verdict,
)
from rapo_echo.errors import ConfigError

CFG = EpmConfig()
ZERO_MDEP = {"C.Prog": 0, "C.Neg": 0, "A.Prog": 0, "A.Neg": 0, "P.Prog": 0, "P.Neg": 0}


def mdep(**levels: int) -> dict[str, int]:
    return {**ZERO_MDEP, **{k.replace("_", "."): v for k, v in levels.items()}}


def test_iedr_levels_map_to_the_initial_deficit():
    levels = {"C.1": 2, "C.2": 1, "C.3": 3, "A.1": 1, "A.2": 2, "A.3": 0, "P.1": 3, "P.2": 1, "P.3": 2}
    # C: -(2*1*2 + 2*1*1 + 2*1.5*3) = -15; A: -(2*1 + 2*2*2 + 0) = -10; P: -(2*3 + 2*2*1 + 2*1.5*2) = -16
    assert initial_deficit(levels, CFG) == (-15.0, -10.0, -16.0)
    top = dict.fromkeys(levels, 3)  # the deepest deficit per axis: C -21, A -27, P -27
    assert initial_deficit(top, CFG) == (-21.0, -27.0, -27.0)
    assert initial_deficit(dict.fromkeys(levels, 0), CFG) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="C.2"):
        initial_deficit({**levels, "C.2": 4}, CFG)
    with pytest.raises(ValueError, match="P.3"):
        initial_deficit({k: v for k, v in levels.items() if k != "P.3"}, CFG)


def test_mdep_levels_map_to_step_vectors():
    # progress 0/1/2 -> 0/+1/+3; regress 0/-1/-2 -> C 0/-2/-4, A and P 0/-2/-5
    assert step_vector(mdep(C_Prog=2, C_Neg=-1, A_Neg=-2, P_Prog=1), CFG) == (1.0, -5.0, 1.0)
    assert step_vector(mdep(C_Neg=-2, A_Prog=1, A_Neg=-1, P_Prog=2, P_Neg=-2), CFG) == (-4.0, -1.0, -2.0)
    assert step_vector(ZERO_MDEP, CFG) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="A.Neg"):
        step_vector(mdep(A_Neg=1), CFG)


def test_work_alignment_and_projection_of_one_step():
    p0 = (-3.0, -4.0, 0.0)  # |P0| = 5, v*0 = (0.6, 0.8, 0)
    th = thresholds(p0, CFG)
    assert th.v_star0 == pytest.approx((0.6, 0.8, 0.0))
    assert (th.eps_energy, th.eps_distance, th.eps_direction) == pytest.approx((5.0, 0.5, 0.5))
    points = [start_point(p0, th, CFG)]
    assert points[0].distance == pytest.approx(math.sqrt(13))  # (-3+1)^2 + (-4+1)^2: the zone is >= -1
    assert points[0].projection == pytest.approx(-5.0)
    pt = advance(points, (1.0, 1.0, 1.0), 1, th, CFG)
    assert pt.p == (-2.0, -3.0, 1.0)
    assert pt.d_e == pytest.approx(1.4)  # 0.6 + 0.8
    assert pt.alignment == pytest.approx(1.4 / math.sqrt(3))
    assert pt.p_norm == pytest.approx(math.sqrt(14))
    assert pt.projection == pytest.approx(-3.6)  # -1.2 - 2.4
    assert pt.distance == pytest.approx(math.sqrt(5))  # (-2+1)^2 + (-3+1)^2
    # the paper's dynamic direction: dE of the next step along -P1/|P1| = (2, 3, -1)/sqrt(14)
    dyn = EpmConfig(direction="current")
    pt2 = advance(points, (1.0, 1.0, 1.0), 2, th, dyn)
    assert pt2.d_e == pytest.approx(4 / math.sqrt(14))
    assert pt2.e_total == pytest.approx(1.4 + 4 / math.sqrt(14))
    assert pt2.projection == pytest.approx((-1 * 0.6) + (-2 * 0.8))  # positional test keeps v*0


def test_zone_distance_dominant_axis_and_difficulty():
    assert distance_to_zone((-1.0, 5.0, -0.5), 1.0) == 0.0
    assert distance_to_zone((-4.0, -1.0, -2.0), 1.0) == pytest.approx(math.sqrt(9 + 1))
    assert dominant_axis((-17, -18, -13)) == "A"
    assert dominant_axis((-21, -18, -21)) == "C"  # ties: C before A before P
    assert [difficulty(x, CFG) for x in (20.0, 27.0, 31.9, 32.0, 36.0)] == [
        "easy",
        "medium",
        "medium",
        "hard",
        "extreme",
    ]


def _path(p0, steps, cfg):
    th = thresholds(p0, cfg)
    points = [start_point(p0, th, cfg)]
    for t, v in enumerate(steps, 1):
        advance(points, v, t, th, cfg)
    return points, th


def test_success_positional_and_geometric_not_before_min_turns():
    cfg = EpmConfig(min_turns=2)
    p0 = (-3.0, -4.0, 0.0)
    # (3,3,0) then (1,1,0): E = 4.2 + 1.4 = 5.6 >= 5; P2 = (1,0,0): |P2| = 1 > 0.5, P2.v*0 = 0.6 >= -0.5
    points, th = _path(p0, [(3, 3, 0), (1, 1, 0)], cfg)
    assert verdict(points[:2], 1, th, cfg) is None  # turn 1 < min_turns
    v = verdict(points, 2, th, cfg)
    assert (v.outcome, v.reason, v.turn) == ("success", "positional", 2)
    # (3,3,0) then (0,1,0): E = 5.0, P2 = origin: |P2| = 0 <= 0.5
    points, th = _path(p0, [(3, 3, 0), (0, 1, 0)], cfg)
    assert verdict(points, 2, th, cfg).reason == "geometric"
    assert verdict(points, 2, th, EpmConfig(min_turns=3)) is None
    assert first_verdict(points, th, cfg).turn == 2


def test_success_needs_the_energy_threshold():
    th = thresholds((-3.0, -4.0, 0.0), CFG)
    near = Point(12, (0.1, 0.1, 0.0), (1, 1, 0), 0.0, 1.0, 1.0, e_total=4.99, p_norm=0.14, projection=0.14)
    assert success_kind(near, 12, th, CFG) is None
    near.e_total = 5.0
    assert success_kind(near, 12, th, CFG) == "geometric"
    far = Point(12, (0.0, -1.0, 0.0), (0, 0, 0), 0.0, 0.0, 0.0, e_total=6.0, p_norm=1.0, projection=-0.8)
    assert success_kind(far, 12, th, CFG) is None  # |P| 1 > 0.5 and projection -0.8 < -0.5
    far.projection = -0.5
    assert success_kind(far, 12, th, CFG) == "positional"


def _points(d_es, norms=None):
    norms = norms or [10.0] * (len(d_es) + 1)
    out = [Point(0, (-1, -1, -1), (0, 0, 0), 0.0, None, p_norm=norms[0])]
    out += [
        Point(t, (-1, -1, -1), (0, 0, 0), 0.0, d, p_norm=n)
        for t, (d, n) in enumerate(zip(d_es, norms[1:]), 1)
    ]
    return out


def test_directional_collapse_needs_five_negative_steps_from_min_turns():
    cfg = EpmConfig(min_turns=5)
    assert directional_collapse(_points([-1, -0.1, -2, -0.5, -1]), 5, cfg)
    assert not directional_collapse(_points([-1, -0.1, 0.0, -0.5, -1]), 5, cfg)  # 0 is not negative
    assert not directional_collapse(_points([-1, -0.1, -2, -0.5, -1]), 4, cfg)  # before min_turns
    assert not directional_collapse(_points([-1, -0.1, -2, -0.5]), 5, cfg)  # only four steps
    assert directional_collapse(_points([3, -1, -1, -1, -1, -1]), 6, cfg)  # only the last five count


def test_stagnation_uses_the_sample_standard_deviation():
    cfg = EpmConfig(min_turns=5)
    flat = [20.0, 10.0, 10.2, 10.4, 10.2, 10.0]  # last five: sample std 0.167
    assert stagnation(_points([0] * 5, flat), 5, cfg)
    # last five 0, 0, 0, 0, 1.2: sample std 0.537 (>= 0.5), population std 0.48 (< 0.5)
    assert not stagnation(_points([0] * 5, [5.0, 0.0, 0.0, 0.0, 0.0, 1.2]), 5, cfg)
    assert not stagnation(_points([0] * 5, flat), 4, cfg)


def test_regression_needs_more_than_seventy_percent_negative_and_a_sum_below_minus_one():
    cfg = EpmConfig(min_turns=8)
    six = [-1, -0.5, 0.5, -0.5, -0.5, 1, -0.5, -0.5]  # 6 of 8 negative (> 5.6), sum -2.5
    assert regression(_points(six), 8, cfg)
    five = [-1, -0.5, 0.5, -0.5, 0.2, 1, -0.5, -0.5]  # 5 of 8: not more than 70 %
    assert not regression(_points(five), 8, cfg)
    shallow = [-0.1, -0.1, 0.4, -0.1, -0.1, 0.5, -0.1, -0.1]  # 6 negative, sum -0.1
    assert not regression(_points(shallow), 8, cfg)


def test_failure_verdict_needs_stagnation_and_regression_together():
    cfg = EpmConfig(min_turns=8)
    th = thresholds((-3.0, -4.0, 0.0), cfg)
    d_es = [-1, -0.5, 0.5, -0.5, -0.5, 1, -0.5, -0.5]
    flat = [10.0] * 4 + [10.0, 10.1, 10.0, 10.1, 10.0]
    pts = _points(d_es, flat)
    assert verdict(pts, 8, th, cfg).reason == "stagnation+regression"
    moving = [10.0] * 4 + [10.0, 11.0, 12.0, 13.0, 14.0]  # regression without stagnation
    assert verdict(_points(d_es, moving), 8, th, cfg) is None
    collapse = _points([1, 1, 1, -1, -1, -1, -1, -1], moving)
    assert verdict(collapse, 8, th, cfg).reason == "collapse"


def _two_step_case(cfg):
    p0 = (-3.0, -4.0, 0.0)
    th = thresholds(p0, cfg)
    points = [start_point(p0, th, cfg)]
    advance(points, step_vector(mdep(C_Prog=2, A_Prog=2), cfg), 1, th, cfg, mdep(C_Prog=2, A_Prog=2))
    lv2 = mdep(C_Neg=-1, A_Prog=1)
    advance(points, step_vector(lv2, cfg), 2, th, cfg, lv2)
    return points


def test_epmq_indices_of_a_hand_worked_case():
    # P0 (-3,-4,0); v1 = (3,3,0): dE 4.2, cos 4.2/(3 sqrt 2); v2 = (-2,1,0): dE -0.4, cos -0.4/sqrt 5
    points = _two_step_case(CFG)
    r0 = math.sqrt(13)  # distance to the zone at the start; |P0| = 5
    assert points[-1].p == (-2.0, 0.0, 0.0) and points[-1].distance == pytest.approx(1.0)
    q = case_quantities(points, 2, CFG)
    assert q["r0"] == pytest.approx(r0)
    assert q["e_total"] == pytest.approx(3.8)
    assert q["s_net"] == 4  # levels: (2 + 2) + (-1 + 1)
    align = (0 + 4.2 / (3 * math.sqrt(2)) - 0.4 / math.sqrt(5)) / 3  # the start point counts (as published)
    tau = (3 * math.sqrt(2) + math.sqrt(5)) / math.sqrt(17)  # path length / |P2 - P0|
    idx = case_indices(q, CFG)
    expected = {
        "idx_rdi": ((r0 - 1) / r0 * 100 + 100) / 2,
        "idx_etot": 3.8 / (1.2 * r0) * 100,
        "idx_snet": 4 / (1.5 * r0) * 100,
        "idx_rho": 1.9 / 2.5 * 100,
        "idx_sproj": (3.8 / 3) / 2.5 * 100,
        "idx_tau": (3 - tau) / 2 * 100,
        "idx_rpos": 100 / 3,
        "idx_align": (align + 1) / 2 * 100,
        "idx_pen": (3 - 1 / 3) / 3 * 100,
    }
    assert idx == pytest.approx(expected)
    # numerically: RDI 86.13, Etot 87.83, Snet 73.96, rho 76.0, Sproj 50.67, tau 71.43, Rpos 33.33,
    # Align 63.52, Pen 88.89
    assert [round(idx[k], 2) for k in expected] == [
        86.13,
        87.83,
        73.96,
        76.0,
        50.67,
        71.43,
        33.33,
        63.52,
        88.89,
    ]


def test_epmq_switches_for_the_papers_readings():
    steps_only = EpmConfig(means_include_start=False)
    idx = case_indices(case_quantities(_two_step_case(steps_only), 2, steps_only), steps_only)
    assert idx["idx_sproj"] == pytest.approx(76.0)  # 3.8 / 2 steps
    assert idx["idx_rpos"] == pytest.approx(50.0)
    assert idx["idx_pen"] == pytest.approx((3 - 0.5) / 3 * 100)
    scores = EpmConfig(mdep_sums="scores")
    q = case_quantities(_two_step_case(scores), 2, scores)
    assert q["s_net"] == 5  # components: (3 + 3 + 0) + (-2 + 1 + 0)
    assert q["r_pen"] == pytest.approx(2 / 3)  # |regress score| of C.Neg -1 is 2


def test_index_edge_cases_clamp_as_published():
    base = {"r0": 0.0, "r_final": 0.0, "rdi": 0.0, "e_total": -3.0, "s_net": -2.0, "rho": -1.0}
    base |= {"s_proj": -1.0, "tortuosity": 0.0, "r_pos": 0.0, "alignment": -1.0, "r_pen": 4.0}
    idx = case_indices(base, CFG)
    assert idx == {
        "idx_rdi": 50.0,
        "idx_etot": 0.0,
        "idx_snet": 0.0,
        "idx_rho": 0.0,
        "idx_sproj": 0.0,
        "idx_tau": 100.0,  # tortuosity below 1 (a closed loop) counts as 1
        "idx_rpos": 0.0,
        "idx_align": 0.0,
        "idx_pen": 0.0,
    }
    assert case_indices({**base, "rdi": 250.0}, CFG)["idx_rdi"] == 100.0


def test_epmq_groups_and_weighted_total():
    a = dict.fromkeys(("idx_rdi", "idx_etot", "idx_snet"), 90.0)
    a |= dict.fromkeys(("idx_rho", "idx_sproj", "idx_tau"), 60.0)
    a |= dict.fromkeys(("idx_rpos", "idx_align", "idx_pen"), 30.0)
    b = {k: v + 30.0 for k, v in a.items()}
    out = epmq([a, b], CFG)
    assert (out["outcome"], out["efficiency"], out["stability"]) == (105.0, 75.0, 45.0)
    assert out["epmq"] == pytest.approx(0.4 * 105 + 0.2 * 75 + 0.4 * 45)  # 75.0
    assert epmq([], CFG) == {}


def test_config_overrides_are_validated():
    assert epm_config(["alpha=0.05", "rho_max=3.464"]).alpha == 0.05
    assert epm_config({"direction": "current"}).direction == "current"
    with pytest.raises(ConfigError, match=r"epm\.alhpa"):
        epm_config(["alhpa=0.05"])
    with pytest.raises(ConfigError, match=r"epm\.alpha: got -1"):
        epm_config(["alpha=-1"])
    with pytest.raises(ConfigError, match="min_turns"):
        epm_config(["min_turns=50"])

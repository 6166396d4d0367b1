"""The Empathy Physics Model (EPM) and its quality index EPM-Q, as pure functions.

Reimplemented from the formulas (EMPA, arXiv 2603.00552, and the benchmark's published code), never
from its source. The method, its constants and where the defaults follow the published code rather than
the paper: docs/benchmarks.md (EPM). Every constant is a field of :class:`EpmConfig`."""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator

from rapo_echo.config import Strict, parse_override
from rapo_echo.errors import ConfigError

AXES = ("C", "A", "P")
AXIS_NAMES = {"C": "cognitive", "A": "affective", "P": "proactive"}
Vec = tuple[float, float, float]


@dataclass(frozen=True)
class Indicator:
    """One IEDR indicator: what the judge rates 0..3 and how much a level weighs on its axis."""

    key: str
    axis: str
    name: str
    weight: float
    question: str


IEDR_INDICATORS: tuple[Indicator, ...] = (
    Indicator(
        "C.1",
        "C",
        "complexity",
        1.0,
        "How much knowledge or reasoning it takes to grasp the person's situation "
        "(0 everyday, 1 some thought, 2 specialised knowledge, 3 tangled and many-sided).",
    ),
    Indicator(
        "C.2",
        "C",
        "depth",
        1.0,
        "How deep their own thinking about it goes (0 surface facts, 1 some reflection, "
        "2 questions their habits or values, 3 questions who they are).",
    ),
    Indicator(
        "C.3",
        "C",
        "cognitive priority",
        1.5,
        "How much they need to be understood and helped to think it through "
        "(0 not at all, 1 secondary, 2 important, 3 the main reason they talk).",
    ),
    Indicator(
        "A.1",
        "A",
        "intensity",
        1.0,
        "How strong their feelings are (0 calm, 1 mild, 2 strong, 3 overwhelming).",
    ),
    Indicator(
        "A.2",
        "A",
        "accessibility",
        2.0,
        "How hard their feelings are to reach (0 said openly, 1 partly hidden, "
        "2 masked or in conflict with what they show, 3 locked away or denied).",
    ),
    Indicator(
        "A.3",
        "A",
        "affective priority",
        1.5,
        "How much they need their feelings to be shared and validated "
        "(0 not at all, 1 secondary, 2 important, 3 the main reason they talk).",
    ),
    Indicator(
        "P.1",
        "P",
        "agency",
        1.0,
        "How far their sense that they can act is weakened (0 acting confidently, 1 acting with "
        "help, 2 stuck, 3 helpless).",
    ),
    Indicator(
        "P.2",
        "P",
        "value relevance",
        2.0,
        "How close the matter sits to what they value most (0 incidental, 1 matters, "
        "2 touches a core value or goal, 3 threatens their sense of worth).",
    ),
    Indicator(
        "P.3",
        "P",
        "proactive priority",
        1.5,
        "How much they need to be affirmed and encouraged to act "
        "(0 not at all, 1 secondary, 2 important, 3 the main reason they talk).",
    ),
)
IEDR_KEYS = tuple(i.key for i in IEDR_INDICATORS)
IEDR_LEVELS = (0, 1, 2, 3)
PROGRESS_LEVELS = (0, 1, 2)
REGRESS_LEVELS = (0, -1, -2)
MDEP_KEYS = tuple(f"{a}.{kind}" for a in AXES for kind in ("Prog", "Neg"))


class EpmConfig(Strict):
    """Every constant of the EPM and EPM-Q (defaults: the published leaderboard's values)."""

    deficit_unit: float = Field(
        2.0, gt=0, description="IEDR level L of an indicator of weight w adds -unit*w*L"
    )
    progress_scores: tuple[float, float, float] = Field(
        (0.0, 1.0, 3.0), description="MDEP progress level 0/1/2 -> step component (every axis)"
    )
    regress_scores_c: tuple[float, float, float] = Field(
        (0.0, -2.0, -4.0), description="MDEP regress level 0/-1/-2 -> step component on C"
    )
    regress_scores_ap: tuple[float, float, float] = Field(
        (0.0, -2.0, -5.0), description="MDEP regress level 0/-1/-2 -> step component on A and P"
    )
    direction: Literal["initial", "current"] = Field(
        "initial",
        description="direction of dE: the fixed -P0/|P0| (published code) or -P_{t-1}/|P_{t-1}| (paper)",
    )
    alpha: float = Field(
        0.1, gt=0, description="eps_distance = eps_direction = alpha*|P0| (0.1 Nov 2025, 0.05 Mar 2026)"
    )
    zone_epsilon: float = Field(
        1.0, ge=0, description="the zone is every axis >= -zone_epsilon; r0 = distance to it"
    )
    min_turns: int = Field(12, ge=1, description="no success or failure verdict before this turn")
    max_turns: int = Field(
        45, ge=1, description="a dialogue without a verdict ends here (timeout, not a success)"
    )
    eval_interval: int = Field(1, ge=1, description="K: the judge scores the last K turns every K turns")
    collapse_window: int = Field(5, ge=1, description="directional collapse: the last N dE all < 0")
    stagnation_window: int = Field(5, ge=2, description="stagnation: sample std of |P_t| over the last N ...")
    stagnation_threshold: float = Field(0.5, ge=0, description="... below this")
    regression_window: int = Field(8, ge=1, description="regression: over the last N dE ...")
    regression_ratio: float = Field(0.7, ge=0, le=1, description="... more than this share < 0 ...")
    regression_sum: float = Field(-1.0, description="... and their sum below this")
    rho_max: float = Field(
        2.5, gt=0, description="Idx_rho and Idx_Sproj divide by this (paper appendix: sqrt(12))"
    )
    alpha_s: float = Field(1.5, gt=0, description="Idx_Snet = S_net / (alpha_s r0) (paper appendix: 1.2)")
    beta: float = Field(1.2, gt=0, description="Idx_Etot = E_total / (beta r0)")
    weights: tuple[float, float, float] = Field(
        (0.4, 0.2, 0.4), description="EPM-Q weights of Outcome, Efficiency, Stability"
    )
    mdep_sums: Literal["levels", "scores"] = Field(
        "levels",
        description="S_net and R_pen sum MDEP levels (published code) or their mapped step scores",
    )
    means_include_start: bool = Field(
        True,
        description="per-turn means (R_pos, Align, S_proj, R_pen) divide by T+1, the start point included "
        "as in the published code; false: by the T steps",
    )
    difficulty_bounds: tuple[float, float, float] = Field(
        (27.0, 32.0, 36.0), description="|P0| below each bound: easy, medium, hard; above the last: extreme"
    )
    iedr_source: Literal["auto", "case", "judge"] = Field(
        "auto", description="P0 from the case's own IEDR levels (auto: when it has them) or the judge"
    )
    director: Literal["llm", "schedule"] = Field(
        "llm", description="story stages released by the director model, or one every stage_every turns"
    )
    stage_every: int = Field(3, ge=1, description="schedule director: a new story stage every N turns")
    judge_history_turns: int = Field(6, ge=0, description="earlier turns the MDEP judge sees as context")
    recompute_from: Literal["stored", "levels"] = Field(
        "stored",
        description="--recompute: per-step values as the result files store them, or recomputed from the "
        "MDEP levels",
    )

    @model_validator(mode="after")
    def _bounds(self) -> EpmConfig:
        if list(self.difficulty_bounds) != sorted(self.difficulty_bounds):
            raise ValueError("difficulty_bounds must increase")
        if self.min_turns > self.max_turns:
            raise ValueError(f"min_turns ({self.min_turns}) must be <= max_turns ({self.max_turns})")
        return self


def epm_config(overrides: Mapping[str, Any] | Sequence[str] = ()) -> EpmConfig:
    """An :class:`EpmConfig` from ``{key: value}`` or ``["key=value", ...]`` (values parsed as YAML);
    a bad key or value is a :class:`ConfigError` naming it."""
    items = dict(overrides) if isinstance(overrides, Mapping) else {}
    if not isinstance(overrides, Mapping):
        for text in overrides:
            path, value = parse_override(text)
            items[".".join(path)] = value
    try:
        return EpmConfig(**items)
    except ValidationError as exc:
        problems = "; ".join(
            f"epm.{'.'.join(str(x) for x in e['loc']) or '(top level)'}: got {e.get('input')!r}; {e['msg']}"
            for e in exc.errors()
        )
        raise ConfigError(f"invalid EPM setting: {problems}") from None


# ---------------------------------------------------------------------------- vectors


def norm(v: Sequence[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def check_levels(
    levels: Mapping[str, int], keys: Sequence[str], allowed: Mapping[str, Sequence[int]]
) -> None:
    """``ValueError`` unless every key has an allowed integer level."""
    for key in keys:
        level = levels.get(key)
        if isinstance(level, bool) or not isinstance(level, int) or level not in allowed[key]:
            raise ValueError(f"{key}: level {level!r} not in {list(allowed[key])}")


IEDR_ALLOWED = {k: IEDR_LEVELS for k in IEDR_KEYS}
MDEP_ALLOWED = {k: (PROGRESS_LEVELS if k.endswith("Prog") else REGRESS_LEVELS) for k in MDEP_KEYS}


def initial_deficit(levels: Mapping[str, int], cfg: EpmConfig) -> Vec:
    """P0 from the nine IEDR levels (0..3)."""
    check_levels(levels, IEDR_KEYS, IEDR_ALLOWED)
    out = {a: 0.0 for a in AXES}
    for ind in IEDR_INDICATORS:
        out[ind.axis] -= cfg.deficit_unit * ind.weight * levels[ind.key]
    return (out["C"], out["A"], out["P"])


def step_vector(levels: Mapping[str, int], cfg: EpmConfig) -> Vec:
    """v_t from the six MDEP levels (progress 0..2, regress 0..-2 per axis)."""
    check_levels(levels, MDEP_KEYS, MDEP_ALLOWED)
    out = []
    for a in AXES:
        regress = cfg.regress_scores_c if a == "C" else cfg.regress_scores_ap
        out.append(cfg.progress_scores[levels[f"{a}.Prog"]] + regress[-levels[f"{a}.Neg"]])
    return (out[0], out[1], out[2])


def distance_to_zone(p: Sequence[float], eps: float) -> float:
    """Euclidean distance from ``p`` to the region where every axis is >= -eps."""
    return math.sqrt(sum((x + eps) ** 2 for x in p if x < -eps))


def dominant_axis(p0: Sequence[float]) -> str:
    """The axis with the largest deficit (ties: C before A before P)."""
    return AXES[max(range(3), key=lambda i: (-p0[i], -i))]


def difficulty(p0_norm: float, cfg: EpmConfig) -> str:
    """easy / medium / hard / extreme by |P0| and ``cfg.difficulty_bounds``."""
    for bound, name in zip(cfg.difficulty_bounds, ("easy", "medium", "hard")):
        if p0_norm < bound:
            return name
    return "extreme"


@dataclass(frozen=True)
class Thresholds:
    """A case's success thresholds, fixed at the start."""

    p0_norm: float
    v_star0: Vec
    eps_energy: float
    eps_distance: float
    eps_direction: float


def thresholds(p0: Sequence[float], cfg: EpmConfig, alpha: float | None = None) -> Thresholds:
    """eps_energy = |P0|, eps_distance = eps_direction = alpha |P0|, v*0 = -P0/|P0|."""
    n = norm(p0)
    a = cfg.alpha if alpha is None else alpha
    v_star = tuple(-x / n for x in p0) if n > 0 else (0.0, 0.0, 0.0)
    return Thresholds(n, (v_star[0], v_star[1], v_star[2]), n, a * n, a * n)


@dataclass
class Point:
    """One point of a trajectory: the start (turn 0, ``v`` zero) or the state after an evaluation."""

    turn: int
    p: Vec
    v: Vec
    distance: float  # to the zone
    d_e: float | None = None  # None at the start point
    alignment: float = 0.0
    e_total: float = 0.0
    p_norm: float = 0.0
    projection: float = 0.0  # P_t . v*0
    levels: dict[str, int] = field(default_factory=dict)  # MDEP levels (empty at the start point)

    def to_json(self) -> dict[str, Any]:
        """The point in the published result files' shape (``mdep_analysis`` levels, ``epm`` block)."""
        out: dict[str, Any] = {
            "turn": self.turn,
            "P_t": list(self.p),
            "v_t": list(self.v),
            "distance": self.distance,
            "in_zone": self.distance == 0.0,
            "epm": {
                "P_norm": self.p_norm,
                "E_total": self.e_total,
                "projection": self.projection,
                "alignment": self.alignment,
                **({"delta_E": self.d_e, "v_t_norm": norm(self.v)} if self.d_e is not None else {}),
            },
        }
        if self.levels:
            out["mdep_analysis"] = {f"{k.replace('.', '_')}_level": level for k, level in self.levels.items()}
        return out


def start_point(p0: Sequence[float], th: Thresholds, cfg: EpmConfig) -> Point:
    """The trajectory's turn-0 point."""
    p = (float(p0[0]), float(p0[1]), float(p0[2]))
    distance = distance_to_zone(p, cfg.zone_epsilon)
    return Point(0, p, (0.0, 0.0, 0.0), distance, p_norm=th.p0_norm, projection=dot(p, th.v_star0))


def advance(
    points: list[Point],
    v: Sequence[float],
    turn: int,
    th: Thresholds,
    cfg: EpmConfig,
    levels: Mapping[str, int] | None = None,
) -> Point:
    """Append the point after step ``v`` at ``turn``: P_t, dE_t, alignment, E_total, |P_t|, projection."""
    prev = points[-1]
    p = (prev.p[0] + v[0], prev.p[1] + v[1], prev.p[2] + v[2])
    if cfg.direction == "initial":
        ideal = th.v_star0
    else:
        n = norm(prev.p)
        ideal = tuple(-x / n for x in prev.p) if n > 0 else (0.0, 0.0, 0.0)
    v_norm = norm(v)
    d_e = dot(v, ideal)
    point = Point(
        turn,
        p,
        (float(v[0]), float(v[1]), float(v[2])),
        distance_to_zone(p, cfg.zone_epsilon),
        d_e,
        d_e / v_norm if v_norm > 0 else 0.0,
        prev.e_total + d_e,
        norm(p),
        dot(p, th.v_star0),
        dict(levels or {}),
    )
    points.append(point)
    return point


# ---------------------------------------------------------------------------- verdicts


def success_kind(point: Point, turn: int, th: Thresholds, cfg: EpmConfig) -> str | None:
    """``geometric`` / ``positional`` when the success rule holds at ``point``, else None."""
    if turn < cfg.min_turns or point.e_total < th.eps_energy:
        return None
    if point.p_norm <= th.eps_distance:
        return "geometric"
    if point.projection >= -th.eps_direction:
        return "positional"
    return None


def _window(points: Sequence[Point], turn: int, size: int, cfg: EpmConfig) -> list[Point] | None:
    """The last ``size`` step points, or None before ``min_turns`` or when fewer steps exist."""
    if turn < cfg.min_turns or len(points) < size + 1:
        return None
    return list(points[-size:])


def directional_collapse(points: Sequence[Point], turn: int, cfg: EpmConfig) -> bool:
    """The last ``collapse_window`` dE are all negative."""
    w = _window(points, turn, cfg.collapse_window, cfg)
    return w is not None and all(p.d_e is not None and p.d_e < 0 for p in w)


def stagnation(points: Sequence[Point], turn: int, cfg: EpmConfig) -> bool:
    """The sample standard deviation of |P_t| over the last ``stagnation_window`` points is small."""
    w = _window(points, turn, cfg.stagnation_window, cfg)
    return w is not None and statistics.stdev(p.p_norm for p in w) < cfg.stagnation_threshold


def regression(points: Sequence[Point], turn: int, cfg: EpmConfig) -> bool:
    """More than ``regression_ratio`` of the last ``regression_window`` dE are negative and they sum
    below ``regression_sum``."""
    w = _window(points, turn, cfg.regression_window, cfg)
    if w is None:
        return False
    deltas = [p.d_e or 0.0 for p in w]
    negative = sum(d < 0 for d in deltas)
    return negative > len(deltas) * cfg.regression_ratio and sum(deltas) < cfg.regression_sum


@dataclass(frozen=True)
class TrajectoryVerdict:
    """How a dialogue ends: ``success`` (geometric / positional) or ``failure`` (collapse /
    stagnation+regression) at ``turn``."""

    outcome: Literal["success", "failure"]
    reason: str
    turn: int


def verdict(points: Sequence[Point], turn: int, th: Thresholds, cfg: EpmConfig) -> TrajectoryVerdict | None:
    """The verdict after the evaluation at ``turn`` (success is checked first), or None."""
    kind = success_kind(points[-1], turn, th, cfg)
    if kind is not None:
        return TrajectoryVerdict("success", kind, turn)
    if directional_collapse(points, turn, cfg):
        return TrajectoryVerdict("failure", "collapse", turn)
    if stagnation(points, turn, cfg) and regression(points, turn, cfg):
        return TrajectoryVerdict("failure", "stagnation+regression", turn)
    return None


def first_verdict(points: Sequence[Point], th: Thresholds, cfg: EpmConfig) -> TrajectoryVerdict | None:
    """The first verdict along a finished trajectory (replaying the rules turn by turn)."""
    for i in range(1, len(points)):
        v = verdict(points[: i + 1], points[i].turn, th, cfg)
        if v is not None:
            return v
    return None


# ---------------------------------------------------------------------------- EPM-Q

INDEX_GROUPS: dict[str, tuple[str, ...]] = {
    "outcome": ("idx_rdi", "idx_etot", "idx_snet"),
    "efficiency": ("idx_rho", "idx_sproj", "idx_tau"),
    "stability": ("idx_rpos", "idx_align", "idx_pen"),
}
INDEX_KEYS = tuple(k for keys in INDEX_GROUPS.values() for k in keys)


def case_quantities(points: Sequence[Point], turns: int, cfg: EpmConfig) -> dict[str, float]:
    """The raw per-case quantities EPM-Q normalises: r0, r_T, RDI (%), E_total, S_net, rho, S_proj,
    tortuosity, R_pos (%), mean alignment, R_pen. ``turns`` is the dialogue's length T."""
    steps = [p for p in points if p.d_e is not None]
    n_mean = len(points) if cfg.means_include_start else len(steps)
    r0, r_t = points[0].distance, points[-1].distance
    e_total = points[-1].e_total
    if cfg.mdep_sums == "levels":
        s_net = float(sum(sum(p.levels.values()) for p in steps))
        neg = float(sum(-p.levels.get(f"{a}.Neg", 0) for p in steps for a in AXES))
    else:
        s_net = float(sum(sum(p.v) for p in steps))
        neg = -sum(
            (cfg.regress_scores_c if a == "C" else cfg.regress_scores_ap)[-p.levels.get(f"{a}.Neg", 0)]
            for p in steps
            for a in AXES
        )
    path = sum(norm(tuple(b - a for a, b in zip(p.p, q.p))) for p, q in itertools.pairwise(points))
    displacement = norm(tuple(b - a for a, b in zip(points[0].p, points[-1].p)))
    if len(points) < 2 or path < 1e-6:
        tau = 1.0
    elif displacement > 1e-6:
        tau = path / displacement
    else:
        tau = 0.0  # a closed loop: the published code's value (the index then clamps it to 1)
    alignments = [p.alignment for p in (points if cfg.means_include_start else steps)]
    return {
        "r0": r0,
        "r_final": r_t,
        "rdi": (r0 - r_t) / r0 * 100 if r0 > 0 else 0.0,
        "e_total": e_total,
        "s_net": s_net,
        "rho": e_total / turns if turns else 0.0,
        "s_proj": sum(p.d_e or 0.0 for p in steps) / n_mean if n_mean else 0.0,
        "tortuosity": tau,
        "r_pos": sum((p.d_e or 0.0) > 0 for p in steps) / n_mean * 100 if n_mean else 0.0,
        "alignment": sum(alignments) / len(alignments) if alignments else 0.0,
        "r_pen": neg / n_mean if n_mean else 0.0,
    }


def case_indices(q: Mapping[str, float], cfg: EpmConfig) -> dict[str, float]:
    """The nine standardised indices of one case (100 = meets the benchmark; above 100 allowed)."""
    r0 = q["r0"] if q["r0"] > 1e-6 else 1.0
    tau = max(q["tortuosity"], 1.0)
    return {
        "idx_rdi": max(0.0, min(100.0, (q["rdi"] + 100) / 2)),
        "idx_etot": max(0.0, q["e_total"]) / (cfg.beta * r0) * 100,
        "idx_snet": max(0.0, q["s_net"]) / (cfg.alpha_s * r0) * 100,
        "idx_rho": max(0.0, q["rho"]) / cfg.rho_max * 100,
        "idx_sproj": max(0.0, q["s_proj"]) / cfg.rho_max * 100,
        "idx_tau": max(0.0, (3.0 - tau) / 2 * 100),
        "idx_rpos": q["r_pos"],
        "idx_align": (q["alignment"] + 1) / 2 * 100,
        "idx_pen": max(0.0, (3.0 - q["r_pen"]) / 3 * 100),
    }


def epmq(per_case: Sequence[Mapping[str, float]], cfg: EpmConfig) -> dict[str, float]:
    """Mean of each index over cases, the three group scores and the weighted EPM-Q (empty: {})."""
    if not per_case:
        return {}
    out = {k: sum(c[k] for c in per_case) / len(per_case) for k in INDEX_KEYS}
    for group, keys in INDEX_GROUPS.items():
        out[group] = sum(out[k] for k in keys) / len(keys)
    w_o, w_e, w_s = cfg.weights
    out["epmq"] = w_o * out["outcome"] + w_e * out["efficiency"] + w_s * out["stability"]
    return out

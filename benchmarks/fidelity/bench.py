"""The fidelity benchmark: do a simulated user's reactions, and a reward's scores, agree with real
help-seekers' own in-dialogue ratings (ESConv feedback, 1-5)? (docs/fidelity.md)

A case is one rated point (:mod:`.points`); the point's prediction is the mean over its supporter turns
of the predictions that exist (a turn without one is counted in ``invalid_turns``; a point with none is
*missing*, counted per predictor). The predictors run together on served engines."""

from __future__ import annotations

import logging
import time
from collections import Counter, defaultdict
from collections.abc import Sequence
from functools import partial
from typing import Any

import numpy as np

from rapo_echo.benchmarks.base import Case, Emit, EvalSettings, Record, Roles
from rapo_echo.benchmarks.fidelity.points import RatedPoint, load_points, point_data
from rapo_echo.benchmarks.fidelity.predictors import BASELINES, Predictor, build_predictors
from rapo_echo.benchmarks.fidelity.stats import (
    TIE_CREDIT,
    RankedPoints,
    dot,
    pair_counts,
)
from rapo_echo.benchmarks.stats import bootstrap_ci
from rapo_echo.engines.concurrency import calls_concurrently, together
from rapo_echo.errors import ConfigError

log = logging.getLogger(__name__)
PROTOCOL_VERSION = "rapo-echo-fidelity-1"
N_BOOT = 1000
RATINGS = (1, 2, 3, 4, 5)
MIN_SURVEY_DIALOGUES = 3  # the dialogue-level figure needs at least this many conversations


class Fidelity:
    """``eval --benchmark fidelity``: see the module doc. ``users`` / ``rewards`` name the predictors
    besides the baselines; ``limit`` counts conversations, not points."""

    name = "fidelity"
    roles = ("simulator", "judge")
    headline = (("top_predictor", "fidelity: best predictor"), ("top_pairwise", "pairwise agreement"))
    repeatable = False  # its figures carry their own intervals over dialogues

    def __init__(self, users: Sequence[str] = (), rewards: Sequence[str] = (), n_boot: int = N_BOOT) -> None:
        if len(set(users)) != len(users) or len(set(rewards)) != len(rewards):
            raise ConfigError("fidelity: a --user or --reward is named twice")
        self.users, self.rewards, self.n_boot = list(users), list(rewards), n_boot
        self._predictors: list[Predictor] | None = None
        self.seed = 0

    @property
    def protocol(self) -> dict[str, Any]:
        return {
            "version": PROTOCOL_VERSION,
            "users": self.users,
            "rewards": self.rewards,
            "baselines": list(BASELINES),
        }

    def load_cases(self, data: str | None, settings: EvalSettings) -> list[Case]:
        if not data:
            raise ConfigError(
                "fidelity: --data is required (an ESConv-format file with in-dialogue ratings, e.g. "
                "../shared/data/esconv/FailedESConv.json or ESConv.json)"
            )
        self.seed = settings.seed or 0
        return [Case(p.id, p, {"dialogue": p.dialogue}) for p in load_points(data)]

    def limit_cases(self, cases: list[Case], limit: int) -> list[Case]:
        """The points of the first ``limit`` conversations."""
        keep = list(dict.fromkeys(c.meta["dialogue"] for c in cases))[:limit]
        wanted = set(keep)
        return [c for c in cases if c.meta["dialogue"] in wanted]

    def predictors(self, roles: Roles, settings: EvalSettings) -> list[Predictor]:
        if self._predictors is None:
            self._predictors = build_predictors(
                self.users, self.rewards, simulator=roles.simulator, judge=roles.judge, settings=settings
            )
        return self._predictors

    def run_batch(self, cases: Sequence[Case], roles: Roles, settings: EvalSettings, emit: Emit) -> None:
        points: list[RatedPoint] = [c.data for c in cases]
        for p in points:
            if p.skip:
                emit(skip_record(p))
        live = [p for p in points if not p.skip]
        if not live:
            return
        items = [i for p in live for i in p.items]
        per_point: dict[str, dict[str, Any]] = {p.id: {} for p in live}
        predictors = self.predictors(roles, settings)

        def run(predictor: Predictor) -> tuple[list[Any], list[Any] | None]:
            predictions = predictor.predict(items)
            return predictions, predictor.likelihood(items) if predictor.kind == "user" else None

        # the predictors do not depend on each other: on served engines they all go out at once
        outputs = together(
            [partial(run, p) for p in predictors], concurrent=calls_concurrently(roles.simulator, roles.judge)
        )
        for predictor, (predictions, likelihoods) in zip(predictors, outputs):
            at = 0
            for p in live:
                n = len(p.items)
                mine = predictions[at : at + n]
                lik = likelihoods[at : at + n] if likelihoods is not None else None
                at += n
                values = [x.value for x in mine if x.value is not None]
                entry: dict[str, Any] = {
                    "kind": predictor.kind,
                    "value": sum(values) / len(values) if values else None,
                    "turns": [x.value for x in mine],
                    "invalid_turns": n - len(values),
                }
                reasons = [x.reason for x in mine if x.reason]
                if reasons:
                    entry["reasons"] = reasons
                messages = [x.message for x in mine]
                if any(messages):
                    entry["messages"] = messages
                if lik is not None:
                    got = [x for x in lik if x is not None]
                    entry["loglik"] = {
                        "persona": sum(x.persona for x in got),
                        "plain": sum(x.plain for x in got),
                        "tokens": sum(x.tokens for x in got),
                    }
                per_point[p.id][predictor.name] = entry
        for p in live:
            emit(point_record(p, per_point[p.id]))

    def summarize(self, records: Sequence[Record]) -> dict[str, Any]:
        return summarize_points(records, n_boot=self.n_boot, seed=self.seed)


def skip_record(p: RatedPoint) -> Record:
    info = {**point_data(p), "skip": p.skip}
    if p.duplicate_of:
        info["duplicate_of"] = p.duplicate_of
    return {"id": p.id, "valid": False, "metrics": {}, "transcript": [], "info": info}


def point_record(p: RatedPoint, predictions: dict[str, Any]) -> Record:
    transcript = [{"role": m["role"], "content": m["content"]} for m in (p.items[0].scenario.messages[-2:])]
    for i in p.items:
        transcript.append({"role": "rated supporter turn", "content": i.reply})
        if i.next_message:
            transcript.append({"role": "seeker (real)", "content": i.next_message})
    metrics = {"rating": p.rating, **{name: e["value"] for name, e in predictions.items()}}
    return {
        "id": p.id,
        "valid": all(e["value"] is not None for e in predictions.values()),
        "metrics": metrics,
        "transcript": transcript,
        "info": {**point_data(p), "predictions": predictions},
    }


# ---------------------------------------------------------------------------- summary


def _improvement(survey: dict[str, Any]) -> float | None:
    """Initial minus final emotion intensity (positive: the seeker felt better), when both exist."""
    a, b = survey.get("initial_emotion_intensity"), survey.get("final_emotion_intensity")
    return None if a is None or b is None else float(a) - float(b)


def summarize_points(records: Sequence[Record], *, n_boot: int = N_BOOT, seed: int = 0) -> dict[str, Any]:
    """Per predictor the agreement figures with intervals, flattened as ``<predictor>/<figure>`` (see the
    module doc and docs/fidelity.md), plus counts of points, conversations and skips."""
    skips = Counter(str(r["info"]["skip"]) for r in records if r["info"].get("skip"))
    points = [r for r in records if not r["info"].get("skip")]
    out: dict[str, Any] = {
        "n_points": len(points),
        "n_dialogues": len({r["info"]["dialogue"] for r in points}),
        "n_skipped": sum(skips.values()),
        **{f"skipped: {reason}": n for reason, n in sorted(skips.items())},
        "tie_credit": TIE_CREDIT,
        "n_boot": n_boot,
        "seed": seed,
    }
    names = list(dict.fromkeys(n for r in points for n in r["info"]["predictions"]))
    best: tuple[float, str] | None = None
    for k, name in enumerate(names, 1):
        start = time.perf_counter()
        figures = predictor_figures(points, name, n_boot=n_boot, seed=seed)
        log.info(
            "fidelity: figures of %s (%d/%d): %d points of %d conversations, %d bootstrap resamples, %.1f s",
            name,
            k,
            len(names),
            figures["points"],
            out["n_dialogues"],
            n_boot,
            time.perf_counter() - start,
        )
        out.update({f"{name}/{k}": v for k, v in figures.items()})
        kind = next(
            r["info"]["predictions"][name]["kind"] for r in points if name in r["info"]["predictions"]
        )
        pw = figures.get("pairwise")
        if kind != "baseline" and pw is not None and (best is None or pw > best[0]):
            best = (pw, name)
    if best is not None:
        out["top_predictor"], out["top_pairwise"] = best[1], best[0]
    return out


def predictor_figures(points: Sequence[Record], name: str, *, n_boot: int, seed: int) -> dict[str, Any]:
    """The figures of one predictor over the scored points (records as :func:`point_record` writes)."""
    by_dialogue: dict[str, list[tuple[float, float]]] = defaultdict(list)
    survey: dict[str, float] = {}
    lik: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    kind, missing, invalid_turns, turns = "baseline", 0, 0, 0
    for r in points:
        e = r["info"]["predictions"].get(name)
        if e is None:
            missing += 1
            continue
        kind = e["kind"]
        invalid_turns += int(e.get("invalid_turns", 0))
        turns += len(e.get("turns", []))
        d = r["info"]["dialogue"]
        if e["value"] is None:
            missing += 1
        else:
            by_dialogue[d].append((float(e["value"]), float(r["metrics"]["rating"])))
        change = _improvement(r["info"].get("survey") or {})
        if change is not None:
            survey[d] = change
        if "loglik" in e and e["loglik"]["tokens"]:
            acc = lik[d]
            acc[0] += e["loglik"]["persona"]
            acc[1] += e["loglik"]["plain"]
            acc[2] += e["loglik"]["tokens"]
    dialogues = sorted(by_dialogue)
    out: dict[str, Any] = {
        "kind": kind,
        "points": sum(len(v) for v in by_dialogue.values()),
        "missing": missing,
        "invalid_turns": invalid_turns,
        "turns": turns,
    }
    # every point with its dialogue's index: a resample weighs each point by its dialogue's draws
    group = np.array([k for k, d in enumerate(dialogues) for _ in by_dialogue[d]], dtype=int)
    pred = np.array([p for d in dialogues for p, _ in by_dialogue[d]], dtype=float)
    rating = np.array([r for d in dialogues for _, r in by_dialogue[d]], dtype=float)

    def with_ci(key: str, stat: Any, n: int) -> None:
        out[key] = stat(np.ones(n))
        out[f"{key}_lo"], out[f"{key}_hi"] = bootstrap_ci(n, stat, n_boot=n_boot, seed=seed)

    ranked = RankedPoints(pred, rating)
    with_ci("spearman", lambda w: ranked.spearman(w[group]), len(dialogues))
    with_ci("kendall", lambda w: ranked.kendall_tau_b(w[group]), len(dialogues))
    counts = [pair_counts(*zip(*by_dialogue[d])) if len(by_dialogue[d]) > 1 else (0.0, 0) for d in dialogues]
    credit = np.array([c for c, _ in counts], dtype=float)
    n_pairs = np.array([n for _, n in counts], dtype=float)

    def agreement(w: np.ndarray) -> float | None:
        n = dot(w, n_pairs)
        return dot(w, credit) / n if n else None

    out["pairs"] = int(n_pairs.sum())
    with_ci("pairwise", agreement, len(dialogues))
    # dialogue level: the simulated trajectory (sum of a user's changes; mean score for the rest)
    level = [d for d in dialogues if d in survey]
    if len(level) < MIN_SURVEY_DIALOGUES:  # two conversations always rank +-1: no figure
        level = []
    agg = [
        sum(p for p, _ in by_dialogue[d])
        if kind == "user"
        else sum(p for p, _ in by_dialogue[d]) / len(by_dialogue[d])
        for d in level
    ]
    change = [survey[d] for d in level]
    out["survey_dialogues"] = len(level)
    by_level = RankedPoints(agg, change)
    with_ci("survey_spearman", by_level.spearman, len(level))
    if lik:
        held = sorted(lik)
        persona, plain, tokens = (np.array([lik[d][i] for d in held], dtype=float) for i in range(3))

        def per_token(w: np.ndarray, which: np.ndarray) -> float | None:
            n = dot(w, tokens)
            return dot(w, which) / n if n else None

        def gain(w: np.ndarray) -> float | None:
            a, b = per_token(w, persona), per_token(w, plain)
            return None if a is None or b is None else a - b

        out["loglik_tokens"] = int(tokens.sum())
        out["loglik_persona"] = per_token(np.ones(len(held)), persona)
        out["loglik_plain"] = per_token(np.ones(len(held)), plain)
        with_ci("loglik_gain", gain, len(held))
    return out

"""EPM benchmark (Echo-N1's dynamic EQ evaluation, published as EMPA): the policy talks with a simulated
person whose unmet needs are a point in C/A/P space; the dialogue succeeds when the policy's replies
carry that point back to the origin (the method: docs/benchmarks.md, EPM).

Each turn, one batched engine call per role over every active case: the simulated user speaks
(:mod:`.user`), the policy replies, the judge fills the MDEP form (every ``eval_interval`` turns), the
step moves P_t and :mod:`.vectors` gives a verdict; then the director (:mod:`.director`, on the
simulator's engine) releases a story stage or a memory, waits, or ends the conversation. A judge form
that stays unparseable after the retries ends the case as invalid: counted, excluded from the metrics."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

from rapo_echo.benchmarks.base import (
    Case,
    Emit,
    EvalSettings,
    Record,
    Roles,
    make_record,
    mean,
    recheck_entry,
    recheck_params,
)
from rapo_echo.benchmarks.epm.data import load_epm_cases
from rapo_echo.benchmarks.epm.director import (
    ACTIONS,
    DirectorState,
    apply_action,
    director_prompt,
    parse_action,
    scheduled_action,
)
from rapo_echo.benchmarks.epm.judge import EpmForm, EpmJudge
from rapo_echo.benchmarks.epm.user import COMPANION, USER, PersonaCard, Turn, clean_user_reply, user_prompt
from rapo_echo.benchmarks.epm.vectors import (
    INDEX_GROUPS,
    INDEX_KEYS,
    EpmConfig,
    Point,
    Thresholds,
    TrajectoryVerdict,
    advance,
    case_indices,
    case_quantities,
    difficulty,
    dominant_axis,
    epm_config,
    epmq,
    initial_deficit,
    norm,
    start_point,
    step_vector,
    thresholds,
    verdict,
)
from rapo_echo.benchmarks.figures import Figure
from rapo_echo.engines.base import reply_texts
from rapo_echo.errors import ConfigError
from rapo_echo.llm.labels import judge_labels
from rapo_echo.prompting import policy_conversation
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Scenario, msg

DIRECTOR_FORMAT = AnswerFormat.choice(ACTIONS, name="epm_director")
SUMMARY_KEYS = ("success_rate", "epmq", "outcome", "efficiency", "stability", *INDEX_KEYS)


@dataclass
class _Episode:
    case: Case
    card: PersonaCard
    iedr: dict[str, Any]
    th: Thresholds | None = None
    points: list[Point] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    director: DirectorState = field(default_factory=DirectorState)
    note: tuple[str, str] | None = None
    log: list[dict[str, Any]] = field(default_factory=list)
    end: str | None = None  # why the dialogue ended
    verdict: TrajectoryVerdict | None = None
    # the last MDEP asked: its earlier turns, latest turns and levels
    asked: tuple[list[Turn], list[Turn], dict[str, int]] | None = None
    recheck: dict[str, Any] | None = None  # that MDEP asked again (info['judge_recheck'])


def case_labels(p0: Sequence[float], cfg: EpmConfig) -> dict[str, Any]:
    """Dominant axis and difficulty of a case from its P0."""
    return {"dominant": dominant_axis(p0), "difficulty": difficulty(norm(p0), cfg), "p0_norm": norm(p0)}


def case_metrics(points: Sequence[Point], turns: int, success: bool, cfg: EpmConfig) -> dict[str, Any]:
    """A finished case's metrics: success, turns, the raw EPM quantities and the nine indices."""
    q = case_quantities(points, turns, cfg)
    last = points[-1]
    return {
        "success": float(success),
        "turns": turns,
        "e_total": last.e_total,
        "p_norm_final": last.p_norm,
        "r0": q["r0"],
        "r_final": q["r_final"],
        "s_net": q["s_net"],
        "tortuosity": q["tortuosity"],
        "alignment": q["alignment"],
        **case_indices(q, cfg),
    }


def case_epmq(part: str) -> Any:
    """A record's own EPM-Q or group score (``epmq``, ``outcome``, ...): :func:`epmq` of the case alone,
    under the record's weights. EPM-Q is linear in the indices, so the mean over cases is the run's."""

    def value(record: Record) -> float | None:
        weights = record.get("info", {}).get("epmq_weights")
        cfg = EpmConfig(weights=tuple(weights)) if weights else EpmConfig()
        return epmq([record["metrics"]], cfg)[part]

    return value


# every summary figure that is a mean over cases, for its interval and spread (benchmarks/figures.py)
EPM_FIGURES: dict[str, Figure] = {
    "success_rate": Figure("success"),
    **{part: Figure(case_epmq(part)) for part in ("epmq", *INDEX_GROUPS)},
    **{k: Figure(k) for k in INDEX_KEYS},
    "avg_turns": Figure("turns"),
}


def summarize_epm(records: Sequence[Record]) -> dict[str, Any]:
    """Success, EPM-Q and its parts, endings and breakdowns over the valid records."""
    valid = [r for r in records if r["valid"]]
    weights = next((r["info"].get("epmq_weights") for r in valid if "epmq_weights" in r["info"]), None)
    cfg = EpmConfig(weights=tuple(weights)) if weights else EpmConfig()
    out: dict[str, Any] = {"success_rate": mean([r["metrics"]["success"] for r in valid])}
    out.update(epmq([r["metrics"] for r in valid], cfg))
    out["avg_turns"] = mean([r["metrics"]["turns"] for r in valid])
    out["avg_turns_success"] = mean([r["metrics"]["turns"] for r in valid if r["metrics"]["success"]])
    endings = Counter(r["info"].get("end", "?") for r in valid)
    out.update({f"end/{k}": v for k, v in sorted(endings.items())})
    for key in ("dominant", "difficulty"):
        groups = sorted({r["info"].get(key) for r in valid if r["info"].get(key)})
        for g in groups:
            rows = [r for r in valid if r["info"].get(key) == g]
            out[f"success/{key}={g}"] = mean([r["metrics"]["success"] for r in rows])
            out[f"n/{key}={g}"] = len(rows)
    published = [r["info"]["published"]["success"] for r in valid if "published" in r["info"]]
    if published:
        out["published_success_rate"] = mean([float(x) for x in published])
    return {k: v for k, v in out.items() if k in SUMMARY_KEYS or v is not None}


class Epm:
    """The EPM benchmark on our persona cards (default) or EMPA's case files (``--data``)."""

    name = "epm"
    roles = ("policy", "simulator", "judge")
    headline = (("success_rate", "EPM success"), ("epmq", "EPM-Q"))
    figures = EPM_FIGURES
    prompt_modules = (
        "rapo_echo.benchmarks.epm.user",
        "rapo_echo.benchmarks.epm.director",
        "rapo_echo.benchmarks.epm.judge",
    )

    def card_details(self, settings: EvalSettings) -> dict[str, Any]:
        """The card's episode (turn cap and every EPM constant) and the policy's system prompt."""
        cfg = self.config(settings)
        return {
            "episode": {"max_turns": settings.max_turns or cfg.max_turns, "epm": cfg.model_dump(mode="json")},
            "system_prompt": settings.system_prompt,
        }

    def config(self, settings: EvalSettings) -> EpmConfig:
        return epm_config(settings.epm)

    def load_cases(self, data: str | None, settings: EvalSettings) -> list[Case]:
        cfg = self.config(settings)
        cards = load_epm_cases(data)
        if cfg.iedr_source == "case":
            missing = [c.id for c in cards if c.iedr is None]
            if missing:
                raise ConfigError(f"epm.iedr_source=case, but cases {missing[:5]} have no IEDR levels")
        return [Case(c.id, c, dict(c.meta)) for c in cards]

    # ------------------------------------------------------------------ the episode loop
    def run_batch(self, cases: Sequence[Case], roles: Roles, settings: EvalSettings, emit: Emit) -> None:
        if roles.simulator is None or roles.judge is None:
            raise ConfigError("the epm benchmark needs a simulator (user and director) and a judge engine")
        cfg = self.config(settings)
        max_turns = settings.max_turns or cfg.max_turns
        rng = random.Random(settings.seed)
        judge = EpmJudge(
            roles.judge,
            settings.judge_params(),
            use_logprobs=settings.judge_logprobs,
            retries=settings.judge_retries,
            rng=rng,
        )
        again = EpmJudge(  # the recheck's own prompt markers and seed; the run's draws stay as they were
            roles.judge,
            recheck_params(settings.judge_params()),
            use_logprobs=settings.judge_logprobs,
            retries=settings.judge_retries,
            rng=random.Random(f"recheck:{settings.seed}"),
        )
        flush = partial(self._flush, judge=again if settings.judge_recheck else None, cfg=cfg, emit=emit)
        self._done: list[_Episode] = []
        episodes = [_Episode(c, c.data, {}) for c in cases]
        self._start(episodes, judge, cfg, emit)
        for turn in range(1, max_turns + 1):
            active = [e for e in episodes if e.end is None]
            if not active:
                break
            self._user_turn(active, roles, settings, rng, cfg, emit)
            active = [e for e in active if e.end is None]
            replies = reply_texts(
                roles.policy,
                [self._policy_prompt(e, settings) for e in active],
                settings.policy_params(),
            )
            for e, reply in zip(active, replies):
                if reply is None:
                    self._fail(e, f"policy request failed at turn {turn}", cfg, emit)
                    continue
                e.turns.append((COMPANION, reply.strip()))
                e.log.append({"turn": turn})
            active = [e for e in active if e.end is None]
            if turn % cfg.eval_interval == 0:
                self._evaluate(active, judge, turn, cfg, emit)
            going = [e for e in active if e.end is None]
            if turn == max_turns:
                for e in going:
                    self._finish(e, "timeout")
                break
            self._direct(going, roles, settings, turn, cfg, rng, emit)
            flush()
        flush()

    def _start(self, episodes: list[_Episode], judge: EpmJudge, cfg: EpmConfig, emit: Emit) -> None:
        """P0 of each case: its own IEDR levels, or the judge's (one call for all that need it)."""
        need = [e for e in episodes if cfg.iedr_source == "judge" or e.card.iedr is None]
        forms = judge.fill_iedr([e.card.card for e in need]) if need else []
        by_id = {e.case.id: f for e, f in zip(need, forms)}
        for e in episodes:
            form = by_id.get(e.case.id)
            if form is None:
                e.iedr = {"levels": e.card.iedr, "source": "case"}
            else:
                e.iedr = {"levels": form.levels, "source": "judge", **_form_info(form)}
            if e.iedr["levels"] is None:
                e.end = "invalid: IEDR unparseable"
                emit(self._record(e, cfg, valid=False))
                continue
            p0 = initial_deficit(e.iedr["levels"], cfg)
            e.th = thresholds(p0, cfg)
            e.points = [start_point(p0, e.th, cfg)]

    def _user_turn(
        self,
        active: list[_Episode],
        roles: Roles,
        settings: EvalSettings,
        rng: random.Random,
        cfg: EpmConfig,
        emit: Emit,
    ) -> None:
        assert roles.simulator is not None
        prompts = [user_prompt(e.card, e.turns, e.note, rng=rng) for e in active]
        for e, text in zip(active, reply_texts(roles.simulator, prompts, settings.simulator_params())):
            if text is None:
                self._fail(e, "user request failed", cfg, emit)
                continue
            e.turns.append((USER, clean_user_reply(text, e.card.name) or "..."))
            e.note = None

    def _fail(self, e: _Episode, why: str, cfg: EpmConfig, emit: Emit) -> None:
        """End a case whose request failed for good: invalid, counted."""
        e.end = f"invalid: {why}"
        emit(self._record(e, cfg, valid=False))

    @staticmethod
    def _policy_prompt(e: _Episode, settings: EvalSettings):
        messages = [msg("user" if who == USER else "assistant", text) for who, text in e.turns]
        return policy_conversation(Scenario(e.case.id, messages), settings.system_prompt)

    def _evaluate(
        self, active: list[_Episode], judge: EpmJudge, turn: int, cfg: EpmConfig, emit: Emit
    ) -> None:
        """MDEP for the last ``eval_interval`` exchanges of every active case; move, then judge the path."""
        k = cfg.eval_interval
        earlier = [e.turns[max(0, len(e.turns) - 2 * (k + cfg.judge_history_turns)) : -2 * k] for e in active]
        forms = judge.fill_mdep(
            [e.card.card for e in active],
            [e.card.name for e in active],
            earlier,
            [e.turns[-2 * k :] for e in active],
        )
        for e, form, before in zip(active, forms, earlier):
            assert e.th is not None
            e.log[-1]["mdep"] = {"levels": form.levels, **_form_info(form)}
            if form.levels is None:
                e.end = f"invalid: MDEP unparseable at turn {turn}"
                emit(self._record(e, cfg, valid=False))
                continue
            e.asked = (list(before), e.turns[-2 * k :], form.levels)
            point = advance(e.points, step_vector(form.levels, cfg), turn, e.th, cfg, form.levels)
            e.log[-1]["v"] = list(point.v)
            e.verdict = verdict(e.points, turn, e.th, cfg)
            if e.verdict is not None:
                self._finish(e, f"{e.verdict.outcome}: {e.verdict.reason}")

    def _direct(
        self,
        going: list[_Episode],
        roles: Roles,
        settings: EvalSettings,
        turn: int,
        cfg: EpmConfig,
        rng: random.Random,
        emit: Emit,
    ) -> None:
        """The director's action for each case still going (one call for all in ``llm`` mode)."""
        if not going:
            return
        if cfg.director == "schedule":
            chosen: list[tuple[str | None, dict[str, Any]]] = [
                (scheduled_action(turn, cfg.stage_every), {"mode": "schedule"}) for _ in going
            ]
        else:
            assert roles.simulator is not None
            prompts = [
                director_prompt(e.card, e.turns, e.director, self._status(e, turn, cfg), rng=rng)
                for e in going
            ]
            verdicts = judge_labels(
                roles.simulator,
                prompts,
                {a: float(i) for i, a in enumerate(ACTIONS)},
                parse_action,
                replace(settings.judge_params(), answer_format=DIRECTOR_FORMAT),
                retries=settings.judge_retries,
                logprobs=settings.judge_logprobs,
            )
            chosen = [(v.label, {"mode": v.mode, "raw": v.raw, "probs": v.probs}) for v in verdicts]
        for e, (label, detail) in zip(going, chosen):
            action, note = apply_action(label or "wait", e.card, e.director, turn, cfg.min_turns)
            e.director.actions.append({"turn": turn, "asked": label, "action": action, **detail})
            e.log[-1]["director"] = action
            if action == "end":
                self._finish(e, "director_end")
            else:
                e.note = note

    @staticmethod
    def _status(e: _Episode, turn: int, cfg: EpmConfig) -> str:
        p, p0 = e.points[-1].p, e.points[0].p
        return (
            f"After turn {turn}, the person's unmet needs stand at C {p[0]:g}, A {p[1]:g}, P {p[2]:g} "
            f"(they started at C {p0[0]:g}, A {p0[1]:g}, P {p0[2]:g}; 0 means fully met). The conversation "
            f"may end from turn {cfg.min_turns} on."
        )

    # ------------------------------------------------------------------ records
    def _finish(self, e: _Episode, end: str) -> None:
        """End a valid case; its record is written at the next :meth:`_flush`."""
        e.end = end
        self._done.append(e)

    def _flush(self, *, judge: EpmJudge | None, cfg: EpmConfig, emit: Emit) -> None:
        """Write the cases finished since the last flush; with ``judge`` (a recheck), first ask each one's
        last MDEP form again (one call for all): ``info['judge_recheck']``, the share of its six levels
        given alike and their mean absolute difference."""
        done, self._done = self._done, []
        asked = [(e, e.asked) for e in done if e.asked is not None]
        if judge is not None and asked:
            forms = judge.fill_mdep(
                [e.card.card for e, _ in asked],
                [e.card.name for e, _ in asked],
                [earlier for _, (earlier, _, _) in asked],
                [latest for _, (_, latest, _) in asked],
            )
            for (e, (_, _, first)), form in zip(asked, forms):
                second = form.levels or {}
                diffs = [abs(first[k] - second[k]) for k in first if k in second]
                e.recheck = recheck_entry(first, second, diffs)
        for e in done:
            emit(self._record(e, cfg, valid=True))

    def _record(self, e: _Episode, cfg: EpmConfig, *, valid: bool) -> Record:
        turns = sum(who == COMPANION for who, _ in e.turns)
        metrics: dict[str, Any] = {}
        info: dict[str, Any] = {
            "name": e.card.name,
            "meta": e.card.meta,
            "iedr": e.iedr,
            "end": e.end,
            "turns": turns,
            "epmq_weights": list(cfg.weights),
            "director_invalid": sum(a["asked"] is None for a in e.director.actions),
            "turn_log": e.log,
        }
        if e.recheck is not None:
            info["judge_recheck"] = e.recheck
        if e.points:
            info.update(case_labels(e.points[0].p, cfg))
            info["p0"] = list(e.points[0].p)
            info["trajectory"] = [p.to_json() for p in e.points]
        if e.th is not None:
            info["thresholds"] = {
                "eps_energy": e.th.eps_energy,
                "eps_distance": e.th.eps_distance,
                "eps_direction": e.th.eps_direction,
            }
        if valid:
            success = e.verdict is not None and e.verdict.outcome == "success"
            metrics = case_metrics(e.points, turns, success, cfg)
        transcript = [
            {"role": e.card.name if who == USER else "companion", "content": text} for who, text in e.turns
        ]
        return make_record(e.case, valid=valid, metrics=metrics, transcript=transcript, info=info)

    def summarize(self, records: Sequence[Record]) -> dict[str, Any]:
        return summarize_epm(records)


def _form_info(form: EpmForm) -> dict[str, Any]:
    info: dict[str, Any] = {"mode": form.mode, "attempts": form.attempts}
    if form.raw:
        info["raw"] = form.raw
    if form.probs:
        info["probs"] = form.probs
    return info

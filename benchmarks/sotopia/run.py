"""SOTOPIA benchmark: the policy plays one agent of a social scenario, a partner model the other
(protocol, ending rules and scorers: docs/benchmarks.md).

Each scenario/agent pair gives two cases, the policy playing agent 1 and then agent 2. Agents act in
round-robin order, agent 1 first; one batched engine call per role per turn covers every active episode,
and with a served partner its call goes out while the policy writes. The scorer is ours (:mod:`.evaluator`)
or SOTOPIA's own (:mod:`.official`); each record names it (``info['scorer']``). An answer that stays
unreadable after the retries, or a request that fails for good, makes the case invalid (counted, not
scored)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, ClassVar

from rapo_echo.benchmarks.base import (
    Case,
    Emit,
    EvalSettings,
    Record,
    Roles,
    case_key,
    make_record,
    mean,
    recheck_entry,
    recheck_params,
)
from rapo_echo.benchmarks.figures import Figure
from rapo_echo.benchmarks.sotopia.agent import (
    ACTION_FORMAT,
    AgentTurn,
    agent_fence,
    agent_prompt,
    parse_action,
)
from rapo_echo.benchmarks.sotopia.evaluator import (
    DIMENSIONS,
    dimension_format,
    evaluator_prompt,
    overall,
)
from rapo_echo.benchmarks.sotopia.profiles import SotopiaPair, load_sotopia
from rapo_echo.engines.base import reply_texts
from rapo_echo.engines.concurrency import calls_concurrently, together
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.llm.answers import generate_parsed
from rapo_echo.llm.fencing import Fence

DEFAULT_MAX_TURNS = 20
MAX_STALE_TURNS = 2


def termination(history: Sequence[AgentTurn], max_turns: int, max_stale: int = MAX_STALE_TURNS) -> str | None:
    """Why the episode ends after ``history``, or None while it goes on: an agent left, more than
    ``max_stale`` consecutive ``none`` actions, or ``max_turns`` actions taken."""
    if history and history[-1].action.action_type == "leave":
        return "an agent left"
    stale = 0
    for t in reversed(history):
        if t.action.action_type != "none":
            break
        stale += 1
    if stale > max_stale:
        return "stale: too many consecutive none actions"
    if len(history) >= max_turns:
        return "max turns"
    return None


SCORERS = ("ours", "sotopia")


def _own_answer(dimension: str, fence: Fence) -> Any:
    """The reader of one dimension's answer in the evaluator's own words (blocks it copied from the
    prompt removed): the parsed ``{"reasoning", "score"}`` object, or None."""
    fmt = dimension_format(dimension)
    return lambda text: fmt.parse(fence.own_words(text))


@dataclass
class _Episode:
    case: Case
    pair: SotopiaPair
    policy_agent: int
    fence: Fence
    history: list[AgentTurn] = field(default_factory=list)
    end: str | None = None
    failed: str | None = None  # a request for this episode failed for good: it is invalid


class Sotopia:
    """SOTOPIA episodes scored with SOTOPIA-Eval."""

    name = "sotopia"
    roles = ("policy", "simulator", "judge")
    headline = (("goal", "SOTOPIA goal"), ("overall", "SOTOPIA overall"), ("hard/goal", "SOTOPIA-hard goal"))
    figures: ClassVar[dict[str, Figure]] = {
        **{d: Figure(d) for d in (*DIMENSIONS, "overall")},
        "hard/goal": Figure("goal", where=lambda r: bool(r["info"].get("hard"))),
        "hard/overall": Figure("overall", where=lambda r: bool(r["info"].get("hard"))),
    }
    prompt_modules = ("rapo_echo.benchmarks.sotopia.agent", "rapo_echo.benchmarks.sotopia.evaluator")

    def card_details(self, settings: EvalSettings) -> dict[str, Any]:
        """The card's episode (turn cap, subset, scorer and its model) and the policy's system prompt."""
        episode: dict[str, Any] = {
            "max_turns": settings.max_turns or DEFAULT_MAX_TURNS,
            "subset": settings.subset,
            "scorer": settings.sotopia_scorer,
        }
        if settings.sotopia_scorer == "sotopia":
            episode["scorer_model"] = settings.sotopia_model
        return {"episode": episode, "system_prompt": None}

    def load_cases(self, data: str | None, settings: EvalSettings) -> list[Case]:
        pairs = list(enumerate(load_sotopia(data)))  # ids keep the index in the file, also for --subset hard
        if settings.subset == "hard":
            pairs = [(i, p) for i, p in pairs if p.env.hard]
            if not pairs:
                raise DataError(f"{data or 'the bundled scenarios'}: no scenario is marked hard")
        return [
            Case(
                f"{i:03d}-{p.env.codename}-p{k + 1}",
                p,
                {"codename": p.env.codename, "hard": p.env.hard, "policy_agent": k},
            )
            for i, p in pairs
            for k in (0, 1)
        ]

    def run_batch(self, cases: Sequence[Case], roles: Roles, settings: EvalSettings, emit: Emit) -> None:
        if roles.simulator is None or roles.judge is None:
            raise ConfigError(
                "the sotopia benchmark needs a simulator (partner) and a judge (evaluator) engine"
            )
        max_turns = settings.max_turns or DEFAULT_MAX_TURNS
        episodes = [
            _Episode(c, c.data, c.meta["policy_agent"], agent_fence(case_key(c), settings.seed))
            for c in cases
        ]
        for turn in range(max_turns):
            actor = turn % 2
            active = [e for e in episodes if e.end is None]
            if not active:
                break
            mine = [e for e in active if e.policy_agent == actor]
            theirs = [e for e in active if e.policy_agent != actor]

            def act(
                group: list[_Episode],
                engine: Any,
                params: Any,
                role: str,
                turn: int = turn,
                actor: int = actor,
            ) -> None:
                prompts = [
                    agent_prompt(e.pair.env, e.pair.agents, actor, e.history, turn, e.fence) for e in group
                ]
                for e, text in zip(group, reply_texts(engine, prompts, params)):
                    if text is None:
                        e.failed = f"{role} request failed"
                        continue
                    action, strict = parse_action(e.fence.own_words(text), [a.name for a in e.pair.agents])
                    e.history.append(AgentTurn(turn, actor, action, raw=text, strict=strict))

            # the partner's action is declared; the policy under test is never constrained. The two groups
            # do not depend on each other: with a served partner its calls go out while the policy writes
            partner = replace(settings.simulator_params(), answer_format=ACTION_FORMAT)
            calls = [
                partial(act, group, engine, params, role)
                for group, engine, params, role in (
                    (mine, roles.policy, settings.policy_params(), "policy"),
                    (theirs, roles.simulator, partner, "partner"),
                )
                if group
            ]
            together(calls, concurrent=calls_concurrently(roles.simulator))
            finished = []
            for e in active:
                e.end = f"invalid: {e.failed}" if e.failed else termination(e.history, max_turns)
                if e.end is not None:
                    finished.append(e)
            self._evaluate(finished, roles, settings, emit)

    def _evaluate(self, episodes: list[_Episode], roles: Roles, settings: EvalSettings, emit: Emit) -> None:
        failed = [e for e in episodes if e.failed]  # a request failed for good: invalid, not scored
        for e in failed:
            info = {**self._info(e, {"text": ""}, 0), "scorer": settings.sotopia_scorer, "error": e.failed}
            emit(make_record(e.case, valid=False, metrics={}, transcript=self._transcript(e), info=info))
        episodes = [e for e in episodes if not e.failed]
        if not episodes:
            return
        rechecks: dict[str, dict[str, Any]] = {}
        if settings.sotopia_scorer == "sotopia":
            verdicts = self._official(episodes, settings)
        else:
            verdicts = self._ours(episodes, roles, settings)
            if settings.judge_recheck:
                rechecks = self._recheck(episodes, verdicts, roles, settings)
        for e, (scores, raw, attempts) in zip(episodes, verdicts):
            metrics: dict[str, Any] = {}
            if scores is not None:
                metrics = {**scores, "overall": overall(scores), "turns": len(e.history)}
            info = {**self._info(e, raw, attempts), "scorer": settings.sotopia_scorer}
            if e.case.id in rechecks:
                info["judge_recheck"] = rechecks[e.case.id]
            emit(
                make_record(
                    e.case,
                    valid=scores is not None,
                    metrics=metrics,
                    transcript=self._transcript(e),
                    info=info,
                )
            )

    def _recheck(
        self,
        episodes: list[_Episode],
        verdicts: list[tuple[dict[str, float] | None, dict[str, Any], int]],
        roles: Roles,
        settings: EvalSettings,
    ) -> dict[str, dict[str, Any]]:
        """Every dimension of each scored episode asked once more, with a fresh prompt marker and seed:
        ``info['judge_recheck']`` per case id (the share of the seven scores given alike, their mean
        absolute difference)."""
        scored = [(e, v[0]) for e, v in zip(episodes, verdicts) if v[0] is not None]
        if not scored:
            return {}
        fences = [
            Fence.derived([case_key(e.case), "recheck"], salt=f"sotopia:{settings.seed}") for e, _ in scored
        ]
        again = self._ours([e for e, _ in scored], roles, settings, fences=fences, partial_scores=True)
        out = {}
        for (e, first), (second, _, _) in zip(scored, again):
            second = second or {}
            diffs = [abs(first[d] - second[d]) for d in first if d in second]
            out[e.case.id] = recheck_entry(first, second, diffs)
        return out

    @staticmethod
    def _ours(
        episodes: list[_Episode],
        roles: Roles,
        settings: EvalSettings,
        *,
        fences: list[Fence] | None = None,
        partial_scores: bool = False,
    ) -> list[tuple[dict[str, float] | None, dict[str, Any], int]]:
        """Our evaluator: per dimension one batched call over the episodes, declaring that dimension's
        answer (its score range), the dimensions together on a served judge (one round); an episode's scores
        are None when any dimension stays unreadable (``partial_scores``: the readable ones). The raw
        answers are kept per dimension. ``fences`` (a recheck): other prompt markers, and another seed."""
        assert roles.judge is not None
        marks = fences or [e.fence for e in episodes]
        params = settings.judge_params() if fences is None else recheck_params(settings.judge_params())

        def dimension(d: str) -> Any:
            prompts = [
                evaluator_prompt(e.pair.env, e.pair.agents, e.history, e.policy_agent, d, f)
                for e, f in zip(episodes, marks)
            ]
            return generate_parsed(
                roles.judge,
                prompts,
                [_own_answer(d, f) for f in marks],
                params,
                max_retries=settings.judge_retries,
                answer_format=dimension_format(d),
            )

        calls = [partial(dimension, d) for d in DIMENSIONS]
        answered = together(calls, concurrent=calls_concurrently(roles.judge))
        per_dim = dict(zip(DIMENSIONS, answered))
        out = []
        for k in range(len(episodes)):
            answers = {d: per_dim[d][k] for d in DIMENSIONS}
            scores = {d: float(a.value["score"]) for d, a in answers.items() if a.value is not None}
            readable = "\n".join(
                (
                    f"{d}: {a.value['score']} ({a.value['reasoning']})"
                    if a.value
                    else f"{d}: unreadable: {a.raw}"
                )
                for d, a in answers.items()
            )
            raw = {"text": readable, "answers": {d: a.raw for d, a in answers.items()}}
            attempts = max(a.attempts for a in answers.values())
            complete = partial_scores or len(scores) == len(DIMENSIONS)
            out.append((scores if complete else None, raw, attempts))
        return out

    @staticmethod
    def _official(
        episodes: list[_Episode], settings: EvalSettings
    ) -> list[tuple[dict[str, float] | None, dict[str, Any], int]]:
        """SOTOPIA's own evaluator (:mod:`.official`)."""
        from rapo_echo.benchmarks.sotopia.official import load_evaluator, official_scores

        evaluator = load_evaluator(settings.sotopia_model)
        items = [(e.pair.env, e.pair.agents, e.history, e.policy_agent) for e in episodes]
        return [(scores, {"text": notes}, 1) for scores, notes in official_scores(evaluator, items)]

    @staticmethod
    def _transcript(e: _Episode) -> list[dict[str, str]]:
        names = [a.name for a in e.pair.agents]
        return [
            {
                "role": names[t.agent] + (" (policy)" if t.agent == e.policy_agent else " (partner)"),
                "content": t.action.describe(names[t.agent]),
            }
            for t in e.history
        ]

    @staticmethod
    def _info(e: _Episode, raw: dict[str, Any], attempts: int) -> dict[str, Any]:
        own = [t for t in e.history if t.agent == e.policy_agent]
        return {
            "codename": e.pair.env.codename,
            "hard": e.pair.env.hard,
            "scenario": e.pair.env.scenario,
            "policy_agent": e.policy_agent,
            "agents": [a.name for a in e.pair.agents],
            "goals": list(e.pair.env.agent_goals),
            "end": e.end,
            "turns": len(e.history),
            "policy_loose_actions": sum(not t.strict for t in own),
            "policy_actions": len(own),
            "actions": [
                {
                    "turn": t.number,
                    "agent": t.agent,
                    "type": t.action.action_type,
                    "argument": t.action.argument,
                    "strict": t.strict,
                }
                for t in e.history
            ],
            "evaluator_raw": raw["text"],  # per dimension: score (reasoning), or the unreadable answer
            **({"evaluator_answers": raw["answers"]} if "answers" in raw else {}),
            "evaluator_attempts": attempts,
        }

    def summarize(self, records: Sequence[Record]) -> dict[str, Any]:
        valid = [r for r in records if r["valid"]]
        hard = [r for r in valid if r["info"].get("hard")]
        keys = [*DIMENSIONS, "overall"]
        out: dict[str, Any] = {k: mean([r["metrics"][k] for r in valid]) for k in keys}
        out["hard/goal"] = mean([r["metrics"]["goal"] for r in hard])
        out["hard/overall"] = mean([r["metrics"]["overall"] for r in hard])
        out["n_hard"] = len(hard)
        out["avg_turns"] = mean([r["info"]["turns"] for r in records])
        actions = sum(r["info"]["policy_actions"] for r in records)
        for scorer in SCORERS:
            out[f"scorer/{scorer}"] = sum(r["info"].get("scorer", "ours") == scorer for r in valid)
        out["policy_loose_action_rate"] = (
            sum(r["info"]["policy_loose_actions"] for r in records) / actions if actions else None
        )
        return out

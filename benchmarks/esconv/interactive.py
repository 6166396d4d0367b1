"""ESConv interactive benchmark (PPDPP protocol): the policy supports a simulated seeker (docs/benchmarks.md).

Each turn: the policy replies, the seeker simulator answers, the critic judges the seeker's state (worse
-1, same -0.5, better 0.5, solved 1); one batched call each over the active cases, which advance together
(:func:`~rapo_echo.llm.turns.advance_together`). With log-probs the turn's reward is the expectation of
that value under the critic's label probabilities -- what PPDPP's mean over 10 sampled critic answers
estimates; without, the parsed label's value (:data:`CRITIC_FORMAT`). A critic reply that stays
unparseable after the retries, or a request that fails for good, ends the case as invalid: counted,
excluded from SR and AT."""

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
from rapo_echo.benchmarks.esconv.data import EsconvConversation, read_esconv
from rapo_echo.benchmarks.esconv.seeker import (
    CRITIC_LABELS,
    SEEKER,
    SUPPORTER,
    case_fence,
    critic_prompt,
    parse_critic,
    seeker_prompt,
    supporter_prompt,
)
from rapo_echo.benchmarks.figures import Figure
from rapo_echo.engines.base import reply_texts
from rapo_echo.engines.concurrency import calls_concurrently
from rapo_echo.errors import ConfigError
from rapo_echo.llm.dialogue import clean_reply
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.labels import judge_labels
from rapo_echo.llm.turns import advance_together
from rapo_echo.structured import AnswerFormat

DEFAULT_MAX_TURNS = 8
CRITIC_FORMAT = AnswerFormat.choice(tuple(CRITIC_LABELS), name="esconv_critic")
SUCCESS_THRESHOLD = 0.5
# Without --data, ``rapo-echo eval`` runs ESConv on this bundled set (ours, six English dialogues in
# ESConv's format): enough to try the pipeline, not a result to compare with published figures.
DEFAULT_DATA = "bundled:esconv_style_en.json"
DATA_HINT = (
    "pass an ESConv-format file with --data, e.g. the PPDPP test split ppdpp_esc-test.jsonl "
    "(github.com/dengyang17/PPDPP data/esc-test.txt) or thu-coai's ESConv.json; to try the pipeline, "
    f"--data {DEFAULT_DATA} (our six English dialogues)"
)


def _own_verdict(text: str, fence: Fence) -> str | None:
    """The critic's verdict in its own words (dialogue blocks it copied removed)."""
    return parse_critic(fence.own_words(text))


def require_data(data: str | None, benchmark: str) -> str:
    """The ``--data`` path, or a clear error saying which file to pass."""
    if not data:
        raise ConfigError(f"benchmark {benchmark!r} needs a data file: {DATA_HINT}")
    return data


@dataclass
class _Episode:
    case: Case
    conv: EsconvConversation
    turns: list[tuple[str, str]]
    fence: Fence
    rewards: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    outcome: dict[str, Any] = field(default_factory=dict)  # the record's valid / success / turns once done
    recheck: dict[str, Any] | None = None  # the critic's last verdict asked again (info['judge_recheck'])


class EsconvInteractive:
    """PPDPP-style interactive ESConv evaluation."""

    name = "esconv"
    default_data = DEFAULT_DATA
    roles = ("policy", "simulator", "judge")
    headline = (("success_rate", "ESConv SR"), ("avg_turns", "ESConv AT"))
    figures: ClassVar[dict[str, Figure]] = {
        "success_rate": Figure("success"),
        "avg_turns": Figure("turns"),
        "final_reward": Figure("final_reward"),
    }
    prompt_modules = ("rapo_echo.benchmarks.esconv.seeker",)

    def card_details(self, settings: EvalSettings) -> dict[str, Any]:
        """The card's episode (turn cap, success threshold) and the policy's system prompt."""
        return {
            "episode": {
                "max_turns": settings.max_turns or DEFAULT_MAX_TURNS,
                "success_above": SUCCESS_THRESHOLD,
            },
            "system_prompt": settings.system_prompt,
        }

    def load_cases(self, data: str | None, settings: EvalSettings) -> list[Case]:
        convs = read_esconv(require_data(data, self.name))
        return [
            Case(c.id, c, {"emotion_type": c.profile.emotion_type, "problem_type": c.profile.problem_type})
            for c in convs
        ]

    def run_batch(self, cases: Sequence[Case], roles: Roles, settings: EvalSettings, emit: Emit) -> None:
        if roles.simulator is None or roles.judge is None:
            raise ConfigError("the esconv benchmark needs a simulator and a judge engine")
        max_turns = settings.max_turns or DEFAULT_MAX_TURNS
        episodes = [
            _Episode(c, c.data, [(SEEKER, c.data.profile.situation)], case_fence(case_key(c), settings.seed))
            for c in cases
        ]

        def policy(batch: list[_Episode]) -> None:
            prompts = [supporter_prompt(settings.system_prompt, e.turns) for e in batch]
            for e, reply in zip(batch, reply_texts(roles.policy, prompts, settings.policy_params())):
                if reply is None:
                    self._fail(e, "policy request failed")
                else:
                    e.turns.append((SUPPORTER, reply.strip()))

        def seeker_and_critic(batch: list[_Episode]) -> None:
            going = [e for e in batch if not e.done]
            prompts = [seeker_prompt(e.conv.profile, e.turns, e.fence) for e in going]
            answered = []
            for e, answer in zip(going, reply_texts(roles.simulator, prompts, settings.simulator_params())):
                if answer is None:
                    self._fail(e, "seeker request failed")
                else:
                    e.turns.append((SEEKER, clean_reply(answer)))
                    answered.append(e)
            if answered:
                self._judge(answered, roles, settings, max_turns)

        def ended(batch: list[_Episode]) -> None:
            if settings.judge_recheck:
                self._recheck([e for e in batch if e.outcome.get("valid")], roles, settings)
            for e in batch:
                emit(self._record(e, **e.outcome))

        advance_together(
            episodes,
            policy,
            seeker_and_critic,
            done=lambda e: e.done,
            on_end=ended,
            overlap=calls_concurrently(roles.simulator, roles.judge),
        )

    def _judge(self, active: list[_Episode], roles: Roles, settings: EvalSettings, max_turns: int) -> None:
        """The critic's verdict on each case's newest turn; a case ends at success, at ``max_turns`` or
        when the verdict stays unparseable (invalid)."""
        verdicts = judge_labels(
            roles.judge,
            [critic_prompt(e.conv.profile, e.turns, e.fence) for e in active],
            CRITIC_LABELS,
            [partial(_own_verdict, fence=e.fence) for e in active],
            replace(settings.judge_params(), answer_format=CRITIC_FORMAT),
            retries=settings.judge_retries,
            logprobs=settings.judge_logprobs,
        )
        for e, v in zip(active, verdicts):
            turn = sum(who == SUPPORTER for who, _ in e.turns)
            e.rewards.append(
                {
                    "turn": turn,
                    "reward": v.value,
                    "label": v.label,
                    "probs": v.probs,
                    "raw": v.raw,
                    "attempts": v.attempts,
                    "mode": v.mode,
                }
            )
            if v.value is None:
                e.done, e.outcome = True, {"valid": False, "success": False, "turns": turn}
            elif v.value > SUCCESS_THRESHOLD or turn == max_turns:
                success = v.value > SUCCESS_THRESHOLD
                e.done, e.outcome = True, {"valid": True, "success": success, "turns": turn}

    @staticmethod
    def _recheck(done: list[_Episode], roles: Roles, settings: EvalSettings) -> None:
        """The critic's last verdict of each finished case asked once more, on the same dialogue with a
        fresh prompt marker and seed: does it answer alike? (``info['judge_recheck']``)"""
        if not done:
            return
        assert roles.judge is not None
        fences = [Fence.derived([case_key(e.case), "recheck"], salt=f"esconv:{settings.seed}") for e in done]
        verdicts = judge_labels(
            roles.judge,
            [critic_prompt(e.conv.profile, e.turns, f) for e, f in zip(done, fences)],
            CRITIC_LABELS,
            [partial(_own_verdict, fence=f) for f in fences],
            replace(recheck_params(settings.judge_params()), answer_format=CRITIC_FORMAT),
            retries=settings.judge_retries,
            logprobs=settings.judge_logprobs,
        )
        for e, v in zip(done, verdicts):
            last = e.rewards[-1]
            diffs = [abs(last["reward"] - v.value)] if v.value is not None else []
            e.recheck = recheck_entry({"verdict": last["label"]}, {"verdict": v.label}, diffs)

    @staticmethod
    def _fail(e: _Episode, why: str) -> None:
        """End a case whose request failed for good: invalid, counted."""
        turn = sum(who == SUPPORTER for who, _ in e.turns)
        e.rewards.append({"turn": turn, "reward": None, "error": why})
        e.done, e.outcome = True, {"valid": False, "success": False, "turns": turn}

    def _record(self, e: _Episode, *, valid: bool, success: bool, turns: int) -> Record:
        transcript = [{"role": who, "content": text} for who, text in e.turns]
        final = e.rewards[-1]["reward"]
        metrics = {"success": float(success), "turns": turns, "final_reward": final} if valid else {}
        info = {"profile": vars(e.conv.profile), "critic": e.rewards, "source": e.conv.meta.get("source")}
        if e.recheck is not None:
            info["judge_recheck"] = e.recheck
        return make_record(e.case, valid=valid, metrics=metrics, transcript=transcript, info=info)

    def summarize(self, records: Sequence[Record]) -> dict[str, Any]:
        valid = [r for r in records if r["valid"]]
        return {
            "success_rate": mean([r["metrics"]["success"] for r in valid]),
            "avg_turns": mean([r["metrics"]["turns"] for r in valid]),
            "final_reward": mean([r["metrics"]["final_reward"] for r in valid]),
        }

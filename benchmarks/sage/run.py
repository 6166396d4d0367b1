"""SAGE ("Sentient Agent as a Judge", arXiv 2505.02847): the policy supports a simulated user whose
emotion is the score (research notes: ``rlver.md`` sections 1 and 3; the protocol, the ending rules and
what is reported: docs/benchmarks.md).

Live mode (``rapo-echo eval --benchmark sage``): the dialogues advance together
(:func:`~rapo_echo.llm.turns.advance_together`); the policy replies and the
:class:`~rapo_echo.simulators.sage.SageSimulator` with the ``sage`` preset updates the emotion and
answers, as in SAGE's released loop (``SAGE/test_npc.py``). A dialogue whose simulator output never
parses, or whose policy request fails for good, is invalid: counted, excluded from the metrics.
Transcripts mode (``--transcripts DIR``, :mod:`.transcripts`) scores dialogues already run, in SAGE's
released result format."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, ClassVar

from rapo_echo.benchmarks.base import (
    RECHECK_SEED_OFFSET,
    Case,
    Emit,
    EvalSettings,
    Record,
    Roles,
    case_key,
    make_record,
    mean,
    recheck_entry,
)
from rapo_echo.benchmarks.figures import Figure
from rapo_echo.benchmarks.sage.tracking import PROBE_FORMAT, PROBE_TOKENS, probe_prompt, tracking_metrics
from rapo_echo.data.files import BUNDLED_PREFIX
from rapo_echo.data.sage_profiles import BUNDLED_HARD_PROFILES, load_profiles
from rapo_echo.engines.base import generate_texts, reply_texts
from rapo_echo.engines.concurrency import calls_concurrently
from rapo_echo.errors import ConfigError
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.turns import advance_together
from rapo_echo.simulators.sage import CHANGE_OPTIONS, PROMPT_VERSION, SageDialogue, SageSimulator, preset
from rapo_echo.types import Conversation, msg

DEFAULT_MAX_TURNS = 10
DEFAULT_SIMULATOR_TOKENS = 512
SUCCESS_AT = 100.0
FAILURE_BELOW = 10.0
# The policy's system prompt with ``--sage-system-prompt sage`` (the default): the kind SAGE's released loop
# gives the model under test, in our words (rlver.md 1.3), so a score is comparable with SAGE's leaderboard.
SAGE_POLICY_PROMPT = (
    "You are a perceptive conversation partner with a high degree of emotional intelligence. Talk with "
    "the person so that they feel at ease and in better spirits, or so that they get the help they are "
    "looking for."
)


def outcome(final_emotion: float, turns: int) -> dict[str, Any]:
    """The per-dialogue metrics SAGE reports: final emotion, success (>= 100), failure (< 10), turns."""
    return {
        "final_emotion": final_emotion,
        "success": float(final_emotion >= SUCCESS_AT),
        "failure": float(final_emotion < FAILURE_BELOW),
        "turns": turns,
    }


def nearest_change(change: float) -> float:
    """The change option (:data:`~rapo_echo.simulators.sage.CHANGE_OPTIONS`) nearest ``change``."""
    return min(CHANGE_OPTIONS.values(), key=lambda option: abs(option - change))


def summarize_outcomes(records: Sequence[Record]) -> dict[str, Any]:
    """SAGE score (mean final emotion), success / failure counts and rates, mean turns, over valid records;
    the emotional state tracking figures where the dialogues were probed (:mod:`.tracking`); and the
    score per kind of seeker where the profiles name one (``style``)."""
    valid = [r["metrics"] for r in records if r.get("valid")]
    successes = int(sum(m["success"] for m in valid))
    failures = int(sum(m["failure"] for m in valid))
    out: dict[str, Any] = {
        "score": mean([m["final_emotion"] for m in valid]),
        "successes": successes,
        "failures": failures,
        "success_rate": successes / len(valid) if valid else None,
        "failure_rate": failures / len(valid) if valid else None,
        "avg_turns": mean([m["turns"] for m in valid]),
    }
    for key in ("tracking_error", "tracking_direction"):
        values = [m[key] for m in valid if key in m]
        if values:
            out[key] = mean(values)
    by_style: dict[str, list[float]] = {}
    for r in records:
        if r.get("valid") and r["info"].get("style"):
            by_style.setdefault(r["info"]["style"], []).append(r["metrics"]["final_emotion"])
    out.update({f"score/{style}": mean(values) for style, values in sorted(by_style.items())})
    return out


class Sage:
    """SAGE's supportive-dialogue benchmark with a simulated user."""

    name = "sage"
    roles = ("policy", "simulator")
    headline = (("score", "SAGE score"), ("successes", "SAGE success"), ("failures", "SAGE failure"))
    # recorded in config.json, so a folder is only resumed under the same simulator prompts
    protocol: ClassVar[dict[str, str]] = {"simulator_prompts": PROMPT_VERSION, "simulator_preset": "sage"}
    figures: ClassVar[dict[str, Figure]] = {
        "score": Figure("final_emotion"),
        "successes": Figure("success", count=True),
        "failures": Figure("failure", count=True),
        "success_rate": Figure("success"),
        "failure_rate": Figure("failure"),
        "avg_turns": Figure("turns"),
        "tracking_error": Figure("tracking_error"),
        "tracking_direction": Figure("tracking_direction"),
    }
    prompt_modules = ("rapo_echo.simulators.sage", "rapo_echo.benchmarks.sage.tracking")

    def card_details(self, settings: EvalSettings) -> dict[str, Any]:
        """The card's episode: turn cap, the simulated user's starting emotion and rules, the readout,
        the profile set; the simulator's reply length; the policy's system prompt."""
        sim = preset("sage")
        return {
            "episode": {
                "max_turns": settings.max_turns or DEFAULT_MAX_TURNS,
                "initial_emotion": sim.initial_emotion,
                "max_delta": sim.max_delta,
                "floor": sim.floor,
                "emotion_readout": settings.emotion_readout,
                "reply": settings.sage_reply,
                "profiles": settings.profiles,
            },
            "simulator_max_new_tokens": settings.simulator_max_new_tokens or DEFAULT_SIMULATOR_TOKENS,
            "system_prompt": self.system_prompt(settings),
        }

    @staticmethod
    def system_prompt(settings: EvalSettings) -> str | None:
        """The policy's system prompt: SAGE's kind (``--sage-system-prompt sage``) or ``--system-prompt``."""
        return SAGE_POLICY_PROMPT if settings.sage_system_prompt == "sage" else settings.system_prompt

    def load_cases(self, data: str | None, settings: EvalSettings) -> list[Case]:
        """One case per profile (``data``: RLVER / SAGE profile JSONL; default: our bundled English ones,
        ``--profiles hard`` our hard-to-help seekers)."""
        if settings.profiles == "hard":
            if data is not None:
                raise ConfigError(
                    "sage: --profiles hard runs our bundled hard-to-help seekers; drop --data (or drop "
                    "--profiles and pass a file of hard profiles with --data, adding --state-probe on)"
                )
            data = BUNDLED_PREFIX + BUNDLED_HARD_PROFILES
        return [Case(str(p.id), p, {"first_talk": bool(p.first_talk)}) for p in load_profiles(data)]

    def simulator(self, roles: Roles, settings: EvalSettings) -> SageSimulator:
        """The simulated user with the ``sage`` preset, reacting to all policy replies but the last."""
        if roles.simulator is None:
            raise ConfigError("the sage benchmark needs a simulator engine (--simulator)")
        turns = settings.max_turns or DEFAULT_MAX_TURNS
        if turns < 2:
            raise ConfigError(
                "sage: --max-turns must be >= 2 (the simulator reacts to all replies but the last)"
            )
        sim_settings = dataclasses.replace(
            preset("sage"),
            max_turns=turns - 1,
            temperature=settings.simulator_temperature,
            max_new_tokens=settings.simulator_max_new_tokens or DEFAULT_SIMULATOR_TOKENS,
            max_retries=settings.judge_retries,
            emotion_readout=settings.emotion_readout,
            plain_reply=settings.sage_reply == "plain",
        )
        return SageSimulator(roles.simulator, sim_settings, seed=settings.seed or 0)

    def run_batch(self, cases: Sequence[Case], roles: Roles, settings: EvalSettings, emit: Emit) -> None:
        sim = self.simulator(roles, settings)
        dialogues = sim.start([c.data for c in cases], [c.id for c in cases], [case_key(c) for c in cases])
        by_id = {c.id: c for c in cases}
        probes: dict[str, list[dict[str, Any]]] = {d.id: [] for d in dialogues}
        for d in dialogues:
            if d.done:
                emit(self._record(by_id[d.id], d, last_reply=None))
        replies: dict[str, str] = {}
        probing = settings.state_probe == "on" or (
            settings.state_probe == "auto" and settings.profiles == "hard"
        )

        def policy(batch: list[SageDialogue]) -> None:
            if probing:
                self._probe(batch, roles, settings, probes)
            prompts = [self._policy_prompt(settings, d) for d in batch]
            for d, text in zip(batch, reply_texts(roles.policy, prompts, settings.policy_params())):
                if text is None:
                    d.log.append({"turn": d.turns + 1, "error": "policy request failed"})
                    d.end("invalid")
                else:
                    replies[d.id] = text.strip()

        def user(batch: list[SageDialogue]) -> None:
            going = [d for d in batch if not d.done]
            if going:
                sim.step(going, [replies[d.id] for d in going])

        def ended(batch: list[SageDialogue]) -> None:
            # SAGE's loop: after the simulator's last reaction the policy still answers once, unscored
            final = [d for d in batch if d.reason == "max_turns"]
            last: dict[str, str] = {}
            if final:
                if probing:
                    self._probe(final, roles, settings, probes)
                texts = generate_texts(
                    roles.policy, [self._policy_prompt(settings, d) for d in final], settings.policy_params()
                )
                last = {d.id: t.strip() for d, t in zip(final, texts)}
            rechecks = self._recheck(batch, roles, settings, sim) if settings.judge_recheck else {}
            for d in batch:
                record = self._record(by_id[d.id], d, last_reply=last.get(d.id))
                if probing:
                    record["info"]["state_probe"] = probes[d.id]
                    if record["valid"]:
                        record["metrics"].update(tracking_metrics(probes[d.id]))
                if d.id in rechecks:
                    record["info"]["judge_recheck"] = rechecks[d.id]
                emit(record)

        advance_together(
            dialogues,
            policy,
            user,
            done=lambda d: d.done,
            on_end=ended,
            overlap=calls_concurrently(roles.simulator),
        )

    @staticmethod
    def _probe(
        batch: list[SageDialogue],
        roles: Roles,
        settings: EvalSettings,
        probes: dict[str, list[dict[str, Any]]],
    ) -> None:
        """Ask the policy how each user feels now (:mod:`.tracking`), beside the dialogue, and keep the
        answer with the hidden emotion it is measured against."""
        fences = [
            Fence.derived([d.fence_key, str(d.turns)], salt=f"sage-probe:{settings.seed}") for d in batch
        ]
        params = dataclasses.replace(
            settings.policy_params(), max_new_tokens=PROBE_TOKENS, answer_format=PROBE_FORMAT
        )
        prompts = [probe_prompt(d.history, f) for d, f in zip(batch, fences)]
        answers = reply_texts(roles.policy, prompts, params)  # one try: a measurement, not a retry loop
        for d, text in zip(batch, answers):
            estimate = None if text is None else PROBE_FORMAT.parse(text)
            probes[d.id].append({"turn": d.turns, "estimate": estimate, "hidden": d.emotion})

    @staticmethod
    def _recheck(
        batch: list[SageDialogue], roles: Roles, settings: EvalSettings, sim: SageSimulator
    ) -> dict[str, dict[str, Any]]:
        """The simulated user's reading of each dialogue's last read reply, asked once more with a fresh
        seed and prompt marker (the user's emotion is this benchmark's judgment): ``info['judge_recheck']``,
        alike when both changes are nearest the same of SAGE's change options (-10, -5, 0, +5, +10: the
        readings' own grain); ``read`` keeps the two changes as read."""
        assert roles.simulator is not None
        again = SageSimulator(roles.simulator, sim.settings, seed=sim.seed + RECHECK_SEED_OFFSET)
        valid = [d for d in batch if not d.invalid]
        out = {}
        for d, read in zip(valid, again.read_again(valid)):
            if read is not None:
                first, second = read
                diffs = [abs(first - second)] if second is not None else []
                entry = recheck_entry(
                    {"change": nearest_change(first)},
                    {"change": None if second is None else nearest_change(second)},
                    diffs,
                )
                out[d.id] = {**entry, "read": [first, second]}
        return out

    @classmethod
    def _policy_prompt(cls, settings: EvalSettings, d: SageDialogue) -> Conversation:
        system = cls.system_prompt(settings)
        head = [msg("system", system)] if system else []
        return head + list(d.history)

    def _record(self, case: Case, d: SageDialogue, *, last_reply: str | None) -> Record:
        transcript: list[dict[str, Any]] = []
        turn_log = {e["turn"]: e for e in d.log}
        policy_turn = 0
        for m in d.history:
            entry: dict[str, Any] = {"role": m["role"], "content": m["content"]}
            if m["role"] == "assistant":
                policy_turn += 1
            else:
                log = turn_log.get(policy_turn, {})
                entry["emotion"] = d.emotions[policy_turn] if policy_turn < len(d.emotions) else None
                if "analysis" in log:
                    entry["inner"] = log["analysis"]
                if "thinking" in log:
                    entry["thinking"] = log["thinking"]
            transcript.append(entry)
        if last_reply is not None:
            transcript.append({"role": "assistant", "content": last_reply, "unscored": True})
        turns = d.turns + (last_reply is not None)
        info = {
            "end_reason": d.reason,
            "style": case.data.style,
            "emotions": d.emotions,
            "parse_failures": d.parse_failures,
            "first_talk": bool(case.data.first_talk),
            "hidden_intention": case.data.hidden_intention,
            "log": d.log,
        }
        metrics = outcome(d.emotion, turns) if not d.invalid else {}
        return make_record(case, valid=not d.invalid, metrics=metrics, transcript=transcript, info=info)

    def summarize(self, records: Sequence[Record]) -> dict[str, Any]:
        return summarize_outcomes(records)

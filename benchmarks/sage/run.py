"""SAGE ("Sentient Agent as a Judge", arXiv 2505.02847): the policy supports a simulated user whose
emotion is the score (research notes: ``rlver.md`` sections 1 and 3).

Live mode (``rapo-echo eval --benchmark sage``): each profile's dialogue opens with its ``first_talk``
(written by the simulator when the profile has none); then the dialogues advance together
(:func:`~rapo_echo.llm.turns.advance_together`: in lockstep over the batch, or, with a served simulator,
each dialogue's simulator calls in flight while the policy answers the dialogues that are back): the policy
replies (one call) and the :class:`~rapo_echo.simulators.sage.SageSimulator` with the ``sage`` preset
updates the emotion and answers (one call each). A policy request that fails for good (a served policy)
makes its dialogue invalid. As in SAGE's released loop (``SAGE/test_npc.py``) the
policy writes at most ``max_turns`` (10) replies and the simulator reacts to all but the last, so the
final emotion comes after at most 9 reactions; a dialogue also stops when the user says goodbye, at
emotion >= 100, or below 10. Reported: the SAGE score (mean final emotion), successes (>= 100) and
failures (< 10) as counts, the average number of policy replies, and transcripts with the emotion and
inner thoughts of every turn. A dialogue whose simulator output never parses is invalid: counted,
excluded from the metrics.

Transcripts mode (``--transcripts DIR``): scores dialogues already run, in SAGE's released result format
(``SAGE/dataset/<simulator>_based_simulator/<model>_result.jsonl``: one JSON object a line with ``id``,
the final ``emo_point``, ``emo_state`` and ``history``, whose user turns carry ``emotion-point`` and the
simulator's ``planning``), so published leaderboard figures can be recomputed.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
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
)
from rapo_echo.benchmarks.figures import Figure
from rapo_echo.data.sage_profiles import load_profiles
from rapo_echo.engines.base import generate_texts, reply_texts
from rapo_echo.engines.concurrency import calls_concurrently
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.llm.turns import advance_together
from rapo_echo.simulators.sage import PROMPT_VERSION, SageDialogue, SageSimulator, preset
from rapo_echo.types import Conversation, msg

DEFAULT_MAX_TURNS = 10
DEFAULT_SIMULATOR_TOKENS = 512
SUCCESS_AT = 100.0
FAILURE_BELOW = 10.0
# The policy's system prompt by default (``--sage-system-prompt sage``): in our words, the kind of prompt
# SAGE's released loop gives the model under test (a warm, emotionally intelligent chat partner who
# puts the person at ease or gets them the help they need; rlver.md 1.3), so a score is comparable
# with SAGE's leaderboard. ``ours`` uses ``--system-prompt`` instead.
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


def summarize_outcomes(records: Sequence[Record]) -> dict[str, Any]:
    """SAGE score (mean final emotion), success / failure counts and rates, mean turns, over valid records."""
    valid = [r["metrics"] for r in records if r.get("valid")]
    successes = int(sum(m["success"] for m in valid))
    failures = int(sum(m["failure"] for m in valid))
    return {
        "score": mean([m["final_emotion"] for m in valid]),
        "successes": successes,
        "failures": failures,
        "success_rate": successes / len(valid) if valid else None,
        "failure_rate": failures / len(valid) if valid else None,
        "avg_turns": mean([m["turns"] for m in valid]),
    }


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
    }
    prompt_modules = ("rapo_echo.simulators.sage",)

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
        """One case per profile (``data``: RLVER / SAGE profile JSONL; default: our bundled English ones)."""
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
        for d in dialogues:
            if d.done:
                emit(self._record(by_id[d.id], d, last_reply=None))
        replies: dict[str, str] = {}

        def policy(batch: list[SageDialogue]) -> None:
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
                texts = generate_texts(
                    roles.policy, [self._policy_prompt(settings, d) for d in final], settings.policy_params()
                )
                last = {d.id: t.strip() for d, t in zip(final, texts)}
            for d in batch:
                emit(self._record(by_id[d.id], d, last_reply=last.get(d.id)))

        advance_together(
            dialogues,
            policy,
            user,
            done=lambda d: d.done,
            on_end=ended,
            overlap=calls_concurrently(roles.simulator),
        )

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


# ---------------------------------------------------------------------------- released transcripts

RESULT_SUFFIX = "_result.jsonl"


def emotion_problem(value: Any) -> str | None:
    """Why ``value`` is not an emotion on SAGE's 0-100 scale (missing, not a number, a boolean, NaN or
    infinite, out of range), else None."""
    if value is None:
        return "emo_point is missing"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"emo_point {value!r} is not a number"
    if not math.isfinite(value):
        return f"emo_point {value!r} is not finite"
    if not 0 <= value <= 100:
        return f"emo_point {value!r} is outside SAGE's 0-100 scale"
    return None


def released_record(obj: Any, where: str, model: str) -> Record:
    """One dialogue of SAGE's released result format as our record: the final ``emo_point`` is the
    score; a dialogue whose ``emo_point`` is not a finite number in 0-100 is invalid (counted, named in
    ``info['invalid']``, never read as 0)."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
    ident = obj.get("id")
    if not isinstance(ident, str) or not ident:
        raise DataError(f"{where}: id: missing or not a string; SAGE result lines have a string 'id'")
    history = obj.get("history")
    if not isinstance(history, list):
        raise DataError(f"{where}: history: expected a list of messages, got {type(history).__name__}")
    transcript = []
    for i, m in enumerate(history):
        if not isinstance(m, dict) or m.get("role") not in ("user", "assistant"):
            raise DataError(
                f"{where}: history[{i}]: expected {{'role': 'user' | 'assistant', 'content': ...}}"
            )
        entry: dict[str, Any] = {"role": m["role"], "content": str(m.get("content", ""))}
        if m["role"] == "user":
            entry["emotion"] = m.get("emotion-point")
            if isinstance(m.get("planning"), dict):
                entry["inner"] = m["planning"]
            if m.get("thinking"):
                entry["thinking"] = m["thinking"]
        transcript.append(entry)
    final = obj.get("emo_point")
    problem = emotion_problem(final)
    valid = problem is None
    user_points = [t["emotion"] for t in transcript if t["role"] == "user" and t.get("emotion") is not None]
    info = {
        "model": model,
        "emo_state": obj.get("emo_state"),
        "hidden_intention": obj.get("task"),
        "emotions": user_points,
        "source": where,
    }
    if problem:
        info["invalid"] = problem
    if valid and user_points and user_points[-1] != final:
        info["mismatch"] = f"emo_point {final} but the last user turn has emotion-point {user_points[-1]}"
    turns = sum(t["role"] == "assistant" for t in transcript)
    metrics = outcome(float(final), turns) if valid else {}
    return {"id": ident, "valid": valid, "metrics": metrics, "transcript": transcript, "info": info}


def result_files(path: str | Path) -> list[Path]:
    """``*_result.jsonl`` files under ``path`` (a folder, searched recursively), or ``path`` itself."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise DataError(f"{p}: no such file or folder of SAGE result files")
    files = sorted(p.rglob(f"*{RESULT_SUFFIX}"))
    if not files:
        raise DataError(f"{p}: holds no *{RESULT_SUFFIX} files (SAGE/dataset/<simulator>_based_simulator/)")
    return files


def model_name(path: Path) -> str:
    """The policy model and simulator a result file belongs to, from SAGE's naming scheme."""
    model = path.name[: -len(RESULT_SUFFIX)] if path.name.endswith(RESULT_SUFFIX) else path.stem
    folder = path.parent.name
    return f"{model} ({folder})" if folder.endswith("_based_simulator") else model


def score_transcripts(path: str | Path, output: str | Path) -> list[dict[str, Any]]:
    """Score every SAGE result file under ``path``; writes one eval folder per file under ``output``
    (``results.jsonl``, ``config.json``, ``summary.json``, readable by ``rapo-echo report``) and returns
    the summaries."""
    from rapo_echo.benchmarks.results import CONFIG_FILE
    from rapo_echo.benchmarks.runner import claim_output

    out_root = Path(output)
    files = result_files(path)
    targets: dict[Path, tuple[Path, dict[str, Any]]] = {}
    for f in files:
        folder = out_root
        if len(files) > 1:  # one folder per result file, at its path under the input folder (no two alike)
            folder = out_root / f.relative_to(path).parent / f.stem
        config = {
            "benchmark": Sage.name,
            "mode": "transcripts",
            "models": {"policy": model_name(f), "simulator": f.parent.name},
            "data": str(f),
        }
        targets[folder] = (f, config)
    if len(files) > 1 and (out_root / CONFIG_FILE).exists():
        raise ConfigError(
            f"--output {out_root} holds an evaluation ({CONFIG_FILE}); choose an empty --output"
        )
    with claim_output(out_root, {folder: config for folder, (_, config) in targets.items()}):
        return [_score_file(f, folder, config) for folder, (f, config) in targets.items()]


def _score_file(f: Path, folder: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Score one SAGE result file into ``folder``; its summary with the folder."""
    from rapo_echo.benchmarks.results import CONFIG_FILE, RESULTS_FILE, SUMMARY_FILE, write_json_atomic
    from rapo_echo.data.files import open_source, read_records

    name = config["models"]["policy"]
    records = [released_record(r.data, r.where, name) for r in read_records(open_source(f))]
    ids = [r["id"] for r in records]
    if len(set(ids)) != len(ids):
        raise DataError(f"{f}: dialogue ids are not unique")
    folder.mkdir(parents=True, exist_ok=True)
    write_json_atomic(folder / CONFIG_FILE, config)
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    (folder / RESULTS_FILE).write_text(text, encoding="utf-8")
    n_valid = sum(r["valid"] for r in records)
    summary = {
        "benchmark": Sage.name,
        "mode": "transcripts",
        "models": config["models"],
        "data": str(f),
        "n_cases": len(records),
        "n_valid": n_valid,
        "n_invalid": len(records) - n_valid,
        "n_expected": len(records),
        "complete": True,
        "invalid_cases": {r["id"]: r["info"]["invalid"] for r in records if "invalid" in r["info"]},
        "metrics": summarize_outcomes(records),
        "headline": [list(h) for h in Sage.headline],
        "mismatches": sum("mismatch" in r["info"] for r in records),
        "written_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    write_json_atomic(folder / SUMMARY_FILE, summary)
    return {**summary, "output": str(folder)}

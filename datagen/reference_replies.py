"""``rapo-echo data references``: a reference reply graded ``target`` (3) of 5 for every RL prompt, the
anchor the ``empathy`` reward compares the policy's reply with (Echo-N1 stores, per prompt, a reply a strong
judge scores 3 of 5; the policy earns a reward only by beating it; docs/algorithms/echo_n1.md).

Per chunk of contexts: the context's own reference reply (``include_reference``) and ``candidates``
replies sampled from the writer (the policy's prompt) are graded by the grader
(:mod:`rapo_echo.datagen.grading`, one batched call); a context with a reply graded exactly
``target`` takes it (of several, the one the grader gave ``target`` the highest probability, else the
first). The others get fresh samples, up to ``rounds`` rounds. A context still without one gets, by
``fallback``, the reply graded nearest the target (``closest``, a tie to the lower grade) or none
(``skip``: it is left out of the dataset).

The dataset, ``scenarios.jsonl``, is the contexts in our scenarios format with ``reference`` set and
``meta.reference_score`` / ``meta.reference_source`` recorded: ``train`` reads it as ``data.path``, the
``empathy`` reward takes each scenario's own ``reference``, and ``data hard-prompts`` reads it as it is.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import Field

from rapo_echo.datagen import grading
from rapo_echo.datagen.contexts import scenario_row
from rapo_echo.datagen.settings import GradingSettings
from rapo_echo.engines.base import ChatEngine
from rapo_echo.prompting import policy_conversation
from rapo_echo.types import SamplingParams, Scenario


class ReferenceSettings(GradingSettings):
    """`data references`' switches (documented with their sources in docs/algorithms/echo_n1.md)."""

    target: int = Field(3, ge=1, le=5, description="The grade a reference must have.")
    candidates: int = Field(4, ge=0, description="Replies sampled per round.")
    rounds: int = Field(2, ge=1, description="Sampling rounds for prompts without one.")
    fallback: Literal["skip", "closest"] = Field(
        "skip", description="A prompt without a reply at the target: `skip` it or take the `closest`."
    )


def protocol() -> dict[str, str]:
    """The grader's prompts' fingerprint (a resume with other prompts is refused)."""
    texts = [grading.RUBRIC, grading.GRADER_SYSTEM, grading.CRITIQUE_ASK]
    return {"prompts": hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]}


class References:
    """The pipeline (:class:`rapo_echo.datagen.runner.Pipeline`)."""

    name = "references"
    dataset_file = "scenarios.jsonl"

    def __init__(self, writer: ChatEngine, judge: ChatEngine, settings: ReferenceSettings) -> None:
        self.writer, self.judge, self.s = writer, judge, settings
        self.chunks = 0

    def run_chunk(self, contexts: Sequence[Scenario]) -> list[dict[str, Any]]:
        s = self.s
        self.chunks += 1
        graded: list[list[dict[str, Any]]] = [[] for _ in contexts]
        open_ = list(range(len(contexts)))
        for round_ in range(s.rounds):
            fresh = self._candidates(contexts, open_, round_)
            items = [(i, c) for i in open_ for c in fresh[i]]
            grades = grading.grade(
                self.judge,
                [(contexts[i].messages, c["text"]) for i, c in items],
                use_logprobs=s.use_logprobs,
                max_retries=s.max_retries,
                max_new_tokens=s.grade_tokens,
            )
            for (i, c), g in zip(items, grades):
                p_target = None if g.probs is None else g.probs.get(str(s.target))
                graded[i].append({**c, "score": g.score, "critique": g.critique, "p_target": p_target})
            open_ = [i for i in open_ if pick(graded[i], s.target) is None]
            if not open_:
                break
        return [self._record(cands) for cands in graded]

    def _candidates(
        self, contexts: Sequence[Scenario], open_: list[int], round_: int
    ) -> dict[int, list[dict]]:
        s = self.s
        out: dict[int, list[dict[str, Any]]] = {i: [] for i in open_}
        if round_ == 0 and s.include_reference:
            for i in open_:
                own = (contexts[i].reference or "").strip()
                if own:
                    out[i].append({"text": own, "source": "context", "round": 0})
        if s.candidates and open_:
            params = SamplingParams(
                max_new_tokens=s.max_new_tokens,
                temperature=s.temperature,
                n=s.candidates,
                seed=s.seed + 1000 * self.chunks + round_,
            )
            prompts = [policy_conversation(contexts[i], s.system_prompt, with_persona=False) for i in open_]
            for i, gens in zip(open_, self.writer.generate(prompts, params)):
                seen = {c["text"] for c in out[i]}
                for g in gens:
                    text = g.text.strip()
                    if text and text not in seen:
                        seen.add(text)
                        out[i].append({"text": text, "source": "writer", "round": round_})
        return out

    def _record(self, cands: list[dict[str, Any]]) -> dict[str, Any]:
        s = self.s
        chosen = pick(cands, s.target)
        status = "target"
        if chosen is None and s.fallback == "closest":
            chosen = grading.closest([c["score"] for c in cands], s.target)
            status = "closest"
        if chosen is None:
            status = "skipped" if any(c["score"] is not None for c in cands) else "invalid"
            return {"status": status, "reference": None, "score": None, "candidates": cands}
        c = cands[chosen]
        return {
            "status": status,
            "reference": c["text"],
            "score": c["score"],
            "source": c["source"],
            "candidates": cands,
        }

    def export(
        self, items: Sequence[tuple[Scenario, dict[str, Any]]]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        rows = []
        for sc, r in items:
            if r["reference"] is None:
                continue
            anchored = Scenario(sc.id, sc.messages, sc.profile, r["reference"], sc.meta)
            rows.append(scenario_row(anchored, reference_score=r["score"], reference_source=r["source"]))
        figures = {
            "status": dict(Counter(r["status"] for _, r in items)),
            "reference_scores": dict(
                sorted(Counter(str(r["score"]) for _, r in items if r["reference"]).items())
            ),
            "candidate_scores": dict(
                sorted(Counter(str(c["score"]) for _, r in items for c in r["candidates"]).items())
            ),
            "candidates_graded": sum(len(r["candidates"]) for _, r in items),
        }
        return rows, figures


def pick(cands: Sequence[dict[str, Any]], target: int) -> int | None:
    """The index of the candidate graded ``target`` with the highest probability of that grade (the
    first among equals, or without probabilities); None when none is graded ``target``."""
    hits = [(-(c.get("p_target") or 0.0), i) for i, c in enumerate(cands) if c["score"] == target]
    return min(hits)[1] if hits else None

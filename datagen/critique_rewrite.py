"""``rapo-echo data critique-rewrite``: preference pairs for the empathy judge, made by Echo-N1's
Critique-Rewrite loop (docs/algorithms/echo_n1.md, "Data pipelines").

Per chunk of contexts, each stage one batched engine call:

1. **select** (``select: judge``): the judge keeps the contexts whose last message calls for empathy;
2. **safety** (``safety: judge``): the judge keeps out those the safety constitution names
   (:mod:`rapo_echo.datagen.screening`);
3. **candidates**: the writer samples ``candidates`` replies per context (the policy's prompt); the
   context's own reference reply (an ESConv supporter turn) joins them with ``include_reference``;
4. **grade**: the grader writes a critique and a score 1-5 for every candidate
   (:mod:`rapo_echo.datagen.grading`);
5. **rewrite**, up to ``rounds`` times: every candidate graded at most ``rewrite_max`` is rewritten from
   its critique and graded again; a version still below ``golden_min`` is rewritten again from its new
   critique;
6. **pairs**: a *golden* reply (a final version graded at least ``golden_min``) against a *contrast*
   reply (an original candidate graded at most ``low_max``) of the same context, graded at least
   ``min_gap`` lower than the golden one (0 trusts a rewrite over its original at an equal grade, e.g.
   with a grader that tells nothing apart, as the embedded model's): ``pairing: own`` pairs
   each successful rewrite with the candidate it came from; ``all`` pairs every golden reply with every
   contrast reply (own pairs first, then by score gap), at most ``max_pairs`` per context.

The dataset, ``pairs.jsonl``, holds ``train-judge`` empathy examples as they are (``rapo_echo/judges/
training_data.py``): ``{"task": "empathy", "messages", "reply": golden, "reference": contrast, "label":
"win", "reasoning"}``; the reasoning is built from the contrast reply's critique.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from pydantic import Field

from rapo_echo.datagen import grading, screening
from rapo_echo.datagen.screening import SAFE_LABEL, Constitution
from rapo_echo.datagen.settings import GradingSettings
from rapo_echo.engines.base import ChatEngine
from rapo_echo.prompting import policy_conversation
from rapo_echo.types import SamplingParams, Scenario


class CritiqueRewriteSettings(GradingSettings):
    """`data critique-rewrite`'s switches (each documented with its source in docs/algorithms/echo_n1.md)."""

    select: Literal["judge", "all"] = Field(
        "judge", description="`judge`: keep only contexts the judge says call for empathy; `all`: every one."
    )
    safety: Literal["judge", "off"] = Field(
        "judge", description="`judge`: keep out contexts the safety constitution names; `off`: no screening."
    )
    rewrite_max: int = Field(3, ge=1, le=5, description="Rewrite replies graded at most this.")
    golden_min: int = Field(4, ge=1, le=5, description="A reply graded at least this is golden.")
    low_max: int = Field(3, ge=1, le=5, description="A contrast reply is graded at most this.")
    min_gap: int = Field(1, ge=0, description="A pair's golden reply is graded at least this much higher.")
    rounds: int = Field(2, ge=0, description="Rewrite rounds per reply.")
    pairing: Literal["all", "own"] = Field(
        "all",
        description="`all`: every golden with every contrast reply; `own`: each rewrite with its original.",
    )
    max_pairs: int = Field(4, ge=1, description="Pairs per context at most.")
    screen_reasoning: bool = Field(
        False, description="The selection and safety judges write a reasoning line before their verdict."
    )


@dataclass
class Version:
    """One text of a candidate (the original or a rewrite) with its grade."""

    text: str
    score: int | None = None
    critique: str = ""


def protocol(constitution: Constitution) -> dict[str, str]:
    """The prompts' fingerprint: a resume with other prompts or another constitution is refused."""
    texts = [
        grading.RUBRIC,
        grading.GRADER_SYSTEM,
        grading.CRITIQUE_ASK,
        grading.REWRITE_SYSTEM,
        grading.REWRITE_ASK,
        screening.SELECT_SYSTEM,
        screening.SELECT_ASK,
        screening.SAFETY_SYSTEM,
        screening.SAFETY_ASK,
        constitution.text(),
    ]
    return {"prompts": hashlib.sha256("\0".join(texts).encode()).hexdigest()[:12]}


class CritiqueRewrite:
    """The pipeline (:class:`rapo_echo.datagen.runner.Pipeline`)."""

    name = "critique-rewrite"
    dataset_file = "pairs.jsonl"

    def __init__(
        self,
        writer: ChatEngine,
        judge: ChatEngine,
        rewriter: ChatEngine,
        settings: CritiqueRewriteSettings,
        constitution: Constitution | None = None,
    ) -> None:
        self.writer, self.judge, self.rewriter = writer, judge, rewriter
        self.s = settings
        self.constitution = constitution or Constitution()
        self.chunks = 0

    # ------------------------------------------------------------------ stages
    def run_chunk(self, contexts: Sequence[Scenario]) -> list[dict[str, Any]]:
        s = self.s
        self.chunks += 1
        records: list[dict[str, Any]] = [{"status": "paired"} for _ in contexts]
        live = list(range(len(contexts)))
        judge_kw = {
            "reasoning": s.screen_reasoning,
            "use_logprobs": s.use_logprobs,
            "max_retries": s.max_retries,
        }
        if s.select == "judge":
            verdicts = screening.needs_empathy(self.judge, [contexts[i].messages for i in live], **judge_kw)
            live = self._screen(records, live, verdicts, "empathy", lambda v: v.label == "yes", "not_empathy")
        if s.safety == "judge" and live:
            verdicts = screening.safety_check(
                self.judge, [contexts[i].messages for i in live], self.constitution, **judge_kw
            )
            live = self._screen(
                records, live, verdicts, "safety", lambda v: v.label == SAFE_LABEL, "excluded"
            )
        chains = self._candidates(contexts, live, records)
        live = [i for i in live if chains[i]]
        self._grade(contexts, [c for i in live for c in chains[i]])
        self._rewrite_rounds(contexts, chains)
        for i in live:
            records[i]["candidates"] = [
                {"source": c["source"], "versions": [asdict(v) for v in c["versions"]]} for c in chains[i]
            ]
            records[i]["pairs"] = self.pairs(chains[i])
            if not records[i]["pairs"]:
                records[i]["status"] = "no_pair"
        return records

    def _screen(self, records, live, verdicts, key, keep, status) -> list[int]:
        kept = []
        for i, v in zip(live, verdicts):
            records[i][key] = {"label": v.label, "reasoning": v.reasoning, "probs": v.probs}
            if v.label is None:
                records[i]["status"] = "invalid"
                records[i]["invalid"] = f"{key} verdict unreadable"
            elif keep(v):
                kept.append(i)
            else:
                records[i]["status"] = status
        return kept

    def _candidates(
        self, contexts: Sequence[Scenario], live: list[int], records: list[dict[str, Any]]
    ) -> dict[int, list[dict[str, Any]]]:
        """Per live context its candidate chains ``{"source", "versions": [Version, ...]}``."""
        s = self.s
        chains: dict[int, list[dict[str, Any]]] = {i: [] for i in live}
        sampled: list[list[str]] = [[] for _ in live]
        if s.candidates and live:
            params = SamplingParams(
                max_new_tokens=s.max_new_tokens,
                temperature=s.temperature,
                n=s.candidates,
                seed=s.seed + self.chunks,
            )
            prompts = [policy_conversation(contexts[i], s.system_prompt, with_persona=False) for i in live]
            sampled = [[g.text.strip() for g in gens] for gens in self.writer.generate(prompts, params)]
        for i, texts in zip(live, sampled):
            own = contexts[i].reference if s.include_reference else None
            seen: set[str] = set()
            for source, text in [("context", (own or "").strip())] + [("writer", t) for t in texts]:
                if text and text not in seen:
                    seen.add(text)
                    chains[i].append({"source": source, "versions": [Version(text)], "context": i})
            if not chains[i]:
                records[i]["status"] = "invalid"
                records[i]["invalid"] = "no candidate reply"
        return chains

    def _grade(self, contexts: Sequence[Scenario], chains: list[dict[str, Any]]) -> None:
        """Grade the last version of each chain (one batched call)."""
        grades = grading.grade(
            self.judge,
            [(contexts[c["context"]].messages, c["versions"][-1].text) for c in chains],
            use_logprobs=self.s.use_logprobs,
            max_retries=self.s.max_retries,
            max_new_tokens=self.s.grade_tokens,
        )
        for c, g in zip(chains, grades):
            c["versions"][-1].score, c["versions"][-1].critique = g.score, g.critique

    def _rewrite_rounds(self, contexts: Sequence[Scenario], chains: dict[int, list[dict[str, Any]]]) -> None:
        s = self.s
        todo = [
            c
            for cs in chains.values()
            for c in cs
            if c["versions"][0].score is not None and c["versions"][0].score <= s.rewrite_max
        ]
        for round_ in range(s.rounds):
            if round_:  # a rewrite still below golden is rewritten again
                todo = [
                    c
                    for c in todo
                    if c["versions"][-1].score is not None and c["versions"][-1].score < s.golden_min
                ]
            if not todo:
                return
            texts = grading.rewrite(
                self.rewriter,
                [
                    (contexts[c["context"]].messages, c["versions"][-1].text, c["versions"][-1].critique)
                    for c in todo
                ],
                max_retries=s.max_retries,
                max_new_tokens=s.max_new_tokens,
            )
            rewritten = []
            for c, text in zip(todo, texts):
                if text is not None:  # an unreadable rewrite ends its chain
                    c["versions"].append(Version(text))
                    rewritten.append(c)
            todo = rewritten
            self._grade(contexts, todo)

    @staticmethod
    def when_empty(figures: dict[str, Any]) -> str:
        """The switches that would give pairs, from the statuses of a run that wrote none."""
        status = figures.get("status") or {}
        hints = []
        if status.get("not_empathy"):
            hints.append("--select all keeps the contexts the judge found need no empathy (not_empathy)")
        if status.get("excluded"):
            hints.append("--safety off keeps those the constitution excluded (excluded)")
        if status.get("no_pair"):
            hints.append(
                "no golden reply was graded above a low one (no_pair): a grader that tells replies apart, or "
                "--golden-min 1 --low-max 5 --rewrite-max 5 --min-gap 0 to pair every rewrite with its "
                "original (docs/algorithms/echo_n1.md)"
            )
        return "; ".join(hints)

    # ------------------------------------------------------------------ pairs
    def pairs(self, chains: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """The context's preference pairs (see the module docstring)."""
        s = self.s
        golden = [
            (k, c["versions"][-1])
            for k, c in enumerate(chains)
            if c["versions"][-1].score is not None and c["versions"][-1].score >= s.golden_min
        ]
        low = [
            (k, c["versions"][0])
            for k, c in enumerate(chains)
            if c["versions"][0].score is not None and c["versions"][0].score <= s.low_max
        ]
        found = []
        for gk, g in golden:
            for lk, lo in low:
                own, gap = gk == lk, g.score - lo.score
                if (s.pairing == "own" and not own) or g.text == lo.text or gap < s.min_gap:
                    continue
                found.append((not own, -gap, gk, lk, g, lo))
        found.sort(key=lambda t: t[:4])
        out: list[dict[str, Any]] = []
        seen: set[tuple[str, str]] = set()
        for cross, _, _, _, g, lo in found:
            if (g.text, lo.text) in seen or len(out) == s.max_pairs:
                continue
            seen.add((g.text, lo.text))
            out.append(
                {
                    "reply": g.text,
                    "reference": lo.text,
                    "reply_score": g.score,
                    "reference_score": lo.score,
                    "kind": "cross" if cross else "own",
                    "reasoning": pair_reasoning(lo.critique),
                }
            )
        return out

    def export(
        self, items: Sequence[tuple[Scenario, dict[str, Any]]]
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        rows = [
            {
                "task": "empathy",
                "messages": list(sc.messages),
                "reply": p["reply"],
                "reference": p["reference"],
                "label": "win",
                "reasoning": p["reasoning"],
            }
            for sc, r in items
            for p in r.get("pairs", [])
        ]
        scores: Counter[str] = Counter()
        rewritten = improved = 0
        for _, r in items:
            for c in r.get("candidates", []):
                first, last = c["versions"][0], c["versions"][-1]
                scores[str(first["score"])] += 1
                if len(c["versions"]) > 1:
                    rewritten += 1
                    improved += last["score"] is not None and last["score"] >= self.s.golden_min
        figures = {
            "status": dict(Counter(r["status"] for _, r in items)),
            "candidate_scores": dict(sorted(scores.items())),
            "rewritten": rewritten,
            "rewrites_golden": improved,
            "pairs": len(rows),
            "pair_kinds": dict(Counter(p["kind"] for _, r in items for p in r.get("pairs", []))),
        }
        return rows, figures


def pair_reasoning(critique: str) -> str:
    """The example's reasoning (``{reply}`` / ``{reference}`` are train-judge's placeholders), from the
    contrast reply's critique (braces in it become parentheses, so it cannot name a placeholder)."""
    head = "{reply} meets this person's needs better than {reference}."
    text = " ".join(critique.replace("{", "(").replace("}", ")").split())
    return f"{head} What {{reference}} misses: {text}" if text else head

"""ESConv reference-based benchmark: the policy's reply to each real context against the real supporter turn.

Every supporter turn that follows at least one seeker turn is a case: its context is the dialogue up to
it (seeker turns as ``user``, supporter turns as ``assistant``, after the policy's system prompt), its
reference the real supporter turn. One batched generation covers a batch of contexts. The summary holds
corpus BLEU-1..4, mean ROUGE-L F and Distinct-1/2/3 over all replies (see :mod:`.text_metrics`),
computed from the records, so a resumed run scores exactly the union of its cases.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rapo_echo.benchmarks.base import Case, Emit, EvalSettings, Record, Roles, make_record
from rapo_echo.benchmarks.esconv.data import read_esconv
from rapo_echo.benchmarks.esconv.interactive import DEFAULT_DATA, require_data
from rapo_echo.benchmarks.esconv.seeker import SUPPORTER, supporter_prompt
from rapo_echo.benchmarks.text_metrics import reference_metrics, rouge_l
from rapo_echo.engines.base import generate_texts


class EsconvReference:
    """Reference-based ESConv evaluation (BLEU, ROUGE-L, Distinct)."""

    name = "esconv-ref"
    default_data = DEFAULT_DATA
    roles = ("policy",)
    headline = (
        ("bleu_1", "BLEU-1"),
        ("bleu_2", "BLEU-2"),
        ("bleu_4", "BLEU-4"),
        ("rouge_l", "ROUGE-L"),
        ("distinct_1", "Dist-1"),
        ("distinct_2", "Dist-2"),
    )

    def load_cases(self, data: str | None, settings: EvalSettings) -> list[Case]:
        cases = []
        for conv in read_esconv(require_data(data, self.name)):
            for k, (who, text) in enumerate(conv.turns):
                if who == SUPPORTER and k > 0:
                    context = conv.turns[:k]
                    cases.append(
                        Case(
                            f"{conv.id}-t{k}",
                            {"context": context, "reference": text},
                            {"conversation": conv.id, "turn": k},
                        )
                    )
        return cases

    def run_batch(self, cases: Sequence[Case], roles: Roles, settings: EvalSettings, emit: Emit) -> None:
        prompts = [supporter_prompt(settings.system_prompt, c.data["context"]) for c in cases]
        replies = [r.strip() for r in generate_texts(roles.policy, prompts, settings.policy_params())]
        scores = rouge_l(replies, [c.data["reference"] for c in cases])
        for case, reply, score in zip(cases, replies, scores):
            transcript = [{"role": who, "content": text} for who, text in case.data["context"]]
            transcript.append({"role": "policy", "content": reply})
            info = {"reply": reply, "reference": case.data["reference"], **case.meta}
            emit(make_record(case, valid=True, metrics={"rouge_l": score}, transcript=transcript, info=info))

    def summarize(self, records: Sequence[Record]) -> dict[str, Any]:
        valid = [r for r in records if r["valid"]]
        if not valid:
            return {}
        return reference_metrics([r["info"]["reply"] for r in valid], [r["info"]["reference"] for r in valid])

"""Constrained decoding on the embedded model: every answer it finishes validates against its format, over
many seeds, greedy and sampled, in the dynamic and the static decode loop; the reported log-probs stay
the untruncated ones. Few tokens per answer."""

from __future__ import annotations

import pytest

from rapo_echo.engines.hf import HFEngine
from rapo_echo.structured import AnswerFormat, object_schema
from rapo_echo.types import SamplingParams, msg

pytestmark = pytest.mark.integration

PROMPTS = [
    [
        msg("system", "You judge replies to a person in distress."),
        msg("user", "Reply: 'That sounds really hard. Do you want to talk about it?' Rate its empathy 0-10."),
    ],
    [msg("user", "Which reply is kinder? A: 'Get over it.' B: 'I am here for you.' Answer A, B or tie.")],
]
FORMATS = {
    "json": AnswerFormat.json_schema(
        object_schema(
            {
                "score": {"type": "integer", "minimum": 0, "maximum": 10},
                "reason": {"type": "string", "maxLength": 40},
            }
        )
    ),
    "choice": AnswerFormat.choice(["A", "B", "tie"]),
    "integer": AnswerFormat.integer(1, 7),
    "regex": AnswerFormat.regex(r"(yes|no), [a-z]{1,8}"),
}
BUDGET = {"json": 40, "choice": 4, "integer": 3, "regex": 12}  # regex: 3 + 8 letters + EOS
SEEDS = {"json": 3, "choice": 8, "integer": 8, "regex": 4}  # x 8 rows (2 prompts x n = 4) per seed


@pytest.fixture(scope="module")
def static_engine(smol_engine: HFEngine) -> HFEngine:
    return HFEngine(smol_engine.model, smol_engine.tokenizer, decode_loop="static")


def conforming(gens, fmt: AnswerFormat) -> tuple[int, int]:
    """(finished answers, all answers); asserts every finished one conforms."""
    flat = [g for group in gens for g in group]
    for g in flat:
        if g.finish_reason == "stop":
            assert fmt.problem(g.text) is None, (g.text, fmt.problem(g.text))
    return sum(g.finish_reason == "stop" for g in flat), len(flat)


@pytest.mark.parametrize("kind", list(FORMATS))
def test_every_answer_validates_over_many_seeds(smol_engine: HFEngine, kind: str) -> None:
    """Greedy, then sampled with ``SEEDS[kind]`` seeds x 8 rows (2 prompts x n = 4), batched."""
    fmt, budget = FORMATS[kind], BUDGET[kind]
    greedy = SamplingParams(max_new_tokens=budget, temperature=0, answer_format=fmt)
    done, total = conforming(smol_engine.generate(PROMPTS, greedy), fmt)
    for seed in range(SEEDS[kind]):
        p = SamplingParams(max_new_tokens=budget, n=4, temperature=1.0, seed=seed, answer_format=fmt)
        d, t = conforming(smol_engine.generate(PROMPTS, p), fmt)
        done, total = done + d, total + t
    # short formats always finish in budget; a json reason of 40 characters may run past 40 tokens
    assert done == total if kind != "json" else done >= total * 3 // 4


def test_static_loop_and_logprobs(static_engine: HFEngine) -> None:
    """The static loop (the compiled path without torch.compile) under a grammar; the sampled tokens'
    log-probs equal a teacher-forced forward of the same tokens (untruncated distribution)."""
    assert static_engine.decode_mode == "static"
    for kind in ("choice", "json"):
        fmt = FORMATS[kind]
        for seed in range(2 if kind == "choice" else 1):  # json: 40 steps on static buffers is the slow part
            p = SamplingParams(max_new_tokens=BUDGET[kind], n=2, seed=seed, answer_format=fmt)
            gens = static_engine.generate(PROMPTS, p)
            done, total = conforming(gens, fmt)
            assert done == total if kind == "choice" else done >= 1
            flat = [g for group in gens for g in group]
            scored = static_engine.score_ids([g.prompt_ids for g in flat], [g.token_ids for g in flat])
            for g, s in zip(flat, scored):
                assert max(abs(a - b) for a, b in zip(g.logprobs or [], s)) < 1e-3

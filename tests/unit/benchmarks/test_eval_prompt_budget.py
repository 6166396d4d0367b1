"""Every benchmark's engine calls share the trainer's prompt budget: a huge ``first_talk`` is cut to the
model's context (oldest turns first, then the beginning of the last message), fast, and the cuts are
counted and logged (issue 31 item 6)."""

from __future__ import annotations

import logging
from pathlib import Path

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.runner import get_benchmark, run_eval
from rapo_echo.engines.hf import HFEngine
from rapo_echo.types import msg
from tests.conftest import make_tiny_model
from tests.unit.benchmarks.test_bench_sage import profiles_file, row, stepping_simulator

CONTEXT = 256


def tiny_engine(smol_tokenizer) -> HFEngine:
    model = make_tiny_model(smol_tokenizer)
    model.config.max_position_embeddings = CONTEXT
    return HFEngine(model, smol_tokenizer, name="policy")


def test_a_huge_first_talk_is_cut_to_the_context_and_counted(tmp_path: Path, smol_tokenizer, caplog) -> None:
    policy = tiny_engine(smol_tokenizer)
    fed: list[int] = []
    generate_ids = policy.generate_ids
    policy.generate_ids = lambda ids, params: fed.extend(len(i) for i in ids) or generate_ids(ids, params)
    data = profiles_file(tmp_path, [row("big", "+5", first_talk="I feel lost. " * 1500)])
    settings = EvalSettings(max_turns=2, max_new_tokens=4)
    with caplog.at_level(logging.WARNING):
        roles = Roles(policy, stepping_simulator())
        summary = run_eval(get_benchmark("sage"), roles, settings, tmp_path / "o", data=data)
    assert summary["metrics"]["score"] is not None
    assert fed and max(fed) <= CONTEXT - 4  # every policy prompt fits beside the reply
    assert policy.prompt_cuts == len(fed)
    assert "cut to fit" in caplog.text
    assert "sage: prompts cut to fit" in caplog.text and f"policy {len(fed)}" in caplog.text


def test_a_200k_token_message_is_cut_fast_keeping_system_prompt_and_its_end(smol_tokenizer) -> None:
    engine = tiny_engine(smol_tokenizer)
    prompt = [msg("system", "Be kind."), msg("user", "word " * 200_000 + "THE END")]
    encoded: list[int] = []  # characters of each conversation the cut encodes
    encode = engine.encode
    engine.encode = lambda conv: encoded.append(sum(len(m["content"]) for m in conv)) or encode(conv)
    ids = engine._prompt(prompt, 16)
    # fast: the huge message is encoded whole twice (to measure it, to drop turns), then only the windows
    # at its end (a bisection over the whole text would encode it about 20 times)
    assert sum(encoded) < 3 * len(prompt[1]["content"]), encoded
    text = smol_tokenizer.decode(ids)
    assert len(ids) <= CONTEXT - 16 and "Be kind." in text and "THE END" in text
    assert engine.prompt_cuts == 1

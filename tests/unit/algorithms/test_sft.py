"""``--algo sft``: rows of the reference replies (nothing sampled), the token-mean NLL over reply tokens
only (checked by hand and against the model's own log-softmax), and a clear error for a row without a
reference."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rapo_echo.algorithms.base import AlgoContext, MicroBatch
from rapo_echo.algorithms.sft import REPLY, SFT, sft_nll
from rapo_echo.data import load_scenarios
from rapo_echo.errors import DataError
from rapo_echo.policy import Policy
from rapo_echo.rewards import RewardSet
from rapo_echo.training.run_config import load_config
from tests.helpers.data_files import write_jsonl

ROWS = [
    {"messages": [{"role": "user", "content": "I failed my exam."}], "reference": "That sounds hard."},
    {
        "messages": [
            {"role": "user", "content": "My cat is ill."},
            {"role": "assistant", "content": "Oh no."},
            {"role": "user", "content": "The vet is closed."},
        ],
        "reference": "That must be worrying; is there an emergency clinic near you?",
    },
]


def make_sft(tmp_path: Path, tiny_folder: Path, rows: list[dict] = ROWS, *sets: str) -> SFT:
    data = write_jsonl(tmp_path / "sft.jsonl", rows)
    cfg = load_config(algo="sft", overrides=[f"model.name={tiny_folder}", f"data.path={data}", *sets])
    policy = Policy(cfg.model, cfg.rollout, need_reference=False, device="cpu")
    return SFT(cfg, AlgoContext(policy, RewardSet([])))


def test_the_nll_by_hand() -> None:
    """Two rows of a mini-batch split over two micro-batches: reply tokens with probabilities 0.5, 0.25
    (row 1; its third column is padding) and 0.1 (row 2). The shares add up to the mean -log p over the
    mini-batch's 3 reply tokens: (ln 2 + ln 4 + ln 10) / 3."""
    logp = torch.log(torch.tensor([[0.5, 0.25, 0.9], [0.1, 0.7, 0.7]]))
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    whole = sft_nll(mask, logp, tokens=3.0)
    shares = sft_nll(mask[:1], logp[:1], 3.0) + sft_nll(mask[1:], logp[1:], 3.0)
    expected = (math.log(2) + math.log(4) + math.log(10)) / 3
    assert whole.item() == pytest.approx(expected) and shares.item() == pytest.approx(expected)


def test_rows_are_the_references_and_only_their_tokens_carry_the_loss(
    tmp_path: Path, tiny_folder: Path
) -> None:
    algo = make_sft(tmp_path, tiny_folder, ROWS, "rollout.max_new_tokens=64", "sft.coef=2")
    policy, tok = algo.ctx.policy, algo.ctx.policy.tokenizer
    scenarios = load_scenarios(tmp_path / "sft.jsonl")
    out = algo.rollout(scenarios, step=0)
    assert [it.kind for it in out.items] == [REPLY, REPLY] and out.metrics["sft/cut"] == 0.0
    for it, s in zip(out.items, scenarios):
        assert it.prompt_ids == policy.prompt_ids(s)  # the earlier assistant turn is prompt, not target
        assert it.completion_ids == tok(s.reference + "<|im_end|>", add_special_tokens=False)["input_ids"]
        whole = [*policy.conversation(s), {"role": "assistant", "content": s.reference}]
        rendered = tok.apply_chat_template(whole, tokenize=False)  # the template's own rendering
        assert rendered.startswith(tok.decode(it.prompt_ids + it.completion_ids))
    # the loss through the real training forward equals the hand sum over reply tokens of the full
    # sequence's log-softmax: prompt tokens add nothing
    items = out.items
    batch = policy.batch([it.prompt_ids for it in items], [it.completion_ids for it in items])
    with torch.no_grad():
        scores = policy.scorer(batch.to("cpu"))
        mb = MicroBatch(
            items, batch, batch.loss_mask, scores.logp, None, torch.zeros(2), torch.ones(2), [REPLY] * 2
        )
        n = float(sum(len(it.completion_ids) for it in items))
        loss, metrics = algo.loss(mb, scores, {REPLY: {"tokens": n, "seqs": 2.0}})
        total = 0.0
        for it in items:
            ids = torch.tensor([it.prompt_ids + it.completion_ids])
            logp = torch.log_softmax(policy.lm(ids).logits[0].float(), -1)
            p = len(it.prompt_ids)
            total -= sum(logp[p - 1 + j, t].item() for j, t in enumerate(it.completion_ids))
    assert metrics["loss/nll"].item() == pytest.approx(total / n, rel=1e-4)
    assert loss.item() == pytest.approx(2 * total / n, rel=1e-4)


def test_long_rows_are_cut_at_sft_max_length_and_said(tmp_path: Path, tiny_folder: Path, caplog) -> None:
    """SFT's targets were cut at the sampling key rollout.max_new_tokens, silently (issue 49, item 9)."""
    sets = ("rollout.max_new_tokens=3", "sft.end_of_turn=false")
    algo = make_sft(tmp_path, tiny_folder, ROWS, *sets)  # sft.max_length 1024: nothing is cut
    out = algo.rollout(load_scenarios(tmp_path / "sft.jsonl"), step=0)
    tok = algo.ctx.policy.tokenizer
    whole = tok("That sounds hard.", add_special_tokens=False)["input_ids"]
    assert out.items[0].completion_ids == whole and out.metrics["sft/cut"] == 0.0
    prompt = len(out.items[0].prompt_ids)
    algo = make_sft(tmp_path, tiny_folder, ROWS, *sets, f"sft.max_length={prompt + 3}")
    with caplog.at_level("WARNING", logger="rapo_echo.algorithms.sft"):
        out = algo.rollout(load_scenarios(tmp_path / "sft.jsonl"), step=0)
        algo.rollout(load_scenarios(tmp_path / "sft.jsonl"), step=1)
    assert out.items[0].completion_ids == whole[:3] and out.metrics["sft/cut"] == 2.0
    second = out.items[1]  # a longer prompt leaves less room (one reply token at least)
    assert len(second.completion_ids) == max(1, prompt + 3 - len(second.prompt_ids))
    assert [s.finish_reason for s in out.samples] == ["length", "length"]
    said = [r.getMessage() for r in caplog.records]
    expected = f"2 of 2 reference replies of step 0 were cut to fit sft.max_length={prompt + 3}"
    assert len(said) == 1 and expected in said[0]


def test_the_memory_plan_sizes_sft_rows_by_max_length(tmp_path: Path) -> None:
    from rapo_echo.autosize import workload_of

    cfg = load_config(algo="sft", overrides=["rollout.max_prompt_tokens=512", "sft.max_length=2048"])
    assert (workload_of(cfg).prompt_tokens, workload_of(cfg).new_tokens) == (512, 1536)
    grpo = load_config(algo="grpo", overrides=["rollout.max_new_tokens=64"])
    assert workload_of(grpo).new_tokens == 64


def test_a_row_without_a_reference_is_named(tmp_path: Path, tiny_folder: Path) -> None:
    rows = [ROWS[0], {"id": "no-ref", "messages": [{"role": "user", "content": "Hi."}]}]
    with pytest.raises(DataError, match=r"sft\.jsonl.*'no-ref' has no reference reply"):
        make_sft(tmp_path, tiny_folder, rows)


def test_one_row_per_scenario_by_default() -> None:
    """No group is sampled: the defaults make the plan count one row per scenario."""
    cfg = load_config(algo="sft")
    assert cfg.rollout.group_size == 1 and cfg.rewards == [] and SFT.needs(cfg).reference is False

"""The ``hf`` engine: batched generation, log-probs that agree with a forward pass, stop strings,
scoring, label probabilities, streaming (tiny random model unless marked integration)."""

from __future__ import annotations

import pytest
import torch

from rapo_echo.engines.hf import HFEngine, sample_next
from rapo_echo.types import SamplingParams, msg
from tests.conftest import make_tiny_model

PROMPTS = [
    [msg("user", "I failed my driving test again and I feel stupid.")],
    [
        msg("system", "Be kind."),
        msg("user", "My dog is old and the vet says he might not have long. I am scared."),
    ],
]


@pytest.fixture
def tiny_engine(smol_tokenizer) -> HFEngine:
    return HFEngine(make_tiny_model(smol_tokenizer), smol_tokenizer, max_batch_size=8)


def test_sample_next_greedy_and_logprob() -> None:
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.0, 0.0, 5.0]])
    tok, lp = sample_next(logits, SamplingParams(temperature=0), None)
    assert tok.tolist() == [1, 2]
    # log softmax of [1,3,2] at index 1: 3 - log(e^1 + e^3 + e^2) = 3 - 3.4076 = -0.4076
    assert lp[0].item() == pytest.approx(-0.40761, abs=1e-4)


def test_top_k_and_top_p_restrict_draws_but_not_logprob() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = torch.Generator().manual_seed(0)
    seen = set()
    for _ in range(200):
        tok, lp = sample_next(logits, SamplingParams(top_p=0.7), g)
        seen.add(tok.item())
        # the log-prob is of the untruncated distribution: log(0.5) or log(0.3)
        assert lp.item() == pytest.approx(
            torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))[tok].item(), abs=1e-5
        )
    assert seen == {0, 1}  # 0.5 + 0.3 reaches 0.7: tokens 2 and 3 are never drawn
    seen_k = {sample_next(logits, SamplingParams(top_k=1), g)[0].item() for _ in range(20)}
    assert seen_k == {0}


def test_batched_mixed_lengths_ids_and_logprobs(tiny_engine: HFEngine) -> None:
    gens = tiny_engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=3, seed=1))
    assert [len(g) for g in gens] == [3, 3]
    flat = [g for group in gens for g in group]
    for g in flat:
        assert 1 <= len(g.token_ids) <= 6 and len(g.logprobs or []) == len(g.token_ids)
        assert g.finish_reason in {"stop", "length"}
    # log-probs returned by sampling agree with a teacher-forced forward of the same tokens
    scored = tiny_engine.score_ids([g.prompt_ids for g in flat], [g.token_ids for g in flat])
    for g, s in zip(flat, scored):
        assert max(abs(a - b) for a, b in zip(g.logprobs or [], s)) < 1e-4


def test_seed_makes_generation_reproducible(tiny_engine: HFEngine) -> None:
    p = SamplingParams(max_new_tokens=5, n=2, seed=7)
    a = tiny_engine.generate(PROMPTS, p)
    b = tiny_engine.generate(PROMPTS, p)
    assert [[g.token_ids for g in x] for x in a] == [[g.token_ids for g in x] for x in b]


def test_group_prefill_shared_equals_separate_prompts(tiny_engine: HFEngine) -> None:
    """Greedy replies with n=2 (prefill shared) equal greedy replies of the prompt repeated."""
    p = SamplingParams(max_new_tokens=5, n=2, temperature=0)
    shared = tiny_engine.generate(PROMPTS[:1], p)[0]
    repeated = tiny_engine.generate(PROMPTS[:1] * 2, SamplingParams(max_new_tokens=5, temperature=0))
    assert shared[0].token_ids == shared[1].token_ids == repeated[0][0].token_ids == repeated[1][0].token_ids


def test_chunking_by_max_batch_size(smol_tokenizer) -> None:
    engine = HFEngine(make_tiny_model(smol_tokenizer), smol_tokenizer, max_batch_size=2)
    gens = engine.generate(PROMPTS * 2, SamplingParams(max_new_tokens=3, n=2, temperature=0))
    assert len(gens) == 4 and gens[0][0].token_ids == gens[2][0].token_ids


def test_continuation_prefix_and_choice_logprobs(tiny_engine: HFEngine) -> None:
    prompt = [*PROMPTS[0], msg("assistant", "Score:")]
    ids = tiny_engine.encode(prompt)
    assert tiny_engine.decode(ids).endswith("assistant\nScore:")
    single = tiny_engine.choice_logprobs([prompt], ["1", "2"])[0]
    direct = tiny_engine.score([prompt, prompt], ["1", "2"])
    assert single["1"] == pytest.approx(sum(direct[0].logprobs or []), abs=1e-4)
    multi = tiny_engine.choice_logprobs([prompt], [" yes", " no thanks"])[0]
    assert set(multi) == {" yes", " no thanks"} and all(v < 0 for v in multi.values())


def test_stream_matches_greedy_generation(tiny_engine: HFEngine) -> None:
    p = SamplingParams(max_new_tokens=8, temperature=0)
    streamed = "".join(tiny_engine.stream(PROMPTS[0], p))
    assert streamed == tiny_engine.generate(PROMPTS[:1], p)[0][0].text


@pytest.mark.integration
def test_real_model_generates_and_logprobs_agree(smol_engine: HFEngine) -> None:
    gens = smol_engine.generate(PROMPTS, SamplingParams(max_new_tokens=12, n=2, seed=3, stop=("\n\n",)))
    flat = [g for group in gens for g in group]
    assert all(g.text.strip() for g in flat)
    scored = smol_engine.score_ids([g.prompt_ids for g in flat], [g.token_ids for g in flat])
    for g, s in zip(flat, scored):
        assert max(abs(a - b) for a, b in zip(g.logprobs or [], s)) < 1e-3
    assert all("\n\n" not in g.text for g in flat)


@pytest.mark.integration
def test_real_model_stop_string(smol_engine: HFEngine) -> None:
    g = smol_engine.generate(
        [[msg("user", "Count from one to ten, one number per line.")]],
        SamplingParams(max_new_tokens=30, temperature=0, stop=("\n",)),
    )[0][0]
    assert g.text.strip() and "\n" not in g.text and g.finish_reason == "stop"
    assert "\n" in smol_engine.decode(g.token_ids)


def test_shared_prefix_grouping_by_hand() -> None:
    from rapo_echo.engines.hf import shared_prefixes

    a = list(range(40)) + [100, 101]
    b = list(range(40)) + [200]
    c = list(range(40))  # identical to the common prefix: keeps its last token as its own
    d = [7, 8, 9]
    # a, b, c share 40 tokens, but c needs one token of its own -> 39; d shares nothing
    assert shared_prefixes([a, b, c, d], min_len=32) == [39, 39, 39, 0]
    assert shared_prefixes([a, b], min_len=41) == [0, 0]


def test_shared_prefix_prefill_equals_plain_prefill(tiny_engine: HFEngine, monkeypatch) -> None:
    """Prompts of one group (a long common system prompt) give the same greedy replies and log-probs
    with the shared-prefix prefill as with the plain one."""
    import rapo_echo.engines.hf as hf

    system = "You are role-playing a person talking to a supporter about something hard. " * 3
    prompts = [
        [msg("system", system), msg("user", f"Reply {i}: {'so ' * i}sorry to hear that.")] for i in range(4)
    ]
    prompts.append([msg("user", "A short unrelated prompt.")])
    assert any(hf.shared_prefixes([tiny_engine.encode(p) for p in prompts]))
    p = SamplingParams(max_new_tokens=5, temperature=0)
    shared = tiny_engine.generate(prompts, p)
    shared_choice = tiny_engine.choice_logprobs(prompts, ["1", "2"])
    monkeypatch.setattr(hf, "shared_prefixes", lambda prompts, min_len=32: [0] * len(prompts))
    plain = tiny_engine.generate(prompts, p)
    plain_choice = tiny_engine.choice_logprobs(prompts, ["1", "2"])
    for x, y in zip(shared, plain):
        assert x[0].token_ids == y[0].token_ids
        assert x[0].logprobs == pytest.approx(y[0].logprobs, abs=1e-4)
    for x, y in zip(shared_choice, plain_choice):
        assert x["1"] == pytest.approx(y["1"], abs=1e-4)

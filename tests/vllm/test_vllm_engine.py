"""The ``vllm`` role engine against the real vLLM (one in-process ``LLM`` per session, the embedded model in
float32): sampling with ``n`` and its log-probs against our own forward, option scores against the ``hf``
engine, each answer format enforced by vLLM's structured outputs, and the temperature bound."""

from __future__ import annotations

import math

import pytest
import torch

from rapo_echo.errors import EngineError
from rapo_echo.types import SamplingParams
from tests.vllm.formats import FORMATS, PROMPTS

pytestmark = pytest.mark.vllm

# |vLLM processed log-prob - our log_softmax(logits / T)| on the same tokens, float32 on this CPU: the
# largest measured gap was 2e-5 (docs/scaling.md); a stale or wrongly scaled value is off by > 0.05
LOGPROB_TOL = 1e-3


def our_logprobs(model, prompt: list[int], completion: list[int], temperature: float) -> list[float]:
    """``log_softmax(logits / T)`` of each completion token under ``model`` (one full forward)."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    logp = torch.log_softmax(logits / temperature, dim=-1)
    return logp.gather(1, torch.tensor(completion)[:, None]).squeeze(1).tolist()


def test_generate_with_n_and_processed_logprobs_equal_our_forward(vllm_engine, smol_engine) -> None:
    """One call, ``n`` samples per prompt, the prompt ids of our chat template, and each sampled token's
    log-prob equal to ``log_softmax(logits / T)`` of our own forward (``processed_logprobs`` mode)."""
    assert vllm_engine.logprobs_mode == "processed_logprobs"
    t = 0.7
    gens = vllm_engine.generate(PROMPTS, SamplingParams(n=3, max_new_tokens=8, temperature=t, seed=1))
    assert [len(g) for g in gens] == [3, 3]
    worst = 0.0
    for prompt, group in zip(PROMPTS, gens):
        ids = smol_engine.encode(prompt)
        assert vllm_engine.encode(prompt) == ids
        for g in group:
            assert g.prompt_ids == ids and len(g.token_ids) == len(g.logprobs) > 0
            ours = our_logprobs(smol_engine.model, ids, g.token_ids, t)
            worst = max(worst, *(abs(a - b) for a, b in zip(g.logprobs, ours)))
    print(f"max |vLLM - ours| at T={t}: {worst:.2e}")
    assert worst < LOGPROB_TOL


def test_score_ids_and_choice_logprobs_match_the_hf_engine(vllm_engine, smol_engine) -> None:
    """Teacher-forced log-probs (vLLM's prompt log-probs, temperature 1) equal the ``hf`` engine's."""
    options = ["Yes", "No", "Maybe"]
    ours = smol_engine.choice_logprobs(PROMPTS, options)
    theirs = vllm_engine.choice_logprobs(PROMPTS, options)
    for a, b in zip(ours, theirs):
        assert set(b) == set(options)
        for o in options:
            assert math.isfinite(b[o]) and b[o] == pytest.approx(a[o], abs=LOGPROB_TOL)
    ids = vllm_engine.encode(PROMPTS[0])
    completion = vllm_engine.tokenizer("I hear you.", add_special_tokens=False)["input_ids"]
    scored = vllm_engine.score_ids([ids], [completion])[0]
    assert scored == pytest.approx(smol_engine.score_ids([ids], [completion])[0], abs=LOGPROB_TOL)


@pytest.mark.parametrize("fmt", FORMATS, ids=lambda f: f.kind)
def test_each_answer_format_is_enforced(vllm_engine, fmt) -> None:
    """Every sample of every prompt conforms (the embedded model unconstrained answers these prompts in
    prose, see test_an_unconstrained_answer_does_not_conform)."""
    assert vllm_engine.structured_output == "grammar"
    params = SamplingParams(n=3, max_new_tokens=40, temperature=1.0, seed=3, answer_format=fmt)
    for group in vllm_engine.generate(PROMPTS, params):
        for g in group:
            assert g.finish_reason == "stop", g.text
            assert fmt.problem(g.text) is None, (fmt.kind, g.text)


def test_an_unconstrained_answer_does_not_conform(vllm_engine) -> None:
    """The control of the test above: the same prompts without the format give text no format accepts."""
    gens = vllm_engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=12, temperature=1.0, seed=3))
    texts = [g.text for group in gens for g in group]
    for fmt in FORMATS:
        assert all(fmt.problem(t) for t in texts), (fmt.kind, texts)


def test_temperature_above_vllms_bound_is_refused_with_the_fix(vllm_engine) -> None:
    """vLLM itself refuses temperature > 2 (checked here against its SamplingParams); our engine says which
    setting to change instead of passing vLLM's error on."""
    from rapo_echo.engines.vllm_engine import MAX_TEMPERATURE

    vllm_engine._vllm.SamplingParams(temperature=MAX_TEMPERATURE)
    with pytest.raises(Exception, match="temperature"):
        vllm_engine._vllm.SamplingParams(temperature=MAX_TEMPERATURE + 0.5)
    with pytest.raises(EngineError, match=r"rollout.temperature"):
        vllm_engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=2, temperature=2.5))

"""``engine: policy`` under LoRA: every call of the role's engine sees the base model, never the adapter."""

from __future__ import annotations

import torch

from rapo_echo.engines.hf import HFEngine
from rapo_echo.engines.shared import FrozenBaseEngine
from rapo_echo.types import SamplingParams
from tests.conftest import make_tiny_model

PROMPT = [{"role": "user", "content": "I lost my job today."}]


def test_every_call_sees_the_base_and_leaves_the_adapter_on(smol_tokenizer) -> None:
    from peft import LoraConfig, get_peft_model

    tok = smol_tokenizer
    base = HFEngine(make_tiny_model(tok), tok)
    lm = get_peft_model(make_tiny_model(tok), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, p in lm.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.5)  # a trained adapter: it moves every output
    adapted, frozen = HFEngine(lm, tok), FrozenBaseEngine(lm, tok)
    prompt, reply = frozen.encode(PROMPT), tok("I am sorry", add_special_tokens=False)["input_ids"]
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)

    def calls(engine: HFEngine) -> list:
        return [
            engine.score_ids([prompt], [reply]),
            engine.choice_logprobs([PROMPT], ["Yes", "No"]),
            engine.generate([PROMPT], greedy)[0][0].token_ids,
            engine.top_logprobs_ids([prompt], [reply], 3),
            list(engine.stream(PROMPT, greedy)),
        ]

    want = calls(base)
    assert calls(adapted) != want
    assert calls(frozen) == want
    assert calls(adapted) != want  # the adapter is on again after the frozen engine's calls

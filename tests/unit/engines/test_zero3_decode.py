"""Engines over DeepSpeed ZeRO-3 weights never take the compiled decode (audit D3): the weights are
gathered into new storage for every rollout, so CUDA graphs captured on one gather would replay stale
addresses. That holds for every engine over such a model -- the policy's, and the roles that share it
(``engine: policy``) -- since the rule sits in the engine itself. A GPU is faked (the device reported as
CUDA); nothing is decoded."""

from __future__ import annotations

import pytest
import torch

from rapo_echo.engines.hf import HFEngine
from rapo_echo.engines.shared import FrozenBaseEngine
from tests.conftest import make_tiny_model


@pytest.fixture
def on_cuda(monkeypatch) -> None:
    monkeypatch.setattr(HFEngine, "device", property(lambda self: torch.device("cuda")))


def zero3_like(model: torch.nn.Module) -> torch.nn.Module:
    """Mark the parameters as DeepSpeed marks ZeRO-3 ones (``ds_id``)."""
    for i, p in enumerate(model.parameters()):
        p.ds_id = i
    return model


@pytest.mark.parametrize("asked", ["auto", "compiled"])
def test_zero3_weights_decode_static_without_graphs(on_cuda, smol_tokenizer, asked: str) -> None:
    engine = HFEngine(zero3_like(make_tiny_model(smol_tokenizer)), smol_tokenizer, decode_loop=asked)
    assert engine.decode_mode == "static"
    assert engine._static is not None and not engine._static.compiled


def test_a_role_sharing_zero3_weights_decodes_static(on_cuda, smol_tokenizer) -> None:
    from peft import LoraConfig, get_peft_model

    lm = get_peft_model(make_tiny_model(smol_tokenizer), LoraConfig(r=2, target_modules=["q_proj"]))
    judge = FrozenBaseEngine(zero3_like(lm), smol_tokenizer, name="judge:policy-base")
    assert judge.decode_mode == "static"


def test_ordinary_weights_keep_the_compiled_decode_on_cuda(on_cuda, smol_tokenizer) -> None:
    engine = HFEngine(make_tiny_model(smol_tokenizer), smol_tokenizer)
    assert engine.decode_mode == "compiled" and engine._static is not None and engine._static.compiled

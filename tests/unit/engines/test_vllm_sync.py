"""What of the ``vllm`` engine runs without vLLM: the missing-package error, the sampling arguments, the
weights as they are streamed into vLLM (full model and LoRA), and the rollout copy's arguments for one and
for several processes (multi-GPU placement cannot run here: the arguments are checked, the placement itself
is vLLM's). The engine against the real vLLM: tests/vllm (``make test-vllm``)."""

from __future__ import annotations

import copy
import sys
from types import SimpleNamespace

import pytest
import torch

from rapo_echo.engines.vllm_engine import sampling_kwargs, version_tuple
from rapo_echo.engines.vllm_sync import rollout_llm_kwargs, vllm_name, weights_for_vllm
from rapo_echo.errors import ConfigError, EngineError
from rapo_echo.types import SamplingParams
from tests.conftest import make_tiny_model


def test_missing_vllm_names_the_install_command(monkeypatch, smol_path):
    from rapo_echo.engines.vllm_engine import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(EngineError) as err:
        VLLMEngine(smol_path)
    assert "pip install 'rapo-echo[vllm]'" in str(err.value) and "docs/scaling.md" in str(err.value)


def test_version_tuple():
    assert version_tuple("0.11.0rc1+cu128") == (0, 11, 0)
    assert version_tuple("0.32.0+cpu") == (0, 32, 0)
    assert version_tuple("dev") == ()


def test_sampling_kwargs_and_vllms_temperature_bound():
    kw = sampling_kwargs(SamplingParams(n=3, max_new_tokens=5, temperature=0.7, top_k=0, stop=["\n"], seed=4))
    assert kw == {
        "n": 3, "max_tokens": 5, "temperature": 0.7, "top_p": 1.0, "top_k": -1, "logprobs": 0,
        "stop": ["\n"], "seed": 4,
    }  # fmt: skip
    assert sampling_kwargs(SamplingParams(top_k=20))["top_k"] == 20
    assert sampling_kwargs(SamplingParams(temperature=2.0))["temperature"] == 2.0
    with pytest.raises(EngineError, match=r"policy:vllm: temperature 2.5 is above 2.*rollout.temperature"):
        sampling_kwargs(SamplingParams(temperature=2.5), "policy:vllm")


def test_config_refuses_temperatures_vllm_refuses():
    from rapo_echo.training.run_config import load_config

    with pytest.raises(ConfigError, match=r"rollout.*temperature 3: vLLM .* at most 2"):
        load_config(overrides=["rollout.engine=vllm", "rollout.temperature=3"])
    assert load_config(overrides=["rollout.temperature=3"]).rollout.temperature == 3  # hf samples it
    # a vllm role has no temperature of its own (its callers set it): the section loads
    assert load_config(overrides=["judge.engine=vllm", "judge.model=m"]).judge.engine == "vllm"


def test_rollout_arguments_one_process_and_several():
    from rapo_echo.training.run_config import load_config

    cfg = load_config(overrides=["rollout.max_prompt_tokens=512", "rollout.max_new_tokens=64"])
    one = rollout_llm_kwargs(cfg.rollout, seed=7, world_size=1, sleep_available=False)
    assert one == {"gpu_memory_utilization": 0.3, "max_model_len": 576, "seed": 7, "enable_sleep_mode": False}
    several = rollout_llm_kwargs(cfg.rollout, seed=8, world_size=4, sleep_available=True)
    assert several["distributed_executor_backend"] == "external_launcher"  # each rank on cuda:LOCAL_RANK
    assert several["enable_sleep_mode"] is True and several["seed"] == 8
    big = load_config(overrides=["rollout.batch_size=64", "rollout.group_size=8"])
    assert rollout_llm_kwargs(big.rollout, seed=0, world_size=1, sleep_available=False)["max_num_seqs"] == 512


def test_a_plain_model_streams_every_parameter_once_as_it_is(smol_tokenizer):
    model = make_tiny_model(smol_tokenizer)
    sent = list(weights_for_vllm(model))
    assert [n for n, _ in sent] == [n for n, _ in model.named_parameters()]  # tied lm_head: once
    assert all(t.data_ptr() == p.data_ptr() for (_, t), (_, p) in zip(sent, model.named_parameters()))


def test_lora_is_merged_into_temporaries_and_the_base_is_untouched(smol_tokenizer):
    """Each LoRA layer goes out as ``W + s*B@A`` (equal to PEFT's own merge), under the base model's names;
    the adapter's tensors stay home and no base weight changes, not even by rounding."""
    from peft import LoraConfig, get_peft_model

    base = make_tiny_model(smol_tokenizer).to(torch.bfloat16)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    model = get_peft_model(base, lora)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    sent = dict(weights_for_vllm(model))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    assert set(sent) == {n for n in reference if n != "lm_head.weight"}  # tied to the embedding
    for name, tensor in sent.items():
        assert tensor.dtype == torch.bfloat16
        assert torch.allclose(tensor.float(), reference[name].float(), atol=1e-2), name
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(sent[q], before[f"base_model.model.{q.replace('.weight', '.base_layer.weight')}"])
    for n, p in model.named_parameters():
        assert torch.equal(p, before[n]), n  # bit-identical: nothing merged in place


def test_peft_names_become_checkpoint_names():
    assert vllm_name("base_model.model.model.layers.0.mlp.up_proj.base_layer.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert vllm_name("base_model.model.lm_head.modules_to_save.default.weight") == "lm_head.weight"
    assert vllm_name("model.norm.weight") == "model.norm.weight"


def test_zero3_parameters_are_gathered_one_at_a_time(monkeypatch):
    """Under ZeRO-3 a parameter's ``.data`` is empty outside a gather: each is read inside its own
    ``GatheredParameters`` (read-only) and released before the next. DeepSpeed's partitioning needs a
    distributed launch, so the partitioned parameter and the gather are stand-ins here (named so)."""
    import deepspeed

    log: list[str] = []

    class FakeGathered:  # stand-in for deepspeed.zero.GatheredParameters
        def __init__(self, params, modifier_rank=None):
            assert modifier_rank is None and len(params) == 1
            self.p = params[0]

        def __enter__(self):
            log.append(f"gather {self.p.tag}")
            self.p.data = self.p.full

        def __exit__(self, *exc):
            log.append(f"release {self.p.tag}")
            self.p.data = torch.empty(0)

    monkeypatch.setattr(deepspeed.zero, "GatheredParameters", FakeGathered)
    model = torch.nn.Linear(3, 2)
    for tag, p in (("w", model.weight), ("b", model.bias)):
        p.ds_id, p.tag, p.full = 1, tag, p.data.clone()  # a partitioned parameter, as ZeRO-3 marks one
        p.data = torch.empty(0)
    for name, tensor in weights_for_vllm(model):
        log.append(f"load {name} {tuple(tensor.shape)}")
    assert log == [
        "gather w", "load weight (2, 3)", "release w", "gather b", "load bias (2,)", "release b",
    ]  # fmt: skip


class SleepModeStandIn:
    """Stands in for ``vllm.LLM`` where sleep mode exists (CUDA, ROCm, XPU; not the CPU build this suite
    has): records the calls the engine makes around a weight load."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        executor = SimpleNamespace(driver_worker=SimpleNamespace(reload_weights=None))
        self.llm_engine = SimpleNamespace(model_executor=executor)

    def sleep(self, level: int) -> None:
        self.calls.append(f"sleep {level}")

    def wake_up(self, tags: list[str]) -> None:
        self.calls.append(f"wake {','.join(tags)}")

    def collective_rpc(self, method: str, kwargs: dict) -> None:
        names = [n for n, _ in kwargs["weights_iterator"]]
        self.calls.append(f"{method} {len(names)}")

    def apply_model(self, fn) -> None:
        self.calls.append("apply_model")

    def reset_prefix_cache(self) -> None:
        self.calls.append("reset_prefix_cache")


def test_sleep_mode_releases_after_the_rollout_and_wakes_around_the_load():
    """Where sleep mode exists: the copy sleeps (level 2) after a rollout, refuses to generate while
    asleep, and wakes its weights, then its KV cache, around the next load (sleep-mode platforms only:
    the calls are checked on a stand-in)."""
    from rapo_echo.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine.__new__(VLLMEngine)
    engine.name, engine.llm = "policy:vllm", SleepModeStandIn()
    engine.sleep_enabled, engine.asleep = True, False
    engine.sleep()
    engine.sleep()  # once
    with pytest.raises(EngineError, match="asleep"):
        engine.generate_ids([[1, 2]], SamplingParams())
    assert engine.load_weights([("a", torch.zeros(1)), ("b", torch.ones(1))]) == 2
    assert engine.llm.calls == [
        "sleep 2", "wake weights", "reload_weights 2", "apply_model", "wake kv_cache", "reset_prefix_cache",
    ]  # fmt: skip
    assert not engine.asleep

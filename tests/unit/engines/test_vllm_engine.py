"""The ``vllm`` engine adapter, checked against a fake ``vllm`` module.

No GPU (and so no vLLM) exists where this suite runs. These tests inject a small fake ``vllm`` module
into ``sys.modules`` that mimics the documented shapes of vLLM's offline API (``LLM(**engine_args)``,
``LLM.generate(prompts, SamplingParams, use_tqdm=...)`` returning ``RequestOutput`` objects whose
``outputs`` are ``CompletionOutput`` with ``token_ids``, ``logprobs`` = one ``{token_id: Logprob}`` per
generated token, ``prompt_logprobs`` = ``[None, {token_id: Logprob}, ...]``, ``LLM.apply_model``).
They check OUR adapter -- request building, ``n``, log-prob extraction, choice log-probs, weight
loading, the missing-package error -- against those documented shapes, not vLLM itself.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
import torch

from rapo_echo.errors import EngineError
from rapo_echo.types import SamplingParams, msg


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    cumulative_logprob: float | None
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str | None = "stop"
    stop_reason: int | str | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    prompt_logprobs: list[dict[int, Logprob] | None] | None
    outputs: list[CompletionOutput]
    finished: bool = True


class FakeSamplingParams:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        for k, v in kwargs.items():
            setattr(self, k, v)
        self.prompt_logprobs = kwargs.get("prompt_logprobs")


EOS = 2


def sample_tokens(prompt: list[int], j: int) -> list[int]:
    """Sample j of a prompt: two tokens that depend on the prompt length and j, then EOS."""
    return [100 + len(prompt) + j, 200 + j, EOS]


def sample_logprob(k: int, j: int) -> float:
    """Log-prob of the k-th generated token of sample j: -(0.5 + 0.1 k + 0.01 j)."""
    return -(0.5 + 0.1 * k + 0.01 * j)


def prompt_logprob(token: int) -> float:
    """Teacher-forced log-prob of a prompt token: -token / 1000."""
    return -token / 1000


@dataclass
class FakeModel:
    loaded: list[list[tuple[str, Any]]] = field(default_factory=list)

    def load_weights(self, weights: Any) -> set[str]:
        weights = [(n, t.clone()) for n, t in weights]  # vLLM copies into its own parameters
        self.loaded.append(weights)
        return {n for n, _ in weights}


class FakeLLM:
    instances: ClassVar[list[FakeLLM]] = []

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[tuple[list[dict], FakeSamplingParams]] = []
        self.workers = [FakeModel(), FakeModel()]  # tensor parallel 2: apply_model runs on both
        self.cache_resets = 0
        self.reverse_outputs = False
        self.finish_reason = "stop"
        self.drop_logprob = False
        FakeLLM.instances.append(self)

    def generate(self, prompts: list[dict], sampling_params: FakeSamplingParams, use_tqdm: bool = True):
        self.calls.append((prompts, sampling_params))
        results = []
        for r, prompt in enumerate(prompts):
            ids = list(prompt["prompt_token_ids"])
            if sampling_params.prompt_logprobs is not None:
                # position 0 has no log-prob; each later position holds the actual token plus a decoy
                plp = [None] + [{t: Logprob(prompt_logprob(t), 7), 5: Logprob(-0.01, 1)} for t in ids[1:]]
                out = CompletionOutput(0, "x", [9], None, None, "length")
                results.append(RequestOutput(str(r), None, ids, plp, [out]))
                continue
            outs = []
            for j in range(sampling_params.n):
                toks = sample_tokens(ids, j)[: sampling_params.max_tokens]
                finish = "stop" if len(toks) == 3 else "length"
                lps = [{t: Logprob(sample_logprob(k, j), 1), 3: Logprob(-9.0, 2)} for k, t in enumerate(toks)]
                if self.drop_logprob:
                    lps[0] = {3: Logprob(-9.0, 2)}
                text = " ".join(f"t{t}" for t in toks if t != EOS)
                outs.append(CompletionOutput(j, text, toks, None, lps, self.finish_reason or finish))
            if self.reverse_outputs:
                outs.reverse()
            results.append(RequestOutput(str(r), None, ids, None, outs))
        return results

    def apply_model(self, func: Any) -> list[Any]:
        return [func(w) for w in self.workers]

    def reset_prefix_cache(self) -> bool:
        self.cache_resets += 1
        return True


def fake_vllm(version: str = "0.30.1") -> types.ModuleType:
    mod = types.ModuleType("vllm")
    mod.__version__ = version
    mod.LLM = FakeLLM
    mod.SamplingParams = FakeSamplingParams
    return mod


@pytest.fixture
def vllm_module(monkeypatch):
    mod = fake_vllm()
    monkeypatch.setitem(sys.modules, "vllm", mod)
    FakeLLM.instances.clear()
    return mod


@pytest.fixture
def engine(vllm_module, smol_path):
    from rapo_echo.engines.vllm_engine import VLLMEngine

    return VLLMEngine(smol_path, name="policy:vllm")


def chat_ids(tokenizer, conv) -> list[int]:
    text = tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_missing_vllm_names_the_install_command(monkeypatch, smol_path):
    from rapo_echo.engines.vllm_engine import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(EngineError) as err:
        VLLMEngine(smol_path)
    assert "pip install 'rapo-echo[vllm]'" in str(err.value)
    assert "GPU" in str(err.value)


def test_engine_arguments(engine, smol_path):
    llm = FakeLLM.instances[-1]
    assert llm.kwargs == {
        "model": smol_path,
        "tokenizer": smol_path,
        "dtype": "auto",
        "trust_remote_code": False,
        "gpu_memory_utilization": 0.3,
        "tensor_parallel_size": 1,
        "seed": 0,
        "logprobs_mode": "processed_logprobs",
    }
    assert engine.supports_logprobs and engine.name == "policy:vllm"


def test_old_vllm_gets_no_logprobs_mode_and_extra_kwargs_pass_through(monkeypatch, smol_path):
    from rapo_echo.engines.vllm_engine import VLLMEngine

    monkeypatch.setitem(sys.modules, "vllm", fake_vllm("0.9.2"))
    VLLMEngine(smol_path, max_model_len=512, enforce_eager=True)
    kwargs = FakeLLM.instances[-1].kwargs
    assert "logprobs_mode" not in kwargs
    assert kwargs["max_model_len"] == 512 and kwargs["enforce_eager"] is True


def test_version_tuple():
    from rapo_echo.engines.vllm_engine import version_tuple

    assert version_tuple("0.11.0rc1+cu128") == (0, 11, 0)
    assert version_tuple("0.10.2") >= (0, 10, 2) > version_tuple("0.10.1.post1")


def test_generate_is_one_call_with_n_and_reads_sampled_logprobs(engine, smol_tokenizer):
    prompts = [[msg("user", "I failed my exam.")], [msg("system", "Be kind."), msg("user", "I feel alone.")]]
    params = SamplingParams(max_new_tokens=5, temperature=0.7, top_p=1.0, n=3, stop=("\n\n",), seed=11)
    out = engine.generate(prompts, params)
    llm = FakeLLM.instances[-1]
    assert len(llm.calls) == 1  # one batched call for every prompt and sample
    sent, sp = llm.calls[0]
    expected_ids = [chat_ids(smol_tokenizer, p) for p in prompts]
    assert sent == [{"prompt_token_ids": ids} for ids in expected_ids]
    assert sp.kwargs == {
        "n": 3,
        "max_tokens": 5,
        "temperature": 0.7,
        "top_p": 1.0,
        "top_k": -1,  # ours 0 (off) -> vLLM's "off" value
        "logprobs": 0,
        "stop": ["\n\n"],
        "seed": 11,
    }
    assert [len(g) for g in out] == [3, 3]
    for i, gens in enumerate(out):
        for j, gen in enumerate(gens):
            assert gen.prompt_ids == expected_ids[i]
            assert gen.token_ids == sample_tokens(expected_ids[i], j)
            # hand values: -(0.5 + 0.1 k + 0.01 j) for k = 0, 1, 2 (the decoy entry is ignored)
            assert gen.logprobs == pytest.approx([-(0.5 + 0.01 * j), -(0.6 + 0.01 * j), -(0.7 + 0.01 * j)])
            assert gen.finish_reason == "stop"
            assert gen.text == f"t{100 + len(expected_ids[i]) + j} t{200 + j}"


def test_generate_sorts_samples_by_index_and_keeps_length_finish(engine):
    llm = FakeLLM.instances[-1]
    llm.reverse_outputs = True
    llm.finish_reason = None  # the fake then reports "length" for truncated samples
    gens = engine.generate([[msg("user", "hi")]], SamplingParams(max_new_tokens=2, n=2))[0]
    assert [g.token_ids[1] for g in gens] == [200, 201]
    assert [g.finish_reason for g in gens] == ["length", "length"]
    assert all(len(g.token_ids) == len(g.logprobs) == 2 for g in gens)
    assert FakeLLM.instances[-1].calls[0][1].kwargs["top_k"] == -1


def test_top_k_is_passed_through(engine):
    engine.generate([[msg("user", "hi")]], SamplingParams(max_new_tokens=3, top_k=20))
    assert FakeLLM.instances[-1].calls[0][1].kwargs["top_k"] == 20


def test_missing_sampled_logprob_and_abort_are_errors(engine):
    llm = FakeLLM.instances[-1]
    llm.drop_logprob = True
    with pytest.raises(EngineError, match="no log-prob for token"):
        engine.generate([[msg("user", "hi")]], SamplingParams(max_new_tokens=3))
    llm.drop_logprob = False
    llm.finish_reason = "abort"
    with pytest.raises(EngineError, match="finish_reason='abort'"):
        engine.generate([[msg("user", "hi")]], SamplingParams(max_new_tokens=3))


@dataclass
class StructuredOutputsParams:  # vLLM >= 0.10.2 (vllm.sampling_params)
    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None


@dataclass
class GuidedDecodingParams:  # older vLLM (vllm.sampling_params)
    json: Any = None
    regex: str | None = None
    choice: list[str] | None = None
    backend: str | None = None


def with_structured_api(monkeypatch, **classes: type) -> types.ModuleType:
    """A fake vLLM whose ``vllm.sampling_params`` holds ``classes``."""
    mod = fake_vllm()
    params_mod = types.ModuleType("vllm.sampling_params")
    for name, cls in classes.items():
        setattr(params_mod, name, cls)
    mod.sampling_params = params_mod
    monkeypatch.setitem(sys.modules, "vllm", mod)
    monkeypatch.setitem(sys.modules, "vllm.sampling_params", params_mod)
    return mod


def test_structured_kwargs_for_each_kind():
    from rapo_echo.engines.vllm_engine import structured_kwargs
    from rapo_echo.structured import AnswerFormat

    api = ("structured_outputs", StructuredOutputsParams)
    schema = {"type": "object", "properties": {"s": {"type": "integer"}}, "required": ["s"]}
    assert structured_kwargs(AnswerFormat.json_schema(schema), api) == {
        "structured_outputs": StructuredOutputsParams(json=schema)
    }
    assert structured_kwargs(AnswerFormat.choice(["A", "B"]), api) == {
        "structured_outputs": StructuredOutputsParams(choice=["A", "B"])
    }
    assert structured_kwargs(AnswerFormat.integer(1, 3), ("guided_decoding", GuidedDecodingParams)) == {
        "guided_decoding": GuidedDecodingParams(regex="(1|2|3)")
    }
    assert structured_kwargs(AnswerFormat.regex("[ab]+"), api) == {
        "structured_outputs": StructuredOutputsParams(regex="[ab]+")
    }
    assert structured_kwargs(None, api) == {} and structured_kwargs(AnswerFormat.choice(["A"]), None) == {}


@pytest.mark.parametrize(
    ("classes", "field", "cls"),
    [
        ({"StructuredOutputsParams": StructuredOutputsParams}, "structured_outputs", StructuredOutputsParams),
        ({"GuidedDecodingParams": GuidedDecodingParams}, "guided_decoding", GuidedDecodingParams),
        (  # a version with both: the new API wins
            {
                "GuidedDecodingParams": GuidedDecodingParams,
                "StructuredOutputsParams": StructuredOutputsParams,
            },
            "structured_outputs",
            StructuredOutputsParams,
        ),
    ],
)
def test_answer_format_reaches_vllm_sampling_params(monkeypatch, smol_path, classes, field, cls):
    from rapo_echo.engines.base import format_enforcement
    from rapo_echo.engines.vllm_engine import VLLMEngine
    from rapo_echo.structured import AnswerFormat

    with_structured_api(monkeypatch, **classes)
    engine = VLLMEngine(smol_path)
    assert engine.structured_output == "grammar" and format_enforcement(engine) == "grammar"
    fmt = AnswerFormat.choice(["calm", "upset"], name="emotion")
    engine.generate([[msg("user", "hi")]], SamplingParams(max_new_tokens=4, answer_format=fmt))
    engine.generate([[msg("user", "hi")]], SamplingParams(max_new_tokens=4))
    calls = FakeLLM.instances[-1].calls
    assert calls[0][1].kwargs[field] == cls(choice=["calm", "upset"])
    assert "structured_outputs" not in calls[1][1].kwargs and "guided_decoding" not in calls[1][1].kwargs


def test_vllm_without_structured_api_parses_only_and_warns_once(engine, caplog):
    from rapo_echo.structured import AnswerFormat

    assert engine.structured_output == "none"  # the plain fake vLLM has neither class
    fmt = AnswerFormat.choice(["A", "B"])
    with caplog.at_level("WARNING"):
        for _ in range(2):
            engine.generate([[msg("user", "hi")]], SamplingParams(max_new_tokens=4, answer_format=fmt))
    assert len([r for r in caplog.records if "no structured-output parameters" in r.getMessage()]) == 1
    sent = [c[1].kwargs for c in FakeLLM.instances[-1].calls]
    assert all(not set(kw) & {"structured_outputs", "guided_decoding"} for kw in sent)


def test_choice_logprobs_from_prompt_logprobs(engine, smol_tokenizer):
    prompts = [[msg("user", "Rate it.")], [msg("user", "Rate this one.")]]
    options = ["A", "B", " maybe later"]
    out = engine.choice_logprobs(prompts, options)
    llm = FakeLLM.instances[-1]
    assert len(llm.calls) == 1
    sent, sp = llm.calls[0]
    assert sp.kwargs == {"max_tokens": 1, "temperature": 1.0, "prompt_logprobs": 1}
    encoded = [smol_tokenizer(o, add_special_tokens=False)["input_ids"] for o in options]
    assert len(encoded[2]) > 1  # a multi-token option is summed over its tokens
    bases = [chat_ids(smol_tokenizer, p) for p in prompts]
    assert sent == [{"prompt_token_ids": b + e} for b in bases for e in encoded]
    for row in out:
        for option, ids in zip(options, encoded):
            # hand value: sum over the option's tokens of -token / 1000
            assert row[option] == pytest.approx(sum(-t / 1000 for t in ids))


def test_stream_yields_the_whole_text_once(engine):
    pieces = list(engine.stream([msg("user", "hi")], SamplingParams(max_new_tokens=4, n=3)))
    assert len(pieces) == 1 and pieces[0].startswith("t")
    assert FakeLLM.instances[-1].calls[0][1].kwargs["n"] == 1


def test_load_weights_goes_through_apply_model_and_resets_the_cache(engine):
    llm = FakeLLM.instances[-1]
    t = torch.ones(2, 2, requires_grad=True)
    engine.load_weights([("model.norm.weight", t)])
    assert all(len(w.loaded) == 1 for w in llm.workers)  # every worker got the tensors
    name, tensor = llm.workers[0].loaded[0][0]
    assert name == "model.norm.weight" and not tensor.requires_grad and torch.equal(tensor, t.detach())
    assert llm.cache_resets == 1
    with pytest.raises(ValueError, match="no tensors"):
        engine.load_weights([])


def test_apply_model_failure_names_the_fix(engine):
    def broken(func):
        raise TypeError("cannot pickle 'function' object")

    FakeLLM.instances[-1].apply_model = broken
    with pytest.raises(EngineError, match="VLLM_ALLOW_INSECURE_SERIALIZATION=1"):
        engine.load_weights([("w", torch.zeros(1))])


def test_legacy_executor_path_and_unsupported_version(engine):
    llm = FakeLLM.instances[-1]
    legacy = FakeModel()
    engine.llm = types.SimpleNamespace(
        llm_engine=types.SimpleNamespace(
            model_executor=types.SimpleNamespace(
                driver_worker=types.SimpleNamespace(model_runner=types.SimpleNamespace(model=legacy))
            )
        )
    )
    engine.load_weights([("w", torch.zeros(1))])
    assert [n for n, _ in legacy.loaded[0]] == ["w"]
    engine.llm = types.SimpleNamespace()
    with pytest.raises(EngineError, match="neither"):
        engine.load_weights([("w", torch.zeros(1))])
    engine.llm = llm


def test_sync_from_plain_model(engine, smol_tokenizer):
    from tests.conftest import make_tiny_model

    model = make_tiny_model(smol_tokenizer)
    count = engine.sync_from(model)
    sent = dict(FakeLLM.instances[-1].workers[0].loaded[0])
    assert count == len(sent) == len(list(model.named_parameters()))
    assert torch.equal(sent["model.embed_tokens.weight"], model.model.embed_tokens.weight)


def test_sync_from_peft_model_sends_merged_base_names(engine, smol_tokenizer):
    from peft import LoraConfig, get_peft_model

    from tests.conftest import make_tiny_model

    base = make_tiny_model(smol_tokenizer)
    w0 = base.model.layers[0].self_attn.q_proj.weight.detach().clone()
    peft_model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj"]))
    layer = peft_model.base_model.model.model.layers[0].self_attn.q_proj
    torch.nn.init.ones_(layer.lora_B["default"].weight)  # make the adapter change the weights
    delta = (layer.lora_B["default"].weight @ layer.lora_A["default"].weight) * (4 / 2)
    engine.sync_from(peft_model)
    sent = dict(FakeLLM.instances[-1].workers[0].loaded[0])
    assert "model.layers.0.self_attn.q_proj.weight" in sent
    assert not any("lora" in n or "base_model" in n or "base_layer" in n for n in sent)
    assert torch.allclose(sent["model.layers.0.self_attn.q_proj.weight"], w0 + delta, atol=1e-6)
    # the adapter is unmerged again afterwards
    assert torch.allclose(layer.base_layer.weight, w0, atol=1e-6)


def test_make_engine_builds_the_vllm_engine(vllm_module, smol_path):
    from rapo_echo.config import EngineConfig
    from rapo_echo.engines import make_engine
    from rapo_echo.engines.vllm_engine import VLLMEngine

    eng = make_engine(EngineConfig(engine="vllm", model=smol_path, dtype="bfloat16"), role="judge")
    assert isinstance(eng, VLLMEngine) and eng.name == "judge:vllm"
    assert FakeLLM.instances[-1].kwargs["dtype"] == "bfloat16"


def test_trainer_samples_with_vllm_and_syncs_weights_every_step(vllm_module, tiny_folder, tmp_path) -> None:
    """``rollout.engine: vllm``: rollouts come from the vLLM copy, the trainer recomputes old log-probs
    (vLLM's numerics differ from the training forward), and pushes the weights after every step."""
    import json

    from rapo_echo.algorithms.learner import Learner
    from rapo_echo.algorithms.run_config import load_config

    run = tmp_path / "run"
    cfg = load_config(
        overrides=[
            f"model.name={tiny_folder}",
            f"output={run}",
            "rollout.engine=vllm",
            "rollout.batch_size=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "rewards=[{name: length, args: {target: 2}}]",
            "train.max_steps=2",
            "logging.progress=false",
            "logging.tensorboard=false",
        ]
    )
    trainer = Learner(cfg)
    llm = FakeLLM.instances[-1]
    trainer.train()
    assert len(llm.calls) == 2 and all(s.n == 2 for _, s in llm.calls)  # one batched call per step
    assert [len(w.loaded) for w in llm.workers] == [2, 2]  # weights pushed after each step
    m = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert all(x["time/old_logprobs"] > 0 and "time/weight_sync" in x for x in m)
    rows = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert rows[0]["reply"].startswith("t")  # the fake engine's text, so rollouts came from it


def test_vllm_sampler_gap_is_logged(vllm_module, tiny_folder, tmp_path, monkeypatch) -> None:
    """The sampler-vs-trainer log-prob gap (``train/sampler_logprob_gap``) on the vLLM path: the mean
    and max of |vLLM's sampled log-prob - the training forward's| over the step's tokens, here the fake
    engine's log-probs against the tiny model's own (a stale or mis-synced vLLM copy shows as a gap)."""
    import json

    from rapo_echo.algorithms.grpo import GRPO
    from rapo_echo.algorithms.learner import Learner
    from rapo_echo.algorithms.run_config import load_config

    seen = []
    rollout = GRPO.rollout
    monkeypatch.setattr(
        GRPO, "rollout", lambda self, sc, step: seen.append(rollout(self, sc, step)) or seen[-1]
    )
    run = tmp_path / "run"
    cfg = load_config(
        overrides=[
            f"model.name={tiny_folder}",
            f"output={run}",
            "rollout.engine=vllm",
            "rollout.batch_size=2",
            "rollout.group_size=2",
            "rollout.max_new_tokens=4",
            "rewards=[{name: length, args: {target: 2}}]",
            "train.max_steps=1",
            "logging.progress=false",
            "logging.tensorboard=false",
        ]
    )
    trainer = Learner(cfg)
    trainer.train()
    items = seen[0].items
    # the gap is measured in the step's training forward, on the starting weights: score the same
    # tokens with a fresh copy of them
    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.models import load_model

    start, _ = load_model(str(tiny_folder), dtype="float32", device="cpu")
    own = HFEngine(start, trainer.policy.tokenizer).score_ids(
        [it.prompt_ids for it in items], [it.completion_ids for it in items]
    )
    diffs = [abs(a - b) for it, row in zip(items, own) for a, b in zip(it.sampler_logprobs, row)]
    m = json.loads((run / "metrics.jsonl").read_text().splitlines()[0])
    assert m["train/sampler_logprob_gap/mean"] == pytest.approx(sum(diffs) / len(diffs), abs=1e-4)
    assert m["train/sampler_logprob_gap/max"] == pytest.approx(max(diffs), abs=1e-4)

"""The ``hf`` engine: batched generation, log-probs that agree with a forward pass, stop strings,
scoring, label probabilities, streaming (tiny random model unless marked integration)."""

from __future__ import annotations

import pytest
import torch

from rapo_echo.engines.hf import HFEngine, sample_next
from rapo_echo.models import tiny_config
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


# ---------------------------------------------------------------------------- static / compiled decode
# The compiled loop runs through torch.compile with the aot_eager backend here (dynamo tracing and
# AOT functionalisation of the real step; inductor's C++ code generation takes ~50 s per shape on
# this CPU and is what runs by default on a GPU).
LOOPS = ["static", "compiled"]


def loop_engine(model, tokenizer, loop: str, max_batch_size: int = 8, **kw) -> HFEngine:
    return HFEngine(
        model, tokenizer, max_batch_size=max_batch_size, decode_loop=loop, compile_backend="aot_eager", **kw
    )


@pytest.fixture(scope="module")
def tiny_model(smol_tokenizer):
    return make_tiny_model(smol_tokenizer)


def test_decode_loop_resolution() -> None:
    from rapo_echo.engines.static_decode import bucket_length, bucket_rows, resolve_decode

    assert resolve_decode("auto", "cpu") == "dynamic" and resolve_decode("auto", "cuda:0") == "compiled"
    assert resolve_decode("static", "cpu") == "static"
    with pytest.raises(ValueError, match="allowed"):
        resolve_decode("fast", "cpu")
    assert [bucket_rows(n) for n in (1, 8, 9, 33, 256)] == [8, 8, 16, 64, 256]
    assert [bucket_length(n) for n in (1, 128, 129)] == [128, 128, 256]


@pytest.mark.parametrize("loop", LOOPS)
def test_static_loops_equal_the_dynamic_loop(tiny_model, smol_tokenizer, loop: str) -> None:
    """Greedy replies, their log-probs and finish reasons are those of the dynamic loop, with EOS
    reached at different steps in different rows (an EOS id taken from the greedy output)."""
    dynamic = loop_engine(tiny_model, smol_tokenizer, "dynamic")
    fast = loop_engine(tiny_model, smol_tokenizer, loop)
    assert fast.decode_mode == loop
    p = SamplingParams(max_new_tokens=7, n=2, temperature=0)
    first = dynamic.generate(PROMPTS, p)
    eos = first[1][0].token_ids[3]  # row 2 stops at step 4, the others may run to the end
    for e in (dynamic, fast):
        e.eos_ids = {*e.eos_ids, eos}
    a, b = dynamic.generate(PROMPTS, p), fast.generate(PROMPTS, p)
    assert [x.finish_reason for g in b for x in g] == [x.finish_reason for g in a for x in g]
    assert "stop" in [x.finish_reason for g in b for x in g]
    for ga, gb in zip(a, b):
        for x, y in zip(ga, gb):
            assert x.token_ids == y.token_ids and x.text == y.text
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-5)


@pytest.mark.parametrize("loop", LOOPS)
def test_static_loops_sample_logprobs_equal_scoring(tiny_model, smol_tokenizer, loop: str) -> None:
    """Sampled tokens' log-probs equal a teacher-forced forward of the same tokens (fp32)."""
    engine = loop_engine(tiny_model, smol_tokenizer, loop)
    gens = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=3, seed=1))
    flat = [g for group in gens for g in group]
    scored = engine.score_ids([g.prompt_ids for g in flat], [g.token_ids for g in flat])
    for g, s in zip(flat, scored):
        assert len(g.logprobs or []) == len(g.token_ids) == len(s)
        assert max(abs(a - b) for a, b in zip(g.logprobs or [], s)) < 1e-4
    again = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=3, seed=1))
    assert [[g.token_ids for g in x] for x in again] == [[g.token_ids for g in x] for x in gens]


def test_static_loop_stop_string(tiny_model, smol_tokenizer) -> None:
    """A stop string ends a row at the token that completes it, as in the dynamic loop."""
    dynamic = loop_engine(tiny_model, smol_tokenizer, "dynamic")
    fast = loop_engine(tiny_model, smol_tokenizer, "static")
    p = SamplingParams(max_new_tokens=8, temperature=0)
    full = dynamic.generate(PROMPTS[:1], p)[0][0]
    stop = dynamic.decode(full.token_ids[2:4]).strip() or dynamic.decode(full.token_ids[2:4])
    assert stop and stop in full.text
    p = SamplingParams(max_new_tokens=8, temperature=0, stop=(stop,))
    a, b = dynamic.generate(PROMPTS[:1], p)[0][0], fast.generate(PROMPTS[:1], p)[0][0]
    assert b.token_ids == a.token_ids and b.text == a.text and b.finish_reason == a.finish_reason == "stop"
    assert stop not in b.text and len(b.token_ids) < len(full.token_ids)


def test_static_buffers_are_allocated_once_and_reused(tiny_model, smol_tokenizer) -> None:
    engine = loop_engine(tiny_model, smol_tokenizer, "static", max_batch_size=64)
    ids = [engine.encode(p) for p in PROMPTS]
    engine.warmup(max(len(i) for i in ids), rows=4, max_new_tokens=5)
    pool = engine._static._pool
    assert len(pool) == 1
    (buf,) = pool.values()
    pointer = buf.cache.layers[0].keys.data_ptr()
    for seed in (1, 2):
        engine.generate_ids(ids, SamplingParams(max_new_tokens=5, n=2, seed=seed))
    assert list(pool.values()) == [buf] and buf.cache.layers[0].keys.data_ptr() == pointer
    short = SamplingParams(max_new_tokens=2, n=2, temperature=0)
    engine.generate_ids(ids * 5, short)  # 20 rows: the 32-row bucket
    engine.generate_ids(ids * 9, short)  # 36 rows: the 64-row bucket
    assert len(pool) == 2 and buf not in pool.values()  # the oldest shape was let go


def test_pinned_shape_serves_every_fitting_call(tiny_model, smol_tokenizer) -> None:
    """A pinned shape (rows x length) is the one buffer set for calls of more than half its rows and at
    most its length; smaller or longer calls use the buckets; results equal the dynamic loop."""
    from rapo_echo.engines.static_decode import StaticDecoder

    engine = loop_engine(tiny_model, smol_tokenizer, "static", max_batch_size=64)
    dynamic = loop_engine(tiny_model, smol_tokenizer, "dynamic", max_batch_size=64)
    ids = [engine.encode(p) for p in PROMPTS]
    assert engine.pin_decode_shape(rows=6, length=100)  # the warm-up already decoded on it
    static = engine._static
    assert isinstance(static, StaticDecoder) and static.pinned == (6, 128)
    (buf,) = static._pinned_buffers.values()
    assert static.shapes == {(6, 128): 1} and not static._pool
    greedy = SamplingParams(max_new_tokens=5, n=2, temperature=0)
    for rows in (ids, ids + ids[:1]):  # 4 and 6 rows: the pinned buffers, padded
        a, b = engine.generate_ids(rows, greedy), dynamic.generate_ids(rows, greedy)
        assert [[g.token_ids for g in x] for x in a] == [[g.token_ids for g in x] for x in b]
        for x, y in zip(a, b):
            assert x[0].logprobs == pytest.approx(y[0].logprobs, abs=1e-5)
    assert static.shapes == {(6, 128): 3} and list(static._pinned_buffers.values()) == [buf]
    engine.generate_ids(ids[:1], greedy)  # 2 rows, not more than half: a bucket
    engine.generate_ids(ids, SamplingParams(max_new_tokens=100, n=2, temperature=0))  # too long
    assert static.shapes[(8, 128)] == 1 and any(length > 128 for _, length in static.shapes)
    assert list(static._pinned_buffers.values()) == [buf]  # never evicted by the bucket pool
    with pytest.raises(ValueError, match="rows and length"):
        static.pin(0, 10)


def test_dynamic_loop_pins_nothing(tiny_model, smol_tokenizer) -> None:
    engine = loop_engine(tiny_model, smol_tokenizer, "dynamic")
    assert engine.pin_decode_shape(rows=4, length=64) is False and engine._static is None


def test_compiled_rollouts_compile_once_after_the_pin(tiny_model, smol_tokenizer) -> None:
    """C2: after the pinned warm-up, rollouts of other prompt widths and fewer rows compile nothing new."""
    from torch._dynamo.utils import counters

    engine = loop_engine(tiny_model, smol_tokenizer, "compiled", max_batch_size=64)
    torch._dynamo.reset()
    engine.pin_decode_shape(rows=12, length=300)
    graphs = counters["stats"]["unique_graphs"]
    assert graphs >= 1
    ids = [engine.encode(p) for p in PROMPTS]
    # 8 and 12 rows of short prompts: buckets (8, 128) and (16, 128) without the pin, (12, 384) with it
    engine.generate_ids(ids, SamplingParams(max_new_tokens=4, n=4, seed=1))
    engine.generate_ids([*ids, ids[1]], SamplingParams(max_new_tokens=6, n=4, seed=2))
    assert counters["stats"]["unique_graphs"] == graphs
    assert engine._static.shapes == {(12, 384): 3}


def test_static_decode_needs_transformers_5_4() -> None:
    from rapo_echo.engines.static_decode import transformers_supports_static_decode

    assert transformers_supports_static_decode()  # the installed one (pyproject's floor is 5.4)
    assert transformers_supports_static_decode("5.4.0") and transformers_supports_static_decode("5.23.1")
    assert transformers_supports_static_decode("6.0.0.dev0")
    assert not transformers_supports_static_decode("5.3.0")
    assert not transformers_supports_static_decode("4.57.1")


def test_old_transformers_falls_back_to_the_dynamic_loop(
    tiny_model, smol_tokenizer, monkeypatch, caplog
) -> None:
    import transformers

    monkeypatch.setattr(transformers, "__version__", "5.3.0")
    engine = loop_engine(tiny_model, smol_tokenizer, "static")
    with caplog.at_level("WARNING"):
        assert engine.decode_mode == "dynamic"
    assert "older than 5.4" in caplog.text and "transformers>=5.4" in caplog.text


def test_sliding_window_models_keep_the_dynamic_loop(smol_tokenizer) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    config = tiny_config(smol_tokenizer, layers=1, hidden=32, config_class=MistralConfig, sliding_window=4)
    engine = HFEngine(MistralForCausalLM(config).eval(), smol_tokenizer, decode_loop="compiled")
    assert engine.decode_mode == "dynamic"
    assert engine.generate(PROMPTS[:1], SamplingParams(max_new_tokens=3, temperature=0))[0][0].token_ids


@pytest.mark.parametrize("loop", ["dynamic", *LOOPS])
def test_bf16_sampling_logprobs_against_the_training_forward(smol_tokenizer, loop: str) -> None:
    """In bfloat16 the sampler's log-probs (cached decode) and the training forward (TokenScorer, shared
    prompt layout) round differently; every decode loop stays within the same small gap. The trainer
    therefore takes bf16 old log-probs from the training forward and logs this gap
    (train/sampler_logprob_gap); in float32 they agree to 1e-4 (tests above)."""
    from rapo_echo.policy import TokenScorer, collate

    model = make_tiny_model(smol_tokenizer).to(torch.bfloat16)
    engine = loop_engine(model, smol_tokenizer, loop)
    gens = engine.generate(PROMPTS, SamplingParams(max_new_tokens=6, n=2, seed=3))
    flat = [g for group in gens for g in group]
    batch = collate([g.prompt_ids for g in flat], [g.token_ids for g in flat], engine.pad_id)
    with torch.no_grad():
        train = batch.rows(TokenScorer(model)(batch.inputs)[0])
    gaps = [abs(a - b) for g, t in zip(flat, train) for a, b in zip(g.logprobs or [], t)]
    assert len(gaps) == sum(len(g.token_ids) for g in flat)
    assert sum(gaps) / len(gaps) < 0.05 and max(gaps) < 0.25

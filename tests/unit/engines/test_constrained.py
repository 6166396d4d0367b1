"""Grammar-constrained decoding on the ``hf`` engine (llguidance): mask unpacking by hand, the masked draw,
the per-row grammar state, and generation under each answer format in every decode loop. A random tiny
model is the harshest test of a grammar: nothing but the mask keeps its text in shape."""

from __future__ import annotations

import pytest
import torch

from rapo_echo.engines.base import format_enforcement
from rapo_echo.engines.constrained import GrammarCache, TokenConstraint, unpack_bitmask
from rapo_echo.engines.hf import HFEngine, sample_next
from rapo_echo.engines.shared import FrozenBaseEngine
from rapo_echo.models import tiny_config
from rapo_echo.structured import AnswerFormat, object_schema
from rapo_echo.types import SamplingParams, msg
from tests.conftest import make_tiny_model

PROMPTS = [
    [msg("user", "Rate the reply from 0 to 10 and say why.")],
    [msg("system", "Answer briefly."), msg("user", "Which reply is kinder, A or B?")],
]
JSON_SCHEMA = object_schema(
    {"score": {"type": "integer", "minimum": 0, "maximum": 10}, "why": {"type": "string", "maxLength": 40}}
)
FORMATS = {
    "json": AnswerFormat.json_schema(JSON_SCHEMA),
    "choice": AnswerFormat.choice(["A", "B", "tie"]),
    "integer": AnswerFormat.integer(1, 7),
    "regex": AnswerFormat.regex(r"(yes|no): [a-z]{1,6}"),
}
# tokens enough for every answer of the format to finish (json: a string of 40 characters may take 40)
BUDGET = {"json": 64, "choice": 4, "integer": 3, "regex": 12}
LOOPS = ["dynamic", "static", "compiled"]


@pytest.fixture(scope="module")
def tiny_model(smol_tokenizer):
    return make_tiny_model(smol_tokenizer)


def engine_for(model, tokenizer, loop: str = "dynamic", **kw) -> HFEngine:
    return HFEngine(model, tokenizer, max_batch_size=16, decode_loop=loop, compile_backend="aot_eager", **kw)


# ---------------------------------------------------------------- the mask, by hand
def test_unpack_bitmask_by_hand() -> None:
    words = torch.tensor(
        [
            [0b101, 0],  # tokens 0 and 2
            [-(2**31), 1],  # bit 31 of word 0 (the sign bit) and bit 0 of word 1: tokens 31 and 32
            [-1, -1],  # everything, cut to the vocabulary
        ],
        dtype=torch.int32,
    )
    mask = unpack_bitmask(words, 40)
    assert mask.dtype == torch.bool and mask.shape == (3, 40)
    assert mask[0].nonzero().flatten().tolist() == [0, 2]
    assert mask[1].nonzero().flatten().tolist() == [31, 32]
    assert mask[2].all()
    word = sum(1 << b for b in (3, 7, 8, 30))
    assert unpack_bitmask(torch.tensor([[word]], dtype=torch.int32), 32)[0].nonzero().flatten().tolist() == [
        3,
        7,
        8,
        30,
    ]


def test_masked_draw_greedy_sampled_and_untruncated_logprobs() -> None:
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0], [0.0, 5.0, 1.0, 2.0]])
    allowed = torch.tensor([[False, True, True, False], [True, False, False, False]])
    full = torch.log_softmax(logits, dim=-1)
    tok, lp = sample_next(logits, SamplingParams(temperature=0), None, allowed)
    assert tok.tolist() == [1, 0]  # the most likely allowed token, not the most likely one
    assert lp.tolist() == pytest.approx([full[0, 1].item(), full[1, 0].item()], abs=1e-6)
    g = torch.Generator().manual_seed(0)
    scaled = torch.log_softmax(logits / 0.7, dim=-1)
    seen: set[int] = set()
    for _ in range(100):
        tok, lp = sample_next(logits, SamplingParams(temperature=0.7, top_k=3, top_p=0.9), g, allowed)
        assert tok[1].item() == 0
        seen.add(tok[0].item())
        expected = [scaled[r, t].item() for r, t in enumerate(tok.tolist())]
        assert lp.tolist() == pytest.approx(expected, abs=1e-5)
    assert seen <= {1, 2}
    nothing = torch.zeros_like(allowed)  # never given by a constraint; drawn unrestricted, no crash
    assert sample_next(logits, SamplingParams(), g, nothing)[0].shape == (2,)


def test_all_allowed_mask_draws_exactly_as_no_mask() -> None:
    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(1))
    everything = torch.ones(6, 50, dtype=torch.bool)
    for params in (SamplingParams(temperature=0), SamplingParams(), SamplingParams(top_k=5, top_p=0.8)):
        a = sample_next(logits, params, torch.Generator().manual_seed(3))
        b = sample_next(logits, params, torch.Generator().manual_seed(3), everything)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


# ---------------------------------------------------------------- the grammar state per row
def test_constraint_rows_eos_only_when_finished_complete_or_broken(smol_tokenizer) -> None:
    vocab = len(smol_tokenizer) + 37  # padding rows of an output layer wider than the tokenizer
    cache = GrammarCache(smol_tokenizer, [smol_tokenizer.eos_token_id])
    eos = smol_tokenizer.eos_token_id
    c = cache.constraint(FORMATS["choice"], 4, vocab)
    assert isinstance(c, TokenConstraint)
    first = c.allowed(range(4))
    assert first.shape == (4, vocab) and not first[:, len(smol_tokenizer) :].any()
    assert not first[:, eos].any()  # an empty answer is not an answer
    a = smol_tokenizer("A", add_special_tokens=False)["input_ids"]
    t = smol_tokenizer("t", add_special_tokens=False)["input_ids"]
    space = smol_tokenizer(" ", add_special_tokens=False)["input_ids"]
    assert len(a) == len(t) == len(space) == 1
    c.advance([0, 1, 2, 3], [a[0], t[0], space[0], eos])  # complete, running, broken, finished
    mask = c.allowed([0, 1, 2, 3])
    for r in (0, 2, 3):
        assert mask[r].nonzero().flatten().tolist() == [eos]
    assert mask[1].sum() >= 1 and not mask[1, eos]  # "t" must go on to "tie"
    assert c.matchers[2].is_error()
    assert c.allowed([1])[0].equal(mask[1])  # rows are asked for by index (dropped rows leave the batch)
    assert cache.mask_steps == 3 and cache.mask_seconds > 0


def test_grammar_cache_compiles_each_format_once(smol_tokenizer) -> None:
    cache = GrammarCache(smol_tokenizer, [smol_tokenizer.eos_token_id])
    fmt = AnswerFormat.json_schema(JSON_SCHEMA)
    assert cache.template(fmt, 49152) is cache.template(AnswerFormat.json_schema(JSON_SCHEMA), 49152)
    assert cache.ll_tokenizer(49152) is cache.ll_tokenizer(49152)


def test_engines_declare_grammar_enforcement(tiny_model, smol_tokenizer) -> None:
    assert format_enforcement(engine_for(tiny_model, smol_tokenizer)) == "grammar"
    assert FrozenBaseEngine.structured_output == "grammar"


# ---------------------------------------------------------------- generation under every format
def check_answers(gens, fmt: AnswerFormat, budget: int) -> int:
    """Every finished answer conforms; returns how many finished."""
    finished = 0
    for g in (x for group in gens for x in group):
        assert len(g.token_ids) <= budget and len(g.logprobs or []) == len(g.token_ids)
        if g.finish_reason == "stop":
            finished += 1
            assert fmt.problem(g.text) is None, (g.text, fmt.problem(g.text))
    return finished


CASES = [(kind, loop) for kind in FORMATS for loop in LOOPS if loop != "compiled" or kind == "json"]


@pytest.mark.parametrize(("kind", "loop"), CASES)
def test_every_finished_answer_conforms(tiny_model, smol_tokenizer, kind: str, loop: str) -> None:
    """Greedy and sampled (n = 2 per prompt, 4 rows batched) over 5 seeds; every row finishes within
    its budget except, for json, a string the random model may not close in time. The compiled loop
    (aot_eager here) samples through the same callback as the static one: json covers it."""
    engine = engine_for(tiny_model, smol_tokenizer, loop)
    fmt = FORMATS[kind]
    budget = BUDGET[kind]
    p = SamplingParams(max_new_tokens=budget, n=2, temperature=0, answer_format=fmt)
    greedy = engine.generate(PROMPTS, p)
    finished = check_answers(greedy, fmt, budget)
    total = 4
    for seed in range(5):
        p = SamplingParams(max_new_tokens=budget, n=2, temperature=1.0, seed=seed, answer_format=fmt)
        finished += check_answers(engine.generate(PROMPTS, p), fmt, budget)
        total += 4
    assert finished == total if kind != "json" else finished >= total // 2


def test_sampled_logprobs_are_the_untruncated_ones(tiny_model, smol_tokenizer) -> None:
    """The reported log-probs are of the temperature-1 distribution over the whole vocabulary, as a
    teacher-forced forward of the same tokens gives them, not of the grammar-renormalised one."""
    for loop in ("dynamic", "static"):
        engine = engine_for(tiny_model, smol_tokenizer, loop)
        p = SamplingParams(max_new_tokens=24, n=2, seed=5, answer_format=FORMATS["json"])
        flat = [g for group in engine.generate(PROMPTS, p) for g in group]
        scored = engine.score_ids([g.prompt_ids for g in flat], [g.token_ids for g in flat])
        for g, s in zip(flat, scored):
            assert max(abs(a - b) for a, b in zip(g.logprobs or [], s)) < 1e-4
            assert sum(g.logprobs or []) < -len(g.token_ids) * 1.0  # a random model: far from 1 each


def test_rows_finishing_at_different_steps(tiny_model, smol_tokenizer) -> None:
    """Answers of different lengths in one batch: the dynamic loop drops finished rows (the grammar state
    follows each row, not its line in the batch), the static loop keeps them; both conform."""
    fmt = AnswerFormat.integer(1, 300)  # one to three digits
    for loop in ("dynamic", "static"):
        engine = engine_for(tiny_model, smol_tokenizer, loop)
        lengths: set[int] = set()
        for seed in range(6):
            p = SamplingParams(max_new_tokens=5, n=4, seed=seed, answer_format=fmt)
            gens = engine.generate(PROMPTS, p)
            assert check_answers(gens, fmt, 5) == 8
            lengths |= {len(g.token_ids) for group in gens for g in group}
        assert len(lengths) > 1


def test_static_and_dynamic_loops_agree_under_a_grammar(tiny_model, smol_tokenizer) -> None:
    p = SamplingParams(max_new_tokens=12, n=2, temperature=0, answer_format=FORMATS["regex"])
    a = engine_for(tiny_model, smol_tokenizer, "dynamic").generate(PROMPTS, p)
    b = engine_for(tiny_model, smol_tokenizer, "static").generate(PROMPTS, p)
    assert [[g.token_ids for g in x] for x in a] == [[g.token_ids for g in x] for x in b]


def test_unconstrained_generation_unchanged(tiny_model, smol_tokenizer, monkeypatch) -> None:
    """Without a format no mask is made; a mask that allows everything draws exactly the same tokens."""
    engine = engine_for(tiny_model, smol_tokenizer)
    p = SamplingParams(max_new_tokens=6, n=2, seed=11)
    before = engine.generate(PROMPTS, p)
    assert engine._grammar is None

    class AllowAll:
        def __init__(self, rows: int, vocab: int) -> None:
            self.vocab = vocab

        def allowed(self, rows, device="cpu"):
            return torch.ones(len(rows), self.vocab, dtype=torch.bool)

        def advance(self, rows, tokens) -> None:
            pass

        def failure(self, row):  # a grammar that allows everything never gives up
            return None

    monkeypatch.setattr(engine, "_constraint", lambda params, rows, vocab: AllowAll(rows, vocab))
    after = engine.generate(PROMPTS, p)
    assert [[(g.token_ids, g.logprobs) for g in x] for x in after] == [
        [(g.token_ids, g.logprobs) for g in x] for x in before
    ]


def test_prefix_continuation_and_stream(tiny_model, smol_tokenizer) -> None:
    """A prompt that ends with an assistant message is continued under the format (the format applies to
    the text generated); a streamed reply is constrained too."""
    engine = engine_for(tiny_model, smol_tokenizer)
    fmt = FORMATS["choice"]
    prompt = [*PROMPTS[1], msg("assistant", "The kinder reply is")]
    for seed in range(4):
        g = engine.generate([prompt], SamplingParams(max_new_tokens=4, n=2, seed=seed, answer_format=fmt))
        assert check_answers(g, fmt, 4) == 2
    p = SamplingParams(max_new_tokens=64, seed=2, answer_format=FORMATS["json"])
    pieces = list(engine.stream_generation(engine.encode(PROMPTS[0]), p))
    final = pieces[-1]
    assert "".join(x for x in pieces if isinstance(x, str)) == final.text
    if final.finish_reason == "stop":
        assert FORMATS["json"].problem(final.text) is None
    else:
        assert final.text.startswith('{"score": ')


def test_padding_rows_of_a_wider_output_layer_never_drawn(smol_tokenizer) -> None:
    """A model whose logits are wider than the tokenizer (padded output rows) stays in the format and
    never draws a padding id, even one at the top of the distribution."""
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    real = len(smol_tokenizer)
    config = tiny_config(smol_tokenizer, layers=1, vocab_size=real + 64, tie_word_embeddings=False)
    engine = engine_for(LlamaForCausalLM(config).eval(), smol_tokenizer)
    fmt = FORMATS["integer"]
    gens = engine.generate(PROMPTS, SamplingParams(max_new_tokens=3, n=3, seed=0, answer_format=fmt))
    assert check_answers(gens, fmt, 3) == 6
    assert all(t < real for group in gens for g in group for t in g.token_ids)
    allowed = engine.grammar.constraint(fmt, 2, real + 64).allowed(range(2))
    assert not allowed[:, real:].any()
    logits = torch.zeros(2, real + 64)
    logits[:, real:] = 100.0
    tok, _ = sample_next(logits, SamplingParams(temperature=0), None, allowed)
    assert all(allowed[r, t] for r, t in enumerate(tok.tolist()))

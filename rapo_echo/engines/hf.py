"""``hf`` engine: batched generation with transformers models, returning token ids and log-probs.

Each distinct prompt is prefilled once and its KV cache shared by its ``n`` samples; the decode
loop is ours (no ``generate``) so that the sampled tokens' log-probs come out of the same logits
that were sampled from, and nothing wider than one row of vocabulary logits per sequence is kept.
Two decode loops (``decode_loop``): ``dynamic`` grows a dynamic KV cache and drops finished rows from the
batch (the CPU default); ``static`` / ``compiled`` decode on pre-allocated fixed-shape buffers,
``compiled`` through ``torch.compile`` -- CUDA graphs on a GPU, the GPU default
(:mod:`rapo_echo.engines.static_decode`). A call with an answer format is decoded under its grammar
in either loop: a token mask per step, applied when sampling, outside the compiled step
(:mod:`rapo_echo.engines.constrained`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from rapo_echo import progress
from rapo_echo.distributed import is_zero3_partitioned
from rapo_echo.engines.base import template_ids, truncate_at_stop
from rapo_echo.engines.constrained import GRAMMAR_FAILED, GrammarCache, TokenConstraint
from rapo_echo.engines.static_decode import StaticDecoder, resolve_decode, supports_static_cache
from rapo_echo.errors import ConfigError
from rapo_echo.progress import label
from rapo_echo.prompting import fit_conversation
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, Generation, SamplingParams

log = logging.getLogger(__name__)


def sample_next(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    allowed: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row; returns (tokens, their log-probs under the temperature-scaled,
    untruncated distribution). ``top_k``/``top_p`` and ``allowed`` (bool ``[rows, vocab]``, the tokens a
    grammar permits: :class:`~rapo_echo.engines.constrained.TokenConstraint`) only restrict which tokens
    can be drawn; ``top_k``/``top_p`` apply to the allowed tokens. Greedy decoding takes the most likely
    allowed token. A row with no allowed token is drawn unrestricted (a constraint never gives one)."""
    logits = logits.float()
    if allowed is not None:
        allowed = allowed | ~allowed.any(dim=-1, keepdim=True)
    if params.temperature == 0:
        logp = torch.log_softmax(logits, dim=-1)
        pick = logp if allowed is None else logp.masked_fill(~allowed, float("-inf"))
        tokens = pick.argmax(dim=-1)
        return tokens, logp.gather(1, tokens[:, None]).squeeze(1)
    logp = torch.log_softmax(logits / params.temperature, dim=-1)
    draw = logp if allowed is None else logp.masked_fill(~allowed, float("-inf"))
    if params.top_k and params.top_k < logp.shape[-1]:
        kth = torch.topk(draw, params.top_k, dim=-1).values[:, -1:]
        draw = draw.masked_fill(draw < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_lp, order = torch.sort(draw, descending=True, dim=-1)
        cum = sorted_lp.softmax(-1).cumsum(-1)
        drop_sorted = cum - sorted_lp.softmax(-1) >= params.top_p  # keep the smallest prefix reaching top_p
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted)
        draw = draw.masked_fill(drop, float("-inf"))
    tokens = torch.multinomial(torch.softmax(draw, dim=-1), 1, generator=generator).squeeze(1)
    return tokens, logp.gather(1, tokens[:, None]).squeeze(1)


MIN_SHARED_PREFIX = 32  # tokens; shorter common prefixes are not worth a separate prefill


def shared_prefixes(prompts: Sequence[Sequence[int]], min_len: int = MIN_SHARED_PREFIX) -> list[int]:
    """For each prompt, how many leading tokens it shares with the other prompts of its prefix group
    (0: none worth sharing). Prompts are grouped greedily in sorted order while their common prefix
    stays at least ``min_len`` long; every prompt keeps at least one token of its own."""
    order = sorted(range(len(prompts)), key=lambda i: list(prompts[i]))
    shared = [0] * len(prompts)
    start = 0
    while start < len(order):
        first = prompts[order[start]]
        end, common = start + 1, len(first)
        while end < len(order):
            other = prompts[order[end]]
            lcp = next(
                (k for k, (a, b) in enumerate(zip(first, other)) if a != b), min(len(first), len(other))
            )
            if min(lcp, common) < min_len:
                break
            common = min(common, lcp)
            end += 1
        if end - start > 1:
            members = order[start:end]
            keep = min(common, *(len(prompts[i]) - 1 for i in members))
            if keep >= min_len:
                for i in members:
                    shared[i] = keep
        start = end
    return shared


def left_pad(
    seqs: Sequence[Sequence[int]], pad: int, device: torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows left-padded with ``pad`` to the longest: (ids, attention mask), both long."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long, device=device)
    mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for i, s in enumerate(seqs):
        if len(s):
            ids[i, width - len(s) :] = torch.tensor(list(s), dtype=torch.long, device=device)
            mask[i, width - len(s) :] = 1
    return ids, mask


@dataclass
class _Row:
    prompt_index: int
    prompt_ids: list[int]
    tokens: list[int]
    logprobs: list[float]
    finish_reason: str | None = None
    error: str | None = None  # the answer format's grammar gave up (finish reason GRAMMAR_FAILED)


class _Ticks:
    """Moves a chunk's progress bar as its replies finish, and notes the decode step (``token 37/128``)."""

    def __init__(self, bar: progress.Task, max_new_tokens: int) -> None:
        self.bar, self.max_new_tokens, self.shown = bar, max_new_tokens, 0

    def __call__(self, step: int, finished: int) -> None:
        if finished > self.shown:
            self.bar.update(finished - self.shown)
            self.shown = finished
        self.bar.note(refresh=False, token=f"{step}/{self.max_new_tokens}")


def _mark_grammar_failures(rows: Sequence[_Row], constraint: TokenConstraint | None) -> None:
    """End each row whose grammar gave up with :data:`GRAMMAR_FAILED` and the reason, never a normal stop."""
    if constraint is None:
        return
    for r, row in enumerate(rows):
        why = constraint.failure(r)
        if why is not None:
            row.finish_reason, row.error = GRAMMAR_FAILED, why


def context_length(model: Any) -> int | None:
    """The model's context length (``config.max_position_embeddings``), None when unknown."""
    value = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return int(value) if isinstance(value, int) else None


class HFEngine:
    """A transformers causal LM (optionally a PEFT model) as a :class:`ChatEngine`.

    A call with :attr:`SamplingParams.answer_format` is decoded under that format's grammar (every row,
    both decode loops and streaming; :mod:`rapo_echo.engines.constrained`)."""

    supports_logprobs = True
    structured_output = "grammar"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str = "hf",
        max_batch_size: int = 64,
        autocast: torch.dtype | None = None,
        decode_loop: str = "auto",
        compile_backend: str = "inductor",
    ) -> None:
        """``autocast`` runs every forward in that lower precision (e.g. bfloat16 for a simulator or
        judge that shares fp32 policy weights: about 2-3x faster on CPUs with bf16 support).
        ``decode_loop``: ``auto`` (``compiled`` on CUDA, ``dynamic`` elsewhere), ``dynamic``, ``static``
        (static KV cache, eager) or ``compiled`` (static cache + ``torch.compile`` with
        ``compile_backend``; CUDA graphs on a GPU)."""
        self.model = model
        self.autocast = autocast
        self.tokenizer = tokenizer
        self.name = name
        self.max_batch_size = max_batch_size
        resolve_decode(decode_loop, "cpu")  # validates the name
        self.decode_loop = decode_loop
        self.compile_backend = compile_backend
        self._static: StaticDecoder | None = None
        self._sharded: bool | None = None  # ZeRO-3 weights (see _no_graphs), read at first use
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.eos_ids = self._eos_ids()
        self._grammar: GrammarCache | None = None
        self._warned_context = False
        self.prompt_cuts = 0  # prompts cut to fit the model's context (see _prompt)

    @classmethod
    def from_spec(cls, spec: str, *, dtype: str = "float32", device: str = "auto", **kw: Any) -> HFEngine:
        """Load a model spec (see :mod:`rapo_echo.models`) into an engine."""
        from rapo_echo.models import load_model

        trust = kw.pop("trust_remote_code", False)
        model, tok = load_model(spec, dtype=dtype, device=device, trust_remote_code=trust)
        return cls(model, tok, **kw)

    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        if self.tokenizer.eos_token_id is not None:
            ids.add(int(self.tokenizer.eos_token_id))
        gen_cfg = getattr(self.model, "generation_config", None)
        eos = getattr(gen_cfg, "eos_token_id", None) if gen_cfg is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif isinstance(eos, (list, tuple)):
            ids.update(int(e) for e in eos)
        return ids

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def grammar(self) -> GrammarCache:
        """The engine's compiled answer-format grammars (made on first use; rebuilt if ``eos_ids``
        changed); its ``mask_seconds`` / ``mask_steps`` count the time spent on token masks."""
        if self._grammar is None or self._grammar.eos_ids != sorted(self.eos_ids):
            self._grammar = GrammarCache(self.tokenizer, self.eos_ids)
        return self._grammar

    def check_format(self, fmt: AnswerFormat) -> None:
        """Compile ``fmt``'s grammar now (kept in :attr:`grammar`): ``ValueError`` with the compiler's
        message when it cannot be used (a server answers that request 400 before generating)."""
        head = self.model.get_output_embeddings() if hasattr(self.model, "get_output_embeddings") else None
        width = getattr(getattr(head, "weight", None), "shape", (None,))[0]
        self.grammar.template(fmt, int(width or self.model.config.vocab_size))

    def _constraint(self, params: SamplingParams, rows: int, vocab: int) -> TokenConstraint | None:
        """The grammar state of ``rows`` rows under ``params.answer_format`` (None without one)."""
        if params.answer_format is None:
            return None
        return self.grammar.constraint(params.answer_format, rows, vocab)

    @property
    def decode_mode(self) -> str:
        """The decode loop in use: ``decode_loop`` resolved for the device; ``dynamic`` for models whose
        cache is not a plain static one (sliding-window or hybrid attention); ``static`` instead of
        ``compiled`` over DeepSpeed ZeRO-3 weights (see :meth:`_no_graphs`)."""
        mode = resolve_decode(self.decode_loop, self.device)
        if mode == "compiled" and self._no_graphs():
            mode = "static"
        if mode != "dynamic" and self._static is None:
            if not supports_static_cache(self.model):
                return "dynamic"
            self._static = StaticDecoder(
                self.model, compiled=mode == "compiled", backend=self.compile_backend
            )
        return mode

    def _no_graphs(self) -> bool:
        """Whether the weights are DeepSpeed ZeRO-3 parameters (the policy's, or a role's that shares them;
        audit D3): they are gathered into new storage for every rollout, so CUDA graphs captured on one
        gather would replay stale addresses, and DeepSpeed's hooks break compiled graphs. Read once."""
        if self._sharded is None:
            self._sharded = is_zero3_partitioned(self.model)
            if self._sharded and self.decode_loop == "compiled":
                log.warning("%s: 'compiled' decode over ZeRO-3 weights runs 'static' (no graphs)", self.name)
        return self._sharded

    def warmup(self, prompt_tokens: int, rows: int, max_new_tokens: int) -> None:
        """Allocate (and, when compiled, compile) the decode buffers for ``rows`` sequences of
        ``prompt_tokens`` + ``max_new_tokens`` before the first timed generation; nothing for the
        dynamic loop."""
        if self.decode_mode == "dynamic" or rows < 1:
            return
        prompt = [self.pad_id] * max(1, prompt_tokens)
        params = SamplingParams(max_new_tokens=max(2, min(max_new_tokens, 3)), n=rows, temperature=1.0)
        own = torch.Generator(device=self.device).manual_seed(0)  # leaves the global RNG untouched
        self._decode_static([prompt], params, own, length=max(1, prompt_tokens) + max_new_tokens)

    def pin_decode_shape(self, rows: int, length: int) -> bool:
        """Fix the static decode's shape at ``rows`` x ``length`` (see
        :meth:`~rapo_echo.engines.static_decode.StaticDecoder.pin`) and allocate (and compile) it now;
        False, doing nothing, for the dynamic loop."""
        if self.decode_mode == "dynamic" or rows < 1:
            return False
        assert self._static is not None
        self._static.pin(rows, length)
        self.warmup(1, rows, max(1, length - 1))
        return True

    # ------------------------------------------------------------------ prompts
    def encode(self, prompt: Conversation) -> list[int]:
        """Token ids of a prompt through the tokenizer's chat template (ready for the reply)."""
        return template_ids(self.tokenizer, prompt)

    def _prompt(self, prompt: Conversation, new_tokens: int = 0) -> list[int]:
        """:meth:`encode`, fitted to the model's context less ``new_tokens`` with the trainer's prompt
        budget (:func:`~rapo_echo.prompting.fit_conversation`: oldest turns first, then the beginning
        of the last message; an assistant prefix to continue is kept whole); every cut is counted in
        ``prompt_cuts`` and the first one is logged. A simulator, judge or benchmark policy prompt built
        from long dialogues can exceed it."""
        ids = self.encode(prompt)
        limit = context_length(self.model)
        if limit is None or len(ids) + new_tokens <= limit:
            return ids
        budget = limit - new_tokens
        continues = bool(prompt) and prompt[-1]["role"] == "assistant"
        conv, prefix = (list(prompt[:-1]), list(prompt[-1:])) if continues else (list(prompt), [])
        fitted = None
        if budget > 0 and conv:
            try:
                fitted = fit_conversation(
                    conv, lambda c: self.encode([*c, *prefix]), budget, f"{self.name}: the model's context"
                )[1]
            except ConfigError:
                fitted = None
        if not self._warned_context:
            self._warned_context = True
            log.warning(
                "%s: a prompt of %d tokens (+%d to generate) exceeds the model's context of %d tokens; %s "
                "(further cases are counted in prompt_cuts, not reported)",
                self.name,
                len(ids),
                new_tokens,
                limit,
                "it is cut to fit: oldest turns first, then the beginning of the last message"
                if fitted is not None
                else "the system prompt alone does not fit, so its output will be poor or fail",
            )
        if fitted is None:
            return ids
        self.prompt_cuts += 1
        return fitted

    def decode(self, ids: Sequence[int]) -> str:
        """Reply text of completion ids, special tokens (EOS) removed."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ------------------------------------------------------------------ generation
    def generate(self, prompts: Sequence[Conversation], params: SamplingParams) -> list[list[Generation]]:
        """``params.n`` replies per prompt, batched, with ids and log-probs."""
        return self.generate_ids([self._prompt(p, params.max_new_tokens) for p in prompts], params)

    def generate_ids(
        self, prompt_ids: Sequence[Sequence[int]], params: SamplingParams
    ) -> list[list[Generation]]:
        """Like :meth:`generate` but from already tokenised prompts."""
        out: list[list[Generation]] = [[] for _ in prompt_ids]
        per_chunk = max(1, self.max_batch_size // params.n)
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        replies = len(prompt_ids) * params.n
        with progress.task(label(self.name, "generate"), total=replies, unit="reply") as bar:
            for start in range(0, len(prompt_ids), per_chunk):
                chunk = [list(p) for p in prompt_ids[start : start + per_chunk]]
                ticks = _Ticks(bar, params.max_new_tokens)
                rows = self._decode_batch(chunk, params, generator, ticks)
                for row in rows:
                    out[start + row.prompt_index].append(self._finish(row, params))
                ticks(params.max_new_tokens, len(rows))
        return out

    def _finish(self, row: _Row, params: SamplingParams) -> Generation:
        text = self.decode(row.tokens)
        if params.stop:
            text, _ = truncate_at_stop(text, params.stop)
        return Generation(
            text=text,
            token_ids=row.tokens,
            logprobs=row.logprobs,
            prompt_ids=row.prompt_ids,
            finish_reason=row.finish_reason or "length",
            error=row.error,
        )

    def _mode(self) -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        stack.enter_context(_EvalMode(self.model))
        if self.autocast is not None:
            stack.enter_context(torch.autocast(self.device.type, dtype=self.autocast))
        return stack

    def _decode_batch(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None,
        ticks: Callable[[int, int], None] | None = None,
    ) -> list[_Row]:
        """The rows of a chunk; ``ticks(step, finished)`` hears the decode step and how many rows have
        finished (every step; with the static loop, every few steps, where it reads that anyway)."""
        if self.decode_mode != "dynamic":
            return self._decode_static(prompts, params, generator, ticks=ticks)
        rows: list[_Row] = []
        for step, _ in enumerate(self._decode_steps(prompts, params, generator, rows), 1):
            if ticks is not None:
                ticks(step, sum(r.finish_reason is not None for r in rows))
        return rows

    def _prefill_rows(
        self, prompts: list[list[int]], n: int
    ) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_prefill`, then each prompt's cache, mask, positions and logits repeated ``n`` times
        (row ``i * n + j`` is sample ``j`` of prompt ``i``)."""
        cache, mask, positions, logits = self._prefill(prompts)
        if n > 1:
            cache.batch_repeat_interleave(n)
            logits = logits.repeat_interleave(n, 0)
            mask = mask.repeat_interleave(n, 0)
            positions = positions.repeat_interleave(n, 0)
        return cache, mask, positions, logits

    def _decode_static(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None,
        length: int | None = None,
        ticks: Callable[[int, int], None] | None = None,
    ) -> list[_Row]:
        """The decode loop on static buffers (:class:`StaticDecoder`); ``length`` only sizes them."""
        assert self._static is not None
        rows = [_Row(i, prompts[i], [], []) for i in range(len(prompts)) for _ in range(params.n)]
        window = max((len(s) for s in params.stop), default=0)
        stop_hit = None
        if window:
            stop_hit = lambda r, tokens: self._hit_stop(tokens, params.stop, window)  # noqa: E731
        with self._mode(), torch.inference_mode():
            cache, mask, positions, logits = self._prefill_rows(prompts, params.n)
            constraint = self._constraint(params, len(rows), logits.shape[-1])
            every = range(len(rows))

            def sample(lg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                if constraint is None:
                    return sample_next(lg, params, generator)
                tok, lp = sample_next(lg, params, generator, constraint.allowed(every, lg.device))
                constraint.advance(every, tok.tolist())
                return tok, lp

            tokens, logprobs, stopped = self._static.decode(
                cache,
                mask,
                positions,
                logits,
                max_new_tokens=params.max_new_tokens,
                sample=sample,
                eos_ids=self.eos_ids,
                pad_id=self.pad_id,
                stop_hit=stop_hit,
                length=length,
                on_check=ticks,
            )
        for row, ids, lps, stop in zip(rows, tokens, logprobs, stopped):
            row.tokens, row.logprobs = ids, lps
            row.finish_reason = "stop" if stop else None
        _mark_grammar_failures(rows, constraint)
        return rows

    def _decode_steps(
        self,
        prompts: list[list[int]],
        params: SamplingParams,
        generator: torch.Generator | None,
        rows: list[_Row],
    ) -> Iterator[list[int]]:
        """Run the decode loop; fills ``rows`` and yields, after each step, the indices of rows that
        received a token."""

        dev = self.device
        n = params.n
        rows.extend(_Row(i, prompts[i], [], []) for i in range(len(prompts)) for _ in range(n))
        stop_window = max((len(s) for s in params.stop), default=0)
        with self._mode(), torch.inference_mode():
            cache, mask, positions, logits = self._prefill_rows(prompts, n)
            constraint = self._constraint(params, len(rows), logits.shape[-1])
            position = positions[:, -1:]
            active = list(range(len(rows)))  # row index of each batch line
            for _step in range(params.max_new_tokens):
                allowed = None if constraint is None else constraint.allowed(active, logits.device)
                tokens, logps = sample_next(logits, params, generator, allowed)
                tok_list, lp_list = tokens.tolist(), logps.tolist()
                if constraint is not None:
                    constraint.advance(active, tok_list)
                keep: list[int] = []
                for line, r in enumerate(active):
                    row = rows[r]
                    row.tokens.append(tok_list[line])
                    row.logprobs.append(lp_list[line])
                    stopped = stop_window and self._hit_stop(row.tokens, params.stop, stop_window)
                    if tok_list[line] in self.eos_ids or stopped:
                        row.finish_reason = "stop"
                    else:
                        keep.append(line)
                yield list(active)
                if not keep or _step == params.max_new_tokens - 1:
                    break
                if len(keep) < len(active):
                    index = torch.tensor(keep, dtype=torch.long, device=dev)
                    cache.batch_select_indices(index)
                    mask, position, tokens = mask[index], position[index], tokens[index]
                    active = [active[line] for line in keep]
                mask = torch.cat([mask, mask.new_ones((mask.shape[0], 1))], dim=1)
                position = position + 1
                out = self.model(
                    input_ids=tokens[:, None],
                    attention_mask=mask,
                    position_ids=position,
                    past_key_values=cache,
                    use_cache=True,
                )
                logits = out.logits[:, -1]
            _mark_grammar_failures(rows, constraint)

    def _hit_stop(self, tokens: Sequence[int], stop: Sequence[str], window: int) -> bool:
        tail = self.tokenizer.decode(list(tokens[-(window + 4) :]), skip_special_tokens=True)
        return any(s and s in tail for s in stop)

    def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]:
        """Yield the text of one reply piece by piece (``params.n`` is ignored)."""
        for piece in self.stream_generation(self._prompt(prompt, params.max_new_tokens), params):
            if isinstance(piece, str):
                yield piece

    # ------------------------------------------------------------------ scoring
    def score_ids(
        self, prompt_ids: Sequence[Sequence[int]], completion_ids: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        """Log-probs of given completion tokens after given prompts (teacher forcing, temperature 1)."""
        out: list[list[float]] = []
        step = max(1, self.max_batch_size // 2)
        with self._mode(), torch.inference_mode():
            for start in range(0, len(prompt_ids), step):
                out.extend(
                    self._score_chunk(prompt_ids[start : start + step], completion_ids[start : start + step])
                )
        return out

    def _score_chunk(
        self, prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]]
    ) -> list[list[float]]:
        ids, mask = left_pad(
            [list(p) + list(c) for p, c in zip(prompts, completions)], self.pad_id, self.device
        )
        width = ids.shape[1]
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = max(len(c) for c in completions) + 1
        logits = self.model(
            input_ids=ids, attention_mask=mask, position_ids=positions, logits_to_keep=keep
        ).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        targets = ids[:, width - keep + 1 :]
        picked = logp.gather(2, targets[:, :, None]).squeeze(2)
        return [picked[i, keep - 1 - len(c) :].tolist() for i, c in enumerate(completions)]

    def score(self, prompts: Sequence[Conversation], continuations: Sequence[str]) -> list[Generation]:
        """Teacher-forced log-probs of each continuation text as the reply to its prompt."""
        p_ids = [self._prompt(p) for p in prompts]
        c_ids = [self.tokenizer(c, add_special_tokens=False)["input_ids"] for c in continuations]
        lps = self.score_ids(p_ids, c_ids)
        return [
            Generation(text=c, token_ids=ci, logprobs=lp, prompt_ids=pi)
            for c, ci, lp, pi in zip(continuations, c_ids, lps, p_ids)
        ]

    def choice_logprobs(
        self, prompts: Sequence[Conversation], options: Sequence[str]
    ) -> list[dict[str, float]]:
        """Log-prob of each option as the start of the reply. Single-token options need one forward
        pass per batch; longer ones are scored token by token."""
        encoded = [self.tokenizer(o, add_special_tokens=False)["input_ids"] for o in options]
        p_ids = [self._prompt(p, 1) for p in prompts]
        if all(len(e) == 1 for e in encoded):
            first = [e[0] for e in encoded]
            out: list[dict[str, float]] = []
            with self._mode(), torch.inference_mode():
                for start in range(0, len(p_ids), self.max_batch_size):
                    chunk = p_ids[start : start + self.max_batch_size]
                    lps = self._next_token_logprobs(chunk)
                    for row in lps:
                        out.append({o: float(row[t]) for o, t in zip(options, first)})
            return out
        flat_p = [p for p in p_ids for _ in options]
        flat_c = [e for _ in p_ids for e in encoded]
        scores = self.score_ids(flat_p, flat_c)
        k = len(options)
        return [{o: sum(scores[i * k + j]) for j, o in enumerate(options)} for i in range(len(p_ids))]

    def _next_token_logprobs(self, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
        logits = self._prefill([list(p) for p in prompts])[3]
        return torch.log_softmax(logits.float(), dim=-1)

    def _prefill(self, prompts: list[list[int]]) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Run the prompts through the model into a KV cache; returns (cache, attention mask, position
        ids, logits of the last position). Prompts that share a long prefix (e.g. a judge's or a
        simulator's prompts for the replies of one group) compute that prefix once: the prefixes are
        prefilled, each row then reads its prefix's cache and prefills only its own suffix."""
        from transformers import DynamicCache

        dev = self.device
        cache = DynamicCache(config=self.model.config)

        def run(ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            out = self.model(
                input_ids=ids,
                attention_mask=mask,
                position_ids=positions,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
            return out.logits[:, -1]

        shared = shared_prefixes(prompts)
        if not any(shared) or min(len(p) for p in prompts) < 2:
            ids, mask = left_pad(prompts, self.pad_id, dev)
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            return cache, mask, positions, run(ids, mask, positions)
        shared = [k or 1 for k in shared]  # a prompt sharing nothing: its first token is its own prefix
        index: dict[tuple[int, ...], int] = {}
        which = [index.setdefault(tuple(p[:k]), len(index)) for p, k in zip(prompts, shared)]
        p_ids, p_mask = left_pad([list(k) for k in index], self.pad_id, dev)
        run(p_ids, p_mask, (p_mask.cumsum(-1) - 1).clamp(min=0))
        rows = torch.tensor(which, dtype=torch.long, device=dev)
        cache.batch_select_indices(rows)  # every row reads its prefix's keys and values
        s_ids, s_mask = left_pad([p[k:] for p, k in zip(prompts, shared)], self.pad_id, dev)
        mask = torch.cat([p_mask[rows], s_mask], dim=1)
        positions = p_mask.sum(-1)[rows][:, None] + (s_mask.cumsum(-1) - 1).clamp(min=0)
        return cache, mask, positions, run(s_ids, mask, positions)

    # ------------------------------------------------------------------ serving helpers
    def encode_chat(
        self,
        messages: Conversation,
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
    ) -> list[int]:
        """Prompt ids with OpenAI/vLLM semantics: ``continue_final_message`` continues the last
        (assistant) message; otherwise ``add_generation_prompt`` opens a new assistant turn, even after
        an assistant message. The usual cases go through :meth:`encode`, so ids match it exactly."""
        last = messages[-1]["role"] if messages else None
        if continue_final_message:
            if last != "assistant":
                raise ValueError("continue_final_message needs a last message with role 'assistant'")
            return self.encode(messages)
        if add_generation_prompt and last != "assistant":
            return self.encode(messages)
        text = self.tokenizer.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def stream_generation(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> Iterator[str | Generation]:
        """Stream one reply from prompt ids: yields its text piece by piece, then, as the last item, the
        finished :class:`Generation` (token ids, log-probs, finish reason). ``params.n`` is ignored."""
        params = SamplingParams(**{**params.__dict__, "n": 1})
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        rows: list[_Row] = []
        sent = ""
        for _ in self._decode_steps([list(prompt_ids)], params, generator, rows):
            text = self.decode(rows[0].tokens)
            if params.stop:
                text, _ = truncate_at_stop(text, params.stop)
            if text.endswith("\ufffd"):
                continue  # an incomplete multi-byte character; wait for the next token
            if len(text) > len(sent) and text.startswith(sent):
                yield text[len(sent) :]
                sent = text
        gen = self._finish(rows[0], params)
        if len(gen.text) > len(sent) and gen.text.startswith(sent):
            yield gen.text[len(sent) :]
        yield gen

    def top_logprobs_ids(
        self,
        prompt_ids: Sequence[Sequence[int]],
        completion_ids: Sequence[Sequence[int]],
        k: int,
        temperature: float = 1.0,
    ) -> list[list[list[tuple[int, float]]]]:
        """The ``k`` most likely tokens ``(id, log-prob)`` at each completion position (teacher forcing),
        under ``log_softmax(logits / temperature)`` -- the distribution :func:`sample_next` reports
        log-probs from (temperature 0 counts as 1). One unpadded forward pass per sequence."""
        scale = temperature if temperature > 0 else 1.0
        out: list[list[list[tuple[int, float]]]] = []
        with self._mode(), torch.inference_mode():
            for p, c in zip(prompt_ids, completion_ids):
                if not c:
                    out.append([])
                    continue
                ids = torch.tensor([list(p) + list(c)[:-1]], dtype=torch.long, device=self.device)
                logits = self.model(input_ids=ids, logits_to_keep=len(c)).logits[0]
                logp = torch.log_softmax(logits.float() / scale, dim=-1)
                vals, idx = torch.topk(logp, min(k, logp.shape[-1]), dim=-1)
                out.append([list(zip(i, v)) for i, v in zip(idx.tolist(), vals.tolist())])
        return out


class _EvalMode(contextlib.AbstractContextManager):
    """Put a module in eval mode for the block and restore each submodule's own mode afterwards (a
    module may hold submodules in different modes; ``train()`` on the root would flip them all)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.modes: list[tuple[Any, bool]] = []

    def __enter__(self) -> None:
        modules = self.model.modules() if hasattr(self.model, "modules") else []
        self.modes = [(m, m.training) for m in modules]
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        for m, training in self.modes:
            m.training = training

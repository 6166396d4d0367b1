"""Grammar-constrained decoding for the ``hf`` engine, through llguidance.

An :class:`~rapo_echo.structured.AnswerFormat` becomes an llguidance grammar (JSON schema, or the
regular expression of a choice, integer or regex format), compiled once per engine and format into a
template matcher (:class:`GrammarCache`). A generation with a format gets a :class:`TokenConstraint`:
one copy of the template per row, which says before each step which tokens keep the row's text a
prefix of a valid answer (a boolean mask over the logits' width, passed to
:func:`~rapo_echo.engines.hf.sample_next`) and consumes the token drawn after it.

llguidance was chosen over xgrammar and outlines: a 3 MB wheel with no dependencies (xgrammar pulls
triton and a TVM runtime into a CPU install), token masks computed on the CPU in tens of
microseconds, JSON schema / regex / Lark grammars, and it is one of vLLM's structured-output backends.

JSON is generated compact and in one fixed layout (no free whitespace; ``", "`` between items and
``": "`` after keys, the layout of ``json.dumps``): a small model given free whitespace can spend its
whole token budget on blank lines. Properties come in the order the schema lists them.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from rapo_echo.structured import AnswerFormat

JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
PARALLEL_ROWS = 32  # rows from which masks are computed on llguidance's thread pool (one at a time below)
MAX_TEMPLATES = 64  # compiled formats kept per engine (about 0.75 MB each), least recently used dropped
GRAMMAR_FAILED = "grammar_error"  # the finish reason of a reply whose grammar gave up
_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def unpack_bitmask(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bool ``[rows, vocab]`` from llguidance's packed mask ``[rows, ceil(vocab/32)]`` of int32 words:
    token ``32 * w + b`` is allowed when bit ``b`` (least significant first) of word ``w`` is set. The
    words are read as little-endian bytes, each expanded through a 256 x 8 table (one gather)."""
    table = _BYTE_BITS.get(words.device)
    if table is None:
        table = ((torch.arange(256)[:, None] >> torch.arange(8)) & 1).bool().to(words.device)
        _BYTE_BITS[words.device] = table
    data = words.contiguous().view(torch.uint8).reshape(-1).int()
    return table.index_select(0, data).reshape(words.shape[0], -1)[:, :vocab]


def grammar_text(fmt: AnswerFormat) -> str:
    """The llguidance grammar of a format (tokenizer-independent text): json -> its schema; integer -> a
    bounded JSON integer (no sign on zero, no leading zeros); choice, regex -> the regular expression of
    :meth:`AnswerFormat.as_regex`."""
    from llguidance import LLMatcher

    if fmt.kind == "json":
        return LLMatcher.grammar_from_json_schema(fmt.schema, overrides=JSON_LAYOUT)
    if fmt.kind == "integer":  # a bounded JSON integer: exact, and smaller than the regex of every value
        bounds = {"type": "integer", "minimum": fmt.lo, "maximum": fmt.hi}
        return LLMatcher.grammar_from_json_schema(bounds, overrides=JSON_LAYOUT)
    return LLMatcher.grammar_from_regex(fmt.as_regex())


class GrammarCache:
    """One engine's llguidance state: its tokenizer (one per logits width, ~0.2-1 s to build) and the
    compiled template matchers of the last ``max_templates`` answer formats used (a server asked for ever
    new schemas keeps a bounded cache). ``mask_seconds`` / ``mask_steps`` add up the time spent computing
    token masks (the cost of constraining, beside the model's forward)."""

    def __init__(self, tokenizer: Any, eos_ids: Iterable[int], max_templates: int = MAX_TEMPLATES) -> None:
        if max_templates < 1:
            raise ValueError(f"GrammarCache: max_templates must be >= 1, got {max_templates}")
        self.tokenizer = tokenizer
        self.eos_ids = sorted(eos_ids)
        self.max_templates = max_templates
        self._ll: dict[tuple[int, tuple[int, ...]], Any] = {}
        self._templates: OrderedDict[tuple[AnswerFormat, int, tuple[int, ...]], Any] = OrderedDict()
        self.mask_seconds = 0.0
        self.mask_steps = 0

    def ll_tokenizer(self, vocab: int) -> Any:
        """The llguidance tokenizer for logits ``vocab`` wide (may exceed the tokenizer's own size:
        padding rows of the output layer, which are never allowed)."""
        key = (vocab, tuple(self.eos_ids))
        if key not in self._ll:
            import llguidance.hf

            self._ll[key] = llguidance.hf.from_tokenizer(
                self.tokenizer, n_vocab=vocab, eos_token=list(self.eos_ids)
            )
        return self._ll[key]

    def template(self, fmt: AnswerFormat, vocab: int) -> Any:
        """A fresh matcher of ``fmt`` for logits ``vocab`` wide (copy it before use); ``ValueError``
        when llguidance cannot compile the format."""
        key = (fmt, vocab, tuple(self.eos_ids))
        if key in self._templates:
            self._templates.move_to_end(key)
            return self._templates[key]
        from llguidance import LLMatcher

        try:
            matcher = LLMatcher(self.ll_tokenizer(vocab), grammar_text(fmt), log_level=0)
        except (ValueError, RecursionError, TypeError) as exc:  # a schema llguidance cannot even read
            raise ValueError(f"answer format {fmt.name!r}: llguidance cannot compile it: {exc}") from None
        if matcher.is_error():
            why = matcher.get_error()
            raise ValueError(f"answer format {fmt.name!r}: llguidance cannot compile it: {why}")
        self._templates[key] = matcher
        while len(self._templates) > self.max_templates:
            self._templates.popitem(last=False)
        return matcher

    def constraint(self, fmt: AnswerFormat, rows: int, vocab: int) -> TokenConstraint:
        """A :class:`TokenConstraint` of ``rows`` rows for logits ``vocab`` wide."""
        usable = min(vocab, len(self.tokenizer))
        return TokenConstraint(self.template(fmt, vocab), rows, vocab, usable, self.eos_ids, self)


class TokenConstraint:
    """The grammar state of every row of one batched generation (one llguidance matcher per row).

    :meth:`allowed` gives, for some rows, the tokens each may draw next; :meth:`advance` feeds the drawn
    tokens. A row that drew EOS is finished. A row whose grammar is complete (the matcher is stopped), in
    an error state, or with no allowed token may only draw EOS: it never crashes the draw. A row whose
    grammar gave up (an error, e.g. llguidance's "too many expressions", or no token left that continues an
    incomplete answer) is recorded: :meth:`failure` says why, and the engine ends that reply with the
    finish reason :data:`GRAMMAR_FAILED`, never a normal stop."""

    def __init__(
        self, template: Any, rows: int, vocab: int, usable: int, eos_ids: Sequence[int], stats: Any = None
    ) -> None:
        self.matchers = [template.deep_copy() for _ in range(rows)]
        self.vocab = vocab
        self.usable = usable  # ids from here up are padding rows of the output layer
        self.eos = [e for e in eos_ids if 0 <= e < vocab]
        self.finished = [False] * rows
        self.errors: dict[int, str] = {}
        self.stats = stats
        self._words = torch.zeros((rows, (vocab + 31) // 32), dtype=torch.int32)

    def allowed(self, rows: Sequence[int], device: torch.device | str = "cpu") -> torch.Tensor:
        """Bool ``[len(rows), vocab]`` on ``device``: the tokens each of ``rows`` may draw next."""
        start = time.perf_counter()
        words = self._words[: len(rows)]
        words.zero_()
        live = [
            (self.matchers[r], line)
            for line, r in enumerate(rows)
            if not (self.finished[r] or self.matchers[r].is_stopped() or self.matchers[r].is_error())
        ]
        size = words.shape[1] * 4
        if len(live) >= PARALLEL_ROWS:
            _executor().unsafe_compute_mask_ptr(live, words.data_ptr(), size, len(rows))
        else:
            for matcher, line in live:
                matcher.unsafe_compute_mask_ptr(words[line].data_ptr(), size)
        mask = unpack_bitmask(words.to(device), self.vocab)
        mask[:, self.usable :] = False
        only_eos = ~mask.any(dim=1)  # finished, complete, in error, or nothing left to draw
        for line, r in enumerate(rows):
            if bool(only_eos[line]) and not self.finished[r] and r not in self.errors:
                self._check(r)
        if bool(only_eos.any()):
            eos_row = torch.zeros(self.vocab, dtype=torch.bool, device=mask.device)
            eos_row[self.eos] = True
            mask[only_eos] = eos_row
        if self.stats is not None:
            self.stats.mask_seconds += time.perf_counter() - start
            self.stats.mask_steps += 1
        return mask

    def _check(self, row: int) -> None:
        """Record why ``row``'s grammar gave up, if it did (an error, or stuck before an accepting state)."""
        matcher = self.matchers[row]
        if matcher.is_error():
            self.errors[row] = str(matcher.get_error()).split("\n")[0][:300]
        elif not matcher.is_stopped() and not matcher.is_accepting():
            self.errors[row] = "no token continues the answer and it is not complete"

    def failure(self, row: int) -> str | None:
        """Why ``row``'s grammar gave up (None when it did not)."""
        if row not in self.errors and self.matchers[row].is_error():
            self._check(row)
        return self.errors.get(row)

    def advance(self, rows: Sequence[int], tokens: Sequence[int]) -> None:
        """Feed each of ``rows`` the token it drew (EOS finishes the row)."""
        for r, token in zip(rows, tokens):
            if self.finished[r]:
                continue
            if token in self.eos:
                self.finished[r] = True
            elif not self.matchers[r].is_stopped():
                self.matchers[r].consume_token(int(token))


_EXECUTOR: list[Any] = []  # llguidance's thread pool for batched masks, made on first use


def _executor() -> Any:
    if not _EXECUTOR:
        from llguidance import LLExecutor

        _EXECUTOR.append(LLExecutor())
    return _EXECUTOR[0]

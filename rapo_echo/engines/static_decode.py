"""The ``hf`` engine's decode loop on a static KV cache, optionally compiled (CUDA graphs on a GPU).

The prompts are prefilled as usual (shared prefixes once, see :meth:`HFEngine._prefill`) into a
dynamic cache, which is then copied into pre-allocated buffers of fixed shape: a transformers
``StaticCache`` of ``[rows, heads, length, dim]`` per layer, an attention mask ``[rows, length]``, the
next token ids and positions ``[rows, 1]``. Every decode step then runs the model on the same tensors
at the same addresses, which is what ``torch.compile(mode="reduce-overhead")`` needs to capture the
step once as a CUDA graph and replay it (one launch per step instead of hundreds of kernels, and no
allocation at all during generation). A *pinned* shape (:meth:`StaticDecoder.pin`: the trainer pins
its rollout chunk's rows and the longest prompt plus the reply) serves every call that fits it and
is more than half its rows, so a run's rollouts compile once; other calls round rows and length up to
buckets (powers of two from 8 rows; multiples of 128 tokens), and the buffers of the last bucketed
shapes used are kept for the next call. Finished rows stay in the batch (shapes are fixed); whether all
rows are done is read back every few steps only. Sampling and the sampled tokens' log-probs stay
outside the compiled step, in the same :func:`~rapo_echo.engines.hf.sample_next` as the dynamic loop.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from rapo_echo.engines.grouped_attention import use_grouped_attention

log = logging.getLogger(__name__)

DECODE_MODES = ("auto", "dynamic", "static", "compiled")
ROW_BUCKET_MIN = 8
LENGTH_BUCKET = 128
CHECK_EVERY = 8  # steps between reads of "are all rows finished" (each read waits for the device)
POOL_SIZE = 2  # buffer sets (shapes) kept per engine


def resolve_decode(mode: str, device: torch.device | str) -> str:
    """``auto``: ``compiled`` on CUDA, ``dynamic`` elsewhere (on CPU the static cache and the compiled
    step measured no faster than the dynamic loop, which drops finished rows; see docs/scaling.md)."""
    if mode not in DECODE_MODES:
        raise ValueError(f"decode mode {mode!r}; allowed: {', '.join(DECODE_MODES)}")
    if mode != "auto":
        return mode
    return "compiled" if torch.device(device).type == "cuda" else "dynamic"


def bucket_rows(rows: int) -> int:
    """Rows rounded up to a power of two (at least :data:`ROW_BUCKET_MIN`)."""
    out = ROW_BUCKET_MIN
    while out < rows:
        out *= 2
    return out


def bucket_length(length: int) -> int:
    """Cache length rounded up to a multiple of :data:`LENGTH_BUCKET`."""
    return -(-length // LENGTH_BUCKET) * LENGTH_BUCKET


# transformers 5.4 gave StaticLayer its ``cumulative_length`` (which :meth:`_Buffers.load` sets) and
# models ``position_ids``-driven cache writes; pyproject's floor is this version.
MIN_TRANSFORMERS = (5, 4)


def transformers_supports_static_decode(version: str | None = None) -> bool:
    """Whether the installed transformers (or ``version``) is at least :data:`MIN_TRANSFORMERS`."""
    import re

    if version is None:
        import transformers

        version = transformers.__version__
    numbers = [int(x) for x in re.findall(r"\d+", version)[:2]]
    return tuple(numbers) >= MIN_TRANSFORMERS


def supports_static_cache(model: Any) -> bool:
    """Whether every layer of the model's static cache is a plain full-attention layer (sliding-window
    and hybrid caches keep the dynamic loop); False, with a warning, under transformers before 5.4."""
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    if not transformers_supports_static_decode():
        import transformers

        log.warning(
            "transformers %s is older than %d.%d: its StaticLayer has no cumulative_length, so the static "
            "and compiled decode are off (dynamic loop); pip install 'transformers>=%d.%d,<6'",
            transformers.__version__,
            *MIN_TRANSFORMERS,
            *MIN_TRANSFORMERS,
        )
        return False

    try:
        cache = StaticCache(config=model.config, max_cache_len=1)
    except Exception:  # any model transformers cannot give a static cache for
        return False
    return all(type(layer) is StaticLayer for layer in cache.layers)


def _forward_step(
    model: Any, cache: Any, ids: torch.Tensor, mask: torch.Tensor, position: torch.Tensor
) -> torch.Tensor:
    """One decode step on the static buffers: logits of the next token, [rows, vocab]."""
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=position, past_key_values=cache, use_cache=True
    )
    return out.logits[:, -1]


@dataclass
class _Buffers:
    """The fixed-shape tensors of one (rows, length, dtype) bucket, reused from call to call."""

    cache: Any  # transformers.StaticCache
    mask: torch.Tensor  # [rows, length] long
    ids: torch.Tensor  # [rows, 1] long
    position: torch.Tensor  # [rows, 1] long

    def load(self, prefix: Any, mask: torch.Tensor, positions: torch.Tensor, pad_id: int) -> None:
        """Copy a prefilled dynamic cache (``rows`` <= bucket rows, width ``mask.shape[1]``) in."""
        rows, width = mask.shape
        for static, dynamic in zip(self.cache.layers, prefix.layers):
            static.keys.zero_()  # stale values of an earlier call must not meet a zero attention weight
            static.values.zero_()
            static.keys[:rows, :, :width].copy_(dynamic.keys)
            static.values[:rows, :, :width].copy_(dynamic.values)
            static.cumulative_length.fill_(width)
        self.mask.zero_()
        self.mask[:rows, :width].copy_(mask)
        self.mask[rows:, 0] = 1  # padding rows attend to one (zero) key, never to nothing
        self.ids.fill_(pad_id)
        self.position.zero_()
        self.position[:rows].copy_(positions[:, -1:])


class StaticDecoder:
    """Decodes on static buffers for one model; ``compiled`` runs the step through ``torch.compile``
    (``backend`` ``inductor`` by default; on CUDA in mode ``reduce-overhead``, i.e. CUDA graphs)."""

    def __init__(self, model: Any, *, compiled: bool, backend: str = "inductor") -> None:
        self.model = model
        self.compiled = compiled
        self.backend = backend
        self._pool: OrderedDict[tuple, _Buffers] = OrderedDict()
        self._pinned: tuple[int, int] | None = None  # (rows, length) of the pinned shape
        self._pinned_buffers: dict[tuple, _Buffers] = {}
        self.shapes: dict[tuple[int, int], int] = {}  # (rows, length) decoded -> calls (one compile each)
        self._step: Callable[..., torch.Tensor] = _forward_step
        use_grouped_attention(model)  # no repeated keys / values in a one-token step (grouped_attention.py)
        if compiled:
            mode = "reduce-overhead" if backend == "inductor" and self._device.type == "cuda" else None
            limit = getattr(torch._dynamo.config, "recompile_limit", None)
            if limit is not None and limit < 64:  # a few shape buckets per engine, several engines
                torch._dynamo.config.recompile_limit = 64
            self._step = torch.compile(_forward_step, backend=backend, mode=mode, dynamic=False)

    @property
    def _device(self) -> torch.device:
        return next(self.model.parameters()).device

    def pin(self, rows: int, length: int) -> None:
        """Fix the decode shape at ``rows`` x ``length`` (length rounded up to a multiple of
        :data:`LENGTH_BUCKET`): every later call with at most that many positions and more than half
        that many rows decodes on one buffer set of exactly this shape, kept for the engine's life."""
        if rows < 1 or length < 1:
            raise ValueError(f"a decode shape needs rows and length >= 1, got {rows} x {length}")
        self._pinned = (rows, bucket_length(length))
        self._pinned_buffers.clear()

    @property
    def pinned(self) -> tuple[int, int] | None:
        """The pinned (rows, length), or None."""
        return self._pinned

    def shape_for(self, rows: int, length: int) -> tuple[int, int, bool]:
        """(rows, length, pinned) of the buffers a call of ``rows`` x ``length`` decodes on."""
        if self._pinned is not None:
            pinned_rows, pinned_length = self._pinned
            if 2 * rows > pinned_rows and rows <= pinned_rows and length <= pinned_length:
                return pinned_rows, pinned_length, True
        return bucket_rows(rows), bucket_length(length), False

    def buffers(self, rows: int, length: int, like: torch.Tensor) -> _Buffers:
        """The buffers for ``rows`` x ``length`` (the pinned shape, else bucketed) in the dtype and
        device of ``like`` (a key tensor ``[rows, heads, width, dim]``); allocated once and kept."""
        from transformers import StaticCache

        rows, length, pinned = self.shape_for(rows, length)
        self.shapes[(rows, length)] = self.shapes.get((rows, length), 0) + 1
        key = (rows, length, like.dtype, like.device, like.shape[1], like.shape[3])
        store: dict[tuple, _Buffers] = self._pinned_buffers if pinned else self._pool
        if key in store:
            if not pinned:
                self._pool.move_to_end(key)
            return store[key]
        while not pinned and len(self._pool) >= POOL_SIZE:
            self._pool.popitem(last=False)
        cache = StaticCache(config=self.model.config, max_cache_len=length)
        cache.early_initialization(rows, like.shape[1], like.shape[3], like.dtype, like.device)
        long = {"dtype": torch.long, "device": like.device}
        buf = _Buffers(
            cache,
            torch.zeros((rows, length), **long),
            torch.zeros((rows, 1), **long),
            torch.zeros((rows, 1), **long),
        )
        for t in (buf.mask, buf.ids, buf.position):
            torch._dynamo.mark_static_address(t)
        store[key] = buf
        return buf

    def decode(
        self,
        prefix: Any,
        mask: torch.Tensor,
        positions: torch.Tensor,
        logits: torch.Tensor,
        *,
        max_new_tokens: int,
        sample: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
        eos_ids: set[int],
        pad_id: int,
        stop_hit: Callable[[int, list[int]], bool] | None = None,
        length: int | None = None,
        on_check: Callable[[int, int], None] | None = None,
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Sample up to ``max_new_tokens`` per row after a prefill (``prefix`` cache, its ``mask`` and
        ``positions``, the ``logits`` of its last position). Returns per row the token ids, their
        log-probs and whether it stopped (EOS, or ``stop_hit(row, tokens)``) rather than ran out.
        ``length`` sizes the buffers when it exceeds the prompt width + ``max_new_tokens`` (warm-up).
        ``on_check(step, finished)`` hears how many rows have finished where the loop reads it anyway."""
        rows, width = mask.shape
        dev = logits.device
        buf = self.buffers(rows, max(length or 0, width + max_new_tokens), prefix.layers[0].keys)
        buf.load(prefix, mask, positions, pad_id)
        tokens = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=dev)
        logps = torch.zeros((rows, max_new_tokens), dtype=torch.float32, device=dev)
        length = torch.full((rows,), max_new_tokens, dtype=torch.long, device=dev)
        done = torch.zeros(rows, dtype=torch.bool, device=dev)
        eos = torch.tensor(sorted(eos_ids) or [-1], dtype=torch.long, device=dev)
        host: list[list[int]] = [[] for _ in range(rows)]
        graphs = self.compiled and dev.type == "cuda"
        for t in range(max_new_tokens):
            tok, lp = sample(logits)
            tokens[:, t] = tok
            logps[:, t] = lp
            hit = torch.isin(tok, eos)
            if stop_hit is not None:
                flags, finished = hit.tolist(), done.tolist()
                for r, token in enumerate(tok.tolist()):
                    host[r].append(token)
                    if not flags[r] and not finished[r] and stop_hit(r, host[r]):
                        flags[r] = True
                hit = torch.tensor(flags, dtype=torch.bool, device=dev)
            length = torch.where(hit & ~done, t + 1, length)
            done = done | hit
            if t == max_new_tokens - 1:
                break
            if stop_hit is not None or t % CHECK_EVERY == CHECK_EVERY - 1:
                finished = int(done.sum())
                if on_check is not None:
                    on_check(t + 1, finished)
                if finished == rows:
                    break
            buf.ids[:rows, 0] = tok
            buf.mask[:, width + t] = 1
            buf.position.add_(1)
            if graphs:
                torch.compiler.cudagraph_mark_step_begin()
            logits = self._step(self.model, buf.cache, buf.ids, buf.mask, buf.position)[:rows]
        lengths, stopped = length.tolist(), done.tolist()
        tok_rows, lp_rows = tokens.tolist(), logps.tolist()
        return (
            [tok_rows[r][: lengths[r]] for r in range(rows)],
            [lp_rows[r][: lengths[r]] for r in range(rows)],
            stopped,
        )

"""The ``ChatEngine`` protocol every role (policy, simulator, judge) is backed by."""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from rapo_echo.errors import CapabilityError
from rapo_echo.types import FAILED, Conversation, Generation, SamplingParams


@runtime_checkable
class ChatEngine(Protocol):
    """A chat model behind one interface.

    A prompt is a conversation (list of messages). When its last message has role ``assistant``,
    the engine continues that message instead of starting a new one (used by judges that read a
    label right after a fixed prefix).

    * ``generate``: ``n`` replies per prompt, one batched call for the whole list.
    * ``choice_logprobs``: for each prompt, the log-probability of each option string as the
      reply's beginning. Raises :class:`CapabilityError` when the engine exposes no log-probs. A remote
      engine gives an empty row for a prompt whose request failed for good (the item is invalid).
    * ``stream``: yields text pieces of one reply as they are produced.

    An engine may say how it honours :attr:`SamplingParams.answer_format` in ``structured_output``
    (:func:`format_enforcement`): ``grammar`` (constrained decoding), ``server`` (the endpoint enforces it),
    ``validated`` (scripted replies are checked) or ``none`` (the format is only parsed afterwards).
    """

    name: str
    supports_logprobs: bool

    def generate(self, prompts: Sequence[Conversation], params: SamplingParams) -> list[list[Generation]]: ...

    def choice_logprobs(
        self, prompts: Sequence[Conversation], options: Sequence[str]
    ) -> list[dict[str, float]]: ...

    def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]: ...


def format_enforcement(engine: ChatEngine) -> str:
    """How ``engine`` honours answer formats (``grammar``, ``server``, ``validated`` or ``none``)."""
    value = getattr(engine, "structured_output", "none")
    return value if isinstance(value, str) else "none"


def generate_texts(engine: ChatEngine, prompts: Sequence[Conversation], params: SamplingParams) -> list[str]:
    """One reply text per prompt (``params.n`` must be 1); a remote request that failed for good gives ``""``
    (use :func:`reply_texts` where such an item must be told apart)."""
    return [t or "" for t in reply_texts(engine, prompts, params)]


def reply_texts(
    engine: ChatEngine, prompts: Sequence[Conversation], params: SamplingParams
) -> list[str | None]:
    """One reply text per prompt (``params.n`` must be 1), None where the engine's request failed for good
    (``finish_reason`` ``"error"``: the caller marks that item invalid)."""
    if params.n != 1:
        raise ValueError("generate_texts draws one reply per prompt; use engine.generate for n > 1")
    replies = engine.generate(prompts, params)
    return [None if gens[0].finish_reason == FAILED else gens[0].text for gens in replies]


def normalize_choices(logprobs: dict[str, float]) -> dict[str, float]:
    """Renormalise option log-probs into probabilities that sum to 1 over the options."""
    if not logprobs:
        return {}
    top = max(logprobs.values())
    if top == -math.inf:
        raise CapabilityError("every option has probability 0; cannot normalise")
    exp = {k: math.exp(v - top) for k, v in logprobs.items()}
    total = sum(exp.values())
    return {k: v / total for k, v in exp.items()}


def template_ids(tokenizer: Any, prompt: Conversation) -> list[int]:
    """Token ids of a prompt through the tokenizer's chat template, ready for the reply (an assistant
    last message is continued)."""
    conv, prefix = list(prompt), ""
    if prompt and prompt[-1]["role"] == "assistant":
        conv, prefix = conv[:-1], prompt[-1]["content"]
    text = tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=True)
    return tokenizer(text + prefix, add_special_tokens=False)["input_ids"]


def truncate_at_stop(text: str, stop: Sequence[str]) -> tuple[str, bool]:
    """Cut ``text`` before the earliest stop string; returns (text, whether a stop string was found)."""
    cut = len(text)
    for s in stop:
        i = text.find(s)
        if s and 0 <= i < cut:
            cut = i
    return text[:cut], cut < len(text)

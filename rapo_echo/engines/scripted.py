"""``scripted`` engine: deterministic replies from rules, lists or a function, for tests and demos.

Rules are ``(regex, reply)`` pairs tried in order against the prompt's text (all messages joined);
the first match wins. A reply may use ``{0}``, ``{1}``... for the match groups. Without a matching
rule the engine cycles through ``replies``, then falls back to ``default``. ``fn`` overrides all of
it. Every call is recorded in ``calls`` so tests can check how a stage batched its requests.

With ``structured=True`` (the default) a call that declares an answer format
(:attr:`~rapo_echo.types.SamplingParams.answer_format`) raises :class:`~rapo_echo.errors.ConfigError` (the
CLI's exit 2) when a scripted reply does not conform to it: a real engine with constrained decoding could
never produce that reply, so the script is wrong.
``structured=False`` plays a server without structured output: formats are ignored.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rapo_echo.engines.base import truncate_at_stop
from rapo_echo.errors import CapabilityError, ConfigError
from rapo_echo.types import Conversation, Generation, SamplingParams

ReplyFn = Callable[[Conversation], str]
ChoiceFn = Callable[[Conversation, Sequence[str]], dict[str, float]]


def prompt_text(prompt: Conversation) -> str:
    """All messages of a prompt as one string, ``role: content`` per line."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in prompt)


class ScriptedEngine:
    """A chat engine whose replies are fixed in advance."""

    name = "scripted"

    def __init__(
        self,
        replies: Sequence[str] | None = None,
        rules: Sequence[tuple[str, str]] | None = None,
        fn: ReplyFn | None = None,
        default: str = "I hear you.",
        choice_fn: ChoiceFn | None = None,
        structured: bool = True,
    ) -> None:
        self.replies = list(replies or [])
        self.rules = [(re.compile(p, re.S), r) for p, r in (rules or [])]
        self.fn = fn
        self.default = default
        self.choice_fn = choice_fn
        self.structured = structured
        self.calls: list[dict[str, Any]] = []
        self._next = 0

    @property
    def supports_logprobs(self) -> bool:
        return self.choice_fn is not None

    @classmethod
    def from_config(cls, script: dict[str, Any]) -> ScriptedEngine:
        """Build from a config mapping ``{replies: [...], rules: [[regex, reply], ...], default: str,
        structured: bool}`` (``structured: false`` plays a server without structured output)."""
        rules = [tuple(r) for r in script.get("rules", [])]
        return cls(
            replies=script.get("replies"),
            rules=rules,
            default=script.get("default", "I hear you."),
            structured=bool(script.get("structured", True)),
        )

    def reply(self, prompt: Conversation) -> str:
        """The scripted reply to one prompt (advances the reply cycle when it is used)."""
        if self.fn is not None:
            return self.fn(prompt)
        text = prompt_text(prompt)
        for pattern, reply in self.rules:
            m = pattern.search(text)
            if m:
                return reply.format(*m.groups())
        if self.replies:
            r = self.replies[self._next % len(self.replies)]
            self._next += 1
            return r
        return self.default

    def generate(self, prompts: Sequence[Conversation], params: SamplingParams) -> list[list[Generation]]:
        """``params.n`` scripted replies per prompt; truncated by word count to ``max_new_tokens``."""
        self.calls.append({"method": "generate", "prompts": [list(p) for p in prompts], "n": params.n})
        out = []
        for p in prompts:
            gens = []
            for _ in range(params.n):
                text, stopped = truncate_at_stop(self.reply(p), params.stop)
                self._check_format(text, params)
                words = text.split(" ")
                finish = "stop"
                if len(words) > params.max_new_tokens:
                    text, finish = " ".join(words[: params.max_new_tokens]), "length"
                gens.append(Generation(text=text, finish_reason="stop" if stopped else finish))
            out.append(gens)
        return out

    @property
    def structured_output(self) -> str:
        """How this engine honours answer formats: ``validated`` (scripted replies are checked) or
        ``none``."""
        return "validated" if self.structured else "none"

    def _check_format(self, text: str, params: SamplingParams) -> None:
        fmt = params.answer_format
        if fmt is None or not self.structured:
            return
        problem = fmt.problem(text)
        if problem is not None:
            raise ConfigError(
                f"scripted engine: the reply {text[:120]!r} does not conform to the answer format "
                f"{fmt.name!r} ({problem}); a real engine with constrained decoding could not produce it. "
                "Fix the script's replies or rules, or set `script.structured: false` "
                "(ScriptedEngine(structured=False)) to play a server without structured output"
            )

    def choice_logprobs(
        self, prompts: Sequence[Conversation], options: Sequence[str]
    ) -> list[dict[str, float]]:
        """Option log-probs from ``choice_fn``; raises :class:`CapabilityError` without one."""
        if self.choice_fn is None:
            raise CapabilityError("this scripted engine has no choice_fn, so it exposes no log-probs")
        self.calls.append(
            {"method": "choice_logprobs", "prompts": [list(p) for p in prompts], "options": list(options)}
        )
        return [self.choice_fn(p, options) for p in prompts]

    def stream(self, prompt: Conversation, params: SamplingParams) -> Iterator[str]:
        """Yield the scripted reply word by word."""
        text = self.generate([prompt], SamplingParams(**{**params.__dict__, "n": 1}))[0][0].text
        words = text.split(" ")
        for i, w in enumerate(words):
            yield w if i == 0 else " " + w

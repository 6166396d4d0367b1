"""The text markers of a tokenizer's chat template, read from the template itself.

Multi-turn rollouts append turns to a token sequence instead of re-rendering the conversation (``--algo
rlver``), and OpenRLHF hands reward functions and agents *text*. :class:`ChatMarkers` recovers what each
message looks like by rendering a probe conversation with sentinel contents, so that it can split a query
into prompt and reply, cut a raw reply at its end-of-turn marker, parse a rendered prompt back into
messages, and write the text that closes a policy turn and opens the next ones. It supports templates
that render every message as ``prefix(role) + content + suffix`` with one end-of-turn suffix for user and
assistant (ChatML, Llama 3, Gemma, Phi-3, SmolLM, Qwen, ...); :meth:`ChatMarkers.from_tokenizer` checks
the layout with a round trip and raises a clear error for any other template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rapo_echo.errors import ConfigError
from rapo_echo.types import Conversation, msg

_S, _U, _A, _V = "QQsysQQ", "QQusrQQ", "QQastQQ", "QQnxtQQ"


@dataclass(frozen=True)
class ChatMarkers:
    """Template text around messages. ``system_prefix`` includes anything the template puts first
    (e.g. a BOS token); ``head`` is what it puts before a conversation that has no system message
    (possibly a default system message); ``generation`` opens an assistant turn."""

    system_prefix: str
    system_suffix: str
    user_prefix: str
    assistant_prefix: str
    suffix: str
    generation: str
    head: str
    stop_texts: tuple[str, ...]

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ChatMarkers:
        """Read the markers from ``tokenizer.apply_chat_template``; a :class:`ConfigError` when the
        template does not follow the supported layout."""
        name = getattr(tokenizer, "name_or_path", "tokenizer")

        def render(conv: Conversation, gen: bool) -> str:
            return tokenizer.apply_chat_template(conv, tokenize=False, add_generation_prompt=gen)

        def fail(why: str) -> ConfigError:
            return ConfigError(
                f"the chat template of {name} is not supported for multi-turn token building ({why}); "
                "it needs templates that render each message as prefix + content + end-of-turn"
            )

        probe = [msg("system", _S), msg("user", _U), msg("assistant", _A), msg("user", _V)]
        full = render(probe, True)
        spans = []
        start = 0
        for sentinel in (_S, _U, _A, _V):
            i = full.find(sentinel, start)
            if i < 0:
                raise fail(f"the content {sentinel!r} does not appear verbatim in the rendered text")
            spans.append((i, i + len(sentinel)))
            start = i + len(sentinel)
        short = render(probe[:2], False)
        generation = render(probe[:2], True)
        if not generation.startswith(short) or len(generation) == len(short):
            raise fail("add_generation_prompt does not append an assistant opening")
        generation = generation[len(short) :]
        tail = full[spans[3][1] :]
        if not tail.endswith(generation):
            raise fail("the generation prompt is not at the end of the rendered text")
        suffix = tail[: len(tail) - len(generation)]
        gap_ua = full[spans[1][1] : spans[2][0]]
        gap_au = full[spans[2][1] : spans[3][0]]
        gap_su = full[spans[0][1] : spans[1][0]]
        if not suffix or not gap_ua.startswith(suffix) or not gap_au.startswith(suffix):
            raise fail("user and assistant messages do not share one end-of-turn marker")
        assistant_prefix = gap_ua[len(suffix) :]
        user_prefix = gap_au[len(suffix) :]
        if not gap_su.endswith(user_prefix):
            raise fail("the system message is not followed by the user prefix")
        alone = render([msg("user", _U)], False)
        j = alone.find(user_prefix + _U)
        if j < 0:
            raise fail("a lone user message is not rendered with the user prefix")
        stops = [suffix.strip()]
        for attr in ("eos_token", "pad_token"):
            token = getattr(tokenizer, attr, None)
            if isinstance(token, str) and token and token not in stops:
                stops.append(token)
        markers = cls(
            system_prefix=full[: spans[0][0]],
            system_suffix=gap_su[: len(gap_su) - len(user_prefix)],
            user_prefix=user_prefix,
            assistant_prefix=assistant_prefix,
            suffix=suffix,
            generation=generation,
            head=alone[:j],
            stop_texts=tuple(s for s in stops if s),
        )
        if markers.parse(full) != probe[:3] + [msg("user", _V)]:
            raise fail("parsing the rendered probe conversation does not give it back")
        return markers

    # ------------------------------------------------------------------ queries and replies
    def split_query(self, query: str, prompt: str | None = None) -> tuple[str, str]:
        """``(prompt text, raw reply)`` of an OpenRLHF query. With the prompt text given, the reply
        starts after as many assistant openings as the prompt holds (so a reply that itself writes an
        assistant marker cannot move the split); without it, after the last one."""
        if prompt is not None and query.startswith(prompt):
            return prompt, query[len(prompt) :]
        count = prompt.count(self.generation) if prompt is not None else None
        cut = -1
        if count is None:
            cut = query.rfind(self.generation)
        else:
            for _ in range(count):
                cut = query.find(self.generation, cut + 1)
                if cut < 0:
                    break
        if cut < 0:
            raise ValueError(f"the query holds no assistant opening {self.generation!r}: {query[-200:]!r}")
        end = cut + len(self.generation)
        return query[:end], query[end:]

    def clean_reply(self, raw: str) -> tuple[str, bool]:
        """The reply text before its first end-of-turn / EOS marker, and whether one was found (False:
        the reply was cut off by the length limit)."""
        cut = len(raw)
        for stop in self.stop_texts:
            i = raw.find(stop)
            if 0 <= i < cut:
                cut = i
        return raw[:cut].strip(), cut < len(raw)

    def closing(self, action_text: str) -> str:
        """What must follow a policy turn's raw text to close the assistant message: the whole
        end-of-turn suffix, or what follows its stop token when the text already ends with that token
        (vLLM keeps EOS in the text when special tokens are not skipped, OpenRLHF's default; a model
        samples the stop token itself, also where the template writes whitespace before it)."""
        if action_text.endswith(self.suffix):
            return ""
        for stop in sorted(self.stop_texts, key=len, reverse=True):
            if stop in self.suffix and action_text.endswith(stop):
                return self.suffix[self.suffix.index(stop) + len(stop) :]
        return self.suffix

    def feedback(self, action_text: str, user_message: str) -> str:
        """Text appended after a policy turn so that the next user message follows and a new assistant
        turn opens, exactly as the chat template renders the whole conversation."""
        return self.closing(action_text) + self.user_prefix + user_message + self.suffix + self.generation

    # ------------------------------------------------------------------ prompts
    def parse(self, text: str) -> Conversation:
        """Messages of a rendered conversation (a trailing assistant opening is dropped; a last message
        without end-of-turn is kept as it is; a default system message the template adds on its own
        is left out)."""
        if text.endswith(self.generation):
            text = text[: len(text) - len(self.generation)]
        out: Conversation = []
        pos = 0
        if self.head and text.startswith(self.head):
            pos = len(self.head)  # no system message (or the template's default one)
        elif text.startswith(self.system_prefix):
            end = text.find(self.system_suffix + self.user_prefix, len(self.system_prefix))
            if end < 0:
                return [msg("system", text[len(self.system_prefix) :])]
            out.append(msg("system", text[len(self.system_prefix) : end]))
            pos = end + len(self.system_suffix)
        while pos < len(text):
            role = self._role_at(text, pos)
            if role is None:
                raise ValueError(f"unexpected text at position {pos}: {text[pos : pos + 80]!r}")
            start = pos + len(self.user_prefix if role == "user" else self.assistant_prefix)
            end = text.find(self.suffix, start)
            if end < 0:
                out.append(msg(role, text[start:]))
                break
            out.append(msg(role, text[start:end]))
            pos = end + len(self.suffix)
        return out

    def _role_at(self, text: str, pos: int) -> str | None:
        for role, prefix in (("user", self.user_prefix), ("assistant", self.assistant_prefix)):
            if text.startswith(prefix, pos):
                return role
        return None


def render_prompt(tokenizer: Any, conversation: Sequence[dict]) -> str:
    """A conversation through the chat template, opened for the assistant's reply."""
    return tokenizer.apply_chat_template(list(conversation), tokenize=False, add_generation_prompt=True)

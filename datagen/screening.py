"""Which contexts enter the Critique-Rewrite data: an LLM judge keeps those that call for empathy, and a
safety constitution keeps out those a style-learning judge should not be trained on (Echo-N1 selects
scenes that need empathy and filters sensitive items with a safety constitution; neither the selection
prompt nor the constitution is published, so both are our own words).

Both are verdicts of the judges' machinery (:func:`rapo_echo.judges.verdict.decide`): label probabilities
where the engine has log-probs, else a JSON verdict under a declared format, retried, then invalid. The
safety verdict's labels are ``none`` and the constitution's rule names, so it says which rule applies.
A constitution can be replaced by a file of ``name: description`` lines (``--constitution``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rapo_echo.engines.base import ChatEngine
from rapo_echo.errors import ConfigError
from rapo_echo.judges.verdict import Verdict, answer_instruction, decide
from rapo_echo.llm.answers import wants_logprobs
from rapo_echo.llm.dialogue import render_dialogue
from rapo_echo.llm.fencing import Fence
from rapo_echo.types import Conversation, msg

EMPATHY_LABELS = ("yes", "no")
SAFE_LABEL = "none"
_RULE_NAME = re.compile(r"[a-z][a-z0-9_]{1,23}")

SELECT_SYSTEM = (
    "You read the start of a conversation and decide whether the person's last message calls for an "
    "empathetic reply: they share a difficulty, a worry, a loss, a strong feeling, or something that "
    "matters to them personally, and they would want to feel understood. Greetings, small talk, factual "
    "questions and requests for a task or for information do not, unless they carry such a feeling."
)
SELECT_ASK = "Does the person's last message call for an empathetic reply? Answer yes or no."

SAFETY_SYSTEM = (
    "You screen conversations before they are used to teach a model what a good supportive reply is. "
    "Some conversations must not be used for that, because the right reply follows a protocol or needs a "
    "professional, not a style to imitate. The rules:"
)
SAFETY_ASK = (
    f"Which rule applies to this conversation? Answer with the rule's name, or '{SAFE_LABEL}' if none "
    "applies. When several apply, name the first one in the list."
)

# Our constitution: (name, description); a name is one lower-case word (a verdict label).
CONSTITUTION: tuple[tuple[str, str], ...] = (
    (
        "crisis",
        "the person signals a risk to their own life or safety (thoughts of suicide, self-harm, a plan or "
        "the means), or someone's life is in immediate danger",
    ),
    ("minor", "the person is, or seems to be, a child or a young teenager"),
    (
        "abuse",
        "the person describes ongoing abuse, violence or coercion against them or someone in their care",
    ),
    (
        "medical",
        "the conversation turns on a diagnosis, medication, dosage or treatment decision that needs a "
        "clinician",
    ),
    ("harm", "the person wants help to hurt someone, or to break the law in a way that hurts others"),
    (
        "private",
        "the text holds details that identify a real person (full name with address, phone number, account "
        "or ID numbers)",
    ),
    ("explicit", "the conversation is sexually explicit"),
)


@dataclass(frozen=True)
class Constitution:
    """Named rules; a context to which one applies is kept out."""

    rules: tuple[tuple[str, str], ...] = CONSTITUTION

    @classmethod
    def from_file(cls, path: str | Path) -> Constitution:
        """Rules from a text file, one ``name: description`` line each (blank lines and ``#`` comments
        skipped); a name is one lower-case word of 2-24 letters, digits or ``_``, and not ``none``."""
        rules: list[tuple[str, str]] = []
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise ConfigError(f"--constitution {path}: cannot read it ({exc.strerror or exc})") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"--constitution {path}: not UTF-8 text (byte {exc.start}); a constitution is a text file of "
                "'name: description' lines"
            ) from None
        for n, line in enumerate(lines, 1):
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            name, sep, text = line.partition(":")
            name = name.strip()
            if not sep or not text.strip():
                raise ConfigError(f"{path}:{n}: expected 'name: description'")
            if not _RULE_NAME.fullmatch(name) or name == SAFE_LABEL:
                raise ConfigError(
                    f"{path}:{n}: rule name {name!r}: use one lower-case word of 2-24 letters, digits or _ "
                    f"(not {SAFE_LABEL!r})"
                )
            if name in {r for r, _ in rules}:
                raise ConfigError(f"{path}:{n}: rule {name!r} is defined twice")
            rules.append((name, " ".join(text.split())))
        if not rules:
            raise ConfigError(f"--constitution {path}: holds no rule")
        return cls(tuple(rules))

    @property
    def labels(self) -> tuple[str, ...]:
        return (SAFE_LABEL, *(name for name, _ in self.rules))

    def text(self) -> str:
        return "\n".join(f"- {name}: {text}." for name, text in self.rules)

    def fingerprint(self) -> str:
        return hashlib.sha256(self.text().encode()).hexdigest()[:12]


def _fence(contexts: Sequence[Conversation], salt: str) -> Fence:
    return Fence.derived([render_dialogue(c) for c in contexts], salt=salt)


def select_prompt(messages: Conversation, fence: Fence, *, reasoning: bool, text_mode: bool) -> Conversation:
    """The selection judge's prompt for one context."""
    body = "\n\n".join(
        [
            "The conversation so far:\n" + fence.block("DIALOGUE", render_dialogue(messages) or "(empty)"),
            SELECT_ASK + " " + answer_instruction(EMPATHY_LABELS, reasoning, text_mode=text_mode),
        ]
    )
    return [msg("system", SELECT_SYSTEM + " " + fence.rules()), msg("user", body)]


def safety_prompt(
    messages: Conversation, constitution: Constitution, fence: Fence, *, reasoning: bool, text_mode: bool
) -> Conversation:
    """The safety judge's prompt for one context: the constitution, the fenced dialogue, the question."""
    system = f"{SAFETY_SYSTEM}\n{constitution.text()}\n{fence.rules()}"
    body = "\n\n".join(
        [
            "The conversation:\n" + fence.block("DIALOGUE", render_dialogue(messages) or "(empty)"),
            SAFETY_ASK + " " + answer_instruction(constitution.labels, reasoning, text_mode=text_mode),
        ]
    )
    return [msg("system", system), msg("user", body)]


def needs_empathy(
    engine: ChatEngine,
    contexts: Sequence[Conversation],
    *,
    reasoning: bool = False,
    use_logprobs: str = "auto",
    max_retries: int = 2,
    max_new_tokens: int = 64,
) -> list[Verdict]:
    """A ``yes`` / ``no`` verdict per context (one batched call per attempt)."""
    fence = _fence(contexts, "select")
    text_mode = not wants_logprobs(engine, use_logprobs)
    prompts = [select_prompt(c, fence, reasoning=reasoning, text_mode=text_mode) for c in contexts]
    return decide(
        engine,
        prompts,
        EMPATHY_LABELS,
        reasoning=reasoning,
        use_logprobs=use_logprobs,
        max_retries=max_retries,
        max_new_tokens=max_new_tokens,
        fence=fence,
    )


def safety_check(
    engine: ChatEngine,
    contexts: Sequence[Conversation],
    constitution: Constitution,
    *,
    reasoning: bool = False,
    use_logprobs: str = "auto",
    max_retries: int = 2,
    max_new_tokens: int = 64,
) -> list[Verdict]:
    """A verdict per context: ``none`` or the name of the rule that keeps it out (one batched call per
    attempt)."""
    fence = _fence(contexts, "safety")
    text_mode = not wants_logprobs(engine, use_logprobs)
    prompts = [
        safety_prompt(c, constitution, fence, reasoning=reasoning, text_mode=text_mode) for c in contexts
    ]
    return decide(
        engine,
        prompts,
        constitution.labels,
        reasoning=reasoning,
        use_logprobs=use_logprobs,
        max_retries=max_retries,
        max_new_tokens=max_new_tokens,
        fence=fence,
    )

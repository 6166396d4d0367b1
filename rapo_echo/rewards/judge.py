"""``judge`` reward: an LLM judge scores each reply against a rubric, through any engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from functools import partial

from rapo_echo.errors import ConfigError
from rapo_echo.llm.answers import answer_words, check_logprobs_mode, generate_parsed, wants_logprobs
from rapo_echo.llm.dialogue import render_dialogue
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.judge_screen import DEFAULT_CONTEXT_POLICY, DEFAULT_POLICY, JudgeScreen
from rapo_echo.llm.labels import read_label_probabilities
from rapo_echo.rewards import RewardContext, RewardOutput
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, Sample, SamplingParams, msg

DEFAULT_RUBRIC = (
    "Rate how emotionally supportive the supporter's reply is. A good reply shows it understood what the "
    "person said and feels, validates the feeling without judging, stays on the person's concern, and "
    "invites them to say more or offers gentle, concrete help. A bad reply is generic, dismissive, "
    "preachy, off-topic, or speaks for the person."
)


def score_format(scale: int) -> AnswerFormat:
    """The text-mode answer of a 1..``scale`` rating: ``{"score": N}``."""
    score = {"type": "integer", "minimum": 1, "maximum": scale}
    return AnswerFormat.json_object({"score": score}, name="score")


class JudgeReward:
    """Scores in [0, 1]: ``(s - 1) / (scale - 1)`` for a 1..``scale`` rating.

    With log-probs the rating is the expectation over the label tokens' probabilities after ``Score: ``
    (robust even with small judges); otherwise the judge answers :attr:`answer_format` (``{"score": N}``),
    read from its own words and retried (sampling) up to ``max_retries`` times, then invalid. Texts that
    address the judge: ``addressed`` / ``addressed_context`` (:mod:`rapo_echo.llm.judge_screen`).
    """

    name = "judge"

    def __init__(
        self,
        ctx: RewardContext,
        rubric: str = DEFAULT_RUBRIC,
        scale: int = 5,
        use_logprobs: str = "auto",
        max_retries: int = 2,
        max_new_tokens: int = 64,
        show_profile: bool = False,
        addressed: str = DEFAULT_POLICY,
        addressed_context: str = DEFAULT_CONTEXT_POLICY,
    ) -> None:
        if ctx.judge is None:
            raise ConfigError("rewards: the 'judge' reward needs a judge engine (config section 'judge')")
        if not 2 <= scale <= 9:
            raise ConfigError(f"rewards: judge scale must be 2..9 (single-digit labels), got {scale}")
        try:
            check_logprobs_mode("rewards: judge", use_logprobs)
            self.screen = JudgeScreen(addressed, addressed_context, owner="rewards: judge")
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.engine = ctx.judge
        self.rubric = rubric
        self.scale = scale
        self.use_logprobs = use_logprobs
        self.max_retries = max_retries
        self.max_new_tokens = max_new_tokens
        self.show_profile = show_profile
        self.labels = [str(k) for k in range(1, scale + 1)]
        self.answer_format = score_format(scale)

    def fence(self, samples: Sequence[Sample]) -> Fence:
        """One fence for a batch, its marker a hash of the batch's texts (reproducible; the prompts of
        one context keep their shared prefix)."""
        texts = [t for s in samples for t in (s.text, render_dialogue(s.scenario.messages))]
        return Fence.derived(texts, salt="judge-reward")

    def prompt(self, sample: Sample, fence: Fence | None = None, *, text_mode: bool = False) -> Conversation:
        """The judge's prompt for one reply: the dialogue, the reply (and the profile) in fenced blocks,
        the rubric and the answer format outside them (``text_mode``: the bare integer the format
        declares; else the ``Score: N`` line whose label probabilities are read)."""
        fence = fence or self.fence([sample])
        profile = ""
        if self.show_profile and sample.scenario.profile:
            lines = "\n".join(f"- {k}: {v}" for k, v in sample.scenario.profile.items())
            block = fence.block("PROFILE", lines)
            profile = f"What we know about the person (hidden from the supporter):\n{block}\n\n"
        dialogue = render_dialogue(sample.scenario.messages)
        shown = fence.block("DIALOGUE", dialogue) if dialogue else "(none: the supporter speaks first)"
        scale = f"an integer from 1 (worst) to {self.scale} (best)"
        answer = (
            f'Answer with one JSON object and nothing else, {{"score": N}}, where N is {scale}.'
            if text_mode
            else f"Answer with one line 'Score: N' where N is {scale}."
        )
        body = (
            f"{self.rubric}\n\n{fence.rules()}\n\n{profile}Dialogue so far:\n{shown}\n\n"
            f"Supporter's reply to rate:\n{fence.block('REPLY', sample.text)}\n\n{answer}"
        )
        return [
            msg("system", "You are a careful judge of emotional-support conversations."),
            msg("user", body),
        ]

    def parse(self, text: str) -> int | None:
        """The rating of a text-mode answer read by :attr:`answer_format` (``{"score": N}`` with N in range;
        an echoed "Score: 1 (worst) to 5" or a sentence quoting "Score: 5" is no answer)."""
        value = self.answer_format.parse(text)
        return value["score"] if isinstance(value, dict) else None

    def _read(self, text: str, view: Fence) -> int | None:
        """The rating of a text-mode answer, read from the judge's own words as ``view`` (its prompt's
        fence) sees them."""
        return self.parse(answer_words(text, view, self.engine, self.answer_format))

    def step_metrics(self) -> dict[str, float]:
        """The replies and contexts that addressed the judge since the last call (``judge/addressed*``)."""
        return self.screen.step_metrics()

    def __call__(self, samples: Sequence[Sample]) -> list[RewardOutput]:
        out: list[RewardOutput | None] = [None] * len(samples)
        shown: list[tuple[int, Sample, dict]] = []
        asides: list[tuple[int, Sample]] = []  # under `lower`: the same samples, suspect spans set aside
        for i, s in enumerate(samples):
            views = self.screen.views(s.scenario)
            reply = self.screen.reply(s.text)
            info = {**reply.info(), **({"addressed_context": True} if views.hit else {})}
            if reply.floored:
                out[i] = RewardOutput(0.0, info={"rating": 1, "source": "addressed", **info})
            elif reply.invalid or self.screen.context_invalid(views.hit):
                out[i] = RewardOutput(None, info={"rating": None, "invalid": "addressed the judge", **info})
            else:
                shown.append((i, replace(s, scenario=views.scenario, text=reply.text), info))
                if reply.aside is not None or views.aside is not None:
                    aside = reply.aside if reply.aside is not None else reply.text
                    asides.append((i, replace(s, scenario=views.aside or views.scenario, text=aside)))
        judged = self._judge([s for _, s, _ in shown] + [s for _, s in asides])
        for (i, _, info), o in zip(shown, judged):
            o.info.update(info)
            out[i] = o
        for (i, _), o in zip(asides, judged[len(shown) :]):
            full = out[i]
            score = self.screen.lowered(full.score, o.score)  # type: ignore[union-attr]  # every index is filled by now
            full.info.update(aside_score=o.score)  # type: ignore[union-attr]  # every index is filled by now
            out[i] = RewardOutput(score, info=full.info)  # type: ignore[union-attr]  # every index is filled by now
        return out  # type: ignore[return-value]  # every index is filled by now

    def _judge(self, samples: Sequence[Sample]) -> list[RewardOutput]:
        """The model's scores of ``samples`` (already screened)."""
        if not samples:
            return []
        fence = self.fence(samples)
        text_mode = not wants_logprobs(self.engine, self.use_logprobs)
        prompts = [self.prompt(s, fence, text_mode=text_mode) for s in samples]
        if not text_mode:
            probs = read_label_probabilities(
                self.engine, [p + [msg("assistant", "Score: ")] for p in prompts], self.labels, role="judge"
            )
            out = []
            for p in probs:
                if p is None:  # NaN or no label among the top log-probs: invalid, counted, warned
                    out.append(RewardOutput(None, info={"rating": None, "source": "logprobs"}))
                    continue
                expected = sum(int(k) * v for k, v in p.items())
                out.append(
                    RewardOutput(
                        (expected - 1) / (self.scale - 1), info={"rating": expected, "source": "logprobs"}
                    )
                )
            return out
        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)
        parsed = generate_parsed(
            self.engine,
            prompts,
            [partial(self._read, view=fence.within(p)) for p in prompts],  # each against its own prompt
            params,
            max_retries=self.max_retries,
            answer_format=self.answer_format,
        )
        return [
            RewardOutput(
                None if p.value is None else (p.value - 1) / (self.scale - 1),
                info={"rating": p.value, "raw": p.raw, "attempts": p.attempts, "source": "text"},
            )
            for p in parsed
        ]

"""What the fidelity benchmark asks for a prediction: simulated users (``user:NAME``), rewards / judges
(``reward:NAME``) and the baselines ``random``, ``length`` and ``questions`` (docs/fidelity.md, What a
predictor sees).

Each predictor gives one number per rated supporter turn (:class:`~.points.Item`) from the turn and its
real context only, or None with a reason (counted, never dropped silently); higher should mean "the
seeker found this more helpful". Every stage is one batched call over all turns of a batch of points."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from rapo_echo.benchmarks.base import EvalSettings
from rapo_echo.benchmarks.fidelity.points import Item
from rapo_echo.engines.base import ChatEngine
from rapo_echo.text import is_blank
from rapo_echo.types import Conversation, Sample

BASELINES = ("random", "length", "questions")
SCALE = 10.0  # the reaction simulator's emotion-change range


@dataclass
class Prediction:
    """One turn's prediction: ``value`` (None: missing, ``reason`` says why) and the predicted next
    message where the predictor writes one."""

    value: float | None
    reason: str = ""
    message: str | None = None


@dataclass
class Likelihood:
    """Summed log-probabilities of the real next seeker message under the simulator's next-message
    prompt (``persona``) and under the same dialogue without the role prompt (``plain``)."""

    persona: float
    plain: float
    tokens: int


@dataclass
class Predictor:
    """A named predictor; subclasses implement :meth:`predict` (and :meth:`likelihood` when they can)."""

    name: str
    kind: str  # user | reward | baseline
    extra: dict[str, Any] = field(default_factory=dict)

    def predict(self, items: Sequence[Item]) -> list[Prediction]:
        raise NotImplementedError

    def likelihood(self, items: Sequence[Item]) -> list[Likelihood | None] | None:
        """Per item, or None when the predictor has no next-message prompt or its engine no scores."""
        return None


# ---------------------------------------------------------------------------- baselines

_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")


def question_share(text: str) -> float:
    """Share of the sentences of ``text`` that end in a question mark (0 for no sentence)."""
    sentences = [s.strip() for s in _SENTENCE.findall(text) if s.strip().strip(".!?")]
    if not sentences:
        return 0.0
    return sum(s.endswith("?") for s in sentences) / len(sentences)


class Baseline(Predictor):
    def __init__(self, name: str, seed: int = 0) -> None:
        if name not in BASELINES:
            raise ValueError(f"unknown baseline {name!r}; allowed: {', '.join(BASELINES)}")
        super().__init__(name, "baseline")
        self.seed = seed

    def predict(self, items: Sequence[Item]) -> list[Prediction]:
        if self.name == "random":
            return [Prediction(random.Random(f"{self.seed}|{i.scenario.id}").random()) for i in items]
        if self.name == "length":
            return [Prediction(float(len(i.reply.split()))) for i in items]
        return [Prediction(question_share(i.reply)) for i in items]


# ---------------------------------------------------------------------------- simulated users


def plain_prompt(prompt: Conversation) -> Conversation:
    """A next-message prompt without its role brief (the system message)."""
    return [m for m in prompt if m["role"] != "system"]


def score_next_messages(
    engine: ChatEngine,
    persona: Sequence[Conversation],
    plain: Sequence[Conversation],
    items: Sequence[Item],
) -> list[Likelihood | None] | None:
    """Log-likelihood of each item's real next message after its ``persona`` prompt and its ``plain``
    prompt; None when the engine cannot score given text (the ``hf`` engine can)."""
    score = getattr(engine, "score", None)
    if score is None:
        return None
    todo = [k for k, i in enumerate(items) if not is_blank(i.next_message)]
    out: list[Likelihood | None] = [None] * len(items)
    if not todo:
        return out
    texts = [items[k].next_message for k in todo]
    with_role = score([persona[k] for k in todo], texts)
    without = score([plain[k] for k in todo], texts)
    for k, a, b in zip(todo, with_role, without):
        if a.logprobs and b.logprobs:
            out[k] = Likelihood(float(sum(a.logprobs)), float(sum(b.logprobs)), len(a.logprobs))
    return out


class UserPredictor(Predictor):
    """A simulator with ``react(pairs)`` (RAPO's reaction simulator or a plugin): its emotion change."""

    def __init__(self, name: str, engine: ChatEngine, settings: EvalSettings) -> None:
        from rapo_echo.simulators.base import build_simulator

        super().__init__(f"user:{name}", "user")
        args: dict[str, Any] = {}
        if name == "reaction":
            args = {
                "with_thought": False,
                "max_new_tokens": settings.simulator_max_new_tokens or settings.max_new_tokens,
                "temperature": settings.simulator_temperature,
                "max_retries": settings.judge_retries,
                "use_logprobs": settings.judge_logprobs,
            }
        self.engine = engine
        self.simulator = build_simulator(
            name, args, engine=engine, scale=SCALE, seed=settings.seed or 0, where="--user"
        )

    def predict(self, items: Sequence[Item]) -> list[Prediction]:
        from rapo_echo.simulators.base import checked_reactions

        pairs = [(i.scenario, i.reply) for i in items]
        reactions = checked_reactions(self.simulator.react(pairs), len(pairs), scale=SCALE, name=self.name)
        return [
            Prediction(r.emotion_delta, message=r.message or None)
            if r.valid and r.emotion_delta is not None
            else Prediction(None, reason=f"invalid reaction: {r.raw[:160]}", message=r.message or None)
            for r in reactions
        ]

    def likelihood(self, items: Sequence[Item]) -> list[Likelihood | None] | None:
        prompt = getattr(self.simulator, "message_prompt", None)
        if prompt is None:
            return None
        prompts = [prompt(i.scenario, i.reply) for i in items]
        return score_next_messages(self.engine, prompts, [plain_prompt(p) for p in prompts], items)


class SagePredictor(Predictor):
    """RLVER's SAGE-style user, started at its initial emotion in the real dialogue: the signed change
    its analysis gives the turn, and the message it writes next (plain reply)."""

    def __init__(self, engine: ChatEngine, settings: EvalSettings) -> None:
        from dataclasses import replace

        from rapo_echo.simulators.sage import SageSimulator, preset

        super().__init__("user:sage", "user")
        self.engine = engine
        sage = replace(
            preset("sage"),
            emotion_readout="auto",
            plain_reply=True,
            temperature=settings.simulator_temperature,
            max_new_tokens=settings.simulator_max_new_tokens or settings.max_new_tokens,
            max_retries=settings.judge_retries,
        )
        self.simulator = SageSimulator(engine, sage, seed=settings.seed or 0)
        self._dialogues: dict[str, Any] = {}

    def predict(self, items: Sequence[Item]) -> list[Prediction]:
        from rapo_echo.simulators.sage import SageDialogue, SageProfile

        s = self.simulator.settings
        dialogues = [
            SageDialogue(
                id=i.scenario.id,
                profile=SageProfile.from_mapping(i.scenario.profile, i.scenario.id),
                emotion=s.initial_emotion,
                fence_key=i.scenario.id,
                history=[dict(m) for m in i.scenario.messages],  # type: ignore[misc]  # plain dicts of role and content
                emotions=[s.initial_emotion],
            )
            for i in items
        ]
        self.simulator.step(dialogues, [i.reply for i in items])
        self._dialogues = {d.id: d for d in dialogues}
        out = []
        for d in dialogues:
            entry = d.log[-1]
            delta = entry.get("delta")
            if delta is None:
                out.append(Prediction(None, reason=str(entry.get("error", "no emotion change"))))
            else:
                out.append(Prediction(float(delta), message=entry.get("message")))
        return out

    def likelihood(self, items: Sequence[Item]) -> list[Likelihood | None] | None:
        """Under the next-message prompt SAGE's user wrote its message with (after :meth:`predict`)."""
        from rapo_echo.simulators.sage import last_feeling, reply_prompt, tier

        prompts = []
        for i in items:
            d = self._dialogues.get(i.scenario.id)
            if d is None:
                return None
            history = [*i.scenario.messages, {"role": "assistant", "content": i.reply}]
            prompts.append(
                reply_prompt(
                    d.profile,
                    history,
                    tier(d.emotion),
                    last_feeling(d),
                    self.simulator.fence(d, "reply"),
                    plain=True,
                )
            )
        return score_next_messages(self.engine, prompts, [_flipped(i) for i in items], items)


def _flipped(item: Item) -> Conversation:
    """The dialogue from the seeker's side with no role brief: the seeker is ``assistant``."""
    flip = {"user": "assistant", "assistant": "user"}
    turns = [{"role": flip[m["role"]], "content": m["content"]} for m in item.scenario.messages]
    turns.append({"role": "user", "content": item.reply})
    if turns[0]["role"] == "assistant":
        turns.insert(0, {"role": "user", "content": "(The chat begins.)"})
    return turns  # type: ignore[return-value]  # plain dicts of role and content


# ---------------------------------------------------------------------------- rewards


class RewardPredictor(Predictor):
    """A reward plugin's score of the turn as the reply to its real context."""

    def __init__(self, name: str, judge: ChatEngine | None, simulator: ChatEngine | None) -> None:
        from rapo_echo.rewards import RewardContext, build_reward

        super().__init__(f"reward:{name}", "reward")
        self.reward = build_reward(
            name, {}, RewardContext(judge=judge, simulator=simulator), where="--reward"
        )

    def predict(self, items: Sequence[Item]) -> list[Prediction]:
        from rapo_echo.rewards import as_output

        samples = [Sample(i.scenario, 0, [], [], None, i.reply) for i in items]
        outputs = list(self.reward(samples))
        if len(outputs) != len(samples):
            raise ValueError(f"{self.name} returned {len(outputs)} scores for {len(samples)} turns")
        out = []
        for value in outputs:
            o = as_output(value, self.name)
            reason = "" if o.score is not None else f"unscored: {str(o.info)[:160]}"
            out.append(Prediction(o.score, reason=reason))
        return out


def build_predictors(
    users: Sequence[str],
    rewards: Sequence[str],
    *,
    simulator: ChatEngine | None,
    judge: ChatEngine | None,
    settings: EvalSettings,
) -> list[Predictor]:
    """The named users and rewards, then the baselines."""
    out: list[Predictor] = []
    for name in users:
        if simulator is None:
            raise ValueError(f"--user {name}: no simulator engine")
        out.append(
            SagePredictor(simulator, settings) if name == "sage" else UserPredictor(name, simulator, settings)
        )
    out.extend(RewardPredictor(name, judge, simulator) for name in rewards)
    out.extend(Baseline(name, settings.seed or 0) for name in BASELINES)
    return out

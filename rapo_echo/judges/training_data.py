"""Examples for judge training (``rapo-echo train-judge``): JSONL rows -> the judges' own prompts and the
answers they should write (the row format: ``rapo_echo/examples/README.md``; docs/judges.md).

An empathy example's ``reasoning`` names the replies ``{reply}`` and ``{reference}``; each example is
shown in both orders with the placeholders replaced and the verdict flipped, so the judge cannot learn a
position; with ``needs`` it also trains the need analysis. Negatives for the humanlike judge (Echo-N1's
augmentations) are made from the ``human`` examples that have a dialogue: ``shuffle`` (the dialogue's turns
reordered) and ``swap`` (the reply moved into another example's dialogue), both labelled ``AI``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from rapo_echo.data.files import Record, expect_object, get_str, open_source, read_records
from rapo_echo.data.scenario_file import ROLES
from rapo_echo.errors import DataError
from rapo_echo.judges.empathy import AXES, EmpathyJudge, NeedAnalysis
from rapo_echo.judges.humanlike import LABELS as HUMANLIKE_LABELS
from rapo_echo.judges.humanlike import HumanlikeJudge
from rapo_echo.judges.verdict import answer_text
from rapo_echo.llm.fencing import Fence
from rapo_echo.text import is_blank
from rapo_echo.types import Conversation, Message, Scenario, msg

TASKS = ("humanlike", "empathy")
EMPATHY_LABELS = ("win", "tie", "loss")
KEYS = {
    "humanlike": ("task", "messages", "opening", "reply", "label", "reasoning"),
    "empathy": ("task", "messages", "opening", "reply", "reference", "label", "reasoning", "needs"),
}
NEGATIVES = ("shuffle", "swap")
SHUFFLED_REASONING = "The turns are out of order, so the reply does not answer what was just said."
SWAPPED_REASONING = "The reply is about something this conversation never mentioned; it belongs elsewhere."


@dataclass
class JudgeExample:
    """One training or held-out example of a judge."""

    task: str
    messages: Conversation
    reply: str
    label: str
    where: str
    reasoning: str | None = None
    reference: str | None = None
    needs: NeedAnalysis | None = None
    origin: str = "data"  # "data", "shuffle" or "swap"


@dataclass
class JudgePair:
    """A judge prompt and the answer it should give; ``gold`` is the verdict label (None for a need line)."""

    task: str
    prompt: Conversation
    target: str
    gold: str | None
    labels: tuple[str, ...] = ()
    origin: str = "data"


def load_examples(paths: Sequence[str | Path], default_task: str | None = None) -> list[JudgeExample]:
    """Read and validate every example; errors name the file, line and field."""
    out: list[JudgeExample] = []
    for path in paths:
        for record in read_records(open_source(path)):
            out.append(parse_example(record, default_task))
    return out


def parse_example(record: Record, default_task: str | None = None) -> JudgeExample:
    """One JSONL row -> :class:`JudgeExample`."""
    obj, where = expect_object(record), record.where
    task = get_str(obj, "task", where, required=default_task is None) or default_task
    if task not in TASKS:
        raise DataError(f"{where}: task: got {task!r}; expected one of {', '.join(TASKS)}")
    unknown = [k for k in obj if k not in KEYS[task]]
    if unknown:
        raise DataError(
            f"{where}: {unknown[0]}: unknown key for a {task} example; allowed: {', '.join(KEYS[task])}"
        )
    messages = _dialogue(obj, where)
    reply = get_str(obj, "reply", where)
    if is_blank(reply):
        raise DataError(f"{where}: reply: empty; expected the reply to judge")
    labels = HUMANLIKE_LABELS if task == "humanlike" else EMPATHY_LABELS
    raw = get_str(obj, "label", where)
    label = next((x for x in labels if x.lower() == raw.strip().lower()), None)  # type: ignore[union-attr]  # get_str is required here: a str
    if label is None:
        raise DataError(f"{where}: label: got {raw!r}; expected one of {', '.join(labels)}")
    reasoning = get_str(obj, "reasoning", where, required=False)
    example = JudgeExample(task, messages, reply, label, where, reasoning or None)  # type: ignore[arg-type]  # task and label checked above
    if task == "empathy":
        example.reference = get_str(obj, "reference", where)
        if is_blank(example.reference):
            raise DataError(f"{where}: reference: empty; expected the reference reply")
        example.needs = _needs(obj.get("needs"), where)
        if not messages:
            raise DataError(f"{where}: messages / opening: an empathy example needs the dialogue")
    return example


def _dialogue(obj: dict, where: str) -> list[Message]:
    if obj.get("messages") is not None and obj.get("opening") is not None:
        raise DataError(f"{where}: messages / opening: got both; expected at most one of them")
    if obj.get("opening") is not None:
        return [msg("user", get_str(obj, "opening", where))]  # type: ignore[arg-type]  # get_str is required here: a str
    value = obj.get("messages")
    if value is None:
        return []
    if not isinstance(value, list):
        raise DataError(f"{where}: messages: expected a list of {{role, content}} objects")
    out: list[Message] = []
    for i, m in enumerate(value):
        if not isinstance(m, dict) or set(m) != {"role", "content"}:
            raise DataError(f"{where}: messages[{i}]: expected an object with exactly role and content")
        role = get_str(m, "role", where, path=f"messages[{i}].")
        if role not in ROLES:
            raise DataError(f"{where}: messages[{i}].role: got {role!r}; expected one of {', '.join(ROLES)}")
        if role == "system" and any(o["role"] != "system" for o in out):
            raise DataError(
                f"{where}: messages[{i}]: a system message in mid-dialogue; the judge's prompt shows only "
                "the user and assistant turns, so it would be dropped without a word: remove it, or put "
                "its text into a neighbouring turn"
            )
        out.append(msg(role, get_str(m, "content", where, path=f"messages[{i}].")))  # type: ignore[arg-type]  # get_str is required here: a str
    return out


def _needs(value: object, where: str) -> NeedAnalysis | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != set(AXES):
        raise DataError(f"{where}: needs: expected an object with exactly {', '.join(AXES)}")
    for axis in AXES:
        get_str(value, axis, where, path="needs.")
    return NeedAnalysis(*(" ".join(value[a].split()) for a in AXES))


def _key(e: JudgeExample) -> tuple:
    return (e.task, tuple((m["role"], m["content"]) for m in e.messages), e.reply, e.reference, e.label)


def dedupe(
    examples: Sequence[JudgeExample], seen: Sequence[JudgeExample] = ()
) -> tuple[list[JudgeExample], int]:
    """``examples`` without repeats (same task, dialogue, reply, reference and label; the first is kept)
    and without any also in ``seen``; and how many were removed. Done before splitting, so no example
    is both trained on and held out."""
    keys = {_key(e) for e in seen}
    out = []
    for e in examples:
        if _key(e) not in keys:
            keys.add(_key(e))
            out.append(e)
    return out, len(examples) - len(out)


def split(
    examples: Sequence[JudgeExample], eval_fraction: float, seed: int
) -> tuple[list[JudgeExample], list[JudgeExample]]:
    """(train, held-out): a seeded shuffle, then the last ``eval_fraction`` of each task held out."""
    if not 0 < eval_fraction < 1:
        raise ValueError(f"eval_fraction must be in (0, 1), got {eval_fraction}")
    train, held = [], []
    for task in TASKS:
        rows = [e for e in examples if e.task == task]
        random.Random(seed).shuffle(rows)
        n_eval = round(len(rows) * eval_fraction) if len(rows) > 1 else 0
        if len(rows) > 1:
            n_eval = min(max(n_eval, 1), len(rows) - 1)
        train += rows[: len(rows) - n_eval]
        held += rows[len(rows) - n_eval :]
    return train, held


def negatives(examples: Sequence[JudgeExample], kinds: Sequence[str], seed: int) -> list[JudgeExample]:
    """Shuffled-context and swapped-reply negatives (labelled ``AI``) of the ``human`` humanlike examples."""
    bad = [k for k in kinds if k not in NEGATIVES]
    if bad:
        raise ValueError(f"unknown negative kind {bad[0]!r}; allowed: {', '.join(NEGATIVES)}")
    rng = random.Random(seed)
    human = [e for e in examples if e.task == "humanlike" and e.label == "human" and e.messages]
    out: list[JudgeExample] = []
    if "shuffle" in kinds:
        for e in human:
            order = list(range(len(e.messages)))
            if len({m["content"] for m in e.messages}) < 2:
                continue  # nothing to reorder
            while order == sorted(order):
                rng.shuffle(order)
            shuffled = [e.messages[i] for i in order]
            out.append(
                replace(e, messages=shuffled, label="AI", reasoning=SHUFFLED_REASONING, origin="shuffle")
            )
    if "swap" in kinds:
        for e in human:
            others = [o.reply for o in human if o.messages != e.messages and o.reply != e.reply]
            if others:
                swapped = rng.choice(others)
                out.append(replace(e, reply=swapped, label="AI", reasoning=SWAPPED_REASONING, origin="swap"))
    return out


def pairs(
    example: JudgeExample, *, reasoning: bool, context_aware: bool, rng: random.Random
) -> list[JudgePair]:
    """The prompts the judge sees for this example and the answers it should write."""
    fence = Fence(rng=rng)
    why = example.reasoning if reasoning else None
    if reasoning and not why:
        raise DataError(
            f"{example.where}: reasoning: missing; needed for training with reasoning (or --no-reasoning)"
        )
    if example.task == "humanlike":
        judge = HumanlikeJudge(None, context_aware=context_aware, reasoning=reasoning)  # type: ignore[arg-type]  # prompts only: no engine is called
        prompt = judge.prompt(example.messages, example.reply, fence)
        target = answer_text(example.label, why)
        return [JudgePair("humanlike", prompt, target, example.label, HUMANLIKE_LABELS, example.origin)]
    judge = EmpathyJudge(None, reasoning=reasoning)  # type: ignore[arg-type,assignment]  # prompts only, no engine; the other judge kind
    scenario = Scenario("example", example.messages)
    out = []
    for reply_first in (True, False):
        a, b = (example.reply, example.reference) if reply_first else (example.reference, example.reply)
        names = (
            {"reply": "Reply A", "reference": "Reply B"}
            if reply_first
            else {"reply": "Reply B", "reference": "Reply A"}
        )
        gold = {"win": names["reply"][-1], "loss": names["reference"][-1], "tie": "tie"}[example.label]
        text = (
            why.replace("{reply}", names["reply"]).replace("{reference}", names["reference"]) if why else None
        )
        prompt = judge.compare_prompt(scenario, example.needs, a, b, fence)
        out.append(JudgePair("empathy", prompt, answer_text(gold, text), gold, judge.labels, example.origin))
    if example.needs is not None:
        for axis in AXES:
            prompt = judge.needs_prompt(scenario, axis, fence)
            out.append(JudgePair("empathy_needs", prompt, " " + getattr(example.needs, axis), None))
    return out

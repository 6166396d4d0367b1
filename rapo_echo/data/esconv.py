"""ESConv-family conversations -> :class:`Dialogue` -> one :class:`Scenario` per chosen supporter turn.

Schemas (shared/data/esconv/PROVENANCE.md): ``esconv`` (raw ``ESConv.json``, speakers ``seeker`` /
``supporter``, and ``FailedESConv.json``, ``speaker`` / ``listener``; survey scores and per-utterance
``strategy`` / ``feedback`` annotations) and ``ppdpp`` / the ``text`` of ``hf_esconv`` rows (``dialog:
[{text, speaker: usr | sys, strategy?}]``, no survey scores, no feedback).

Seeker utterances become ``user`` messages and supporter ones ``assistant`` messages; consecutive
utterances of one speaker are merged into one turn (:meth:`Dialogue.turns`). This is the one ESConv
parser: training data (:func:`dialogue_scenarios`) and the benchmarks both read through it
(:func:`rapo_echo.data.load_dialogues`). Of the survey only ``experience_type`` and the seeker's initial /
final emotion intensity are kept; ratings are validated as integers 1-5 (or digit strings).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rapo_echo.config import SelectionConfig
from rapo_echo.data.files import get_str
from rapo_echo.errors import DataError
from rapo_echo.text import is_blank
from rapo_echo.types import Scenario

RAW_SPEAKERS = {"seeker": "user", "supporter": "assistant", "speaker": "user", "listener": "assistant"}
REFORMATTED_SPEAKERS = {"usr": "user", "sys": "assistant"}
# f_before of a supporter turn that has no feedback rating before it: the middle of the 1-5 scale
NEUTRAL_FEEDBACK = 3


@dataclass
class Utterance:
    role: str  # "user" (seeker) or "assistant" (supporter)
    content: str
    index: int  # position in the file's ``dialog`` list
    strategy: str | None = None
    feedback: int | None = None  # seeker's in-chat rating 1-5 (raw ESConv only)


@dataclass
class Turn:
    """Consecutive utterances of one speaker, merged; ``first`` / ``last`` are ``dialog`` indices."""

    role: str
    content: str
    first: int
    last: int
    strategies: list[str] = field(default_factory=list)


@dataclass
class Dialogue:
    """One ESConv-family conversation: hidden profile plus the utterances in order."""

    id: str
    index: int  # position of the conversation in its file
    source: str  # "esconv", "failed_esconv", "ppdpp" or "hf_esconv"
    file: str
    profile: dict[str, Any]
    utterances: list[Utterance]
    where: str = ""  # the record's location, ``file:line`` (for messages)

    def turns(self, sep: str = "\n", squash_whitespace: bool = False) -> list[Turn]:
        """The utterances with consecutive ones of the same speaker merged, joined by ``sep``.

        ``squash_whitespace``: every run of whitespace inside an utterance becomes one space first
        (training keeps the text as written and joins with a newline; the ESConv benchmark squashes and
        joins with a space).
        """
        out: list[Turn] = []
        for u in self.utterances:
            content = " ".join(u.content.split()) if squash_whitespace else u.content
            if out and out[-1].role == u.role:
                t = out[-1]
                t.content, t.last = f"{t.content}{sep}{content}", u.index
            else:
                out.append(Turn(u.role, content, u.index, u.index))
            if u.strategy and u.strategy not in out[-1].strategies:
                out[-1].strategies.append(u.strategy)
        return out

    def feedback(self) -> list[tuple[int, int]]:
        """``(dialog index, rating)`` of every seeker feedback rating, in order."""
        return [(u.index, u.feedback) for u in self.utterances if u.feedback is not None]


def esconv_dialogue(obj: dict[str, Any], *, where: str, index: int, stem: str, file: str) -> Dialogue:
    """A raw ESConv / FailedESConv conversation -> :class:`Dialogue`."""
    profile = _profile(obj, where)
    experience = get_str(obj, "experience_type", where, required=False)
    if experience:
        profile["experience_type"] = experience
    survey = obj.get("survey_score") or {}
    seeker = survey.get("seeker") if isinstance(survey, dict) else None
    if survey and not isinstance(seeker, (dict, type(None))):
        raise DataError(f"{where}: survey_score.seeker: got {type(seeker).__name__}; expected an object")
    for key in ("initial_emotion_intensity", "final_emotion_intensity"):
        value = _rating((seeker or {}).get(key), where, f"survey_score.seeker.{key}")
        if value is not None:
            profile[key] = value
    utterances, labels = [], set()
    for i, u in enumerate(_dialog(obj, where)):
        speaker = _speaker(u, i, where, RAW_SPEAKERS)
        labels.add(speaker)
        content = get_str(u, "content", where, path=f"dialog[{i}].")
        ann = u.get("annotation") or {}
        if not isinstance(ann, dict):
            raise DataError(f"{where}: dialog[{i}].annotation: got {type(ann).__name__}; expected an object")
        strategy = get_str(ann, "strategy", where, path=f"dialog[{i}].annotation.", required=False)
        feedback = _rating(ann.get("feedback"), where, f"dialog[{i}].annotation.feedback")
        role = RAW_SPEAKERS[speaker]
        if role == "assistant":
            feedback = None
        if not is_blank(content):
            utterances.append(Utterance(role, content.strip(), i, strategy, feedback))
    source = "failed_esconv" if labels & {"speaker", "listener"} else "esconv"
    return Dialogue(f"{stem}-{index}", index, source, file, profile, utterances, where)


def reformatted_dialogue(
    obj: dict[str, Any], *, where: str, index: int, stem: str, file: str, source: str, path: str = ""
) -> Dialogue:
    """A PPDPP / HF ``thu-coai/esconv`` conversation (usr / sys speakers) -> :class:`Dialogue`."""
    profile = _profile(obj, where, path)
    utterances = []
    for i, u in enumerate(_dialog(obj, where, path)):
        role = REFORMATTED_SPEAKERS[_speaker(u, i, where, REFORMATTED_SPEAKERS, path)]
        text = get_str(u, "text", where, path=f"{path}dialog[{i}].")
        strategy = get_str(u, "strategy", where, path=f"{path}dialog[{i}].", required=False)
        if not is_blank(text):
            utterances.append(Utterance(role, text.strip(), i, strategy))
    return Dialogue(f"{stem}-{index}", index, source, file, profile, utterances, where)


def _profile(obj: dict[str, Any], where: str, path: str = "") -> dict[str, Any]:
    return {k: get_str(obj, k, where, path) for k in ("emotion_type", "problem_type", "situation")}


def _dialog(obj: dict[str, Any], where: str, path: str = "") -> list[dict[str, Any]]:
    dialog = obj.get("dialog")
    if not isinstance(dialog, list) or not dialog:
        got = "missing" if dialog is None else f"got {type(dialog).__name__}"
        raise DataError(f"{where}: {path}dialog: {got}; expected a non-empty list of utterances")
    for i, u in enumerate(dialog):
        if not isinstance(u, dict):
            raise DataError(f"{where}: {path}dialog[{i}]: got {type(u).__name__}; expected an object")
    return dialog


def _speaker(u: dict[str, Any], i: int, where: str, allowed: dict[str, str], path: str = "") -> str:
    speaker = get_str(u, "speaker", where, path=f"{path}dialog[{i}].")
    if speaker not in allowed:
        expected = ", ".join(allowed)
        raise DataError(f"{where}: {path}dialog[{i}].speaker: got {speaker!r}; expected one of {expected}")
    return speaker


def _rating(value: Any, where: str, name: str) -> int | None:
    """A 1-5 rating given as an int or a digit string ("" / missing -> None)."""
    if value is None or value == "":
        return None
    try:
        rating = int(value)
    except (TypeError, ValueError, OverflowError):  # Infinity, 1e400, NaN, a 5001-digit integer
        rating = 0
    if isinstance(value, bool) or not 1 <= rating <= 5 or (isinstance(value, float) and value != rating):
        raise DataError(f"{where}: {name}: got {value!r}; expected a rating from 1 to 5")
    return rating


# --------------------------------------------------------------------------- hindsight selection


def feedback_pivot_scores(dialogue: Dialogue) -> dict[int, float]:
    """Pivot score of each supporter turn (keyed by its index in :meth:`Dialogue.turns`).

    Rule: score = |f_after - f_before|, where f_after is the first seeker feedback rating given after
    the turn and f_before the last one given before it. A turn with no rating before it uses the
    neutral start value ``NEUTRAL_FEEDBACK`` = 3 (the middle of the 1-5 scale); a turn with no rating
    after it has no score (it is never selected by this signal).
    """
    ratings = dialogue.feedback()
    scores: dict[int, float] = {}
    for k, turn in enumerate(dialogue.turns()):
        if turn.role != "assistant":
            continue
        after = [r for i, r in ratings if i > turn.last]
        if not after:
            continue
        before = [r for i, r in ratings if i < turn.first]
        scores[k] = float(abs(after[0] - (before[-1] if before else NEUTRAL_FEEDBACK)))
    return scores


def select_turns(dialogue: Dialogue, selection: SelectionConfig) -> list[tuple[int, float | None]]:
    """The supporter turns to train on, as ``(turn index, pivot score or None)`` in dialogue order.

    Eligible turns have at least ``max(1, min_history_turns)`` seeker turns before them. With
    ``signal: feedback`` and a dialogue that has feedback ratings, eligible turns scoring at least
    ``threshold`` are kept, at most ``top_k_per_dialogue`` best (ties: the earlier turn). Otherwise
    (no ratings, or ``signal: none``) every eligible turn is kept.
    """
    turns = dialogue.turns()
    eligible, seeker_turns = [], 0
    for k, turn in enumerate(turns):
        if turn.role == "user":
            seeker_turns += 1
        elif seeker_turns >= max(1, selection.min_history_turns):
            eligible.append(k)
    if selection.signal == "none" or not dialogue.feedback():
        return [(k, None) for k in eligible]
    scores = feedback_pivot_scores(dialogue)
    kept = [(k, scores[k]) for k in eligible if k in scores and scores[k] >= selection.threshold]
    kept.sort(key=lambda ks: (-ks[1], ks[0]))
    if selection.top_k_per_dialogue is not None:
        kept = kept[: selection.top_k_per_dialogue]
    return sorted(kept)


def dialogue_scenarios(dialogue: Dialogue, selection: SelectionConfig) -> list[Scenario]:
    """One :class:`Scenario` per selected supporter turn: the context before it, the turn as reference.

    The context keeps the last ``max_history_messages`` messages and ends with the seeker's turn;
    no system prompt is added. ``meta``: source, file, dialogue (index in the file), turn (``dialog``
    index of the turn's first utterance), strategy (list of the turn's strategies, when annotated),
    pivot_score (when scored by feedback).
    """
    turns = dialogue.turns()
    messages = [{"role": t.role, "content": t.content} for t in turns]
    out = []
    for k, score in select_turns(dialogue, selection):
        turn = turns[k]
        context = messages[:k][-selection.max_history_messages :]
        meta: dict[str, Any] = {
            "source": dialogue.source,
            "file": dialogue.file,
            "dialogue": dialogue.index,
            "turn": turn.first,
        }
        if turn.strategies:
            meta["strategy"] = list(turn.strategies)
        if score is not None:
            meta["pivot_score"] = score
        out.append(
            Scenario(
                id=f"{dialogue.id}-{turn.first}",
                messages=context,  # type: ignore[arg-type]  # plain dicts of role and content
                profile=dict(dialogue.profile),
                reference=turn.content,
                meta=meta,
            )
        )
    return out

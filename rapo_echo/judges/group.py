"""RAPO's generative group judge (GRM): ranks a group of candidate replies by the person's reactions
and writes a short critique of each (docs/algorithms/rapo.md: the ``ties`` rules, ``orders`` and their
study; docs/judges.md: the ``addressed`` policies).

Candidates are shown anonymised as ``A``, ``B``, ... (shuffled with ``shuffle``); results come back in
the caller's order. Log-prob mode reads P(best) over the space-prefixed labels after :data:`BEST_PREFIX`
in one ``choice_logprobs`` call; text mode asks for :func:`ranking_format` and keeps only a permutation
of the labels. A group whose label log-probs are unusable (NaN, or no label among a server's top
log-probs) is invalid, counted and warned about. Untrusted text reaches the prompts only fenced (one
marker per call, so a group's prompts share their prefix) and is screened first
(:mod:`rapo_echo.llm.judge_screen`).
"""

from __future__ import annotations

import logging
import random
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from rapo_echo.config import GroupJudgeConfig
from rapo_echo.engines.base import ChatEngine
from rapo_echo.judges.bias import PositionBias, first_rank_share
from rapo_echo.llm.addressing import addresses_judge, set_aside
from rapo_echo.llm.answers import (
    Parsed,
    answer_words,
    describe_engine,
    generate_parsed,
    wants_logprobs,
)
from rapo_echo.llm.dialogue import render_dialogue
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.judge_screen import JudgeScreen
from rapo_echo.llm.labels import usable_probabilities
from rapo_echo.llm.ranks import average_ranks
from rapo_echo.llm.reaction import Reaction, render_profile
from rapo_echo.llm.strength import warn_if_weak
from rapo_echo.structured import AnswerFormat
from rapo_echo.types import Conversation, SamplingParams, Scenario, msg

log = logging.getLogger(__name__)
LABELS = string.ascii_uppercase
BEST_PREFIX = "The reply that helped the person most is Reply"
CRITIQUE_PREFIX = "The person's reaction shows"  # starts the critique: keeps small judges on task
CRITIQUE_STOP = ("\n\n",)  # a critique is one short paragraph
CRITIQUE_CHARS = 600
# a short paragraph: up to three bounded lines, then the blank line that the stop sequence ends it at
CRITIQUE_FORMAT = AnswerFormat.regex(
    rf"[^\n]{{0,{CRITIQUE_CHARS}}}(\n[^\n]{{1,{CRITIQUE_CHARS}}}){{0,2}}\n{{0,2}}", name="critique"
)
RANKING_KEY = "ranking"
SYSTEM = (
    "You judge emotional-support replies by their effect on the person. For each reply you see how the "
    "person reacted: what they said next, how their feelings changed and what they privately thought. "
    "A reply is better when the reaction shows the person felt understood, calmer or more hopeful and "
    "kept opening up; it is worse when they felt dismissed, lectured, confused or pushed away. Judge the "
    "outcome shown by the reaction, not the style or length of the reply."
)
CRITIC_SYSTEM = (
    "You coach an emotional supporter. You read how a person reacted to the supporter's reply and explain "
    "briefly, concretely and kindly what worked or failed."
)


@dataclass
class Candidate:
    """One reply of a group and the person's reaction to it."""

    reply: str
    reaction: Reaction | None  # None: the reply had no (valid) reaction; the judge sees "(no reaction)"


@dataclass
class GroupJudgement:
    """The judge's verdict on one group, in the caller's candidate order."""

    ranks: (
        list[float] | None
    )  # 1 = best; ties share the average rank (e.g. [1, 2.5, 2.5, 4]); None if invalid
    critiques: list[str | None]  # one per candidate (None if not requested / failed)
    scores: list[float] | None  # what the ranking came from (P(best) per candidate in log-prob mode)
    valid: bool
    raw: list[str]  # raw judge texts, for logs
    attempts: int = 1


Groups = Sequence[Sequence[Candidate]]
Job = tuple[int, Sequence[int]]  # (group index, presentation order in caller indices)
PassSets = dict[int, list[list[float]]]  # per group: one rank or score vector per usable pass
CritiqueJob = tuple[int, int, list[float]]  # (group, candidate, the group's ranks)


def ranking_format(size: int) -> AnswerFormat:
    """The text-mode answer for a group of ``size``: ``{"ranking": [labels, best first]}``, every item one
    of the group's labels and exactly ``size`` of them (that each appears once is :func:`ranking_ranks`'
    check: a schema cannot say it)."""
    labels = list(LABELS[:size])
    return AnswerFormat.json_object(
        {
            RANKING_KEY: {
                "type": "array",
                "items": {"type": "string", "enum": labels},
                "minItems": size,
                "maxItems": size,
            }
        },
        name="ranking",
    )


def ranking_ranks(value: Any, labels: Sequence[str]) -> list[float] | None:
    """Ranks (in ``labels`` order, 1 = best) from a parsed ranking answer, or None unless its list is a
    permutation of ``labels``."""
    order = value.get(RANKING_KEY) if isinstance(value, dict) else None
    if not isinstance(order, list) or sorted(order) != sorted(labels):
        return None
    return [float(order.index(label) + 1) for label in labels]


def read_ranking(
    text: str, fence: Fence, labels: Sequence[str], engine: ChatEngine | None = None
) -> list[float] | None:
    """:func:`ranking_ranks` of the answer read by :func:`ranking_format` from the judge's own words
    (blocks, copies of fenced text and quotes removed) or, from an ``engine`` that enforced the format,
    from the whole answer (:func:`~rapo_echo.llm.answers.answer_words`)."""
    fmt = ranking_format(len(labels))
    own = fence.own_words(text, copies=True) if engine is None else answer_words(text, fence, engine, fmt)
    return ranking_ranks(fmt.parse(own), labels)


def label_options(size: int) -> list[str]:
    """The log-prob options for a group of ``size``: ``" A"``, ``" B"``, ... (space-prefixed labels)."""
    return [" " + label for label in LABELS[:size]]


def clean_critique(text: str) -> str | None:
    """The whole critique from the judge's continuation of :data:`CRITIQUE_PREFIX` (whitespace
    normalised); None when the continuation is empty."""
    text = " ".join(text.split())
    if not text:
        return None
    return CRITIQUE_PREFIX + ("" if text[0] in ".,:;" else " ") + text


def ranks_from_p_best(p_best: Sequence[float], ties: str, tie_eps: float) -> list[float]:
    """Average ranks from P(best) under the P(best) tie rules: ``chained`` (neighbours closer than
    ``tie_eps`` tie, chained), ``leader`` (scores closer than ``tie_eps`` to their block's best tie),
    ``none`` (only equal probabilities tie)."""
    if ties not in ("chained", "leader", "none"):
        raise ValueError(f"ranks_from_p_best: ties must be chained, leader or none, got {ties!r}")
    return average_ranks(p_best, tie_eps=0.0 if ties == "none" else tie_eps, chain=ties == "chained")


def pairwise_scores(size: int, shown: Sequence[tuple[int, int, float, float]]) -> list[float]:
    """Each candidate's expected share of wins from pairwise presentations ``(i, j, p_i, p_j)``: reply ``i``
    shown first, ``j`` second, and the judge's probability that each helped more. A candidate's score is
    the mean of its probabilities over the presentations it appears in (0 if none)."""
    wins = [0.0] * size
    seen = [0] * size
    for i, j, p_i, p_j in shown:
        wins[i] += p_i
        wins[j] += p_j
        seen[i] += 1
        seen[j] += 1
    return [w / n if n else 0.0 for w, n in zip(wins, seen)]


def balanced_orders(order: Sequence[int]) -> list[list[int]]:
    """The cyclic shifts of ``order``: G presentations in which every candidate appears once in every
    position (a Latin square), so that a judge's preference for a slot cancels out of the mean rank."""
    return [list(order[k:]) + list(order[:k]) for k in range(len(order))]


def _fmt(rank: float) -> str:
    return f"{rank:g}"


class GroupRanker:
    """What the group judges share: :meth:`rank` judges, counts and critiques every group;
    :meth:`critique` picks the candidates a subclass's ``_critiques`` writes for."""

    stats: Counter[str]

    def rank(
        self, scenarios: Sequence[Scenario], groups: Groups, *, with_critiques: bool = True
    ) -> list[GroupJudgement]:
        """Judge each group (``groups[k]`` answers ``scenarios[k]``); results in the caller's order."""
        if len(scenarios) != len(groups):
            raise ValueError(
                f"{type(self).__name__}.rank: {len(scenarios)} scenarios but {len(groups)} groups"
            )
        judged = self._judge(scenarios, groups)
        self.stats["groups"] += len(groups)
        self.stats["invalid_groups"] += sum(not j.valid for j in judged)
        if with_critiques:
            self.critique(scenarios, groups, judged)
        return judged

    def critique(
        self,
        scenarios: Sequence[Scenario],
        groups: Groups,
        judged: Sequence[GroupJudgement],
        which: Sequence[tuple[int, int]] | None = None,
    ) -> None:
        """Fill ``critiques`` in place for the ``(group, candidate)`` pairs in ``which`` (default: every
        candidate) of the valid groups."""
        if which is None:
            which = [(k, i) for k in range(len(groups)) for i in range(len(groups[k]))]
        jobs = [(k, i, ranks) for k, i in which if (ranks := judged[k].ranks) is not None]
        for (k, i, _), text in zip(jobs, self._critiques(scenarios, groups, jobs)):
            judged[k].critiques[i] = text

    def _judge(self, scenarios: Sequence[Scenario], groups: Groups) -> list[GroupJudgement]:
        raise NotImplementedError

    def _critiques(
        self, scenarios: Sequence[Scenario], groups: Groups, jobs: Sequence[CritiqueJob]
    ) -> list[str | None]:
        raise NotImplementedError


class GroupJudge(GroupRanker):
    """Ranks groups of candidate replies by the person's reactions and critiques each candidate."""

    def __init__(
        self,
        engine: ChatEngine,
        cfg: GroupJudgeConfig | None = None,
        *,
        rng: random.Random | None = None,
        **settings: Any,
    ) -> None:
        """``cfg``: the judge's section (e.g. RAPO's ``rapo.judge``), taken whole; ``settings``: fields of
        :class:`~rapo_echo.config.GroupJudgeConfig` given one by one (over ``cfg``'s)."""
        given = cfg.model_dump(include=set(GroupJudgeConfig.model_fields)) if cfg is not None else {}
        self.cfg = GroupJudgeConfig.model_validate({**given, **settings})
        self.screen = JudgeScreen(self.cfg.addressed, self.cfg.addressed_context, owner="GroupJudge")
        self.engine = engine
        self.position_bias = PositionBias()
        self.rng = rng if rng is not None else random.Random(0)
        self.stats: Counter[str] = Counter()
        self._fence: Fence | None = None

    # ------------------------------------------------------------------ prompts
    @property
    def fence(self) -> Fence:
        """The fence of the current batch: drawn from ``rng`` by every :meth:`rank` and :meth:`critique`
        call (one marker per batch, so a group's prompts still share their prefix)."""
        if self._fence is None:
            self._fence = Fence(rng=self.rng)
        return self._fence

    def _context(self, scenario: Scenario, fence: Fence) -> str:
        profile = render_profile(scenario.profile, strip_addressed=False) if self.cfg.show_profile else ""
        about = (
            "What we know about the person (hidden from the supporter):\n"
            + fence.block("PROFILE", profile)
            + "\n\n"
            if profile
            else ""
        )
        dialogue = render_dialogue(scenario.messages)
        shown = fence.block("DIALOGUE", dialogue) if dialogue else "(none: the supporter speaks first)"
        return f"{fence.rules()}\n\n{about}Dialogue so far:\n{shown}\n\n"

    @staticmethod
    def render_reaction(reaction: Reaction | None, fence: Fence | None = None, label: str = "") -> str:
        """The person's reaction as judge-facing lines, what they said and thought in fenced blocks
        (``REACTION <label>``, ``THOUGHT <label>``); ``(no reaction)`` when missing or invalid."""
        if reaction is None or not reaction.valid:
            return "Person's reaction: (no reaction)"
        fence = fence or Fence.derived([reaction.message, reaction.thought])
        tag = f" {label}" if label else ""
        lines = [f"Person's reaction:\n{fence.block('REACTION' + tag, reaction.message)}"]
        if reaction.emotion_delta is not None:
            bound = f"{reaction.scale:g}"
            lines.append(
                f"Emotion change: {reaction.emotion_delta:+.1f} on a -{bound}..+{bound} scale "
                "(negative = feels worse)"
            )
        if reaction.thought:
            lines.append(f"Person's unspoken thought:\n{fence.block('THOUGHT' + tag, reaction.thought)}")
        return "\n".join(lines)

    def _candidate(self, candidate: Candidate, label: str, fence: Fence) -> str:
        reply = fence.block(f"REPLY {label}", candidate.reply)
        return f"Reply {label}:\n{reply}\n{self.render_reaction(candidate.reaction, fence, label)}"

    def rank_prompt(
        self,
        scenario: Scenario,
        group: Sequence[Candidate],
        order: Sequence[int],
        *,
        text_mode: bool,
        fence: Fence | None = None,
    ) -> Conversation:
        """The ranking prompt for one group shown in presentation ``order`` (caller indices): the context,
        replies and reactions in fenced blocks (``fence``, default :attr:`fence`), the instructions
        outside them. Log-prob mode ends with the assistant prefix :data:`BEST_PREFIX`, right before
        the label."""
        fence = fence or self.fence
        labels = LABELS[: len(order)]
        candidates = "\n\n".join(self._candidate(group[i], LABELS[pos], fence) for pos, i in enumerate(order))
        body = (
            self._context(scenario, fence)
            + "The supporter tried these replies; after each is how the person reacted to it.\n\n"
            + candidates
            + "\n\n"
        )
        if text_mode:
            example = ", ".join(f'"{label}"' for label in labels)
            body += (
                f"Rank all {len(labels)} replies from the one that helped the person most to the one that "
                "helped least, judged by the reactions. Answer with one JSON object and nothing else: "
                f'{{"{RANKING_KEY}": [...]}} whose list holds the labels {example} ordered from best to '
                "worst, each exactly once."
            )
            return [msg("system", SYSTEM), msg("user", body)]
        body += "Judged by the reactions, which reply helped the person most?"
        return [msg("system", SYSTEM), msg("user", body), msg("assistant", BEST_PREFIX)]

    def critique_prompt(
        self,
        scenario: Scenario,
        group: Sequence[Candidate],
        ranks: Sequence[float],
        index: int,
        fence: Fence | None = None,
    ) -> Conversation:
        """The critique prompt for candidate ``index`` of a ranked group (contrasted with the best one),
        untrusted text fenced as in :meth:`rank_prompt`; ends with the assistant prefix
        :data:`CRITIQUE_PREFIX`."""
        fence = fence or self.fence
        best = min(range(len(group)), key=lambda i: ranks[i])
        own = group[index]
        body = (
            "Review a supporter's reply by how the person reacted to it.\n\n"
            + self._context(scenario, fence)
            + f"Reply under review (ranked {_fmt(ranks[index])} of {len(group)}, 1 = best):\n"
            + fence.block("REVIEWED REPLY", own.reply)
            + "\n"
            + self.render_reaction(own.reaction, fence, "REVIEWED")
            + "\n\n"
        )
        if ranks[index] > ranks[best]:
            body += (
                "Best-ranked reply, for contrast:\n"
                + fence.block("BEST REPLY", group[best].reply)
                + "\n"
                + self.render_reaction(group[best].reaction, fence, "BEST")
                + "\n\nIn at most three short sentences: what in the person's reaction shows the reply under "
                "review failed, its main mistake, and one concrete hint to do better."
            )
        else:
            body += (
                "In at most three short sentences: what in the person's reaction shows the reply under "
                "review worked, and one concrete hint to make it even better."
            )
        body += " Do not write a new reply."
        return [msg("system", CRITIC_SYSTEM), msg("user", body), msg("assistant", CRITIQUE_PREFIX)]

    # ------------------------------------------------------------------ running
    def _judge(self, scenarios: Sequence[Scenario], groups: Groups) -> list[GroupJudgement]:
        for k, group in enumerate(groups):
            if not 1 <= len(group) <= len(LABELS):
                raise ValueError(f"GroupJudge.rank: group {k} has {len(group)} candidates; allowed 1..26")
        warn_if_weak(self.engine, "judge")
        screened = [self._screen_group(sc, group) for sc, group in zip(scenarios, groups)]
        todo = [k for k, (_, kept, _, bad, _) in enumerate(screened) if not bad and kept]
        lowered = [k for k in todo if screened[k][4] is not None]  # under `lower`: judged set aside too
        shown_scenarios = [screened[k][0] for k in todo] + [screened[k][4][0] for k in lowered]  # type: ignore[index]  # screened[k][4] is not None for k in lowered
        shown_groups = [screened[k][2] for k in todo] + [screened[k][4][1] for k in lowered]  # type: ignore[index]  # screened[k][4] is not None for k in lowered
        self._fence = Fence(rng=self.rng)
        passes = self._presentation_orders(shown_groups)
        text_mode = not wants_logprobs(self.engine, self.cfg.use_logprobs)
        judged_shown = (
            self._rank_text(shown_scenarios, shown_groups, passes)
            if text_mode
            else self._rank_logprobs(shown_scenarios, shown_groups, passes)
        )
        by_group = dict(zip(todo, judged_shown))
        for k, aside in zip(lowered, judged_shown[len(todo) :]):
            by_group[k] = self._lower(by_group[k], aside, screened[k][4][2])  # type: ignore[index]  # screened[k][4] is not None for k in lowered
        return [
            self._expand(len(group), screened[k][1], screened[k][3], by_group.get(k))
            for k, group in enumerate(groups)
        ]

    def step_metrics(self) -> dict[str, float]:
        """This step's position bias (``judge/position_bias/*``) and the texts that addressed the judge
        (``judge/addressed*``), since the last call."""
        return {**self.position_bias.step_metrics(), **self.screen.step_metrics()}

    def _screen_group(
        self, scenario: Scenario, group: Sequence[Candidate]
    ) -> tuple[
        Scenario, list[int], list[Candidate], bool, tuple[Scenario, list[Candidate], list[bool]] | None
    ]:
        """A group through :attr:`screen`: (the scenario to show, the indices of the candidates the model
        judges, those candidates as shown, whether the group is invalid under an ``invalid`` policy, and
        under ``lower`` the set-aside scenario and candidates with which of them were suspect, or None)."""
        views = self.screen.views(scenario)
        kept: list[int] = []
        cands: list[Candidate] = []
        asides: list[Candidate] = []
        suspect: list[bool] = []
        bad = self.screen.context_invalid(views.hit)
        for i, cand in enumerate(group):
            reply = self.screen.reply(cand.reply)
            reaction, r_hit = self._screen_reaction(cand.reaction)
            bad = bad or reply.invalid or self.screen.context_invalid(r_hit)
            if reply.judged and not reply.floored:
                kept.append(i)
                same = reply.text == cand.reply and reaction is cand.reaction
                cands.append(cand if same else Candidate(reply.text, reaction))
                lowered = r_hit and self.screen.context_policy == "lower"
                aside_reaction = self._aside_reaction(cand.reaction) if lowered else reaction
                aside = reply.text if reply.aside is None else reply.aside
                asides.append(Candidate(aside, aside_reaction))
                suspect.append(views.aside is not None or reply.aside is not None or lowered)
        if not any(suspect):
            return views.scenario, kept, cands, bad, None
        return views.scenario, kept, cands, bad, (views.aside or views.scenario, asides, suspect)

    def _aside_reaction(self, reaction: Reaction | None) -> Reaction | None:
        if reaction is None:
            return None
        message, thought = self.screen.aside_text(reaction.message), self.screen.aside_text(reaction.thought)
        return replace(reaction, message=message, thought=thought)

    def _lower(self, full: GroupJudgement, aside: GroupJudgement, suspect: Sequence[bool]) -> GroupJudgement:
        """A group judged as written (``full``) and set aside: each ``suspect`` candidate takes the worse of
        its two ranks and the lower P(best), the others their standing against the set-aside texts."""
        if not aside.valid or aside.ranks is None:
            return aside
        if not full.valid or full.ranks is None:  # nothing suspect in the set-aside reading: it stands
            return replace(aside, raw=[*full.raw, *aside.raw])
        ranks, scores = [], []
        both = full.scores is not None and aside.scores is not None
        for i, lowered in enumerate(suspect):
            if lowered and aside.ranks[i] > full.ranks[i]:
                self.screen.counts["lowered"] += 1
            ranks.append(max(full.ranks[i], aside.ranks[i]) if lowered else aside.ranks[i])
            if both:
                mine = aside.scores[i]  # type: ignore[index]  # both: each side has scores
                scores.append(min(full.scores[i], mine) if lowered else mine)  # type: ignore[index]  # both: each side has scores
        return replace(full, ranks=ranks, scores=scores if both else None, raw=[*full.raw, *aside.raw])

    def _screen_reaction(self, reaction: Reaction | None) -> tuple[Reaction | None, bool]:
        if reaction is None or not reaction.valid:
            return reaction, False
        message, m_hit = self.screen.context_text(reaction.message)
        thought, t_hit = self.screen.context_text(reaction.thought)
        if not (m_hit or t_hit):
            return reaction, False
        return replace(reaction, message=message, thought=thought), True

    @staticmethod
    def _expand(size: int, kept: Sequence[int], bad: bool, shown: GroupJudgement | None) -> GroupJudgement:
        """The judgement of a whole group from the judgement of its ``kept`` candidates: each kept one keeps
        its rank and score, the others (floored) share the last ranks with P(best) 0; all of them floored:
        one tie. ``bad`` or an invalid judgement: the group is invalid."""
        if bad or (kept and (shown is None or not shown.valid)):
            raw, attempts = (shown.raw, shown.attempts) if shown is not None else ([], 0)
            return GroupJudgement(None, [None] * size, None, False, raw, attempts)
        if len(kept) == size and shown is not None:
            return shown
        floor_rank = (len(kept) + 1 + size) / 2
        ranks = [floor_rank] * size
        scores: list[float] | None = [0.0] * size
        for pos, i in enumerate(kept):
            ranks[i] = shown.ranks[pos]  # type: ignore[union-attr,index]  # shown is set when kept
            if shown.scores is None:  # type: ignore[union-attr]  # shown is set when kept
                scores = None
            elif scores is not None:
                scores[i] = shown.scores[pos]  # type: ignore[union-attr]  # shown is set when kept
        raw, attempts = (shown.raw, shown.attempts) if shown is not None else ([], 0)
        return GroupJudgement(ranks, [None] * size, scores, True, raw, attempts)

    def _presentation_orders(self, groups: Groups) -> list[list[list[int]]]:
        """Per group, the presentation orders of its passes (caller indices): one order (shuffled with
        ``shuffle``), or under ``orders`` ``both`` (or ``auto`` while biased) its G cyclic shifts, a
        balanced set in which every candidate is shown once in every position; ``reverse_pass`` adds each
        order reversed."""
        every = self.position_bias.both_orders(self.cfg.orders, self.cfg.auto_probe, self.cfg.auto_threshold)
        out = []
        for group in groups:
            order = list(range(len(group)))
            if self.cfg.shuffle:
                self.rng.shuffle(order)
            shown = balanced_orders(order) if every else [order]
            both = self.cfg.reverse_pass
            out.append([o for base in shown for o in ([base, base[::-1]] if both else [base])])
        return out

    def _tally(self, ranks: Sequence[float], order: Sequence[int]) -> None:
        """Record one presentation's decision for :attr:`position_bias`: the share of rank 1 that went to
        the candidate shown first, against the chance 1 / G."""
        if len(order) > 1:
            self.position_bias.add(first_rank_share(ranks, order[0]), 1.0 / len(order))

    def _combine(self, per_pass: Sequence[list[float]]) -> list[float]:
        """One rank vector from the passes' rank vectors: their mean, re-ranked with average ranks."""
        if len(per_pass) == 1:
            return per_pass[0]
        mean = [sum(col) / len(col) for col in zip(*per_pass)]
        return average_ranks(mean, higher_is_better=False)

    def _rank_logprobs(
        self, scenarios: Sequence[Scenario], groups: Groups, passes: Sequence[Sequence[Sequence[int]]]
    ) -> list[GroupJudgement]:
        many = [k for k in range(len(groups)) if len(groups[k]) > 1]
        found: dict[int, tuple[list[float], list[float]] | None]
        if self.cfg.ties == "pairwise":
            found = self._pairwise(scenarios, groups, many)
        else:
            jobs = [(k, order) for k in many for order in passes[k]]
            rank_sets, score_sets = (
                self._sequential(scenarios, groups, jobs)
                if self.cfg.ties == "sequential"
                else self._p_best(scenarios, groups, jobs)
            )
            found = {}
            for k in many:
                if k not in rank_sets or len(rank_sets[k]) < len(passes[k]):  # a pass was unusable
                    found[k] = None
                    continue
                ranks = self._combine(rank_sets[k])
                found[k] = (ranks, [sum(col) / len(col) for col in zip(*score_sets[k])])
        out = []
        for k, group in enumerate(groups):
            if len(group) == 1:
                out.append(GroupJudgement([1.0], [None], [1.0], True, [], attempts=0))
                continue
            result = found[k]
            if result is None:
                out.append(GroupJudgement(None, [None] * len(group), None, False, []))
                continue
            ranks, scores = result
            out.append(GroupJudgement(ranks, [None] * len(group), scores, True, []))
        bad = sum(found[k] is None for k in many)
        if bad:
            log.warning(
                "judge engine %s: %d of %d groups got no usable label probabilities (NaN, or no label among "
                "the top log-probs); those groups are invalid",
                describe_engine(self.engine),
                bad,
                len(groups),
            )
        return out

    def _best_probs(
        self, scenarios: Sequence[Scenario], groups: Groups, jobs: Sequence[Job]
    ) -> list[list[float] | None]:
        """One batched ``choice_logprobs`` call: for each ``(group, presentation order)`` job, P(best) of
        each shown candidate, in presentation order; None where the label log-probs are unusable
        (:func:`~rapo_echo.llm.labels.usable_probabilities`)."""
        if not jobs:
            return []
        width = max(len(order) for _, order in jobs)
        prompts = [self.rank_prompt(scenarios[k], groups[k], o, text_mode=False) for k, o in jobs]
        logprobs = self.engine.choice_logprobs(prompts, label_options(width))
        self.stats["rank_calls"] += 1
        out: list[list[float] | None] = []
        for (_, order), lp in zip(jobs, logprobs):
            options = label_options(len(order))
            p_best = usable_probabilities(lp, options)
            out.append(None if p_best is None else [p_best[o] for o in options])
        return out

    def _p_best(
        self, scenarios: Sequence[Scenario], groups: Groups, jobs: Sequence[Job]
    ) -> tuple[PassSets, PassSets]:
        """Ranks by P(best) (ties: ``chained``, ``leader`` or ``none``), per group one rank and one score
        vector per usable pass, in the caller's order."""
        rank_sets: PassSets = {}
        score_sets: PassSets = {}
        for (k, order), shown in zip(jobs, self._best_probs(scenarios, groups, jobs)):
            if shown is None:
                continue
            scores = [0.0] * len(order)
            for pos, i in enumerate(order):
                scores[i] = shown[pos]
            score_sets.setdefault(k, []).append(scores)
            ranks = ranks_from_p_best(scores, self.cfg.ties, self.cfg.tie_eps)
            rank_sets.setdefault(k, []).append(ranks)
            self._tally(ranks, order)
        return rank_sets, score_sets

    def _sequential(
        self, scenarios: Sequence[Scenario], groups: Groups, jobs: Sequence[Job]
    ) -> tuple[PassSets, PassSets]:
        """Listwise selection: each round asks every job with two or more candidates left which one helped
        most (one batched call), gives it the next rank and removes it; the last one left takes rank G.
        The scores are the first round's P(best). A job with an unusable round is dropped."""
        left = [list(order) for _, order in jobs]
        ranks = [[0.0] * len(order) for _, order in jobs]
        first: list[list[float]] = [[0.0] * len(order) for _, order in jobs]
        failed: set[int] = set()
        place = 1
        while True:
            active = [j for j, rest in enumerate(left) if len(rest) > 1 and j not in failed]
            if not active:
                break
            shown = self._best_probs(scenarios, groups, [(jobs[j][0], left[j]) for j in active])
            for j, probs in zip(active, shown):
                if probs is None:
                    failed.add(j)
                    continue
                if place == 1:
                    for pos, i in enumerate(left[j]):
                        first[j][i] = probs[pos]
                pick = max(range(len(probs)), key=probs.__getitem__)  # first shown wins an exact tie
                ranks[j][left[j].pop(pick)] = float(place)
            place += 1
        for j, rest in enumerate(left):
            for i in rest:
                ranks[j][i] = float(len(jobs[j][1]))
        rank_sets: PassSets = {}
        score_sets: PassSets = {}
        for j, ((k, order), r, f) in enumerate(zip(jobs, ranks, first)):
            if j not in failed:
                self._tally(r, order)
                rank_sets.setdefault(k, []).append(r)
                score_sets.setdefault(k, []).append(f)
        return rank_sets, score_sets

    def _pairwise(
        self, scenarios: Sequence[Scenario], groups: Groups, many: Sequence[int]
    ) -> dict[int, tuple[list[float], list[float]] | None]:
        """Every ordered pair of each group in one batched call; scores from :func:`pairwise_scores`, ranks
        by score (exact ties only); None for a group with an unusable pair. Presentation shuffling and
        ``reverse_pass`` are moot: both orders of every pair are asked."""
        jobs = [
            (k, [i, j]) for k in many for i in range(len(groups[k])) for j in range(len(groups[k])) if i != j
        ]
        shown: dict[int, list[tuple[int, int, float, float]]] = {k: [] for k in many}
        failed: set[int] = set()
        for (k, (i, j)), probs in zip(jobs, self._best_probs(scenarios, groups, jobs)):
            if probs is None:
                failed.add(k)
            else:
                shown[k].append((i, j, probs[0], probs[1]))
                won = 1.0 if probs[0] > probs[1] else 0.5 if probs[0] == probs[1] else 0.0
                self.position_bias.add(won, 0.5)
        out: dict[int, tuple[list[float], list[float]] | None] = {}
        for k in many:
            scores = pairwise_scores(len(groups[k]), shown[k])
            out[k] = None if k in failed else (average_ranks(scores), scores)
        return out

    def _rank_text(
        self, scenarios: Sequence[Scenario], groups: Groups, passes: Sequence[Sequence[Sequence[int]]]
    ) -> list[GroupJudgement]:
        jobs = [(k, order) for k, orders in enumerate(passes) if len(groups[k]) > 1 for order in orders]
        results_by_group: dict[int, list[tuple[Sequence[int], Parsed[list[float]]]]] = {}
        if jobs:
            prompts = [self.rank_prompt(scenarios[k], groups[k], o, text_mode=True) for k, o in jobs]
            fence = self.fence
            parsers = [  # each answer read against its own prompt's fenced texts
                partial(read_ranking, fence=fence.within(p), labels=LABELS[: len(o)], engine=self.engine)
                for p, (_, o) in zip(prompts, jobs)
            ]
            sizes = {len(o) for _, o in jobs}
            # one declared format per call: groups of one size share it; mixed sizes go size by size
            parsed_by_job: dict[int, Parsed[list[float]]] = {}
            for size in sorted(sizes):
                idx = [n for n, (_, o) in enumerate(jobs) if len(o) == size]
                for n, p in zip(
                    idx,
                    generate_parsed(
                        self.engine,
                        [prompts[n] for n in idx],
                        [parsers[n] for n in idx],
                        SamplingParams(max_new_tokens=self.cfg.max_new_tokens, temperature=0.0),
                        max_retries=self.cfg.max_retries,
                        answer_format=ranking_format(size),
                    ),
                ):
                    parsed_by_job[n] = p
            parsed = [parsed_by_job[n] for n in range(len(jobs))]
            self._count_calls("rank", parsed)
            for (k, order), p in zip(jobs, parsed):
                results_by_group.setdefault(k, []).append((order, p))
        out = []
        for k, group in enumerate(groups):
            if len(group) == 1:
                out.append(GroupJudgement([1.0], [None], None, True, [], attempts=0))
                continue
            results = results_by_group[k]
            raw = [p.raw for _, p in results]
            attempts = max(p.attempts for _, p in results)
            if any(p.value is None for _, p in results):
                out.append(GroupJudgement(None, [None] * len(group), None, False, raw, attempts))
                continue
            rank_sets = []
            for order, p in results:
                ranks = [0.0] * len(group)
                for pos, i in enumerate(order):
                    ranks[i] = (p.value or [])[pos]
                rank_sets.append(ranks)
                self._tally(ranks, order)
            out.append(
                GroupJudgement(self._combine(rank_sets), [None] * len(group), None, True, raw, attempts)
            )
        return out

    def _critiques(
        self, scenarios: Sequence[Scenario], groups: Groups, jobs: Sequence[CritiqueJob]
    ) -> list[str | None]:
        """One batched generation for all the ``(group, candidate)`` jobs."""
        if not jobs:
            return []
        # the critic reads the texts without what addresses the judge (not counted again)
        scenarios = [self.screen.scenario(sc, count=False)[0] for sc in scenarios]
        groups = [
            [Candidate(set_aside(c.reply), c.reaction) if addresses_judge(c.reply) else c for c in g]
            for g in groups
        ]
        self._fence = fence = Fence(rng=self.rng)
        prompts = [self.critique_prompt(scenarios[k], groups[k], ranks, i) for k, i, ranks in jobs]
        parsed = generate_parsed(
            self.engine,
            prompts,
            lambda text: clean_critique(fence.own_words(CRITIQUE_FORMAT.parse(text) or "")),
            SamplingParams(max_new_tokens=self.cfg.critique_tokens, temperature=0.0, stop=CRITIQUE_STOP),
            max_retries=self.cfg.max_retries,
            answer_format=CRITIQUE_FORMAT,
        )
        self._count_calls("critique", parsed)
        self.stats["failed_critiques"] += sum(p.value is None for p in parsed)
        return [p.value for p in parsed]

    def _count_calls(self, stage: str, parsed: Sequence[Parsed]) -> None:
        """Engine calls made (the most attempts any prompt needed) and prompts asked again."""
        self.stats[f"{stage}_calls"] += max((p.attempts for p in parsed), default=0)
        self.stats[f"{stage}_retries"] += sum(max(p.attempts - 1, 0) for p in parsed)

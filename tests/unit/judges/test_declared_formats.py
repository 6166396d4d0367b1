"""Every generation a judge or a reward asks for declares its AnswerFormat (issue 29 item 1), so that an
engine with constrained decoding can only write a parseable answer: the scripted engine (which checks its
replies against the declared format) plays such an engine, and a recorder lists what each call declared."""

from __future__ import annotations

import math
import random

from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.judges.empathy import EmpathyJudge, NeedAnalysis
from rapo_echo.judges.group import CRITIQUE_FORMAT, Candidate, GroupJudge, ranking_format
from rapo_echo.judges.humanlike import HumanlikeJudge
from rapo_echo.judges.verdict import REASONING_LINE, verdict_format
from rapo_echo.llm.answers import FIELD_LINE
from rapo_echo.llm.reaction import Reaction
from rapo_echo.rewards.persona import PersonaInference
from rapo_echo.types import Scenario, msg
from tests.helpers.formats import record_formats

SCENARIO = Scenario("s", [msg("user", "I failed my driving test again.")], {"need": "encouragement"})


def test_need_analysis_and_persona_lines_declare_one_bounded_line() -> None:
    engine = ScriptedEngine(default=" to be heard and understood")
    formats = record_formats(engine)
    [needs] = EmpathyJudge(engine).analyse([SCENARIO])
    assert needs is not None and formats == [FIELD_LINE]
    persona = PersonaInference(engine)
    assert persona.infer([SCENARIO])[0] is not None and formats == [FIELD_LINE, FIELD_LINE]
    assert FIELD_LINE.problem("two\nlines") is not None and FIELD_LINE.problem("x" * 401) is not None


def test_reasoning_line_in_logprob_mode_then_the_label() -> None:
    engine = ScriptedEngine(default=" It reads casual.", choice_fn=lambda p, o: dict.fromkeys(o, 0.0))
    formats = record_formats(engine)
    HumanlikeJudge(engine, reasoning=True).score([([], "lol same")])
    assert formats == [REASONING_LINE]


def test_text_mode_verdicts_of_every_comparison_stage_declare_the_json_verdict() -> None:
    engine = ScriptedEngine(
        rules=[(r"Which need is most pressing", '{{"verdict": "A"}}'), (r"Reply A", '{{"verdict": "tie"}}')]
    )
    formats = record_formats(engine)
    judge = EmpathyJudge(engine, use_logprobs="never")
    needs = NeedAnalysis("a b", "c d", "e f")
    [dominant] = judge.dominant([SCENARIO], [needs])
    [verdict] = judge.compare([(SCENARIO, needs, "x", "y")])
    assert (dominant.label, verdict.label) == ("A", "tie")
    assert formats == [verdict_format(("C", "A", "P"), False), verdict_format(("A", "B", "tie"), False)]


def test_group_ranking_and_critiques_declare_their_formats() -> None:
    def fn(prompt):
        if prompt[0]["content"].startswith("You coach"):
            return " they felt heard.\nKeep asking."
        return '{"ranking": ["B", "A"]}'

    engine = ScriptedEngine(fn=fn)
    formats = record_formats(engine)
    group = [Candidate(r, Reaction(f"reaction to {r}", 1.0, "", True)) for r in ("a", "b")]
    [out] = GroupJudge(engine, use_logprobs="never", rng=random.Random(0)).rank([SCENARIO], [group])
    assert out.valid and all(c is not None for c in out.critiques)
    assert formats == [ranking_format(2), CRITIQUE_FORMAT]


def test_a_logprob_row_without_any_label_falls_back_to_a_declared_label() -> None:
    # every label at probability 0 (e.g. none among a server's top log-probs): the label is generated
    # after the same prefix, under a choice of the labels
    engine = ScriptedEngine(default=" human", choice_fn=lambda p, o: dict.fromkeys(o, -math.inf))
    formats = record_formats(engine)
    [score] = HumanlikeJudge(engine).score([([], "lol same")])
    assert score.p_human == 1.0 and formats[0].kind == "choice" and formats[0].choices == ("human", "AI")

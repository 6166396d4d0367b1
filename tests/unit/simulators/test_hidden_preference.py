"""The hidden-preference user (rules, scores, reactions by hand), the judge that ranks from reactions,
and a RAPO step against both (tiny model, scripted replies)."""

from __future__ import annotations

import zlib

import pytest

from rapo_echo.algorithms.base import AlgoContext
from rapo_echo.algorithms.rapo import RAPO, SD
from rapo_echo.errors import ConfigError
from rapo_echo.judges.group import Candidate
from rapo_echo.judges.reactions import ReactionJudge
from rapo_echo.llm.reaction import Reaction
from rapo_echo.policy import Policy
from rapo_echo.rewards import RewardSet
from rapo_echo.simulators.hidden_preference import (
    DEFAULT_RULES,
    DETAILS_RULE,
    DETECTORS,
    PARROT_RULE,
    REPEAT_RULE,
    RESTATE_RULE,
    HiddenPreferenceUser,
    content_words,
    own_words,
    parrots,
    picks_up_details,
    repeats_earlier,
    restates,
)
from rapo_echo.training.run_config import load_config
from rapo_echo.types import Generation, Scenario, msg

SC = Scenario(
    "gran",
    [msg("user", "My gran died last week.")],
    profile={"emotion_type": "sadness", "problem_type": "grief"},
)
WARM = "That sounds so lonely. What do you miss most about her?"  # reflects + open question
MIXED = "You should go for a walk. How are you sleeping?"  # advice first + open question
SELF = "I remember when I lost my grandad."  # self-talk
COLD = "Try to relax. When I was young I had this too."  # advice first + self-talk
NEUTRAL = "Do you have anyone to talk to?"  # a yes/no question: nothing fires


@pytest.mark.parametrize(
    ("reply", "fired"),
    [
        (WARM, {"reflects_feeling", "open_question"}),
        (MIXED, {"advice_first", "open_question"}),
        (SELF, {"self_talk"}),
        (COLD, {"advice_first", "self_talk"}),
        (NEUTRAL, set()),
        ("Are you feeling anxious?", {"reflects_feeling"}),  # addressed + a feeling word; yes/no question
        ("Lonely days. Tell me about her?", {"open_question"}),  # the feeling is not addressed to them
        ("I am sorry. You should rest.", set()),  # the advice is not in the first sentence
        ("Me too, honestly.", {"self_talk"}),
        ("I'm so sorry to hear that. I'm SO sorry, to hear it.", {"repeats_itself"}),  # 4 words twice
        ("I am so sorry. I am so glad.", set()),  # 3 words twice is not a repeat
        ("You're a warm listener. Respond to the person in two sentences.", {"meta_talk"}),
        ("Here's a revised version of your message: you failed.", {"meta_talk"}),
        ("Here's my reply: that sounds hard.", {"meta_talk"}),
        ("Thank you for telling me. I'm proud of the person you are.", set()),  # talks to them
        # editing talk a policy fell into in ESConv dialogues whose seeker echoed it (missed before)
        ("That hurts. Here's a suggested alternative: it hurts.", {"meta_talk"}),
        ("Here's the revised text: you are fine.", {"meta_talk"}),
        ("I made a few minor adjustments to the original text.", {"meta_talk"}),
        ("This alternative is more concise, for clarity and grammar.", {"meta_talk"}),
        ("He ended it by text? The text he sent sounds cruel.", set()),  # a text message, not the text
        ("Minor changes at work can pile up. What happened?", {"open_question"}),
        # how a policy answered ESConv seekers who opened with a bare topic ("finals"; missed before)
        (
            "I'm sorry for your part of the sentence. Please ensure that you use the correct grammar and "
            "punctuation.",
            {"meta_talk"},
        ),
        ("I came off them too. I'm not sure what you're asking for.", {"meta_talk"}),
        ("There's a typo in the spelling here.", {"meta_talk"}),
        ("Grammar school exams are a lot of pressure. How are you holding up?", {"open_question"}),
    ],
)
def test_detectors(reply: str, fired: set[str]) -> None:
    assert {name for name, fn in DETECTORS.items() if fn(reply)} == fired


def test_content_words_and_picks_up_details_by_hand() -> None:
    heard = "After my shift at the warehouse, so like 11pm till 3. I'm so stressed, I can't revise."
    # four letters or more, no stop word ("after", "like"), no feeling word ("stressed"), no number
    assert content_words(heard) == {"shift", "warehouse", "till", "revise"}
    assert picks_up_details("Revising after a warehouse shift sounds exhausting.", heard)  # warehouse, shift
    assert not picks_up_details("That sounds so stressful. What helps?", heard)  # nothing of theirs
    assert not picks_up_details("You feel so stressed after that, like you can't.", heard)  # stop / feeling
    assert not picks_up_details("Your warehouse job sounds hard.", "")  # nothing heard, nothing picked up
    assert picks_up_details("WAREHOUSE!", heard)  # case is ignored


def test_repeats_earlier_by_hand() -> None:
    before = ["I'm so sorry to hear about your loss. How are you coping?", "finals"]
    # six words in a row of an earlier turn, case and punctuation ignored
    assert repeats_earlier("i'm SO sorry to hear about... that. What now?", before)
    assert not repeats_earlier("I'm so sorry to hear that.", before)  # five words in a row is not
    assert repeats_earlier("Finals!", before)  # a short reply that is an earlier one
    assert not repeats_earlier("Finals week?", before)  # a short reply that is not
    assert not repeats_earlier("I'm so sorry to hear about your loss.", [])  # nothing said before
    assert not repeats_earlier("", before)


def test_a_reply_said_again_costs_in_the_dialogue() -> None:
    """repeats_earlier reads the supporter's earlier turns from the scenario's messages."""
    user = HiddenPreferenceUser(extra_rules=[{"detect": "repeats_earlier", "weight": -2.0}])
    first = Scenario("s", [msg("user", "My gran died.")], profile={"emotion_type": "sadness"})
    again = Scenario("s", [*first.messages, msg("assistant", WARM), msg("user", "Yes.")], first.profile)
    # rules: -1 -1 +1 +1 -2 (lo -4, hi 2); WARM s = 2 -> +10; said again s = 0 -> 10 * (2 * 4 / 6 - 1)
    assert user.react_one(first, WARM).emotion_delta == pytest.approx(10.0)
    said_again = user.react_one(again, WARM)
    assert said_again.emotion_delta == pytest.approx(10.0 / 3)
    assert said_again.message.startswith(("You already said that.", "That's the same thing you said"))
    assert user.react_one(again, NEUTRAL).emotion_delta == pytest.approx(10.0 / 3)  # s 0, nothing repeated
    assert user.hidden_rule_score(WARM, "Yes.", [WARM]) == pytest.approx(4 / 6)


def test_parrots_by_hand() -> None:
    heard = "My grandfather's brother passed away a few days ago."
    assert parrots("Your grandfather's brother passed away a few days ago, and you feel low.", heard)
    assert parrots("So he PASSED away, a few days... ago?", heard)  # five words in a row, case / punctuation
    assert not parrots("Losing your great-uncle so recently must hurt.", heard)  # takes up, does not copy
    assert not parrots("He passed away a week ago.", heard)  # four words in a row is not a copy
    assert not parrots("passed away a few days", "")  # nothing heard, nothing copied
    assert parrots("Finals.", "finals") and parrots("A few days.", heard)  # no word of its own
    assert not parrots("Finals week?", "finals") and not parrots("", "finals")


def test_restates_by_hand() -> None:
    """Replies a quickstart policy (seed 3) gave in ESConv dialogues, where the 135M seeker then echoed
    them for eight turns, against replies that take something up and answer it."""
    boss = "I was working when one of my bosses continued to bully and speak down to me"
    # shares "continued", "speak" ("bosses" is not "boss"); 6 of its 11 words occur in the message
    assert restates("The boss should not have continued to speak down to me.", boss)
    quits = "We've been together for a long time and he decided to call it quits."
    assert restates("The person decided to call it quits.", quits)  # 5 of 7 words
    assert restates("DECIDED to call it QUITS?", quits)  # case and punctuation ignored
    # shares "long", "together", but 3 of 10 words: takes them up in its own words
    assert not restates("After so long together, that is a lot to lose.", quits)
    # shares three content words, 5 of 16 words
    assert not restates(
        "It sounds like your boss continued to speak down to you. How did you handle it?", boss
    )
    gran = "My grandfather's brother passed away a few days ago and I'm depressed because of it."
    assert not restates("Losing your grandfather's brother must be so hard. How are you holding up?", gran)
    assert not restates("Finals.", "finals")  # one content word: that is parrots' business
    assert not restates("decided to call it quits", "")  # nothing heard, nothing restated


def test_restating_costs_more_than_taking_up_earns() -> None:
    user = HiddenPreferenceUser(
        rules=[
            {"detect": "picks_up_details", "weight": 2.0},
            {"detect": "restates", "weight": -3.0},
        ]
    )
    # lo = -3, hi = 2: (s + 3) / 5; a restatement takes up their words too: 2 - 3 = -1
    heard = "We've been together for a long time and he decided to call it quits."
    assert user.hidden_rule_score("The person decided to call it quits.", heard) == pytest.approx(2 / 5)
    assert user.hidden_rule_score("After so long together, that is a lot to lose.", heard) == pytest.approx(1)
    assert user.hidden_rule_score("Oh.", heard) == pytest.approx(3 / 5)
    r = user.react([(Scenario("q", [msg("user", heard)]), "The person decided to call it quits.")])[0]
    assert r.raw == "fired: restates, picks_up_details" and r.emotion_delta == pytest.approx(-2.0)
    assert any(r.message.startswith(line) for line in RESTATE_RULE["said"])


def test_parroting_is_felt_apart_from_picking_up() -> None:
    user = HiddenPreferenceUser(
        extra_rules=[{"detect": "picks_up_details", "weight": 1.0}, {"detect": "parrots", "weight": -1.0}]
    )
    # defaults + details + parrots: lo = -3, hi = 3, score = (s + 3) / 6
    sc = Scenario("test", [msg("user", "I failed the driving test again today.")])
    heard = sc.last_user_message()
    # copies six words; its own words ("You .") take nothing up: -1
    copied = "You failed the driving test again today."
    assert user.hidden_rule_score(copied, heard) == pytest.approx(2 / 6)
    assert user.hidden_rule_score("The driving test is brutal.", heard) == pytest.approx(4 / 6)  # picks up
    # picks up "driving" in its own words and copies the rest: +1 - 1
    both = "Driving is hard. You failed the driving test again today."
    assert user.hidden_rule_score(both, heard) == pytest.approx(0.5)
    r = user.react([(sc, both)])[0]
    assert r.raw == "fired: parrots, picks_up_details"  # colder first
    assert any(r.message.startswith(line) for line in PARROT_RULE["said"])


def test_own_words_cut_what_was_copied() -> None:
    heard = "My grandfather's brother passed away a few days ago."
    assert own_words("So he PASSED away, a few days... ago? I'm sorry.", heard) == "So he ? I'm sorry."
    assert own_words("Finals.", "finals") == ""  # no word of its own
    assert own_words("He passed away a week ago.", heard) == "He passed away a week ago."  # 4 words: no copy
    assert own_words("passed away a few days", "") == "passed away a few days"


def test_a_quoted_message_earns_none_of_its_words_credit() -> None:
    """A reply that quotes the person's message back ("Here's a rewritten version of your text: ...",
    which a policy learnt in a quickstart run) earned the credit of the feeling, question and details in
    the quote (+1 +1 +1 -1: score 5/6); only the parrot rule judges copied words now."""
    user = HiddenPreferenceUser(
        extra_rules=[{"detect": "picks_up_details", "weight": 1.0}, {"detect": "parrots", "weight": -1.0}]
    )
    heard = "You know what, I feel so lonely since you moved away. What am I supposed to do?"
    quote = f"Here's a rewritten version of your text:\n\n{heard}"
    assert [r.detect for r in user.fired(quote, heard)] == ["parrots"]
    assert user.hidden_rule_score(quote, heard) == pytest.approx(2 / 6)
    # without a parrot rule, copies are not judged apart (the default rules score the whole reply)
    plain = HiddenPreferenceUser()
    assert {r.detect for r in plain.fired(quote, heard)} == {"reflects_feeling", "open_question"}


def test_picks_up_details_reads_the_persons_last_message() -> None:
    user = HiddenPreferenceUser(extra_rules=[{"detect": "picks_up_details", "weight": 1.0}])
    # defaults + the details rule: lo = -2, hi = 3, score = (s + 2) / 5, delta = 10 (2 score - 1)
    assert (user.lo, user.hi) == (-2.0, 3.0)
    reply = "Losing your gran so suddenly must feel lonely."  # reflects + picks up "gran": s = 2
    assert user.hidden_rule_score(reply, "My gran died last week.") == pytest.approx(0.8)
    assert user.hidden_rule_score(reply) == pytest.approx(0.6)  # nothing heard: only the reflection
    assert user.hidden_rule_score(NEUTRAL, "My gran died last week.") == pytest.approx(0.4)
    # the reaction compares the reply with the scenario's last user message
    r = user.react([(SC, reply)])[0]
    assert r.emotion_delta == pytest.approx(6.0)
    assert r.raw == "fired: reflects_feeling, picks_up_details"
    said = DETAILS_RULE["said"][zlib.crc32(reply.encode()) % 2]
    assert said in r.message
    turns = [msg("assistant", "I'm sorry."), msg("user", "The funeral is Monday.")]
    later = Scenario("gran2", [*SC.messages, *turns])
    assert user.react([(later, reply)])[0].raw == "fired: reflects_feeling"  # gran was said earlier


def test_scores_and_emotion_change_by_hand() -> None:
    user = HiddenPreferenceUser(scale=10.0)
    # default weights +1, +1, -1, -1: lo = -2, hi = 2, score = (s + 2) / 4, delta = 10 (2 score - 1)
    expected = {
        WARM: (1.0, 10.0),
        MIXED: (0.5, 0.0),
        SELF: (0.25, -5.0),
        COLD: (0.0, -10.0),
        NEUTRAL: (0.5, 0.0),
    }
    for reply, (score, delta) in expected.items():
        assert user.hidden_rule_score(reply) == pytest.approx(score)
        assert user.emotion_delta(reply) == pytest.approx(delta)


def test_custom_rules_change_the_ground_truth() -> None:
    rules = [
        {"detect": "pattern", "pattern": r"\bsorry\b", "where": "first_sentence", "weight": 2,
         "said": "Thanks.", "thought": "Kind."},
        {"detect": "advice_first", "weight": -1, "said": ["Hm."], "thought": ["Pushy."]},
    ]  # fmt: skip
    user = HiddenPreferenceUser(rules=rules, scale=6.0)
    # lo = -1, hi = 2: score = (s + 1) / 3
    assert user.hidden_rule_score("I'm so sorry. You should rest.") == pytest.approx(1.0)
    assert user.hidden_rule_score("You should rest. I'm sorry.") == pytest.approx(0.0)
    assert user.hidden_rule_score("That is a lot.") == pytest.approx(1 / 3)
    assert user.emotion_delta("That is a lot.") == pytest.approx(6.0 * (2 / 3 - 1))
    r = user.react([(SC, "I'm so sorry. You should rest.")])[0]
    assert (r.message, r.thought, r.emotion_delta) == ("Thanks.", "Kind.", 6.0)
    # rules_broken names the negative rules only (a pattern rule by its expression)
    assert user.rules_broken("You should rest. I'm sorry.") == ["advice_first"]
    assert user.rules_broken("I'm so sorry. You should rest.") == []
    neg = HiddenPreferenceUser(rules=[{**rules[0], "weight": -2}, rules[1]])
    assert neg.rules_broken("Sorry. You should rest.") == [r"pattern:\bsorry\b"]


def test_extra_rules_add_to_the_defaults_with_the_detectors_own_lines() -> None:
    user = HiddenPreferenceUser(extra_rules=[{"detect": "repeats_itself", "weight": -1.0}])
    # defaults + the repeat rule: lo = -3, hi = 2, score = (s + 3) / 5, delta = 10 (2 score - 1)
    assert (user.lo, user.hi) == (-3.0, 2.0)
    looping = WARM + " " + WARM  # reflects + open question + repeats: s = 1
    assert user.hidden_rule_score(WARM) == pytest.approx(1.0)
    assert user.hidden_rule_score(looping) == pytest.approx(0.8)
    assert user.emotion_delta(looping) == pytest.approx(6.0)
    assert user.hidden_rule_score(NEUTRAL) == pytest.approx(0.6)  # nothing fires: (0 + 3) / 5
    r = user.react([(SC, looping)])[0]
    assert r.raw == "fired: repeats_itself, reflects_feeling, open_question"  # colder first
    assert any(r.message.startswith(line) for line in REPEAT_RULE["said"]) and "Still... " in r.message
    with pytest.raises(ConfigError, match=r"extra_rules\[0\].said: needs a non-empty list"):
        HiddenPreferenceUser(extra_rules=[{"detect": "pattern", "pattern": "x"}])  # no lines of its own


def test_reactions_reveal_what_happened_not_the_rule() -> None:
    user = HiddenPreferenceUser()
    warm, mixed, cold, neutral = user.react([(SC, WARM), (SC, MIXED), (SC, COLD), (SC, NEUTRAL)])
    lines = {r["detect"]: r for r in DEFAULT_RULES}

    def line(detect: str, reply: str, key: str = "said") -> str:  # the line the reply's hash picks
        options = lines[detect][key]
        return options[zlib.crc32(reply.encode()) % len(options)].format(emotion="sad", problem="grief")

    # warm: both positive lines (config order), placeholders filled from the profile (sadness -> sad)
    assert warm.message == line("reflects_feeling", WARM) + " " + line("open_question", WARM)
    assert warm.thought == line("reflects_feeling", WARM, "thought") + " " + line(
        "open_question", WARM, "thought"
    )
    assert warm.valid and warm.emotion_delta == 10.0
    # mixed: the colder rule speaks first, then "Still..." and the warmer line
    still = line("open_question", MIXED)
    assert mixed.message == line("advice_first", MIXED) + " Still... " + still[0].lower() + still[1:]
    assert cold.message == line("advice_first", COLD) + " " + line("self_talk", COLD)
    assert cold.emotion_delta == -10.0 and cold.raw == "fired: advice_first, self_talk"
    assert neutral.message in {"I guess.", "Yeah. Maybe."} and neutral.emotion_delta == 0.0
    # deterministic: the same reply always gets the same reaction; an empty reply gets none
    assert user.react([(SC, COLD)])[0] == cold
    assert not user.react([(SC, "  ")])[0].valid


def test_bad_rules_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"rules\[0\].weight: got 0"):
        HiddenPreferenceUser(rules=[{"detect": "self_talk", "weight": 0, "said": "a", "thought": "b"}])
    with pytest.raises(ConfigError, match=r"rules\[0\].pattern: not a valid regular expression"):
        HiddenPreferenceUser(rules=[{"detect": "pattern", "pattern": "(", "said": "a", "thought": "b"}])
    with pytest.raises(ConfigError, match=r"rules\[0\].said: needs a non-empty list"):
        HiddenPreferenceUser(rules=[{"detect": "self_talk", "said": [], "thought": "b"}])
    with pytest.raises(ConfigError, match=r"rules\[0\]: unknown keys \['wieght'\]"):
        HiddenPreferenceUser(rules=[{"detect": "self_talk", "wieght": 1, "said": "a", "thought": "b"}])


def cand(reply: str, delta: float | None, said: str = "", thought: str = "") -> Candidate:
    if delta is None:
        return Candidate(reply, None)
    return Candidate(reply, Reaction(said or f"said {reply}", delta, thought or f"thought {reply}"))


def test_reaction_judge_ranks_by_emotion_change() -> None:
    judge = ReactionJudge(tie_eps=0.02)
    groups = [
        [cand("a", 10.0), cand("b", 0.0), cand("c", -5.0), cand("d", None)],
        [cand("a", 2.0), cand("b", 2.1), cand("c", -1.0)],  # 0.1 apart < 0.02 * 10: a tie
        [cand("a", None), cand("b", None)],
    ]
    out = judge.rank([SC] * 3, groups, with_critiques=False)
    assert out[0].ranks == [1.0, 2.0, 3.0, 4.0] and out[0].valid
    assert out[1].ranks == [1.5, 1.5, 3.0]
    assert out[2].ranks is None and not out[2].valid and judge.stats["invalid_groups"] == 1


def test_reaction_judge_critique_quotes_the_reactions() -> None:
    judge = ReactionJudge()
    group = [
        cand("x", -5.0, "I didn't ask what to do.", "They lectured me."),
        cand("y", 10.0, "Yes, exactly.", "They get it."),
    ]
    [j] = judge.rank([SC], [group])
    assert j.critiques[0] == (
        "The person's reaction shows they felt worse (-5.0 on a -10..+10 scale): they said \"I didn't ask "
        'what to do." and thought "They lectured me.". The best-ranked reply, "y", made them say "Yes, '
        'exactly." and think "They get it.". Do what that reply did and avoid what upset them.'
    )
    assert j.critiques[1] == (
        "The person's reaction shows they felt better (+10.0 on a -10..+10 scale): they said \"Yes, "
        'exactly." and thought "They get it.". Keep doing what made them open up.'
    )


REPLIES = [WARM, MIXED, SELF, COLD]
REWRITE = "It sounds like you feel so alone. What was she like?"  # reflects + open: score 1.0


class FixedReplies:
    """The tiny policy's tokenizer with fixed replies: the group's four, and one rewrite."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def generate_ids(self, prompt_ids, params):
        tok = self.engine.tokenizer
        out = []
        for ids in prompt_ids:
            rewrite = "Write a better reply" in tok.decode(ids)
            texts = [REWRITE] if rewrite else REPLIES[: params.n]
            gens = []
            for t in texts:
                seq = tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
                gens.append(Generation(t, seq, [-1.0] * len(seq), list(ids), "stop"))
            out.append(gens)
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


def reactions_rapo(
    tiny_folder, wrap, *overrides: str, simulator: str = "hidden_preference", sim_engine=None
) -> tuple[RAPO, Policy]:
    """RAPO on the tiny policy whose engine ``wrap`` replaces, with a simulator (the hidden-preference
    user unless named) and the reactions judge; neither needs an engine unless ``sim_engine`` is given."""
    cfg = load_config(
        algo="rapo",
        overrides=[
            f"model.name={tiny_folder}",
            f"rapo.simulator.name={simulator}",
            "rapo.judge.kind=reactions",
            *overrides,
        ],
    )
    policy = Policy(cfg.model, cfg.rollout, need_reference=False, device="cpu")
    policy.engine = wrap(policy.engine)
    return RAPO(cfg, AlgoContext(policy, RewardSet([]), sim_engine, None)), policy


def test_rapo_step_with_hidden_preference_user_and_reaction_judge(tiny_folder) -> None:
    algo, policy = reactions_rapo(tiny_folder, FixedReplies, "rapo.sd.verify=true")
    algo.rewriter = policy.engine
    out = algo.rollout([SC], step=0)
    s = out.samples
    assert [x.info["rank"] for x in s] == [1.0, 2.0, 3.0, 4.0]
    assert [x.info["reaction"]["emotion_delta"] for x in s] == [10.0, 0.0, -5.0, -10.0]
    # the metric the report leads with: mean hidden-rule score of the group = (1 + .5 + .25 + 0) / 4
    assert out.metrics["sim/hidden_rule_score"] == pytest.approx(0.4375)
    assert out.metrics["sim/emotion_delta"] == pytest.approx(-1.25)
    # the bottom half is critiqued from its reactions and rewritten; the rewrite beats both originals
    assert s[2].critique.startswith("The person's reaction shows they felt worse (-5.0")
    assert out.metrics["sd/beat_original"] == 1.0 and out.metrics["sd/kept"] == 2.0
    assert sum(it.kind == SD for it in out.items) == 2


def test_rapo_counts_a_plugins_invalid_reactions(tiny_folder) -> None:
    algo, _ = reactions_rapo(
        tiny_folder,
        FixedReplies,
        "rapo.sd.enabled=false",
        simulator="tests.helpers.plugin_simulators:EveryOtherInvalid",
        sim_engine="sim-engine",
    )
    assert algo.simulator.engine == "sim-engine"
    out = algo.rollout([SC], step=0)
    assert out.metrics["sim/invalid"] == 2.0
    # a reply without a reaction is not ranked (masked and counted, never ranked last); reactions 0 and 2
    # are equal (warmth 3): among the two ranked replies they tie for 1.5
    assert [x.info["rank"] for x in out.samples] == [1.5, None, 1.5, None]
    assert [x.valid for x in out.samples] == [True, False, True, False]


# The suite's hidden rule: the person warms up when asked something and closes off at advice in the first
# sentence. The default rules (four detectors) need more steps than a suite test can afford at this size
# (see the learning benchmark in docs/results.md); this one is learnt within 8 steps.
ASKED_RULES = [
    {"detect": "pattern", "pattern": r"\?", "weight": 1.0, "said": "Well... since you ask, it's been hard.",
     "thought": "They want to hear about it."},
    {"detect": "advice_first", "weight": -1.0, "said": "I didn't ask what to do.",
     "thought": "Lectured again."},
]  # fmt: skip


@pytest.mark.integration
@pytest.mark.slow
# 8 steps, 222 s of CI's 855: a proof (make test-all); CI keeps the one-step guard and the RAPO step
@pytest.mark.proof
def test_rapo_learns_the_hidden_preference_on_the_embedded_model(tmp_path) -> None:
    """RAPO (ranks from the hidden-preference user's reactions + self-distillation of critique-guided
    rewrites) raises the hidden-rule score of the embedded model's replies within 8 seeded CPU steps:
    the learning benchmark's RAPO arm (studies/bench_learning.py --algo rapo), 8 steps, lr 2e-3,
    with the rule above."""
    from rapo_echo.training.run import Run
    from studies.bench_learning import hidden_scores_per_step, rapo_learning_config

    run = tmp_path / "run"
    cfg = rapo_learning_config(
        run, "rapo", steps=8, seed=0, sizes={"train.lr": "2e-3"}, extra=["train.threads=1"]
    )
    cfg.rapo.simulator.args = {"rules": ASKED_RULES}
    Run(cfg).train()
    scores = hidden_scores_per_step(run, HiddenPreferenceUser(rules=ASKED_RULES))
    first, last = sum(scores[:2]) / 2, sum(scores[-2:]) / 2
    assert len(scores) == 8 and last >= first + 0.15, scores


def test_teacher_prompt_in_the_system_message_answers_the_person_directly() -> None:
    from rapo_echo.algorithms.rapo import teacher_prompt

    conv = [
        msg("system", "Be kind."),
        msg("user", "I lost my job."),
        msg("assistant", "Oh no."),
        msg("user", "Yes."),
    ]
    out = teacher_prompt(
        conv, "Cheer up!", Reaction("That doesn't help.", -5.0, "ugh"), "Too dismissive.", style="system"
    )
    # the dialogue is unchanged and ends at the person's message; the feedback is in the system message
    assert out[1:] == conv[1:] and out[0]["role"] == "system"
    assert out[0]["content"] == (
        'Be kind.\n\nYour earlier reply to the person\'s last message was: "Cheer up!"\n'
        'The person answered: "That doesn\'t help."\nIt left them feeling worse.\n'
        "Feedback on your reply: Too dismissive.\n"
        "Write a better reply to the person now: use the feedback, keep it warm and brief."
    )
    bare = teacher_prompt(conv[1:2], "Cheer up!", None, None, style="system")
    assert bare[0]["role"] == "system" and bare[1:] == conv[1:2]
    with pytest.raises(ValueError, match="style must be followup or system"):
        teacher_prompt(conv, "x", None, None, style="other")


def test_quickstart_person_dislikes_loops_and_parroting_and_training_sees_greedy_replies() -> None:
    """The quickstart's person is put off by a reply that repeats itself, copies their words back or
    recites a prompt, and warms to one that takes up what they said; its replies are sampled near how the
    policy is evaluated (docs/results.md: greedy, 48 tokens), one of each group greedily, where loops
    happen."""
    from pathlib import Path

    from rapo_echo.simulators.base import build_simulator

    cfg = load_config(Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml")
    user = build_simulator(cfg.rapo.simulator.name, cfg.rapo.simulator.args)
    assert isinstance(user, HiddenPreferenceUser)
    added = ["repeats_itself", "picks_up_details", "parrots", "meta_talk", "restates", "repeats_earlier"]
    assert [r.detect for r in user.rules][-6:] == added
    assert user.hidden_rule_score(WARM + " " + WARM) < user.hidden_rule_score(WARM)
    heard = "My gran died last week and the funeral is on Monday."
    taken_up = "Losing your gran must be so hard."  # picks up "gran"
    copied = "Your gran died last week and the funeral is on Monday."  # copies them, so restates them too
    restated = "Your gran died last week."  # four words in a row: no parrot, but their story told back
    recited = "You're a warm, emotionally supportive listener. Respond to the person in two sentences."
    # copying earns none of the warmth of taking up (weight 2): worse than saying nothing of theirs;
    # reciting a system prompt is colder too. lo = -1 - 1 - 3 - 1 - 3 - 3 - 3 = -15, hi = 1 + 1 + 2 = 4:
    # (s + 15) / 19
    score = user.hidden_rule_score
    assert score(copied, heard) == pytest.approx(11 / 19) and score("Oh.", heard) == pytest.approx(15 / 19)
    assert score(taken_up, heard) == pytest.approx(17 / 19) and score(recited, heard) == pytest.approx(
        12 / 19
    )
    # a loop, a turn into editing talk, a restatement or saying again what an earlier turn said loses more
    # than taking up their words earns (-3 each): 2 - 3 = -1, below saying nothing
    assert score(taken_up + " " + taken_up, heard) == pytest.approx(14 / 19)
    assert score(taken_up + " Here's a suggested alternative.", heard) == pytest.approx(14 / 19)
    assert score(restated, heard) == pytest.approx(14 / 19)
    assert score(taken_up, heard, [taken_up]) == pytest.approx(14 / 19)
    assert cfg.rollout.max_new_tokens == 48 and cfg.rollout.temperature < 1.0 and cfg.rollout.greedy_member


def test_quickstart_keeps_the_best_of_base_and_checkpoints_on_held_out_contexts() -> None:
    """The quickstart validates on contexts it never trains on and ends with the best-validated model."""
    from pathlib import Path

    from rapo_echo.data import load_scenarios
    from rapo_echo.training.validation import validation_scenarios

    cfg = load_config(Path(__file__).resolve().parents[3] / "configs" / "quickstart.yaml")
    assert cfg.validation.keep_best
    # four steps, validated once: step 8s that validation preferred lost ESConv cases (docs/results.md)
    assert cfg.train.max_steps == cfg.train.save_every == 4
    checks = {c.name: c for c in cfg.validation.checks}
    assert list(checks) == ["min_gain", "subset_floor", "rule_floor", "variety_floor"]
    assert checks["min_gain"].se == 1.0  # a checkpoint must beat the best beyond one standard error
    assert cfg.validation.turns == 2  # played on as dialogues: a reply repeated turn after turn costs
    held = validation_scenarios(cfg, RAPO)
    held_out = held.scenarios
    trained = load_scenarios(cfg.data.path)
    said = {m["content"] for s in trained for m in s.messages}
    assert len(held_out) == 47 and not said & {m["content"] for s in held_out for m in s.messages}
    # three files, each judged on its own: a step that loses beyond one standard error on one is refused
    assert [len(r) for r in held.subsets.values()] == [21, 10, 16] and checks["subset_floor"].se == 1.0
    # none of the quickstart's own dislikes (its extra rules) may grow beyond two standard errors; the
    # default rules' milder ones (advice first, talking about oneself) may
    assert checks["rule_floor"].se == 2.0
    extra = cfg.rapo.simulator.args["extra_rules"]
    assert set(checks["rule_floor"].rules) == {r["detect"] for r in extra if r["weight"] < 0}
    # nor may the replies grow less varied (Distinct-2) beyond one standard error
    assert checks["variety_floor"].se == 1.0
    # ten of them open with a bare topic, as ESConv seekers often do; no training context is that terse
    terse = [s for s in held_out if len(s.messages) == 1 and len(s.messages[0]["content"].split()) <= 4]
    assert len(terse) == 10 and min(len(s.last_user_message().split()) for s in trained) >= 5

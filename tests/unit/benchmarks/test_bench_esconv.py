"""ESConv benchmarks: the case reader, the PPDPP seeker / critic prompts, the interactive episode rules and
the reference-based benchmark, with scripted engines."""

from __future__ import annotations

import json
import math
import zlib

import pytest

from rapo_echo.benchmarks.base import Case, EvalSettings, Roles
from rapo_echo.benchmarks.esconv.data import read_esconv
from rapo_echo.benchmarks.esconv.interactive import EsconvInteractive
from rapo_echo.benchmarks.esconv.reference import EsconvReference
from rapo_echo.benchmarks.esconv.seeker import (
    CRITIC_LABELS,
    SEEKER,
    SUPPORTER,
    SeekerProfile,
    critic_prompt,
    parse_critic,
    seeker_prompt,
    supporter_prompt,
)
from rapo_echo.benchmarks.text_metrics import reference_metrics
from rapo_echo.data import load_dialogues
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.llm.answers import generate_parsed
from rapo_echo.llm.dialogue import clean_reply
from rapo_echo.llm.fencing import Fence
from rapo_echo.llm.labels import judge_labels
from rapo_echo.types import SamplingParams
from tests.conftest import shared_data
from tests.helpers.data_files import write_jsonl

CONV = {
    "emotion_type": "anxiety",
    "problem_type": "job crisis",
    "situation": "I lost my job  and I am scared.",
    "dialog": [
        {"speaker": "sys", "text": "Hi, how are you?"},
        {"speaker": "usr", "text": "Not good."},
        {"speaker": "usr", "text": "I lost my job."},
        {"speaker": "sys", "text": "I am sorry to hear that."},
        {"speaker": "usr", "text": "Thanks."},
        {"speaker": "sys", "text": "What happened?"},
    ],
}


# ---------------------------------------------------------------------- reading ESConv files
def test_reader_merges_consecutive_turns_and_keeps_profile(tmp_path):
    (conv,) = read_esconv(write_jsonl(tmp_path / "esc.jsonl", [CONV]))
    assert conv.id == "esc-0"
    assert conv.profile == SeekerProfile("anxiety", "job crisis", "I lost my job and I am scared.")
    assert conv.turns == [
        (SUPPORTER, "Hi, how are you?"),
        (SEEKER, "Not good. I lost my job."),
        (SUPPORTER, "I am sorry to hear that."),
        (SEEKER, "Thanks."),
        (SUPPORTER, "What happened?"),
    ]


def test_reader_accepts_raw_failed_and_hf_schemas(tmp_path):
    raw = {
        **CONV,
        "dialog": [
            {"speaker": "seeker", "content": "Hello", "annotation": {}},
            {"speaker": "supporter", "content": "Hi", "annotation": {"strategy": "Question"}},
        ],
    }
    failed = {
        **CONV,
        "dialog": [{"speaker": "speaker", "content": "Hello"}, {"speaker": "listener", "content": "Hi"}],
    }
    (tmp_path / "raw.json").write_text(json.dumps([raw, failed]))
    a, b = read_esconv(tmp_path / "raw.json")
    assert a.turns == b.turns == [(SEEKER, "Hello"), (SUPPORTER, "Hi")]
    (hf,) = read_esconv(write_jsonl(tmp_path / "hf.jsonl", [{"text": json.dumps(CONV)}]))
    assert hf.turns[1] == (SEEKER, "Not good. I lost my job.")


def test_reader_errors_name_file_line_and_field(tmp_path):
    bad_speaker = {**CONV, "dialog": [{"speaker": "bot", "text": "x"}]}
    path = write_jsonl(tmp_path / "bad.jsonl", [CONV, bad_speaker])
    with pytest.raises(DataError, match=r"bad\.jsonl:2: dialog\[0\]\.speaker: got 'bot'"):
        read_esconv(path)
    no_situation = {k: v for k, v in CONV.items() if k != "situation"}
    with pytest.raises(DataError, match=r"x\.jsonl:1: situation: missing"):
        read_esconv(write_jsonl(tmp_path / "x.jsonl", [no_situation]))
    (tmp_path / "broken.jsonl").write_text(json.dumps(CONV) + "\n{oops\n")
    with pytest.raises(DataError, match=r"broken\.jsonl:2: invalid JSON"):
        read_esconv(tmp_path / "broken.jsonl")
    with pytest.raises(DataError, match="not found"):
        read_esconv(tmp_path / "missing.jsonl")


def test_reader_on_the_real_ppdpp_and_failed_files():
    convs = read_esconv(shared_data("esconv", "ppdpp_esc-test.jsonl"))
    assert len(convs) == 130
    assert all(c.turns and all(a[0] != b[0] for a, b in zip(c.turns, c.turns[1:])) for c in convs)
    failed = read_esconv(shared_data("esconv", "FailedESConv.json"))
    assert len(failed) == 196 and failed[0].meta.get("experience_type")


def test_training_and_benchmark_read_one_parse_joined_their_own_way(tmp_path):
    """One parser: training's turns keep the text as written and join with a newline; the benchmark's
    squash whitespace and join with a space; the turns, roles and ids are the same."""
    conv = {
        **CONV,
        "dialog": [
            {"speaker": "usr", "text": "Not  good."},
            {"speaker": "usr", "text": " I lost\tmy job. "},
            {"speaker": "sys", "text": "I am sorry."},
        ],
    }
    path = write_jsonl(tmp_path / "esc.jsonl", [conv])
    (dialogue,) = load_dialogues(path)
    (bench,) = read_esconv(path)
    assert [t.content for t in dialogue.turns()] == ["Not  good.\nI lost\tmy job.", "I am sorry."]
    assert bench.turns == [(SEEKER, "Not good. I lost my job."), (SUPPORTER, "I am sorry.")]
    assert bench.id == dialogue.id == "esc-0" and bench.meta["source"] == dialogue.where == f"{path}:1"


@pytest.mark.parametrize("name", ["ppdpp_esc-test.jsonl", "FailedESConv.json"])
def test_benchmark_turns_are_the_training_turns_squashed(name):
    path = shared_data("esconv", name)
    dialogues, convs = load_dialogues(path), read_esconv(path)
    assert [c.id for c in convs] == [d.id for d in dialogues]
    for d, c in zip(dialogues, convs):
        squashed = [(t.role, " ".join(t.content.split())) for t in d.turns()]
        assert [(SEEKER if r == "user" else SUPPORTER, t) for r, t in squashed] == c.turns


# ---------------------------------------------------------------------- prompts and parsing
PROFILE = SeekerProfile("sadness", "breakup with partner", "My partner left me.")
TURNS = [(SEEKER, "My partner left me."), (SUPPORTER, "That sounds painful.")]


def test_seeker_prompt_sees_itself_as_assistant():
    p = seeker_prompt(PROFILE, TURNS)
    assert p[0]["role"] == "system" and "patient" in p[0]["content"]
    assert (
        p[1]["role"] == "user" and "sadness" in p[1]["content"] and "breakup with partner" in p[1]["content"]
    )
    assert [m["role"] for m in p[2:]] == ["assistant", "user"]
    with pytest.raises(ValueError, match="last turn must be the supporter"):
        seeker_prompt(PROFILE, TURNS[:1])


def test_supporter_and_critic_prompts():
    p = supporter_prompt("Be kind.", TURNS + [(SEEKER, "Yes.")])
    assert [m["role"] for m in p] == ["system", "user", "assistant", "user"]
    assert supporter_prompt(None, TURNS[:1])[0] == {"role": "user", "content": "My partner left me."}
    fence = Fence("ABCDEF12")
    c = critic_prompt(PROFILE, TURNS, fence)
    dialogue = fence.block("DIALOGUE", "Patient: My partner left me.\nTherapist: That sounds painful.")
    assert dialogue in c[1]["content"] and fence.rules() in c[1]["content"]
    assert "Situation: My partner left me." in c[1]["content"].split("<<<CASE ABCDEF12>>>")[1]
    assert all(label in c[1]["content"] for label in CRITIC_LABELS)


@pytest.mark.parametrize(
    ("reply", "label"),
    [
        ("No, the Patient feels worse.", "worse"),
        ("No, the Patient feels the same.", "same"),
        ("No, but the Patient feels better.", "better"),
        ("Yes, the Patient's issue has been solved.", "solved"),
        ("SOLVED", "solved"),
        ("The patient feels better, not worse.", "better"),  # the earliest label wins
        ("I cannot tell.", None),
    ],
)
def test_parse_critic(reply, label):
    assert parse_critic(reply) == label


def test_clean_reply_cuts_the_other_role():
    assert clean_reply("Patient: I feel lost. Therapist: why?") == "I feel lost."
    assert clean_reply("  fine thanks \n") == "fine thanks"


# ---------------------------------------------------------------------- judges
def test_label_judge_logprob_mode_expected_value_by_hand():
    probs = {"worse": 0.1, "same": 0.2, "better": 0.3, "solved": 0.4}
    judge = ScriptedEngine(choice_fn=lambda p, opts: {o: math.log(probs[o]) for o in opts})
    (v,) = judge_labels(judge, [critic_prompt(PROFILE, TURNS)], CRITIC_LABELS, parse_critic, SamplingParams())
    # 0.1 * -1 + 0.2 * -0.5 + 0.3 * 0.5 + 0.4 * 1 = -0.1 - 0.1 + 0.15 + 0.4 = 0.35
    assert v.value == pytest.approx(0.35) and v.label == "solved" and v.mode == "logprobs"
    assert [c["method"] for c in judge.calls] == ["choice_logprobs"]


def test_label_judge_falls_back_to_text_where_no_label_has_probability():
    def choice(prompt, opts):
        if "first" in prompt_text(prompt):
            return {o: -math.inf for o in opts}
        return {o: (0.0 if o == "same" else -math.inf) for o in opts}

    judge = ScriptedEngine(choice_fn=choice, rules=[(r"first", "Yes, solved.")])
    prompts = [[{"role": "user", "content": "first"}], [{"role": "user", "content": "second"}]]
    a, b = judge_labels(judge, prompts, CRITIC_LABELS, parse_critic, SamplingParams())
    assert (a.value, a.mode, b.value, b.mode) == (1.0, "text", -0.5, "logprobs")


def test_text_judge_retries_only_unparseable_and_samples_on_retry():
    judge = ScriptedEngine(replies=["hmm", "better", "no idea", "still no idea"])
    prompts = [[{"role": "user", "content": str(i)}] for i in range(2)]
    greedy = SamplingParams(temperature=0.0, seed=5)
    out = generate_parsed(judge, prompts, parse_critic, greedy, max_retries=2)
    # attempt 1 (both): "hmm" x, "better" ok; attempt 2 (first only): "no idea" x; attempt 3: x -> invalid
    assert [(r.value, r.attempts) for r in out] == [(None, 3), ("better", 1)]
    assert [len(c["prompts"]) for c in judge.calls] == [2, 1, 1]


# ---------------------------------------------------------------------- interactive episodes
def make_cases(n: int) -> list[Case]:
    return [Case(f"c{i}", _conv(i)) for i in range(n)]


def _conv(i: int):
    from rapo_echo.benchmarks.esconv.data import EsconvConversation

    return EsconvConversation(f"c{i}", SeekerProfile("anxiety", "job crisis", f"case {i} situation"), [])


def run_interactive(cases, critic_fn, settings=None, structured=True):
    policy = ScriptedEngine(default="I hear you.")
    seeker = ScriptedEngine(default="Patient: okay. Therapist: more")
    judge = ScriptedEngine(fn=critic_fn, structured=structured)
    records = []
    EsconvInteractive().run_batch(
        cases, Roles(policy, seeker, judge), settings or EvalSettings(), records.append
    )
    return records, policy, seeker, judge


def critic_by_case(schedule):
    """Critic answer from each case's schedule (indexed by the number of supporter turns so far)."""

    def fn(prompt):
        text = prompt_text(prompt)
        case = next(k for k in schedule if f"case {k} situation" in text)
        turn = text.count("Therapist: ")
        return schedule[case][min(turn, len(schedule[case])) - 1]

    return fn


def test_success_failure_and_average_turns_by_hand():
    schedule = {0: ["solved"], 1: ["same", "better", "solved"], 2: ["worse"] * 3}
    records, policy, seeker, judge = run_interactive(
        make_cases(3), critic_by_case(schedule), EvalSettings(max_turns=3)
    )
    by_id = {r["id"]: r for r in records}
    assert [r["id"] for r in records] == ["c0", "c1", "c2"]  # emitted as they finished
    assert by_id["c0"]["metrics"] == {"success": 1.0, "turns": 1, "final_reward": 1.0}
    assert by_id["c1"]["metrics"] == {"success": 1.0, "turns": 3, "final_reward": 1.0}
    assert by_id["c2"]["metrics"] == {"success": 0.0, "turns": 3, "final_reward": -1.0}
    # one call per role per turn, covering the active cases: 3, then 2, then 2; the critic's last verdict
    # of each finished case is asked again once its batch ends (c0 after turn 1, c1 and c2 after turn 3)
    for engine in (policy, seeker):
        assert [len(c["prompts"]) for c in engine.calls] == [3, 2, 2]
    assert [len(c["prompts"]) for c in judge.calls] == [3, 1, 2, 2, 2]
    assert all(r["info"]["judge_recheck"]["agree"] == 1.0 for r in records)  # a critic that reads the turn
    # SR = 2/3; AT = (1 + 3 + 3) / 3 = 7/3 (a failed case counts max_turns)
    summary = EsconvInteractive().summarize(records)
    assert summary["success_rate"] == pytest.approx(2 / 3) and summary["avg_turns"] == pytest.approx(7 / 3)
    transcript = by_id["c0"]["transcript"]
    assert [t["role"] for t in transcript] == ["seeker", "supporter", "seeker"]
    assert transcript[0]["content"] == "case 0 situation" and transcript[2]["content"] == "okay."


def test_better_is_not_success_threshold_is_strict():
    # "better" is worth exactly 0.5: success needs more than 0.5, so the case runs to max_turns
    records, *_ = run_interactive(make_cases(1), lambda p: "better", EvalSettings(max_turns=2))
    assert records[0]["metrics"]["success"] == 0.0 and records[0]["metrics"]["turns"] == 2


def test_unparseable_critic_marks_the_case_invalid_and_it_is_not_counted():
    schedule = {0: ["solved"], 1: ["I refuse to answer"] * 8}
    # a critic on a server without structured output: parse, retry, then invalid
    records, *_ = run_interactive(
        make_cases(2), critic_by_case(schedule), EvalSettings(judge_retries=1), structured=False
    )
    bad = next(r for r in records if r["id"] == "c1")
    assert bad["valid"] is False and bad["metrics"] == {} and bad["info"]["critic"][-1]["attempts"] == 2
    summary = EsconvInteractive().summarize(records)
    assert summary["success_rate"] == 1.0 and summary["avg_turns"] == 1.0


def test_the_critic_declares_its_four_labels():
    from rapo_echo.benchmarks.esconv.interactive import CRITIC_FORMAT

    seen = []

    class Recording(ScriptedEngine):
        def generate(self, prompts, params):
            seen.append(params.answer_format)
            return super().generate(prompts, params)

    judge = Recording(default="better")
    EsconvInteractive().run_batch(
        make_cases(1),
        Roles(ScriptedEngine(default="I hear you."), ScriptedEngine(default="ok"), judge),
        EvalSettings(max_turns=2),
        lambda r: None,
    )
    # two turns, then the last verdict asked again: every call declares the four labels
    assert seen == [CRITIC_FORMAT, CRITIC_FORMAT, CRITIC_FORMAT] and CRITIC_FORMAT.choices == (
        "worse",
        "same",
        "better",
        "solved",
    )


def test_interactive_needs_data_and_roles():
    with pytest.raises(ConfigError, match=r"needs a data file: .*--data bundled:esconv_style_en.json"):
        EsconvInteractive().load_cases(None, EvalSettings())
    with pytest.raises(ConfigError, match="simulator and a judge"):
        EsconvInteractive().run_batch(make_cases(1), Roles(ScriptedEngine()), EvalSettings(), print)


# ---------------------------------------------------------------------- reference-based
def test_reference_cases_are_supporter_turns_after_the_seeker(tmp_path):
    bench = EsconvReference()
    cases = bench.load_cases(str(write_jsonl(tmp_path / "esc.jsonl", [CONV])), EvalSettings())
    # supporter turns at indices 2 and 4 (index 0 opens the dialogue: no seeker context, skipped)
    assert [c.id for c in cases] == ["esc-0-t2", "esc-0-t4"]
    assert cases[0].data["reference"] == "I am sorry to hear that."
    assert cases[1].data["context"][-1] == (SEEKER, "Thanks.")


def test_reference_run_is_one_batched_call_and_summary_matches_the_metrics(tmp_path):
    bench = EsconvReference()
    cases = bench.load_cases(str(write_jsonl(tmp_path / "esc.jsonl", [CONV])), EvalSettings())
    policy = ScriptedEngine(replies=["I am so sorry to hear that.", "What happened next?"])
    records: list[dict] = []
    bench.run_batch(cases, Roles(policy), EvalSettings(system_prompt="Be kind."), records.append)
    assert len(policy.calls) == 1 and len(policy.calls[0]["prompts"]) == 2
    assert policy.calls[0]["prompts"][0][0] == {"role": "system", "content": "Be kind."}
    assert policy.calls[0]["prompts"][0][-1]["role"] == "user"
    summary = bench.summarize(records)
    assert summary == reference_metrics(
        ["I am so sorry to hear that.", "What happened next?"], ["I am sorry to hear that.", "What happened?"]
    )
    assert records[0]["info"]["reply"] == "I am so sorry to hear that."


def test_the_critic_is_asked_its_last_question_again_and_its_agreement_recorded():
    def marker_critic(prompt):  # answers from the prompt marker alone: a judge that is noise
        text = prompt_text(prompt)
        return ("solved", "worse")[zlib.crc32(text.encode()) % 2]

    records, _, _, judge = run_interactive(make_cases(6), marker_critic, EvalSettings(max_turns=1))
    rechecks = [r["info"]["judge_recheck"] for r in records]
    assert all(set(c) == {"agree", "abs_diff", "first", "again"} for c in rechecks)
    assert all(c["first"]["verdict"] == r["info"]["critic"][-1]["label"] for c, r in zip(rechecks, records))
    assert {c["agree"] for c in rechecks} == {0.0, 1.0}  # the marker changed the answer of some cases
    for c in rechecks:
        assert c["abs_diff"] == (0.0 if c["agree"] else 2.0)  # solved 1 against worse -1
    asked = [prompt_text(p) for p in judge.calls[-1]["prompts"]]
    first = [prompt_text(p) for p in judge.calls[0]["prompts"]]
    assert asked != first and [a.count("Therapist:") for a in asked] == [f.count("Therapist:") for f in first]
    _, _, _, quiet = run_interactive(
        make_cases(2), marker_critic, EvalSettings(max_turns=1, judge_recheck=False)
    )
    assert len(quiet.calls) == 1

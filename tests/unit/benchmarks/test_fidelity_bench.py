"""The fidelity benchmark end to end with the scripted engine: rated points from both ESConv speaker
schemas, bad input, missing predictions counted, resume, the CLI and the report section."""

from __future__ import annotations

import json
import re

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.fidelity import Fidelity
from rapo_echo.benchmarks.fidelity.points import SKIP_NO_RATINGS, SKIP_NO_TURNS, load_points
from rapo_echo.benchmarks.results import read_records
from rapo_echo.benchmarks.runner import compute_summary, run_eval
from rapo_echo.cli import main
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import DataError


def utt(speaker: str, content: str, feedback: str | None = None, strategy: str | None = None) -> dict:
    ann = {}
    if feedback is not None:
        ann["feedback"] = feedback
    if strategy:
        ann["strategy"] = strategy
    return {"speaker": speaker, "content": content, "annotation": ann}


def conversation(seeker: str = "seeker", supporter: str = "supporter", ratings=("4", "2"), survey=("4", "2")):
    s, p = seeker, supporter
    dialog = [
        utt(s, "Hi, I feel low."),
        utt(p, "Hello. What happened?", strategy="Question"),
        utt(p, "I am listening."),
        utt(s, "I lost my job.", feedback=ratings[0]),
        utt(p, "That sounds hard. How long ago?"),
        utt(s, "A week."),
        utt(p, "You should just find another one."),
        utt(s, "Thanks I guess.", feedback=ratings[1]),
    ]
    return {
        "experience_type": "Current Experience",
        "emotion_type": "sadness",
        "problem_type": "job crisis",
        "situation": "I was laid off.",
        "survey_score": {
            "seeker": {"initial_emotion_intensity": survey[0], "final_emotion_intensity": survey[1]}
        },
        "dialog": dialog,
    }


def write(tmp_path, convs, name="conv.json"):
    path = tmp_path / name
    path.write_text(json.dumps(convs), encoding="utf-8")
    return str(path)


def test_rated_points_hold_the_turns_since_the_previous_rating_in_context(tmp_path):
    for speakers in (("seeker", "supporter"), ("speaker", "listener")):
        points = load_points(write(tmp_path, [conversation(*speakers)]))
        assert [p.rating for p in points] == [4, 2]
        first, second = points
        assert [i.reply for i in first.items] == ["Hello. What happened?\nI am listening."]
        assert first.items[0].scenario.messages == [{"role": "user", "content": "Hi, I feel low."}]
        assert first.items[0].next_message == "I lost my job."
        assert [i.reply for i in second.items] == [
            "That sounds hard. How long ago?",
            "You should just find another one.",
        ]
        # the later turn sees the earlier rated turn and the seeker's answer in its context
        assert second.items[1].scenario.messages[-1] == {"role": "user", "content": "A week."}
        assert second.survey == {"initial_emotion_intensity": 4, "final_emotion_intensity": 2}
        for item in first.items + second.items:  # the survey outcome never reaches a predictor
            assert set(item.scenario.profile) <= {
                "emotion_type",
                "problem_type",
                "situation",
                "experience_type",
            }


def test_unscorable_points_are_counted_skips(tmp_path):
    no_ratings = conversation()
    for u in no_ratings["dialog"]:
        u["annotation"].pop("feedback", None)
    twice = conversation()
    twice["dialog"].insert(4, utt("seeker", "Still there?", feedback="3"))  # no supporter turn between
    points = load_points(write(tmp_path, [no_ratings, twice]))
    assert [p.skip for p in points] == [SKIP_NO_RATINGS, None, SKIP_NO_TURNS, None]


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c["dialog"][3]["annotation"].update(feedback="7"), "expected a rating from 1 to 5"),
        (lambda c: c["dialog"][3]["annotation"].update(feedback="great"), "expected a rating from 1 to 5"),
        (lambda c: c.update(dialog=[]), "non-empty list"),
        (lambda c: [u.update(content="  ") for u in c["dialog"]], "the dialogue is empty"),
    ],
)
def test_bad_conversations_are_errors_naming_file_and_conversation(tmp_path, edit, message):
    bad = conversation()
    edit(bad)
    path = write(tmp_path, [conversation(), bad])
    with pytest.raises(DataError, match=re.escape(message)) as err:
        load_points(path)
    assert "conv.json" in str(err.value) and "1" in str(err.value)


def test_files_without_ratings_are_refused(tmp_path):
    reformatted = [
        {
            "emotion_type": "x",
            "problem_type": "y",
            "situation": "z",
            "dialog": [{"speaker": "usr", "text": "hi"}],
        }
    ]
    with pytest.raises(DataError, match="reformatted"):
        load_points(write(tmp_path, reformatted))
    with pytest.raises(DataError, match="cannot tell the data format"):
        load_points(write(tmp_path, [{"foo": 1}]))
    bare = conversation()
    for u in bare["dialog"]:
        u["annotation"].pop("feedback", None)
    with pytest.raises(DataError, match="no conversation holds"):
        load_points(write(tmp_path, [bare]))


def scripted_user() -> ScriptedEngine:
    """Text-mode reaction simulator: better after questions, worse after advice; unparseable once."""

    def reply(prompt):
        text = prompt[-1]["content"]
        block = text.split("The supporter now says:")[-1]
        if "listening" in block:
            return "I do not know."  # no answer object: invalid, counted
        change = 5 if "?" in block else -5
        return json.dumps({"reply": "ok", "valence_change": change})

    return ScriptedEngine(fn=reply, structured=False)  # a server without structured output (one bad answer)


def run(tmp_path, engine, **kw):
    data = write(
        tmp_path, [conversation(), conversation(ratings=("5", "1")), conversation(ratings=("2", "2"))]
    )
    bench = Fidelity(users=["reaction"], rewards=["question"], n_boot=50)
    settings = EvalSettings(batch_size=2, judge_retries=0)
    summary = run_eval(
        bench, Roles(policy=None, simulator=engine), settings, tmp_path / "out", data=data, **kw
    )
    return summary


def test_scripted_end_to_end_counts_missing_predictions(tmp_path):
    summary = run(tmp_path, scripted_user())
    m = summary["metrics"]
    assert m["n_points"] == 6 and m["n_dialogues"] == 3
    assert list(dict.fromkeys(k.split("/")[0] for k in m if "/" in k)) == [
        "user:reaction",
        "reward:question",
        "random",
        "length",
        "questions",
    ]
    # the first point's only turn ("... I am listening.") never parsed: missing, not dropped
    assert m["user:reaction/missing"] == 3 and m["user:reaction/invalid_turns"] == 3
    # second points: a question (+5) then advice (-5) -> mean 0; ratings fall in two of three dialogues
    records = read_records(tmp_path / "out" / "results.jsonl")
    assert len(records) == 6
    second = next(r for r in records if r["id"].endswith("-r7"))
    assert second["info"]["predictions"]["user:reaction"]["turns"] == [5.0, -5.0]
    assert "rating" not in json.dumps([c["content"] for c in second["transcript"]])
    assert m["random/pairs"] == 2  # the ("2", "2") conversation has no pair
    assert set(m) >= {"user:reaction/spearman_lo", "user:reaction/pairwise", "user:reaction/survey_spearman"}
    # the three conversations' surveys all say 4 -> 2: a constant side, so no correlation (not 0)
    assert m["user:reaction/survey_dialogues"] == 3 and m["user:reaction/survey_spearman"] is None


def test_an_interrupted_run_resumes_without_redoing_or_losing_points(tmp_path):
    calls = {"n": 0}
    inner = scripted_user()

    def flaky(prompt):
        calls["n"] += 1
        if calls["n"] > 3:
            raise KeyboardInterrupt
        return inner.fn(prompt)

    with pytest.raises(KeyboardInterrupt):
        run(tmp_path, ScriptedEngine(fn=flaky, structured=False))
    kept = read_records(tmp_path / "out" / "results.jsonl")
    assert 0 < len(kept) < 6
    engine = scripted_user()
    summary = run(tmp_path, engine)
    records = read_records(tmp_path / "out" / "results.jsonl")
    assert sorted(r["id"] for r in records) == sorted({r["id"] for r in records})
    assert summary["n_cases"] == 6 and summary["metrics"]["n_points"] == 6
    asked = sum(len(c["prompts"]) for c in engine.calls)
    assert asked < 7  # only the points not yet written were asked again
    before = len(engine.calls)
    run(tmp_path, engine)  # nothing left to do
    assert len(engine.calls) == before


def test_limit_counts_conversations(tmp_path):
    summary = run(tmp_path, scripted_user(), limit=2)
    assert summary["metrics"]["n_dialogues"] == 2 and summary["n_cases"] == 4
    # two conversations always rank +-1: the dialogue-level figure needs three
    assert summary["metrics"]["random/survey_dialogues"] == 0
    assert summary["metrics"]["random/survey_spearman"] is None


def test_cli_runs_baselines_and_the_report_shows_the_section(tmp_path, capsys):
    data = write(tmp_path, [conversation(), conversation(ratings=("5", "1"))])
    out = tmp_path / "fid"
    assert (
        main(["eval", "--benchmark", "fidelity", "--data", data, "--reward", "length", "--output", str(out)])
        == 0
    )
    summary = json.loads((out / "summary.json").read_text())
    assert summary["metrics"]["reward:length/points"] == 4
    assert (
        main(["eval", "--benchmark", "fidelity", "--data", data, "--reward", "length", "--output", str(out)])
        == 0
    )
    assert len(read_records(out / "results.jsonl")) == 4  # resumed: nothing rerun
    assert compute_summary(out)["metrics"]["random/points"] == 4
    assert main(["report", str(out), "--output", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "report.html").read_text()
    assert "Fidelity to real seekers" in page and page.count("data:image/png") >= 1
    assert "| fid | reward:length |" in (tmp_path / "rep" / "report.md").read_text()
    capsys.readouterr()
    assert (
        main(
            [
                "eval",
                "--benchmark",
                "esconv",
                "--policy",
                "p",
                "--user",
                "reaction",
                "--output",
                str(tmp_path / "x"),
            ]
        )
        != 0
    )
    assert "fidelity only" in capsys.readouterr().err
    assert main(["eval", "--benchmark", "fidelity", "--output", str(tmp_path / "y")]) != 0
    assert "--data is required" in capsys.readouterr().err


# ---------------------------------------------------------------------------- served engines
def three_conversations(tmp_path):
    convs = [conversation(), conversation(ratings=("5", "1")), conversation(ratings=("2", "2"))]
    return write(tmp_path, convs)


def test_on_a_served_engine_every_predictor_and_point_goes_out_at_once(tmp_path):
    from rapo_echo.engines.openai_engine import OpenAIEngine
    from tests.helpers.fake_openai import FakeAPI, Rendezvous, ServedAPI, prompt_of

    # 3 conversations x 3 rated turns = 9 turns; the first round: the reaction user's message and emotion
    # read, SAGE's analysis (its change label read from the same request) and the humanlike judge, 36
    rv = Rendezvous(36, lambda s: s.method == "POST" and prompt_of(s) != "Hi")  # "Hi": the setup's probe
    with FakeAPI(ServedAPI(gate=rv)) as api:
        engine = OpenAIEngine(api.url, api_key_env=None)
        bench = Fidelity(users=["reaction", "sage"], rewards=["humanlike"], n_boot=20)
        roles = Roles(policy=None, simulator=engine, judge=engine)
        summary = run_eval(bench, roles, EvalSettings(), tmp_path / "out", data=three_conversations(tmp_path))
    assert rv.peak == 36  # one wave: all six points in one batch, the predictors together
    chats = [s for s in api.posts() if prompt_of(s) != "Hi"]
    assert len(chats) == 36 + 9  # then SAGE's replies: no separate change-label request
    assert summary["n_valid"] == 6 and summary["remote_failed"] == 0


def test_failed_requests_cost_their_turns_not_the_run(tmp_path, capsys):
    from tests.helpers.fake_openai import FakeAPI, ServedAPI, prompt_of

    advice = "You should just find another one."  # one of each conversation's three rated turns

    def fail(seen):  # every request about that turn fails, every time (HTTP 500)
        return 500 if advice in prompt_of(seen).split("The supporter now says:")[-1] else None

    served = ServedAPI(fail=fail)
    with FakeAPI(served) as api:
        out = tmp_path / "out"
        data = three_conversations(tmp_path)
        argv = ["eval", "--benchmark", "fidelity", "--data", data, "--user", "reaction", "--user", "sage",
                "--reward", "humanlike", "--simulator", api.url, "--judge", api.url,
                "--max-concurrency", "64", "--output", str(out)]  # fmt: skip
        assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    m = summary["metrics"]
    # 3 failed turns x (message, emotion read, analysis, humanlike verdict); each tried 4 times
    assert summary["remote_failed"] == 12 and served.failed == 48
    for name in ("user:reaction", "user:sage", "reward:humanlike"):
        assert m[f"{name}/invalid_turns"] == 3  # counted, and the points keep their other turns
    assert summary["n_cases"] == 6

"""Scenario data: loaders, validation errors, hindsight selection, the resumable stream, bundled data."""

from __future__ import annotations

import fnmatch
import json
import random
from importlib import resources
from pathlib import Path

import pytest

from rapo_echo.config import DataConfig, SelectionConfig
from rapo_echo.data import (
    BUNDLED_ESCONV,
    BUNDLED_SCENARIOS,
    NEUTRAL_FEEDBACK,
    SUPPORT_NEEDS,
    ScenarioStream,
    bundled_names,
    detect_format,
    dialogue_scenarios,
    esconv_dialogue,
    feedback_pivot_scores,
    load_dialogues,
    load_scenarios,
    scenarios_from_config,
    select_turns,
)
from rapo_echo.errors import DataError
from rapo_echo.types import Scenario
from tests.conftest import shared_data
from tests.helpers.data_files import refuses, write_jsonl


def sk(text: str, feedback: str | None = None) -> dict:
    return {"speaker": "seeker", "annotation": {"feedback": feedback} if feedback else {}, "content": text}


def sp(text: str, strategy: str) -> dict:
    return {"speaker": "supporter", "annotation": {"strategy": strategy}, "content": text}


def esconv_conv(dialog: list[dict], **extra) -> dict:
    conv = {
        "experience_type": "Current Experience",
        "emotion_type": "anxiety",
        "problem_type": "job crisis",
        "situation": "worried about a review",
        "survey_score": {"seeker": {"initial_emotion_intensity": "4", "final_emotion_intensity": "2"}},
        "dialog": dialog,
    }
    conv.update(extra)
    return conv


# dialog index: turn index (consecutive utterances of one speaker merge into one turn)
HAND_MADE = [
    sp("Hi, how are you?", "Question"),  # 0: turn 0 (assistant)
    sk("hello"),  # 1: turn 1 (user) ...
    sk("I feel awful", "2"),  # 2: ... rating 2
    sp("What happened?", "Question"),  # 3: turn 2
    sk("I might lose my job", "4"),  # 4: turn 3, rating 4
    sp("That sounds scary.", "Reflection of feelings"),  # 5: turn 4 ...
    sp("Just relax.", "Providing Suggestions"),  # 6: ... merged
    sk("easy for you to say"),  # 7: turn 5
    sp("You're right, sorry.", "Others"),  # 8: turn 6
    sk("whatever", "1"),  # 9: turn 7, rating 1
    sp("I am still here.", "Affirmation and Reassurance"),  # 10: turn 8
    sk("ok"),  # 11: turn 9
]


def hand_made_dialogue():
    return esconv_dialogue(esconv_conv(HAND_MADE), where="hand:1", index=0, stem="hand", file="hand")


# --------------------------------------------------------------------------- hindsight selection


def test_pivot_scores_by_hand():
    # ratings (dialog index, value): (2, 2), (4, 4), (9, 1); neutral start NEUTRAL_FEEDBACK = 3
    # turn 0 [dialog 0]:    before none -> 3, after first = 2 (idx 2)  -> |2 - 3| = 1
    # turn 2 [dialog 3]:    before 2 (idx 2), after 4 (idx 4)          -> |4 - 2| = 2
    # turn 4 [dialog 5-6]:  before 4 (idx 4), after 1 (idx 9)          -> |1 - 4| = 3
    # turn 6 [dialog 8]:    before 4 (idx 4), after 1 (idx 9)          -> |1 - 4| = 3
    # turn 8 [dialog 10]:   no rating after                            -> no score
    assert NEUTRAL_FEEDBACK == 3
    assert feedback_pivot_scores(hand_made_dialogue()) == {0: 1.0, 2: 2.0, 4: 3.0, 6: 3.0}


def test_merging_and_roles():
    turns = hand_made_dialogue().turns()
    assert [t.role for t in turns] == ["assistant", "user"] * 5
    assert turns[1].content == "hello\nI feel awful" and (turns[1].first, turns[1].last) == (1, 2)
    assert turns[4].content == "That sounds scary.\nJust relax."
    assert turns[4].strategies == ["Reflection of feelings", "Providing Suggestions"]


@pytest.mark.parametrize(
    ("selection", "expected"),
    [
        # eligible (>= 1 seeker turn before): turns 2, 4, 6, 8; scored 2, 4, 6 (>= threshold 1)
        (SelectionConfig(), [(2, 2.0), (4, 3.0), (6, 3.0)]),
        # top-1: turns 4 and 6 tie at 3 -> the earlier one
        (SelectionConfig(top_k_per_dialogue=1), [(4, 3.0)]),
        (SelectionConfig(top_k_per_dialogue=2), [(4, 3.0), (6, 3.0)]),
        (SelectionConfig(threshold=2.5), [(4, 3.0), (6, 3.0)]),
        # seeker turns before: turn 2 -> 1, turn 4 -> 2, turn 6 -> 3, turn 8 -> 4
        (SelectionConfig(min_history_turns=3), [(6, 3.0)]),
        (SelectionConfig(signal="none"), [(2, None), (4, None), (6, None), (8, None)]),
        (SelectionConfig(signal="none", min_history_turns=4), [(8, None)]),
        # turn 0 has no seeker turn before it, so it is never a scenario, even with min_history_turns=0
        (SelectionConfig(threshold=0.0, min_history_turns=0), [(2, 2.0), (4, 3.0), (6, 3.0)]),
    ],
)
def test_select_turns(selection, expected):
    assert select_turns(hand_made_dialogue(), selection) == expected


def test_no_feedback_falls_back_to_every_turn():
    plain = [
        {**u, "annotation": {k: v for k, v in u["annotation"].items() if k != "feedback"}} for u in HAND_MADE
    ]
    dialogue = esconv_dialogue(esconv_conv(plain), where="x", index=0, stem="x", file="x")
    assert select_turns(dialogue, SelectionConfig()) == [(2, None), (4, None), (6, None), (8, None)]


def test_dialogue_scenarios_content():
    scenarios = dialogue_scenarios(hand_made_dialogue(), SelectionConfig(top_k_per_dialogue=1))
    assert len(scenarios) == 1
    s = scenarios[0]
    assert s.id == "hand-0-5"
    assert s.messages == [
        {"role": "assistant", "content": "Hi, how are you?"},
        {"role": "user", "content": "hello\nI feel awful"},
        {"role": "assistant", "content": "What happened?"},
        {"role": "user", "content": "I might lose my job"},
    ]
    assert s.reference == "That sounds scary.\nJust relax."
    assert s.profile == {
        "emotion_type": "anxiety",
        "problem_type": "job crisis",
        "situation": "worried about a review",
        "experience_type": "Current Experience",
        "initial_emotion_intensity": 4,
        "final_emotion_intensity": 2,
    }
    assert s.meta == {
        "source": "esconv",
        "file": "hand",
        "dialogue": 0,
        "turn": 5,
        "strategy": ["Reflection of feelings", "Providing Suggestions"],
        "pivot_score": 3.0,
    }
    trimmed = dialogue_scenarios(
        hand_made_dialogue(), SelectionConfig(top_k_per_dialogue=1, max_history_messages=2)
    )
    assert trimmed[0].messages == s.messages[-2:]


# --------------------------------------------------------------------------- formats and detection


def test_scenarios_format_json_and_jsonl(tmp_path):
    rows = [
        {"opening": "I can't sleep.", "profile": {"need": "validation"}},
        {
            "id": "multi",
            "messages": [
                {"role": "system", "content": "be kind"},
                {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": "I failed."},
            ],
            "reference": "That hurts.",
            "meta": {"topic": "exam"},
        },
    ]
    for path in (write_jsonl(tmp_path / "mine.txt", rows), tmp_path / "mine.json"):
        if path.suffix == ".json":
            path.write_text(json.dumps(rows, indent=2))
        a, b = load_scenarios(path)
        assert a.id == "mine-0" and a.messages == [{"role": "user", "content": "I can't sleep."}]
        assert a.profile == {"need": "validation"} and a.reference is None
        assert b.id == "multi" and b.reference == "That hurts." and len(b.messages) == 4
        assert b.meta["topic"] == "exam" and b.meta["source"] == "scenarios"
    assert [s.id for s in load_scenarios(path, limit=1)] == ["mine-0"]


def test_detect_format():
    assert detect_format({"opening": "x"}, "f:1") == "scenarios"
    assert detect_format({"dialog": [{"speaker": "seeker", "content": "x"}]}, "f:1") == "esconv"
    assert detect_format({"dialog": [{"speaker": "listener", "content": "x"}]}, "f:1") == "esconv"
    assert detect_format({"dialog": [{"speaker": "usr", "text": "x"}]}, "f:1") == "ppdpp"
    assert detect_format({"text": '{"dialog": []}'}, "f:1") == "hf_esconv"
    with pytest.raises(DataError, match=r"f:7: cannot tell the data format from the keys \['foo'\]"):
        detect_format({"foo": 1}, "f:7")


def ppdpp_row(i: int) -> dict:
    return {
        "emotion_type": "sadness",
        "problem_type": "breakup with partner",
        "situation": f"situation {i}",
        "dialog": [
            {"text": "Hi, what's up?", "speaker": "sys", "strategy": "Question"},
            {"text": "she left me", "speaker": "usr"},
            {"text": "after six years", "speaker": "usr"},
            {"text": "I'm so sorry.", "speaker": "sys", "strategy": "Reflection of feelings"},
            {"text": "thanks", "speaker": "usr"},
        ],
    }


def test_ppdpp_file(tmp_path):
    path = write_jsonl(tmp_path / "esc-test.txt", [ppdpp_row(0), ppdpp_row(1)])
    scenarios = load_scenarios(path)  # auto-detected from content, not from the .txt name
    assert [s.id for s in scenarios] == ["esc-test-0-3", "esc-test-1-3"]
    s = scenarios[0]
    assert s.messages == [
        {"role": "assistant", "content": "Hi, what's up?"},
        {"role": "user", "content": "she left me\nafter six years"},
    ]
    assert s.reference == "I'm so sorry."
    assert s.meta == {
        "source": "ppdpp",
        "file": str(path),
        "dialogue": 0,
        "turn": 3,
        "strategy": ["Reflection of feelings"],
    }
    assert s.profile == {
        "emotion_type": "sadness",
        "problem_type": "breakup with partner",
        "situation": "situation 0",
    }


def test_hf_esconv_rows_from_jsonl_and_parquet(tmp_path, monkeypatch):
    """JSON rows are read by our line-numbered reader; a parquet file of the same rows goes through
    datasets and gives the same scenarios."""
    import datasets

    calls = []
    real = datasets.load_dataset

    def spy(*args, **kwargs):
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", spy)
    rows = [{"text": json.dumps(ppdpp_row(i))} for i in range(3)]
    jsonl = write_jsonl(tmp_path / "train.json", rows)
    scenarios = load_scenarios(jsonl)
    assert not calls
    assert len(scenarios) == 3 and {s.meta["source"] for s in scenarios} == {"hf_esconv"}
    assert scenarios[2].profile["situation"] == "situation 2" and scenarios[2].reference == "I'm so sorry."
    parquet = tmp_path / "train.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(parquet))
    from_parquet = load_scenarios(parquet)
    assert calls and calls[0][0][0] == "parquet" and calls[0][1]["data_files"] == str(parquet)
    assert [(s.id, s.messages, s.reference) for s in from_parquet] == [
        (s.id, s.messages, s.reference) for s in scenarios
    ]
    as_list = tmp_path / "rows.json"
    as_list.write_text(json.dumps(rows))
    assert [s.id for s in load_scenarios(as_list, fmt="hf_esconv")] == ["rows-0-3", "rows-1-3", "rows-2-3"]


def test_hf_esconv_errors_name_the_line(tmp_path):
    bad = ppdpp_row(1)
    bad["dialog"][1]["speaker"] = "bot"
    rows = [{"text": json.dumps(ppdpp_row(0))}, {"text": json.dumps(bad)}, {"text": "{not json"}]
    path = write_jsonl(tmp_path / "hf.jsonl", rows)
    message = r"text\.dialog\[1\]\.speaker: got 'bot'; expected one of usr, sys"
    with pytest.raises(DataError, match=rf"{path}:2: {message}"):
        load_scenarios(path, fmt="hf_esconv")
    write_jsonl(path, [rows[0], rows[2]])
    with pytest.raises(DataError, match=rf"{path}:2: text: .*expected one conversation"):
        load_scenarios(path, fmt="hf_esconv")
    write_jsonl(path, [{"conversation": "x"}])
    with pytest.raises(DataError, match=r"text: column missing \(columns: conversation\)"):
        load_scenarios(path, fmt="hf_esconv")


def test_scenarios_from_config():
    cfg = DataConfig(path="bundled:" + BUNDLED_ESCONV, limit=3, selection=SelectionConfig(signal="none"))
    scenarios = scenarios_from_config(cfg)
    assert len(scenarios) == 3
    assert [s.id for s in scenarios] == [
        s.id
        for s in load_scenarios("bundled:" + BUNDLED_ESCONV, selection=SelectionConfig(signal="none"))[:3]
    ]
    assert all("pivot_score" not in s.meta for s in scenarios)


# --------------------------------------------------------------------------- errors


def test_broken_jsonl_line_is_named(tmp_path):
    path = tmp_path / "data.jsonl"
    refuses(
        load_scenarios,
        path,
        '{"opening": "a"}\n{"opening": "b"}\n{"opening": "c"\n{"opening": "d"}\n',
        rf"^{path}:3: invalid JSON",
    )


def test_broken_first_line_of_jsonl(tmp_path):
    path = tmp_path / "data.jsonl"
    refuses(load_scenarios, path, '{"opening": "a",\n{"opening": "b"}\n', rf"^{path}:1: invalid JSON")


def test_json_list_errors_and_element_lines(tmp_path):
    path = tmp_path / "data.json"
    path.write_text('[\n  {"opening": "a"},\n  {"opening": "b",\n   "refrence": "x"}\n]\n')
    message = r"refrence: unknown key; did you mean 'reference'\? \(keys read: id, "
    with pytest.raises(DataError, match=rf"^{path}:3 \(list index 1\): {message}"):
        load_scenarios(path)
    refuses(
        load_scenarios,
        path,
        '[\n  {"opening": "a"},\n  {"opening": "b"\n  {"opening": "c"}\n]\n',
        rf"^{path}:4: invalid JSON: Expecting ',' delimiter",
    )
    refuses(load_scenarios, path, '[{"opening": "a"}] x', "extra data after the closing")


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"profile": {}}, r"messages / opening / prompt: got none of them; expected exactly one of them"),
        ({"opening": "a", "messages": [{"role": "user", "content": "b"}]}, "got messages and opening"),
        ({"opening": 5}, r"opening: got int 5; expected a string"),
        ({"opening": "  "}, "opening: empty"),
        ({"messages": []}, "messages: expected a non-empty list"),
        ({"messages": [{"role": "user"}]}, r"messages\[0\]\.content: missing; expected a string"),
        ({"messages": [{"role": "bot", "content": "x"}]}, r"messages\[0\]\.role: got 'bot'; expected one of"),
        (
            {"messages": [{"role": "assistant", "content": "x"}, {"role": "assistant", "content": "y"}]},
            r"messages\[0\]\.role: got 'assistant'; the context must end with the user's turn",
        ),
        (
            {"messages": [{"role": "assistant", "content": "y"}]},
            r"messages\[0\]\.role: got no turn before the reference reply",
        ),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
             "reference": "z"},
            r"messages\[1\]: an assistant last turn is the reference reply, and this row has a reference too",
        ),
        ({"prompt": [{"role": "user", "content": "x"}], "completion": 3}, "completion: expected a non-empty"),
        ({"prompt": "  "}, "prompt: empty"),
        (
            {"messages": [{"role": "user", "content": "x"}, {"role": "system", "content": "y"}]},
            "a system message may only come first",
        ),
        ({"opening": "x", "profile": "sad"}, r"profile: got str; expected a JSON object"),
        ({"opening": "x", "id": 3.5}, r"id: got float 3.5; expected a string or an integer"),
        (["opening"], "expected a JSON object, got list"),
    ],
)
def test_scenario_field_errors(tmp_path, record, message):
    path = write_jsonl(tmp_path / "s.jsonl", [{"opening": "fine"}, record])
    with pytest.raises(DataError, match=rf"{path}:2: .*{message}"):
        load_scenarios(path, fmt="scenarios")


def test_duplicate_ids(tmp_path):
    rows = [{"id": "a", "opening": "x"}, {"opening": "y"}, {"id": "a", "opening": "z"}]
    path = write_jsonl(tmp_path / "s.jsonl", rows)
    with pytest.raises(DataError, match=rf"{path}:3: id: 'a' is already used at {path}:1"):
        load_scenarios(path)
    # a default id (<stem>-<n>) may clash with an explicit one too
    path = write_jsonl(tmp_path / "t.jsonl", [{"id": "t-1", "opening": "x"}, {"opening": "y"}])
    with pytest.raises(DataError, match=r"'t-1' is already used"):
        load_scenarios(path)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda c: c.pop("situation"), r"situation: missing; expected a string"),
        (lambda c: c.pop("dialog"), r"dialog: missing; expected a non-empty list"),
        (lambda c: c["dialog"][1].update(speaker="bot"), r"dialog\[1\]\.speaker: got 'bot'; expected one of"),
        (lambda c: c["dialog"][2].pop("content"), r"dialog\[2\]\.content: missing"),
        (
            lambda c: c["dialog"][2]["annotation"].update(feedback="7"),
            r"dialog\[2\]\.annotation\.feedback: got '7'; expected a rating from 1 to 5",
        ),
        (
            lambda c: c["survey_score"]["seeker"].update(initial_emotion_intensity="high"),
            r"survey_score\.seeker\.initial_emotion_intensity: got 'high'",
        ),
    ],
)
def test_esconv_field_errors(tmp_path, mutate, message):
    convs = [esconv_conv([dict(u, annotation=dict(u["annotation"])) for u in HAND_MADE]) for _ in range(2)]
    mutate(convs[1])
    path = tmp_path / "ESConv.json"
    path.write_text(json.dumps(convs, indent=1))
    second_line = path.read_text().split("\n").index(" {", 2) + 1
    with pytest.raises(DataError, match=rf"{path}:{second_line} \(list index 1\): {message}"):
        load_scenarios(path, fmt="esconv")


def test_file_level_errors(tmp_path):
    with pytest.raises(DataError, match="data file not found"):
        load_scenarios(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="is a folder"):
        load_scenarios(tmp_path)
    empty = tmp_path / "empty.jsonl"
    refuses(load_scenarios, empty, "\n  \n", rf"{empty}: the file is empty")
    (tmp_path / "list.json").write_text("[]")
    with pytest.raises(DataError, match="holds an empty list"):
        load_scenarios(tmp_path / "list.json")
    (tmp_path / "csv.txt").write_text("a,b\n1,2\n")
    with pytest.raises(DataError, match=r"csv.txt:1: expected a JSON list \('\['\) or JSON objects"):
        load_scenarios(tmp_path / "csv.txt")
    good = write_jsonl(tmp_path / "good.jsonl", [{"opening": "x"}])
    with pytest.raises(DataError, match="unknown data format 'csv'; allowed: auto, scenarios"):
        load_scenarios(good, fmt="csv")
    with pytest.raises(DataError, match="limit: got 0"):
        load_scenarios(good, limit=0)
    with pytest.raises(DataError, match="bundled:nope.json: no such bundled data file"):
        load_scenarios("bundled:nope.json")


def test_nothing_selected_is_an_error(tmp_path):
    path = tmp_path / "one.json"
    path.write_text(json.dumps([esconv_conv(HAND_MADE)]))
    with pytest.raises(DataError, match="no scenarios were selected.*lower data.selection.threshold"):
        load_scenarios(path, selection=SelectionConfig(threshold=4.0))


# --------------------------------------------------------------------------- stream


def make_scenarios(n: int) -> list[Scenario]:
    return [Scenario(id=f"s{i}", messages=[{"role": "user", "content": str(i)}]) for i in range(n)]


def test_stream_walks_a_seeded_permutation_per_epoch():
    scenarios = make_scenarios(5)
    stream = ScenarioStream(scenarios, seed=7)
    drawn = [s.id for _ in range(5) for s in stream.next_batch(3)]  # 15 = three epochs of 5
    for epoch in range(3):
        order = list(range(5))
        random.Random(7 + epoch).shuffle(order)
        assert drawn[5 * epoch : 5 * epoch + 5] == [f"s{i}" for i in order]
    assert stream.epoch == 2 and stream.position == 5
    assert drawn[:5] != drawn[5:10] or drawn[5:10] != drawn[10:15]  # reshuffled between epochs
    plain = ScenarioStream(scenarios, seed=7, shuffle=False)
    assert [s.id for s in plain.next_batch(7)] == ["s0", "s1", "s2", "s3", "s4", "s0", "s1"]


def test_stream_resumes_exactly():
    scenarios = make_scenarios(11)
    stream = ScenarioStream(scenarios, seed=3)
    for _ in range(4):
        stream.next_batch(4)
    state = json.loads(json.dumps(stream.state_dict()))
    assert (state["epoch"], state["position"]) == (1, 5)  # 16 drawn = 11 + 5
    expected = [[s.id for s in stream.next_batch(4)] for _ in range(6)]
    resumed = ScenarioStream(scenarios, seed=3)
    resumed.load_state_dict(state)
    assert [[s.id for s in resumed.next_batch(4)] for _ in range(6)] == expected


def test_stream_state_mismatch_and_bad_input():
    state = ScenarioStream(make_scenarios(4), seed=1).state_dict()
    with pytest.raises(DataError, match="stream state: seed: saved 1, this stream has 2"):
        ScenarioStream(make_scenarios(4), seed=2).load_state_dict(state)
    with pytest.raises(DataError, match="stream state: size"):
        ScenarioStream(make_scenarios(5), seed=1).load_state_dict(state)
    other = make_scenarios(4)
    other[0].id = "changed"
    with pytest.raises(DataError, match="stream state: fingerprint"):
        ScenarioStream(other, seed=1).load_state_dict(state)
    with pytest.raises(DataError, match="stream state: position: got -1"):
        ScenarioStream(make_scenarios(4), seed=1).load_state_dict({"epoch": 0, "position": -1})
    with pytest.raises(DataError, match="no scenarios"):
        ScenarioStream([], seed=0)
    with pytest.raises(ValueError, match="batch size"):
        ScenarioStream(make_scenarios(2), seed=0).next_batch(0)


# --------------------------------------------------------------------------- bundled data


def test_bundled_files_are_package_data():
    names = bundled_names()
    assert BUNDLED_SCENARIOS in names and BUNDLED_ESCONV in names
    root = resources.files("rapo_echo")
    for name in names:
        assert (root / "examples" / name).is_file()
    # every bundled file matches a package-data pattern, so wheels ship it
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    setuptools_cfg = pyproject["tool"]["setuptools"]
    assert "rapo_echo.examples" in setuptools_cfg["packages"]
    patterns = setuptools_cfg["package-data"]["rapo_echo.examples"]
    for name in names:
        assert any(fnmatch.fnmatch(name, p) for p in patterns), name
    default = load_scenarios()
    assert default[0].meta["file"] == str(root / "examples" / BUNDLED_SCENARIOS)


def test_bundled_scenarios_validate():
    scenarios = load_scenarios()
    assert len(scenarios) >= 24
    assert len({s.id for s in scenarios}) == len(scenarios)
    needs = set()
    multi_turn = 0
    for s in scenarios:
        assert set(s.profile) == {"persona", "emotion_type", "problem_type", "situation", "need"}, s.id
        assert all(isinstance(v, str) and v.strip() for v in s.profile.values()), s.id
        assert s.profile["need"] in SUPPORT_NEEDS, s.id
        needs.add(s.profile["need"])
        assert s.messages[-1]["role"] == "user"
        if len(s.messages) > 1:
            multi_turn += 1
            exchanges = len(s.messages) // 2
            assert 2 <= exchanges <= 4, s.id
            assert [m["role"] for m in s.messages] == ["user", "assistant"] * exchanges + ["user"], s.id
    assert needs == set(SUPPORT_NEEDS)
    assert len(scenarios) / 4 <= multi_turn <= len(scenarios) / 2


def test_bundled_esconv_style():
    dialogues = load_dialogues("bundled:" + BUNDLED_ESCONV)
    assert len(dialogues) == 6
    assert sum(bool(d.feedback()) for d in dialogues) == 5  # one conversation has no ratings
    for d in dialogues:
        assert d.source == "esconv"
        assert all(u.strategy for u in d.utterances if u.role == "assistant")
    picked = load_scenarios("bundled:" + BUNDLED_ESCONV)
    every = load_scenarios("bundled:" + BUNDLED_ESCONV, selection=SelectionConfig(signal="none"))
    assert 0 < len(picked) < len(every)
    assert {s.id for s in picked} <= {s.id for s in every}
    for s in every:
        assert s.messages[-1]["role"] == "user" and s.reference
    # the conversation with no ratings contributes all its turns with no score
    no_feedback = next(d.index for d in dialogues if not d.feedback())
    ours = [s for s in picked if s.meta["dialogue"] == no_feedback]
    assert ours and all("pivot_score" not in s.meta for s in ours)
    assert all(s.meta["pivot_score"] >= 1.0 for s in picked if s.meta["dialogue"] != no_feedback)


# --------------------------------------------------------------------------- real shared data


def raw_turn_text(dialog: list[dict], start: int, key: str) -> str:
    """The supporter turn starting at ``start``: it and the following utterances of the same speaker."""
    out = []
    for u in dialog[start:]:
        if u["speaker"] != dialog[start]["speaker"]:
            break
        out.append(u[key].strip())
    return "\n".join(out)


def test_shared_ppdpp_test_split():
    path = shared_data("esconv", "ppdpp_esc-test.jsonl")
    raw = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    assert len(load_dialogues(path)) == len(raw) == 130
    scenarios = load_scenarios(path)
    assert {s.meta["source"] for s in scenarios} == {"ppdpp"}
    assert len({s.meta["dialogue"] for s in scenarios}) == 130
    for s in scenarios:
        dialog = raw[s.meta["dialogue"]]["dialog"]
        assert dialog[s.meta["turn"]]["speaker"] == "sys"
        assert s.reference == raw_turn_text(dialog, s.meta["turn"], "text")
        assert s.messages[-1]["role"] == "user" and len(s.messages) <= 12
        assert "pivot_score" not in s.meta


def test_shared_failed_esconv():
    path = shared_data("esconv", "FailedESConv.json")
    raw = json.loads(path.read_text())
    dialogues = load_dialogues(path)
    assert len(dialogues) == len(raw) == 196
    assert {d.source for d in dialogues} == {"failed_esconv"}
    picked = load_scenarios(path, selection=SelectionConfig(top_k_per_dialogue=2))
    every = load_scenarios(path, selection=SelectionConfig(signal="none"))
    assert 0 < len(picked) < len(every)
    for s in every:
        dialog = raw[s.meta["dialogue"]]["dialog"]
        assert dialog[s.meta["turn"]]["speaker"] == "listener"
        assert s.reference == raw_turn_text(dialog, s.meta["turn"], "content")
        assert s.messages[-1]["role"] == "user"
    per_dialogue: dict[int, int] = {}
    for s in picked:
        per_dialogue[s.meta["dialogue"]] = per_dialogue.get(s.meta["dialogue"], 0) + 1
        if "pivot_score" in s.meta:
            assert s.meta["pivot_score"] >= 1.0
    assert max(per_dialogue.values()) <= 2

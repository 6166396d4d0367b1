"""Data sources through one reader: the same rows from JSON, JSONL, parquet, arrow, csv, a saved dataset
folder and a Hub id; TRL's prompt / prompt-completion / messages rows; column mapping; errors."""

from __future__ import annotations

import json

import datasets
import pytest

from rapo_echo.config import DataConfig
from rapo_echo.data import load_scenarios, read_rows, scenarios_from_config
from rapo_echo.errors import DataError

ROWS = [
    {"id": "a", "prompt": [{"role": "user", "content": "I failed my exam."}]},
    {
        "id": "b",
        "prompt": [
            {"role": "system", "content": "Be kind."},
            {"role": "user", "content": "My dog died."},
        ],
        "completion": [{"role": "assistant", "content": "I'm so sorry about your dog."}],
    },
    {
        "id": "c",
        "messages": [
            {"role": "user", "content": "I can't sleep."},
            {"role": "assistant", "content": "That sounds exhausting."},
            {"role": "user", "content": "It's been weeks."},
            {"role": "assistant", "content": "Weeks without sleep is hard; what keeps you up?"},
        ],
    },
]


def seen(scenarios):
    return [(s.id, s.messages, s.reference) for s in scenarios]


EXPECTED = [
    ("a", [{"role": "user", "content": "I failed my exam."}], None),
    (
        "b",
        [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "My dog died."}],
        "I'm so sorry about your dog.",
    ),
    (
        "c",
        [
            {"role": "user", "content": "I can't sleep."},
            {"role": "assistant", "content": "That sounds exhausting."},
            {"role": "user", "content": "It's been weeks."},
        ],
        "Weeks without sleep is hard; what keeps you up?",
    ),
]


def write_each_format(tmp_path) -> dict[str, str]:
    """The rows as JSON, JSONL, parquet, arrow and a save_to_disk folder."""
    (tmp_path / "rows.json").write_text(json.dumps(ROWS, indent=1))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    # a table holds one schema: each row has every column (None where it had none)
    table = datasets.Dataset.from_list([{"messages": None, "completion": None, **r} for r in ROWS])
    table.to_parquet(str(tmp_path / "rows.parquet"))
    table.save_to_disk(str(tmp_path / "saved"))
    arrow = next((tmp_path / "saved").glob("*.arrow"))
    (tmp_path / "rows.arrow").write_bytes(arrow.read_bytes())
    datasets.DatasetDict({"train": table.select([0]), "test": table}).save_to_disk(str(tmp_path / "dict"))
    return {
        "json": str(tmp_path / "rows.json"),
        "jsonl": str(tmp_path / "rows.jsonl"),
        "parquet": str(tmp_path / "rows.parquet"),
        "arrow": str(tmp_path / "rows.arrow"),
        "saved": str(tmp_path / "saved"),
    }


def test_same_rows_from_every_format(tmp_path):
    paths = write_each_format(tmp_path)
    for kind, path in paths.items():
        assert seen(load_scenarios(path)) == EXPECTED, kind
    # a saved DatasetDict: the split named (the train split holds only the first row)
    assert seen(load_scenarios(tmp_path / "dict", split="test")) == EXPECTED
    assert seen(load_scenarios(tmp_path / "dict")) == EXPECTED[:1]
    with pytest.raises(DataError, match=r"dict: no split 'dev'; it has train, test \(set data.split\)"):
        load_scenarios(tmp_path / "dict", split="dev")


def test_locations_name_line_or_row(tmp_path):
    paths = write_each_format(tmp_path)
    assert [r.where for r in read_rows(paths["jsonl"])] == [f"{paths['jsonl']}:{i}" for i in (1, 2, 3)]
    assert [r.where for r in read_rows(paths["parquet"], limit=2)] == [
        f"{paths['parquet']} row 0",
        f"{paths['parquet']} row 1",
    ]
    bad = [*ROWS[:2], {"id": "d", "prompt": [{"role": "bot", "content": "x"}]}]
    datasets.Dataset.from_list([{"completion": None, **r} for r in bad]).to_parquet(
        str(tmp_path / "bad.parquet")
    )
    with pytest.raises(DataError, match=r"bad.parquet row 2: prompt\[0\]\.role: got 'bot'"):
        load_scenarios(tmp_path / "bad.parquet")


def test_plain_prompts_from_csv_and_extra_columns(tmp_path):
    path = tmp_path / "plain.csv"
    path.write_text('prompt,topic,id\n"I lost my job, and I am scared.",work,7\nI cannot sleep.,health,8\n')
    scenarios = load_scenarios(path)
    assert seen(scenarios) == [
        ("7", [{"role": "user", "content": "I lost my job, and I am scared."}], None),
        ("8", [{"role": "user", "content": "I cannot sleep."}], None),
    ]
    assert scenarios[0].meta["columns"] == {"topic": "work"}  # kept for TRL-style reward functions
    tsv = tmp_path / "plain.tsv"
    tsv.write_text("prompt\ttopic\nI am lonely.\tfriends\n")
    assert load_scenarios(tsv)[0].messages == [{"role": "user", "content": "I am lonely."}]


def test_columns_rename_before_the_format_is_read(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question": "I am anxious.", "answer": "That sounds hard."}\n')
    with pytest.raises(DataError, match=r"cannot tell the data format.*data.columns"):
        load_scenarios(path)
    cfg = DataConfig(path=str(path), columns={"question": "prompt", "answer": "completion"})
    assert seen(scenarios_from_config(cfg)) == [
        ("q-0", [{"role": "user", "content": "I am anxious."}], "That sounds hard.")
    ]
    cfg = DataConfig(path=str(path), columns={"query": "prompt"})
    with pytest.raises(DataError, match=rf"{path}:1: data.columns: column 'query' is not in this row"):
        scenarios_from_config(cfg)


def test_hub_id_goes_to_datasets_load_dataset(monkeypatch):
    calls = []

    def load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return datasets.Dataset.from_list([{"prompt": "I feel alone."}])

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    cfg = DataConfig(path="someone/support-prompts", subset="en", split="validation")
    scenarios = scenarios_from_config(cfg)
    assert calls == [("someone/support-prompts", "en", "validation")]
    assert seen(scenarios) == [("support-prompts-0", [{"role": "user", "content": "I feel alone."}], None)]
    assert read_rows("someone/support-prompts", subset="en", split="validation")[0].where == (
        "someone/support-prompts/en[validation] row 0"
    )


def test_hub_id_unreachable_says_what_a_source_is(monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)  # as here: no network
    with pytest.raises(DataError, match=r"nobody-here/no-such-set: not a local file or folder.*parquet"):
        load_scenarios("nobody-here/no-such-set")


def test_file_errors_say_which_sources_exist(tmp_path):
    parquet_named_json = tmp_path / "rows.json"
    datasets.Dataset.from_list([{"prompt": "x"}]).to_parquet(str(parquet_named_json))
    with pytest.raises(DataError, match=r"not UTF-8 text .*a parquet file: name it \.parquet"):
        load_scenarios(parquet_named_json)
    with pytest.raises(DataError, match=r"nope.parquet: data file not found; a data source is .*Hub"):
        load_scenarios(tmp_path / "nope.parquet")
    with pytest.raises(DataError, match=r"save_to_disk"):
        load_scenarios(tmp_path)
    broken = tmp_path / "broken.parquet"
    broken.write_text("not parquet")
    with pytest.raises(DataError, match=r"broken.parquet: datasets could not read it as parquet"):
        load_scenarios(broken)


@pytest.mark.parametrize("name", ["csv", "json", "parquet", "text", "CSV"])
def test_a_loader_name_is_not_taken_for_a_hub_dataset(name, tmp_path, monkeypatch):
    # issue 46: --data csv loaded every csv under the working folder, recursively, without a word
    (tmp_path / "deep").mkdir()
    (tmp_path / "deep" / "secret.csv").write_text("prompt\nsomeone else's rows\n")
    monkeypatch.chdir(tmp_path)
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append(a))
    with pytest.raises(
        DataError, match=rf"{name}: no such file here, and '{name}' is the name of a datasets loader"
    ):
        read_rows(name)
    assert calls == []

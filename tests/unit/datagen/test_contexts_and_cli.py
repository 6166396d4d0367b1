"""The data commands read contexts through the training loader and write scenario rows it reads back; the
command line refuses bad settings and a foreign --output before any model loads; every switch is
documented."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from rapo_echo.cli import main
from rapo_echo.config import DataConfig
from rapo_echo.data import scenarios_from_config
from rapo_echo.datagen.contexts import context_key, load_contexts, scenario_row
from rapo_echo.datagen.critique_rewrite import CritiqueRewriteSettings
from rapo_echo.datagen.hard_prompts import HardPromptSettings
from rapo_echo.datagen.reference_replies import ReferenceSettings
from rapo_echo.datagen.synthesis import SynthesisSettings
from rapo_echo.errors import ConfigError, DataError
from tests.conftest import shared_data

REPO = Path(__file__).resolve().parents[3]


def test_contexts_are_the_training_loaders(tmp_path: Path) -> None:
    path = shared_data("esconv", "FailedESConv.json")
    ours = load_contexts(str(path), limit=20)
    assert ours == scenarios_from_config(DataConfig(path=str(path), limit=20))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(scenario_row(sc, tag=1)) + "\n" for sc in ours))
    back = load_contexts(str(rows))
    assert [(s.id, s.messages, s.profile, s.reference) for s in back] == [
        (s.id, s.messages, s.profile, s.reference) for s in ours
    ]
    assert back[0].meta["tag"] == 1 and back[0].meta["source"] == ours[0].meta["source"]
    assert [context_key(s) for s in back] != [context_key(s) for s in ours]  # meta.tag is content


def test_context_problems_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"opening": "hi"}) + "\n")
    with pytest.raises(ConfigError, match="--format"):
        load_contexts(str(path), "csv")
    profiles = tmp_path / "p.jsonl"
    profiles.write_text(json.dumps({"id": "x", "player": "a nurse", "scene": "at work"}) + "\n")
    with pytest.raises(DataError, match=r"p.jsonl: context .*does not end with the person's message"):
        load_contexts(str(profiles))


def test_cli_refuses_before_loading_a_model(tmp_path: Path, capsys, monkeypatch) -> None:
    import rapo_echo.engines as engines

    monkeypatch.setattr(engines, "engine_from_spec", lambda *a, **k: pytest.fail("a model was loaded"))
    assert main(["data", "references", "--output", str(tmp_path / "a"), "--target", "7"]) == 2
    assert "flag --target: target: got 7; Input should be less than or equal to 5" in capsys.readouterr().err
    foreign = tmp_path / "run"
    foreign.mkdir()
    (foreign / "metrics.jsonl").write_text("{}\n")
    assert main(["data", "critique-rewrite", "--output", str(foreign)]) == 2
    assert "holds no data command" in capsys.readouterr().err
    assert main(["data", "hard-prompts", "--output", str(tmp_path / "b"), "--reward-args", "[1]"]) == 2
    assert main(["data", "synthesize", "--output", str(tmp_path / "c"), "--stages", "5:sad"]) == 2
    assert "TONE one of neutral, mild, intense" in capsys.readouterr().err
    assert (
        main(
            [
                "data",
                "critique-rewrite",
                "--output",
                str(tmp_path / "d"),
                "--writer",
                "rewriter",
                "--rewriter",
                "writer",
            ]
        )
        == 2
    )
    assert "name each other" in capsys.readouterr().err


@pytest.mark.parametrize(
    "settings", [CritiqueRewriteSettings, ReferenceSettings, HardPromptSettings, SynthesisSettings]
)
def test_every_switch_is_documented(settings: type) -> None:
    """Each setting (but the run-level ones) is a row of the switch tables in docs/algorithms/echo_n1.md,
    under its command-line flag."""
    page = (REPO / "docs" / "algorithms" / "echo_n1.md").read_text()
    common = {"seed", "batch_size", "use_logprobs", "max_retries"}
    for name in settings.model_fields:
        if name in common:
            continue
        flag = "--" + name.replace("_", "-")
        assert re.search(rf"`{re.escape(flag)}[` ]", page) or (
            name in ("include_reference", "system_in_rows") and f"--no-{name.replace('_', '-')}" in page
        ), f"{settings.__name__}.{name} ({flag}) is not in docs/algorithms/echo_n1.md"


def test_each_engine_is_named_by_the_roles_it_plays() -> None:
    """Progress bars said ``cli:hf: generate`` for every data command's role (issue 49, item 13)."""
    from rapo_echo.datagen.cli import load_engines

    specs = {"writer": "http://127.0.0.1:9/v1", "judge": "http://127.0.0.1:8/v1", "rewriter": "writer"}
    engines = load_engines(specs, model="m")  # a named model: no request to the (absent) servers
    assert engines["writer"] is engines["rewriter"] and engines["writer"].name == "writer+rewriter:openai"
    assert engines["judge"].name == "judge:openai"


def test_a_binary_constitution_is_a_one_line_error(tmp_path: Path, capsys) -> None:
    binary = tmp_path / "rules.bin"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe")
    assert (
        main(["data", "critique-rewrite", "--output", str(tmp_path / "o"), "--constitution", str(binary)])
        == 2
    )
    err = capsys.readouterr().err
    assert "--constitution" in err and "not UTF-8 text" in err and "Traceback" not in err

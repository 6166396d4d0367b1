"""Weights & Biases logging: the config (secrets redacted) at init, metrics, and samples as a table;
through the real wandb in offline mode when it is installed, and at the wandb boundary always."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rapo_echo.training.run_log import TABLE_COLUMNS, WandbLog, sample_records
from rapo_echo.types import Sample, Scenario, msg
from tests.helpers.wandb_stand_in import StandIn

CONFIG = {"algo": "grpo", "judge": {"engine": "openai", "api_key": "sk-live-123", "api_key_env": "KEY"}}


def samples() -> list[Sample]:
    sc = Scenario("s1", [msg("system", "Be kind."), msg("user", "I lost my job.")])
    out = []
    for i, text in enumerate(["That is hard.", "Oh no."]):
        s = Sample(sc, 0, [1], [2, 3], None, text, "stop")
        s.reward, s.info["advantage"] = 0.5 * i, (-1.0, 1.0)[i]
        out.append(s)
    return out


def test_sample_records_carry_their_rank() -> None:
    records = sample_records(samples(), step=3, rank=1)
    assert [(r["step"], r["rank"], r["reply"], r["advantage"]) for r in records] == [
        (3, 1, "That is hard.", -1.0),
        (3, 1, "Oh no.", 1.0),
    ]
    assert "advantage" not in records[0]["info"]


def test_wandb_gets_config_metrics_and_sample_tables(monkeypatch, tmp_path: Path) -> None:
    wandb = StandIn()
    monkeypatch.setitem(sys.modules, "wandb", wandb.module)
    log = WandbLog("proj", tmp_path / "run-a", CONFIG, resume=False)
    assert wandb.inits[0]["project"] == "proj" and wandb.inits[0]["name"] == "run-a"
    assert wandb.inits[0]["config"]["judge"] == {"engine": "openai", "api_key": "***", "api_key_env": "KEY"}
    log.metrics({"step": 1, "reward/mean": 0.25}, 1)
    log.samples(sample_records(samples(), step=1, rank=0), 1)
    log.close()
    (metrics, step_a), (table, step_b) = wandb.logged
    assert metrics == {"step": 1, "reward/mean": 0.25} and step_a == step_b == 1
    t = table["samples"]
    assert t.columns == list(TABLE_COLUMNS)
    assert t.data[1] == [1, 0, "s1", 0, "I lost my job.", "Oh no.", 0.5, 1.0, ""]
    assert wandb.finished == 1


def test_real_wandb_offline(monkeypatch, tmp_path: Path) -> None:
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    log = WandbLog("rapo-echo-test", run_dir, CONFIG, resume=False)
    assert dict(log.run.config)["judge"]["api_key"] == "***"
    log.metrics({"reward/mean": 0.25}, 1)
    log.samples(sample_records(samples(), step=1, rank=0), 1)
    log.close()
    tables = list(run_dir.glob("wandb/offline-run-*/files/media/table/samples_*.table.json"))
    assert len(tables) == 1
    written = json.loads(tables[0].read_text())
    assert written["columns"] == list(TABLE_COLUMNS)
    assert [row[5] for row in written["data"]] == ["That is hard.", "Oh no."]


def test_wandb_gets_no_key_a_reply_carries(monkeypatch, tmp_path: Path) -> None:
    """What goes to wandb is scrubbed as samples.jsonl is: a registered key in a reply or a metric name is
    masked (the wandb folder sits in the run folder)."""
    from rapo_echo import scrub

    monkeypatch.setattr(scrub, "_registered", set())  # this test's key only, forgotten after it
    scrub.register_secret("sk-live-0123456789abcdef")
    wandb = StandIn()
    monkeypatch.setitem(sys.modules, "wandb", wandb.module)
    log = WandbLog("proj", tmp_path / "run", CONFIG, resume=False)
    leaky = samples()
    leaky[0].text = "my key is sk-live-0123456789abcdef"
    log.metrics({"step": 1, "note/sk-live-0123456789abcdef": 1.0}, 1)
    log.samples(sample_records(leaky, step=1, rank=0), 1)
    (metrics, _), (table, _) = wandb.logged
    assert "sk-live-0123456789abcdef" not in json.dumps(metrics)
    assert "sk-live-0123456789abcdef" not in json.dumps(table["samples"].data)
    assert table["samples"].data[1][5] == "Oh no."

"""The EPM benchmark on the real embedded model: policy, simulated user, director and judge are all
SmolLM2-135M-Instruct; one short case, two turns, few tokens."""

from __future__ import annotations

import json

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.epm.vectors import INDEX_KEYS
from rapo_echo.benchmarks.results import read_records
from rapo_echo.benchmarks.runner import get_benchmark, run_eval

pytestmark = pytest.mark.integration

CARD = {
    "id": "short-01",
    "name": "Ana",
    "topic": "failing a driving test",
    "situation": "She failed her driving test this morning for the second time.",
    "threshold": "medium",
    "needs": {"cognitive": "low", "affective": "high", "proactive": "medium"},
    "stages": [{"title": "The examiner", "content": "The examiner sighed when she stalled."}],
    "memories": ["Her brother passed first time."],
}


def test_epm_on_the_embedded_model(smol_engine, tmp_path):
    data = tmp_path / "cards.json"
    data.write_text(json.dumps([CARD]))
    settings = EvalSettings(
        max_turns=2, max_new_tokens=12, judge_max_new_tokens=24, judge_retries=0, batch_size=1
    )
    summary = run_eval(
        get_benchmark("epm"),
        Roles(smol_engine, smol_engine, smol_engine),
        settings,
        tmp_path / "out",
        data=str(data),
        models={"policy": "default"},
    )
    [r] = read_records(tmp_path / "out" / "results.jsonl")
    # the hf engine exposes log-probs: every IEDR and MDEP level is read from label probabilities
    assert r["valid"] and r["info"]["iedr"]["source"] == "judge" and r["info"]["iedr"]["mode"] == "logprobs"
    assert all(t["mdep"]["mode"] == "logprobs" for t in r["info"]["turn_log"])
    assert len(r["info"]["trajectory"]) == 3 and r["info"]["end"] == "timeout"  # no verdict before turn 12
    assert r["info"]["turn_log"][0]["director"] in ("story", "memory", "wait")  # "end" waits for turn 12
    assert [t["role"] for t in r["transcript"]] == ["Ana", "companion", "Ana", "companion"]
    assert all(0.0 <= r["metrics"][k] < 1000.0 for k in INDEX_KEYS) and r["metrics"]["success"] == 0.0
    assert summary["metrics"]["success_rate"] == 0.0 and summary["metrics"]["epmq"] is not None

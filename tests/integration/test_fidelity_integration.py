"""The fidelity benchmark from the CLI with the embedded model: the reaction simulator (with the
log-likelihood of the real next messages) and the humanlike reward on a few real FailedESConv points."""

from __future__ import annotations

import json

import pytest

from rapo_echo.benchmarks.results import read_records
from rapo_echo.cli import main
from tests.conftest import shared_data


@pytest.mark.integration
def test_embedded_model_as_user_and_judge_from_the_cli(tmp_path, smol_path):
    source = shared_data("esconv", "FailedESConv.json")
    conv = json.loads(source.read_text(encoding="utf-8"))[0]
    rated = [i for i, u in enumerate(conv["dialog"]) if (u.get("annotation") or {}).get("feedback")]
    conv["dialog"] = conv["dialog"][: rated[1] + 1]  # its first two rated points: few prompts
    data = tmp_path / "two_points.json"
    data.write_text(json.dumps([conv]), encoding="utf-8")
    out = tmp_path / "fid"
    args = ["eval", "--benchmark", "fidelity", "--data", str(data), "--user", "reaction"]
    args += ["--reward", "humanlike", "--simulator", smol_path, "--judge", smol_path]
    args += ["--simulator-max-new-tokens", "8", "--judge-max-new-tokens", "8", "--output", str(out)]
    assert main(args) == 0
    m = json.loads((out / "summary.json").read_text())["metrics"]
    assert m["n_points"] == 2
    for name in ("user:reaction", "reward:humanlike", "random"):
        assert m[f"{name}/points"] + m[f"{name}/missing"] == 2
    assert m["user:reaction/loglik_tokens"] > 0  # the hf engine scores the real next messages
    assert m["user:reaction/loglik_persona"] < 0 and m["user:reaction/loglik_plain"] < 0
    records = read_records(out / "results.jsonl")
    assert all("user:reaction" in r["info"]["predictions"] for r in records)

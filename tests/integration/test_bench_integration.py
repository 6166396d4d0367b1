"""The three benchmarks on the real embedded model: in-process, from the CLI, and against ``rapo-echo serve``
(an OpenAI-compatible endpoint), then the report. Few cases, two turns, few tokens."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.report import build_report
from rapo_echo.benchmarks.results import read_records
from rapo_echo.benchmarks.runner import get_benchmark, run_eval
from rapo_echo.benchmarks.sotopia.evaluator import DIMENSIONS
from tests.conftest import shared_data
from tests.helpers.launch import served_process

pytestmark = pytest.mark.integration

TINY = EvalSettings(max_turns=2, max_new_tokens=10, judge_max_new_tokens=24, judge_retries=0, batch_size=2)


def test_three_benchmarks_on_the_embedded_model(smol_engine, tmp_path):
    data = str(shared_data("esconv", "ppdpp_esc-test.jsonl"))
    roles = Roles(smol_engine, smol_engine, smol_engine)
    out = {}
    for name, bench_data in (("esconv", data), ("esconv-ref", data), ("sotopia", None)):
        out[name] = run_eval(
            get_benchmark(name),
            roles,
            TINY,
            tmp_path / name,
            data=bench_data,
            limit=2,
            models={"policy": "default"},
        )
        assert out[name]["n_cases"] == 2 and out[name]["complete"]
    records = read_records(tmp_path / "esconv" / "results.jsonl")
    for r in records:  # the hf engine exposes log-probs: the critic reads label probabilities
        assert r["valid"] and r["info"]["critic"][0]["mode"] == "logprobs"
        assert sum(r["info"]["critic"][0]["probs"].values()) == pytest.approx(1.0)
        assert -1.0 <= r["metrics"]["final_reward"] <= 1.0 and r["metrics"]["turns"] in (1, 2)
        assert all(t["content"] for t in r["transcript"][:2])
    assert 0.0 <= out["esconv"]["metrics"]["success_rate"] <= 1.0
    assert 0.0 < out["esconv-ref"]["metrics"]["distinct_1"] <= 100.0
    sotopia = read_records(tmp_path / "sotopia" / "results.jsonl")
    assert all(r["info"]["turns"] <= 2 and r["info"]["evaluator_raw"] for r in sotopia)
    for r in sotopia:  # a 135M evaluator is often unparseable: then the case is invalid, never scored
        if r["valid"]:
            assert set(r["metrics"]) == {*DIMENSIONS, "overall", "turns"}
            assert all(lo <= r["metrics"][d] <= hi for d, (lo, hi) in DIMENSIONS.items())
        else:
            assert r["metrics"] == {} and r["info"]["evaluator_attempts"] == 1
    html_path, md_path = build_report([tmp_path], tmp_path / "report")
    assert "SOTOPIA goal" in md_path.read_text() and html_path.stat().st_size > 10_000


def test_eval_cli_on_the_embedded_model(tmp_path):
    from rapo_echo.cli import main

    data = str(shared_data("esconv", "ppdpp_esc-test.jsonl"))
    argv = [
        "eval",
        "--benchmark",
        "esconv-ref",
        "--policy",
        "default",
        "--data",
        data,
        "--limit",
        "2",
        "--max-new-tokens",
        "8",
        "--device",
        "cpu",
        "--output",
        str(tmp_path / "ref"),
    ]
    assert main(argv) == 0
    summary = json.loads((tmp_path / "ref" / "summary.json").read_text())
    assert summary["n_cases"] == 2 and summary["models"] == {"policy": "default"}


# ---------------------------------------------------------------------- against ``rapo-echo serve``
@pytest.fixture(scope="module")
def endpoint(tmp_path_factory) -> Iterator[str]:
    """``rapo-echo serve --model default`` on a free port; stopped after the module."""
    if importlib.util.find_spec("rapo_echo.serve") is None or importlib.util.find_spec("fastapi") is None:
        pytest.skip("rapo_echo.serve or fastapi is not available")
    log = tmp_path_factory.mktemp("serve") / "server.log"
    cmd = [
        sys.executable,
        "-m",
        "rapo_echo.cli",
        "serve",
        "--model",
        "default",
        "--port",
        "0",
        "--device",
        "cpu",
        "--served-name",
        "smol",
        "--log-level",
        "warning",
    ]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with served_process(cmd, log, env) as url:
        yield url


def test_three_benchmarks_from_the_cli_against_an_endpoint_and_resume(endpoint, tmp_path):
    from rapo_echo.cli import main

    data = str(shared_data("esconv", "ppdpp_esc-test.jsonl"))
    roles = ["--policy", endpoint, "--simulator", endpoint, "--judge", endpoint]
    tiny = [
        "--max-turns",
        "2",
        "--max-new-tokens",
        "8",
        "--judge-max-new-tokens",
        "24",
        "--judge-retries",
        "0",
    ]
    for name in ("esconv", "sotopia"):
        extra = ["--data", data] if name == "esconv" else []
        argv = [
            "eval",
            "--benchmark",
            name,
            *roles,
            *extra,
            *tiny,
            "--limit",
            "1",
            "--output",
            str(tmp_path / name),
        ]
        assert main(argv) == 0
        summary = json.loads((tmp_path / name / "summary.json").read_text())
        assert summary["n_cases"] == 1 and summary["models"]["policy"] == endpoint
    ref = ["eval", "--benchmark", "esconv-ref", "--policy", endpoint, "--data", data, *tiny]
    ref += ["--output", str(tmp_path / "ref")]
    assert main([*ref, "--limit", "2"]) == 0
    first = (tmp_path / "ref" / "results.jsonl").read_text().splitlines()
    assert main([*ref, "--limit", "3"]) == 0  # resumes: the two finished cases are kept, one more runs
    lines = (tmp_path / "ref" / "results.jsonl").read_text().splitlines()
    assert lines[:2] == first and len(lines) == 3
    html_path, _ = build_report([tmp_path], tmp_path / "report")
    assert endpoint in html_path.read_text()


def test_hard_seekers_through_sage_on_the_embedded_model(smol_engine, tmp_path):
    """Our hard-to-help seekers (--profiles hard) with the state probe, the user's reading asked again and
    two repeats: every record says what kind of seeker it was and carries its probes."""
    settings = EvalSettings(
        max_turns=2,
        max_new_tokens=6,
        simulator_max_new_tokens=12,
        judge_retries=0,
        batch_size=4,
        profiles="hard",
        repeats=2,
    )
    roles = Roles(smol_engine, smol_engine)
    summary = run_eval(
        get_benchmark("sage"), roles, settings, tmp_path / "hard", limit=1, models={"policy": "default"}
    )
    records = read_records(tmp_path / "hard" / "results.jsonl")
    assert len(records) == 2 and summary["repeats"] == 2 and summary["complete"]
    assert {r["info"]["style"] for r in records} == {"withdrawn"}  # the first profile
    for r in records:
        probes = r["info"]["state_probe"]
        assert probes and all(p["hidden"] == 40.0 for p in probes[:1])  # the hidden emotion starts at 40
        assert all(p["estimate"] is None or 0 <= p["estimate"] <= 100 for p in probes)
        if r["valid"] and any(p["estimate"] is not None for p in probes):
            assert r["metrics"]["tracking_error"] >= 0
    card = summary["card"]["instrument"]
    assert card["episode"]["profiles"] == "hard" and card["episode"]["initial_emotion"] == 40.0
    assert card["simulator"]["model_type"] == "llama" and len(card["simulator"]["weights_sha256"]) == 64
    if summary["n_valid"]:
        assert "score" in summary["figures"] and len(summary["figures"]["score"]["repeats"]) == 2

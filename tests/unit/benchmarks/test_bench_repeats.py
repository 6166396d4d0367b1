"""``eval --repeats N`` and the benchmark card with scripted engines: each repeat's own seed, its
records, resuming and extending a run, the summary's intervals and spread, and what the card holds and
refuses."""

from __future__ import annotations

import json

import pytest

from rapo_echo.benchmarks import card as card_module
from rapo_echo.benchmarks.base import EvalSettings, Roles, repeat_seed
from rapo_echo.benchmarks.card import card_differences, engine_identity, prompt_wording
from rapo_echo.benchmarks.results import read_records
from rapo_echo.benchmarks.runner import check_resume, get_benchmark, run_eval
from rapo_echo.engines.openai_engine import OpenAIEngine
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import ConfigError
from tests.helpers.fake_openai import FakeAPI, Reply, ServedAPI
from tests.unit.benchmarks.test_bench_sage import hashing_simulator, profiles_file, row


def sage_run(tmp_path, out, **settings):
    data = profiles_file(tmp_path, [row(f"p{i}", "0") for i in range(4)])
    policy = ScriptedEngine(fn=lambda p: f"I hear: {p[-1]['content'][:20]}")
    roles = Roles(policy, hashing_simulator())
    return run_eval(get_benchmark("sage"), roles, EvalSettings(**settings), tmp_path / out, data=data)


def emotions(folder):
    return {r["id"]: r["info"]["emotions"] for r in read_records(folder / "results.jsonl")}


def test_each_repeat_runs_with_its_own_seed(tmp_path):
    summary = sage_run(tmp_path, "two", repeats=2)
    records = read_records(tmp_path / "two" / "results.jsonl")
    assert sorted(r["id"] for r in records[:4]) == ["p0", "p1", "p2", "p3"]  # repeat 0 first, as before
    assert sorted(r["id"] for r in records[4:]) == ["p0#r1", "p1#r1", "p2#r1", "p3#r1"]
    assert all(r["case"] == r["id"][:2] and r["repeat"] == 1 for r in records[4:])
    assert all("case" not in r and "repeat" not in r for r in records[:4])
    # repeat 0 is the run with the seed, repeat 1 the run with seed + 1000
    sage_run(tmp_path, "seed0", seed=0)
    sage_run(tmp_path, "seed1000", seed=repeat_seed(0, 1))
    two = emotions(tmp_path / "two")
    assert {k: v for k, v in two.items() if "#" not in k} == emotions(tmp_path / "seed0")
    assert {k.split("#")[0]: v for k, v in two.items() if "#" in k} == emotions(tmp_path / "seed1000")
    assert emotions(tmp_path / "seed0") != emotions(tmp_path / "seed1000")
    assert summary["repeats"] == 2 and summary["n_cases"] == 8
    score = summary["figures"]["score"]
    assert len(score["repeats"]) == 2 and score["mean"] == pytest.approx(summary["metrics"]["score"])
    assert score["sd"] is not None and score["lo"] <= score["mean"] <= score["hi"] and score["cases"] == 4
    assert summary["figures_method"]["resamples"] == 1000
    assert summary["card"]["seeds"] == {"seed": 0, "repeats": [0, 1000]}


def test_a_finished_run_gets_more_repeats_on_resume(tmp_path):
    sage_run(tmp_path, "grow", repeats=1)
    first = (tmp_path / "grow" / "results.jsonl").read_text().splitlines()
    grown = sage_run(tmp_path, "grow", repeats=2)
    lines = (tmp_path / "grow" / "results.jsonl").read_text().splitlines()
    assert lines[:4] == first and len(lines) == 8 and all("#r1" in line for line in lines[4:])
    fresh = sage_run(tmp_path, "fresh", repeats=2)
    assert grown["figures"] == fresh["figures"]
    fewer = sage_run(tmp_path, "grow", repeats=1)  # asks for one repeat: summarises that one
    assert fewer["repeats"] == 1 and fewer["n_cases"] == 4


def test_repeats_do_not_apply_to_fidelity(tmp_path):
    from rapo_echo.benchmarks.fidelity.bench import Fidelity

    with pytest.raises(ConfigError, match="--repeats does not apply"):
        run_eval(Fidelity(), Roles(None), EvalSettings(repeats=2), tmp_path / "f", data=None)  # type: ignore[arg-type]


def test_the_card_records_the_instrument(tmp_path):
    sage_run(tmp_path, "c", simulator_temperature=0.7, seed=3, repeats=2)
    card = json.loads((tmp_path / "c" / "card.json").read_text())
    inst = card["instrument"]
    assert inst["benchmark"] == "sage" and inst["simulator"]["engine"] == "ScriptedEngine"
    assert inst["sampling"]["simulator"] == {"temperature": 0.7, "max_new_tokens": 512, "retries": 2}
    assert "judge" not in inst["sampling"]  # sage has no judge role
    assert inst["episode"]["initial_emotion"] == 40.0 and inst["episode"]["max_turns"] == 10
    assert set(inst["prompts"]) == {"rapo_echo.simulators.sage", "rapo_echo.benchmarks.sage.tracking"}
    assert inst["data"]["cases"] == 4 and len(inst["data"]["file_sha256"]) == 64
    assert card["seeds"] == {"seed": 3, "repeats": [3, 1003]}
    assert card["under_test"]["sampling"] == {"temperature": 0.0, "max_new_tokens": 128}
    assert card["code"]["version"]


def test_two_runs_that_differ_in_simulator_temperature_differ_in_their_cards(tmp_path):
    cold = sage_run(tmp_path, "cold")["card"]
    warm = sage_run(tmp_path, "warm", simulator_temperature=0.7)["card"]
    assert card_differences(cold, warm) == ["sampling.simulator.temperature: 0.0 vs 0.7"]
    assert card_differences(cold, sage_run(tmp_path, "cold2", seed=5)["card"]) == []  # seeds are not compared


def test_a_resume_with_another_instrument_is_refused(tmp_path, monkeypatch):
    sage_run(tmp_path, "r")
    real = card_module.prompt_hashes
    monkeypatch.setattr(
        card_module, "prompt_hashes", lambda m, s: {**real(m, s), "rapo_echo.simulators.sage": "0" * 64}
    )
    with pytest.raises(ConfigError, match=r"another instrument.*prompts\.rapo_echo\.simulators\.sage"):
        sage_run(tmp_path, "r")


def test_an_older_folder_without_the_new_settings_resumes(tmp_path):
    sage_run(tmp_path, "old")
    path = tmp_path / "old" / "config.json"
    config = json.loads(path.read_text())
    for key in ("repeats", "judge_recheck", "state_probe", "profiles"):
        del config["settings"][key]
    path.write_text(json.dumps(config))
    (tmp_path / "old" / "card.json").unlink()
    check_resume(tmp_path / "old", json.loads(json.dumps({**config, "settings": {**config["settings"]}})))
    summary = sage_run(tmp_path, "old")
    assert summary["n_cases"] == 4


def test_a_served_model_is_recorded_as_the_server_reports_it():
    with FakeAPI(ServedAPI()) as api:
        engine = OpenAIEngine(api.url, backoff_s=0.01, api_key_env=None)
        ident = engine_identity(engine, api.url)
        version = next(s for s in api.seen if s.path == "/version")  # what the fake vLLM answered
    assert set(ident) == {"spec", "engine", "id", "owned_by", "server_version"}
    assert ident["spec"] == api.url and ident["engine"] == "OpenAIEngine" and ident["owned_by"] == "vllm"
    assert ident["id"] == engine.model and version and isinstance(ident["server_version"], str)
    listing = {"data": [{"id": "m", "root": "org/m", "created": 1, "max_model_len": 4096}]}

    def plain(seen, index):
        return Reply(body=listing) if seen.path.endswith("/models") else Reply(status=404, body={})

    with FakeAPI(plain) as api:
        ident = engine_identity(OpenAIEngine(api.url, backoff_s=0.01, api_key_env=None), None)
    assert ident["root"] == "org/m" and ident["max_model_len"] == 4096 and "created" not in ident
    assert ident["server_version"] is None


def test_prompt_wording_is_the_string_constants_without_docstrings(tmp_path, monkeypatch):
    mod = tmp_path / "wording_probe.py"
    mod.write_text(
        '"""Doc."""\nA = "You are a judge."\n\n\ndef f():\n    """Not a prompt."""\n    return f"Rate {A}!"\n'
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert prompt_wording("wording_probe") == "You are a judge.\nRate \n!"

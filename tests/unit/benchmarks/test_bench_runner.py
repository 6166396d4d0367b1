"""The benchmark runner: batching, resume after a crash or interrupt, result-file repair, config checks, and
the ``eval`` CLI (engines replaced by scripted ones)."""

from __future__ import annotations

import argparse
import json

import pytest

from rapo_echo.benchmarks import cli as bench_cli
from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.results import ResultWriter, read_records
from rapo_echo.benchmarks.runner import get_benchmark, run_eval
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.errors import ConfigError, DataError
from tests.helpers.answers import SOTOPIA_SCORES, sotopia_rules
from tests.helpers.data_files import esconv_file


class Crash(Exception):
    pass


def crashing_engine(after: int, reply: str = "I hear you.") -> ScriptedEngine:
    """Replies normally to the first ``after`` prompts, then raises."""
    seen = {"n": 0}

    def fn(prompt):
        seen["n"] += 1
        if seen["n"] > after:
            raise Crash("engine died")
        return reply

    return ScriptedEngine(fn=fn)


def test_resume_after_a_crash_runs_only_the_missing_cases(tmp_path):
    data, out = esconv_file(tmp_path, n=5), tmp_path / "out"
    bench = get_benchmark("esconv-ref")
    settings = EvalSettings(batch_size=2)
    with pytest.raises(Crash):  # batches of 2: the first two batches (4 cases) finish, the third dies
        run_eval(bench, Roles(crashing_engine(after=4)), settings, out, data=data)
    assert [r["id"] for r in read_records(out / "results.jsonl")] == [
        "esc-0-t1",
        "esc-1-t1",
        "esc-2-t1",
        "esc-3-t1",
    ]
    assert not (out / "summary.json").exists()
    policy = ScriptedEngine(default="I hear you.")
    summary = run_eval(bench, Roles(policy), settings, out, data=data)
    assert [len(c["prompts"]) for c in policy.calls] == [1]  # only the missing case ran
    ids = [json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert sorted(ids) == [f"esc-{i}-t1" for i in range(5)] and len(ids) == 5
    assert summary["n_cases"] == 5 and summary["complete"] and summary["n_expected"] == 5
    assert json.loads((out / "summary.json").read_text())["metrics"] == summary["metrics"]
    # the summary is computed from every record in the file: all five replies scored together
    assert summary["metrics"]["distinct_1"] == pytest.approx(100 * 4 / 20)  # "i hear you ." x5: 4 of 20


def test_cases_finished_inside_a_crashed_batch_are_kept(tmp_path):
    data, out = esconv_file(tmp_path, n=2), tmp_path / "out"
    bench = get_benchmark("esconv")

    def critic(prompt):  # case 0 is solved at turn 1; case 1 never is
        return "solved" if "situation number 0" in prompt_text(prompt) else "same"

    judge = ScriptedEngine(fn=critic)
    simulator = crashing_engine(after=2, reply="ok")  # turn 1 (2 prompts) works, turn 2 dies
    with pytest.raises(Crash):
        run_eval(bench, Roles(ScriptedEngine(), simulator, judge), EvalSettings(batch_size=2), out, data=data)
    assert [r["id"] for r in read_records(out / "results.jsonl")] == ["esc-0"]
    policy = ScriptedEngine()
    summary = run_eval(
        bench, Roles(policy, ScriptedEngine(default="ok"), judge), EvalSettings(batch_size=2), out, data=data
    )
    assert len(policy.calls[0]["prompts"]) == 1 and summary["n_cases"] == 2
    assert summary["metrics"]["success_rate"] == 0.5 and summary["metrics"]["avg_turns"] == pytest.approx(
        (1 + 8) / 2
    )


def test_a_half_written_last_line_is_dropped_and_rerun(tmp_path):
    path = tmp_path / "results.jsonl"
    path.write_text('{"id": "a", "valid": true}\n{"id": "b", "val')
    assert [r["id"] for r in read_records(path)] == ["a"]
    with ResultWriter(path) as w:
        w.append({"id": "b", "valid": True})
    assert path.read_text() == '{"id": "a", "valid": true}\n{"id": "b", "valid": true}\n'
    path.write_text('{"id": "a"}\n{oops\n{"id": "c"}\n')
    with pytest.raises(DataError, match=r"results\.jsonl:2: not valid JSON"):
        read_records(path)
    path.write_text('{"id": "a"}')  # complete but without its newline: kept, newline added before appending
    with ResultWriter(path) as w:
        w.append({"id": "z"})
    assert [r["id"] for r in read_records(path)] == ["a", "z"]


def test_resume_refuses_different_settings_but_not_a_different_batch_size(tmp_path):
    data, out = esconv_file(tmp_path, n=2), tmp_path / "out"
    bench = get_benchmark("esconv-ref")
    run_eval(bench, Roles(ScriptedEngine()), EvalSettings(), out, data=data, models={"policy": "a"})
    run_eval(
        bench, Roles(ScriptedEngine()), EvalSettings(batch_size=1), out, data=data, models={"policy": "a"}
    )
    with pytest.raises(ConfigError, match=r"settings\.max_new_tokens=128, this run has 16"):
        run_eval(
            bench,
            Roles(ScriptedEngine()),
            EvalSettings(max_new_tokens=16),
            out,
            data=data,
            models={"policy": "a"},
        )
    with pytest.raises(ConfigError, match=r"models\.policy='a', this run has 'b'"):
        run_eval(bench, Roles(ScriptedEngine()), EvalSettings(), out, data=data, models={"policy": "b"})


def test_limit_and_bad_limit(tmp_path):
    esconv = get_benchmark("esconv-ref")
    data = esconv_file(tmp_path, n=5)
    summary = run_eval(esconv, Roles(ScriptedEngine()), EvalSettings(), tmp_path / "o", data=data, limit=2)
    assert summary["n_cases"] == 2
    with pytest.raises(ConfigError, match="--limit must be >= 1"):
        run_eval(esconv, Roles(ScriptedEngine()), EvalSettings(), tmp_path / "p", data=data, limit=0)
    with pytest.raises(ConfigError, match="unknown benchmark 'nope'"):
        get_benchmark("nope")


def test_a_benchmark_that_forgets_a_case_is_an_error(tmp_path):
    class Forgetful:
        name, roles, headline = "forgetful", ("policy",), ()

        def load_cases(self, data, settings):
            from rapo_echo.benchmarks.base import Case

            return [Case("x", None), Case("y", None)]

        def run_batch(self, cases, roles, settings, emit):
            emit({"id": "x", "valid": True})

        def summarize(self, records):
            return {}

    with pytest.raises(RuntimeError, match=r"without results for \['y'\]"):
        run_eval(Forgetful(), Roles(ScriptedEngine()), EvalSettings(), tmp_path / "f")


# ---------------------------------------------------------------------- CLI
@pytest.fixture
def fake_engines(monkeypatch):
    """``engine_from_spec`` replaced: every spec gets its own scripted engine, recorded by spec."""
    import rapo_echo.engines

    made: dict[str, list[ScriptedEngine]] = {}

    def fake(spec, **kw):
        engine = ScriptedEngine(
            rules=[*sotopia_rules(SOTOPIA_SCORES), (r"Has the Patient's issue", "solved")],
            default='{"action_type": "speak", "argument": "Hello there."}',
        )
        made.setdefault(spec, []).append(engine)
        return engine

    monkeypatch.setattr(rapo_echo.engines, "engine_from_spec", fake)
    return made


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_cli.register(parser.add_subparsers())
    return parser.parse_args(argv)


def eval_argv(bench: str, policy: str, out, *more: str) -> list[str]:
    return ["eval", "--benchmark", bench, "--policy", policy, "--output", str(out), *more]


def test_eval_cli_runs_each_benchmark_and_shares_engines(tmp_path, fake_engines, capsys):
    data = esconv_file(tmp_path, n=3)
    flags = ["--judge", "policy", "--limit", "2", "--max-turns", "3"]
    args = parse(eval_argv("esconv", "my-model", tmp_path / "e", "--data", data, *flags))
    assert args.func(args) == 0
    # policy and judge share one engine; the simulator ("default") is loaded once
    assert {k: len(v) for k, v in fake_engines.items()} == {"my-model": 1, "default": 1}
    summary = json.loads((tmp_path / "e" / "summary.json").read_text())
    assert summary["n_cases"] == 2 and summary["metrics"]["success_rate"] == 1.0
    assert summary["models"] == {"policy": "my-model", "simulator": "default", "judge": "policy"}
    assert "summary.json" in capsys.readouterr().out
    args = parse(eval_argv("sotopia", "default", tmp_path / "s", "--limit", "2", "--max-turns", "2"))
    assert args.func(args) == 0
    assert json.loads((tmp_path / "s" / "summary.json").read_text())["metrics"]["goal"] == 7.0
    args = parse(eval_argv("esconv-ref", "x", tmp_path / "r", "--data", data))
    assert args.func(args) == 0 and json.loads((tmp_path / "r" / "summary.json").read_text())["n_cases"] == 3


def test_esconv_without_data_runs_on_the_bundled_set(tmp_path, fake_engines, caplog):
    for bench in ("esconv", "esconv-ref"):
        out = tmp_path / bench
        args = parse(eval_argv(bench, "p", out, "--limit", "1"))
        assert args.func(args) == 0
        config = json.loads((out / "config.json").read_text())
        assert config["data"] == "bundled:esconv_style_en.json"
    assert "no data given, so the bundled bundled:esconv_style_en.json" in caplog.text


def test_eval_cli_errors_before_loading_models(tmp_path, fake_engines):
    args = parse(eval_argv("esconv-ref", "p", tmp_path / "x", "--data", str(tmp_path / "none.jsonl")))
    with pytest.raises(DataError, match="not found"):
        args.func(args)
    data = esconv_file(tmp_path, n=5)
    args = parse(eval_argv("esconv-ref", "p", tmp_path / "x", "--data", data, "--batch-size", "0"))
    with pytest.raises(ConfigError, match="flag --batch-size: batch_size: got 0; Input should be greater"):
        args.func(args)
    assert fake_engines == {}


def test_top_level_cli_has_eval_and_report(tmp_path, fake_engines):
    from rapo_echo.cli import main

    assert main(eval_argv("esconv-ref", "p", tmp_path / "r", "--data", esconv_file(tmp_path, n=2))) == 0
    assert main(["report", str(tmp_path / "r"), "--output", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "report.html").is_file() and (tmp_path / "rep" / "report.md").is_file()
    assert main(["eval", "--benchmark", "fidelity", "--output", str(tmp_path / "x")]) == 2  # needs --data

"""The SAGE benchmark: the live protocol with scripted engines (SAGE's loop, termination, invalid
dialogues, reproducible reruns, resume, what config.json records) and the transcripts mode on a small
synthetic file of ours in SAGE's released result format."""

from __future__ import annotations

import json
import re
import zlib
from pathlib import Path

import pytest

from rapo_echo.benchmarks.base import EvalSettings, Roles
from rapo_echo.benchmarks.results import read_records
from rapo_echo.benchmarks.runner import get_benchmark, run_eval
from rapo_echo.benchmarks.sage.transcripts import released_record, score_transcripts
from rapo_echo.cli import main
from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.simulators.sage import PROMPT_VERSION
from tests.helpers.answers import sage_analysis

REPLY = "{}"  # the user's message alone (the eval's default: --sage-reply plain)


def profiles_file(tmp_path: Path, rows: list[dict]) -> str:
    path = tmp_path / "profiles.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def row(ident: str, step: str, first_talk: str | None = "hi") -> dict:
    """A profile whose analysis always answers ``step`` (the scripted simulator reads it from the persona)."""
    out = {"id": ident, "player": f"STEP[{step}] persona {ident}", "scene": "a scene", "task": "be heard"}
    if first_talk:
        out["first_talk"] = first_talk
    return out


def stepping_simulator(structured: bool = True) -> ScriptedEngine:
    def fn(prompt):
        text = prompt_text(prompt)
        step = re.search(r"STEP\[(.*?)\]", text).group(1)
        if "emotion right now" in text:
            return sage_analysis(int(step)) if step.lstrip("+-").isdigit() else f"Change: {step}"
        if "conversation begins now" in text:
            return REPLY.format("I need to talk.")
        return REPLY.format("mm, go on")

    return ScriptedEngine(fn=fn, structured=structured)


def test_sage_loop_scores_all_replies_but_the_last(tmp_path):
    data = profiles_file(tmp_path, [row("up", "+5"), row("down", "-10"), row("flat", "0", first_talk=None)])
    policy, sim = ScriptedEngine(default="I hear you."), stepping_simulator()
    summary = run_eval(get_benchmark("sage"), Roles(policy, sim), EvalSettings(), tmp_path / "out", data=data)
    recs = {r["id"]: r for r in read_records(tmp_path / "out" / "results.jsonl")}
    # up: 40 + 9 * 5 = 85 after 9 reactions, then the 10th (unscored) reply
    assert recs["up"]["metrics"] == {"final_emotion": 85.0, "success": 0.0, "failure": 0.0, "turns": 10}
    assert recs["up"]["info"]["end_reason"] == "max_turns" and recs["up"]["transcript"][-1]["unscored"]
    assert [t["role"] for t in recs["up"]["transcript"]] == ["user", "assistant"] * 10
    # down: 40 -> 30 -> 20 -> 10 -> 0 (< 10): stops after 4 replies, the user's closing words recorded
    assert recs["down"]["metrics"] == {"final_emotion": 0.0, "success": 0.0, "failure": 1.0, "turns": 4}
    assert recs["down"]["transcript"][-1]["role"] == "user"
    assert [t.get("emotion") for t in recs["down"]["transcript"] if t["role"] == "user"] == [
        40,
        30,
        20,
        10,
        0,
    ]
    assert recs["down"]["transcript"][2]["inner"] == {  # inner thoughts, under SAGE's field names
        "Content": "c",
        "TargetCompletion": "t",
        "Activity": "a",
        "Analyse": "fine",
    }
    # flat: no first_talk, so the simulator wrote the opening
    assert recs["flat"]["transcript"][0]["content"] == "I need to talk."
    assert recs["flat"]["metrics"]["final_emotion"] == 40.0
    m = summary["metrics"]
    assert m["score"] == pytest.approx((85 + 0 + 40) / 3) and (m["successes"], m["failures"]) == (0, 1)
    assert m["avg_turns"] == pytest.approx(8.0)
    # lockstep: one policy call per turn for all active dialogues (+ the final unscored replies)
    assert [len(c["prompts"]) for c in policy.calls][:5] == [3, 3, 3, 3, 2]
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["protocol"] == {"simulator_prompts": PROMPT_VERSION, "simulator_preset": "sage"}
    assert config["settings"]["seed"] == 0 and "simulator_temperature" in config["settings"]


def test_success_at_100_and_invalid_dialogues_are_counted_not_scored(tmp_path):
    data = profiles_file(tmp_path, [row("win", "+10"), row("bad", "nothing")])
    sim = stepping_simulator(structured=False)  # a server without structured output: parse, retry, invalid
    settings = EvalSettings(judge_retries=1)
    summary = run_eval(
        get_benchmark("sage"), Roles(ScriptedEngine(), sim), settings, tmp_path / "o", data=data
    )
    recs = {r["id"]: r for r in read_records(tmp_path / "o" / "results.jsonl")}
    assert (
        recs["win"]["metrics"]["final_emotion"] == 100.0
        and recs["win"]["info"]["end_reason"] == "emotion_high"
    )
    assert recs["win"]["metrics"]["turns"] == 6  # 40 + 6 * 10
    assert recs["bad"]["valid"] is False and recs["bad"]["metrics"] == {}
    assert recs["bad"]["info"]["end_reason"] == "invalid"
    assert summary["n_invalid"] == 1 and summary["metrics"]["score"] == 100.0
    assert summary["metrics"]["successes"] == 1


def hashing_simulator() -> ScriptedEngine:
    """Deterministic, but every answer depends on the whole prompt (markers included)."""

    def fn(prompt):
        text = prompt_text(prompt)
        h = zlib.crc32(text.encode())
        if "emotion right now" in text:
            return sage_analysis((-10, -5, 5, 10)[h // 7 % 4])
        return REPLY.format(f"answer {h % 97}")

    return ScriptedEngine(fn=fn)


def test_a_rerun_with_a_deterministic_simulator_gives_the_same_score(tmp_path):
    data = profiles_file(tmp_path, [row(f"p{i}", "0") for i in range(5)])
    bench = get_benchmark("sage")

    def run(out, seed, batch_size, limit=None):
        settings = EvalSettings(seed=seed, batch_size=batch_size)
        policy = ScriptedEngine(fn=lambda p: f"I hear: {p[-1]['content'][:20]}")
        roles = Roles(policy, hashing_simulator())
        return run_eval(bench, roles, settings, tmp_path / out, data=data, limit=limit)

    first, again, batched = run("a", 0, 8), run("b", 0, 8), run("c", 0, 2)
    assert first["metrics"] == again["metrics"] == batched["metrics"]  # batching does not change a dialogue

    def emotions(out):
        return {r["id"]: r["info"]["emotions"] for r in read_records(tmp_path / out / "results.jsonl")}

    run("resumed", 0, 8, limit=2)  # an interrupted run, resumed: only the 3 missing dialogues run
    assert run("resumed", 0, 8)["metrics"] == first["metrics"]
    assert emotions("a") == emotions("b") == emotions("c") == emotions("resumed")
    assert len({len(e) for e in emotions("a").values()}) > 1  # the dialogues did differ from each other
    other = run("d", 1, 8)
    assert emotions("d") != emotions("a")
    assert other["n_cases"] == 5
    # resuming a folder with another seed is refused
    with pytest.raises(ConfigError, match="settings.seed"):
        run("a", 1, 8)


# ---------------------------------------------------------------------------- released transcripts


def released_line(ident: str, points: list[int], final=None) -> str:
    """One dialogue in SAGE's released result format (``SAGE/test_npc.py`` writes these)."""
    history = []
    for i, p in enumerate(points):
        user = {"role": "user", "content": f"u{i}", "emotion-point": p}
        if i:
            user["planning"] = {
                "activity": "a",
                "TargetCompletion": "t",
                "content": "c",
                "analyse": "x",
                "change": 5,
            }
            user["thinking"] = "th"
        history.append(user)
        history.append({"role": "assistant", "content": f"npc {i}"})
    final = points[-1] if final is None else final
    rec = {
        "id": ident,
        "emo_point": final,
        "emo_state": "Emotion-B",
        "target": "eq",
        "player": "p",
        "scene": "s",
    }
    return json.dumps({**rec, "character": "被动型", "topic": "t", "task": "你想被倾听", "history": history})


def synthetic_results(folder: Path) -> Path:
    sim = folder / "deepseek-v3-2024-1227_based_simulator"
    sim.mkdir(parents=True)
    lines = [
        released_line("d1", [40, 50, 60, 70, 80, 90, 100]),  # success
        released_line("d2", [40, 30, 20, 10, 5]),  # failure (< 10)
        released_line("d3", [40, 45, 40, 45, 50, 45, 40, 45, 50, 55]),  # 10 policy replies
        released_line("d4", [40, 45], final="n/a"),  # no numeric emo_point: invalid, not 0
    ]
    (sim / "model-a_result.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (sim / "model-b_result.jsonl").write_text(released_line("e1", [40, 100]) + "\n", encoding="utf-8")
    return folder


def test_transcripts_mode_recomputes_score_success_failure(tmp_path, capsys):
    root = synthetic_results(tmp_path / "dataset")
    summaries = {s["models"]["policy"]: s for s in score_transcripts(root, tmp_path / "scored")}
    a = summaries["model-a (deepseek-v3-2024-1227_based_simulator)"]
    assert a["n_cases"] == 4 and a["n_invalid"] == 1
    assert a["metrics"]["score"] == pytest.approx((100 + 5 + 55) / 3)
    assert (a["metrics"]["successes"], a["metrics"]["failures"]) == (1, 1)
    assert a["metrics"]["avg_turns"] == pytest.approx((7 + 5 + 10) / 3)
    assert summaries["model-b (deepseek-v3-2024-1227_based_simulator)"]["metrics"]["score"] == 100.0
    folder = Path(a["output"])
    assert folder == tmp_path / "scored" / "deepseek-v3-2024-1227_based_simulator" / "model-a_result"
    # the folders are ordinary eval folders: the report reads them
    from rapo_echo.benchmarks.runner import compute_summary

    assert compute_summary(folder)["metrics"] == a["metrics"]
    # through the CLI, no model loaded
    assert (
        main(["eval", "--benchmark", "sage", "--transcripts", str(root), "--output", str(tmp_path / "cli")])
        == 0
    )
    out = capsys.readouterr().out
    assert "| model-a (deepseek-v3-2024-1227_based_simulator) | 4 | 3 | 53.33 | 1 | 1 | 7.33 |" in out


def test_transcripts_mode_errors_and_mismatches(tmp_path):
    rec = released_record(json.loads(released_line("x", [40, 50], final=45)), "f:1", "m")
    assert rec["info"]["mismatch"] == "emo_point 45 but the last user turn has emotion-point 50"
    assert rec["metrics"]["final_emotion"] == 45  # the file's own final emo_point is the score
    bad = tmp_path / "bad_result.jsonl"
    bad.write_text(released_line("x", [40]) + "\n{broken\n")
    with pytest.raises(DataError, match=r"bad_result.jsonl:2: invalid JSON"):
        score_transcripts(bad, tmp_path / "o")
    bad.write_text(json.dumps({"emo_point": 3, "history": []}) + "\n")
    with pytest.raises(DataError, match=r"bad_result.jsonl:1: id: missing"):
        score_transcripts(bad, tmp_path / "o")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="holds no"):
        score_transcripts(tmp_path / "empty", tmp_path / "o2")
    with pytest.raises(DataError, match="no such file or folder"):
        score_transcripts(tmp_path / "missing", tmp_path / "o2")


def test_cli_errors(tmp_path, capsys):
    bad = tmp_path / "m_result.jsonl"
    bad.write_text(released_line("x", [40]) + "\n")
    assert (
        main(["eval", "--benchmark", "esconv", "--transcripts", str(bad), "--output", str(tmp_path / "x")])
        == 2
    )
    assert "use --benchmark sage" in capsys.readouterr().err
    assert main(["eval", "--benchmark", "sage", "--output", str(tmp_path / "x")]) == 2
    assert "--policy is required" in capsys.readouterr().err

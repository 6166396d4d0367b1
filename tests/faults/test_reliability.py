"""Issue 14's defects, each as a fast test: torn JSON lines, literal secrets, reward plugins that are
not plugins, config traps (duplicate keys, recursive anchors, non-UTF-8, group_size 1), run-directory
locks, eval summaries under --limit, tampered results, prompt truncation by turns, the ``hf`` engine's
context warning and the serve fixes (seed range, /docs, bearer)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rapo_echo import algorithms
from rapo_echo.config import dump_config
from rapo_echo.engines.openai_engine import OpenAIEngine
from rapo_echo.errors import ConfigError, DataError, ModelResolutionError
from rapo_echo.rewards import RewardContext, build_reward
from rapo_echo.training.run_config import load_config
from rapo_echo.types import msg


def write(path: Path, text: str | bytes) -> Path:
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


# ---------------------------------------------------------------- 1: JSON lines
def test_torn_last_line_is_dropped_and_rewrite_is_atomic(tmp_path: Path, caplog) -> None:
    from rapo_echo.jsonl import append_jsonl, keep_jsonl, read_jsonl

    path = write(tmp_path / "samples.jsonl", '{"step": 1}\n{"step": 2}\n{"step": 3, "rep')
    with caplog.at_level(logging.WARNING):
        assert [v["step"] for _, v in read_jsonl(path)] == [1, 2]
    assert "half-written last line" in caplog.text
    assert keep_jsonl(path, lambda r: r["step"] <= 1) == 1  # step 2 dropped (the torn line is not a record)
    assert path.read_text() == '{"step": 1}\n'
    append_jsonl(path, [{"step": 2, "text": "a\nb"}, {"step": 2, "text": "c"}])
    assert [v for _, v in read_jsonl(path)][1:] == [{"step": 2, "text": "a\nb"}, {"step": 2, "text": "c"}]
    write(path, '{"step": 1}\n{oops\n{"step": 3}\n')
    with pytest.raises(DataError, match=r"samples\.jsonl:2: not valid JSON; fix or delete that line"):
        read_jsonl(path)


def test_full_disk_during_an_append_names_the_file_and_the_fix(tmp_path: Path, monkeypatch) -> None:
    from rapo_echo.jsonl import FileWriteError, append_jsonl

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(FileWriteError, match=r"metrics\.jsonl: the disk is full .*resume"):
        append_jsonl(tmp_path / "metrics.jsonl", [{"step": 1}], fix="Free space, then --resume.")


def test_full_disk_during_a_checkpoint_keeps_the_last_one(tmp_path: Path) -> None:
    import torch

    from rapo_echo.checkpoint import latest_checkpoint, save_checkpoint
    from rapo_echo.jsonl import FileWriteError

    param = torch.nn.Parameter(torch.ones(2))
    opt = torch.optim.SGD([param], lr=0.1)
    kw = {"optimizer": opt, "scheduler": None, "trainer_state": {"data": {}}}
    save_checkpoint(tmp_path, 1, save_model=lambda folder: folder.mkdir(), **kw)

    def full(folder: Path) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(FileWriteError, match=r"step-2: the disk is full.*checkpoint is .*step-1.*--resume"):
        save_checkpoint(tmp_path, 2, save_model=full, **kw)
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoints" / "step-1"
    assert not list((tmp_path / "checkpoints").glob(".tmp-*"))


# ---------------------------------------------------------------- 2: secrets
@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rewards=[{name: length, args: {api_token: abc123}}]", "rewards.0.args.api_token"),
        ("judge.base_url=http://me:hunter22@judge-host:8000/v1", "judge.base_url"),
        ("simulator.base_url=http://sim:8001/v1?api_key=sk-123", "simulator.base_url"),
    ],
)
def test_a_literal_secret_in_a_config_is_refused(override: str, key: str) -> None:
    with pytest.raises(ConfigError) as exc:
        load_config(overrides=["judge.engine=openai", "judge.base_url=http://j:1/v1", override])
    msg_ = str(exc.value)
    assert (
        f"--set {key.split('.')[0]}" in msg_ and f": {key}: holds" in msg_ and "environment variable" in msg_
    )
    assert "hunter22" not in msg_ and "sk-123" not in msg_


def test_the_value_of_a_secret_variable_is_refused_but_its_name_round_trips(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAPO_TEST_TOKEN", "tok-0123456789")
    with pytest.raises(ConfigError, match="the environment variable RAPO_TEST_TOKEN"):
        load_config(overrides=["rewards=[{name: length, args: {note: 'tok-0123456789'}}]"])
    cfg = load_config(overrides=["judge.api_key_env=RAPO_TEST_TOKEN", "rewards=[{name: length, args: {}}]"])
    dump_config(cfg, tmp_path / "config.yaml")
    again = load_config(tmp_path / "config.yaml")
    assert again == cfg and "***" not in (tmp_path / "config.yaml").read_text()


def test_credentials_inside_an_endpoint_url_are_refused() -> None:
    with pytest.raises(ConfigError, match="credentials inside the URL") as exc:
        OpenAIEngine("http://me:hunter22@127.0.0.1:9/v1", "m", api_key_env=None)
    assert "hunter22" not in str(exc.value)


# ---------------------------------------------------------------- 3: reward plugins
def test_a_config_cannot_name_arbitrary_code(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    args = {"args": f"touch {marker}", "shell": True}
    with pytest.raises(ConfigError, match=r"rewards\.0\.name: 'subprocess:Popen' is not a reward plugin"):
        build_reward("subprocess:Popen", args, RewardContext(), where="rewards.0.name")
    with pytest.raises(ConfigError, match="not a reward plugin"):
        build_reward("os:system", {}, RewardContext())
    with pytest.raises(ConfigError, match="not a reward plugin"):  # a function, but not a reward's
        build_reward("shutil:rmtree", {"path": str(tmp_path)}, RewardContext())
    assert not marker.exists() and tmp_path.exists()


def test_declared_plugins_load(tmp_path: Path, monkeypatch) -> None:
    write(
        tmp_path / "my_plugins.py",
        textwrap.dedent(
            """
            from rapo_echo.rewards import Reward

            def warmth(prompts, completions, **columns):
                return [1.0 for _ in completions]

            def brief(completions, **kwargs):
                return [0.0 for _ in completions]

            class Marked:
                is_reward_plugin = True
                def __init__(self, bonus=0.0):
                    self.bonus = bonus
                def __call__(self, samples):
                    return [self.bonus for _ in samples]

            class Subclassed(Reward):
                name = "subclassed"
                def __call__(self, samples):
                    return [0.0 for _ in samples]

            class Undeclared:
                def __call__(self, samples):
                    return [0.0 for _ in samples]
            """
        ),
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    ctx = RewardContext()
    assert build_reward("my_plugins:warmth", {}, ctx).name == "warmth"
    assert build_reward("my_plugins:brief", {}, ctx).name == "brief"
    assert build_reward("my_plugins:Marked", {"bonus": 2.0}, ctx).bonus == 2.0
    assert build_reward("my_plugins:Subclassed", {}, ctx).name == "subclassed"
    assert build_reward("rapo_echo.rewards.builtin:LengthReward", {}, ctx).name == "length"  # registered
    with pytest.raises(ConfigError, match="is_reward_plugin = True"):
        build_reward("my_plugins:Undeclared", {}, ctx)


# ---------------------------------------------------------------- 10, 12: configs
@pytest.mark.parametrize(
    ("text", "needle"),
    [
        (
            b"train:\n  lr: 0.1\n  seed: 3\n  lr: 0.2\n",
            r"run\.yaml:4: key 'lr' is given twice \(first on line 2\)",
        ),
        (b"rollout: &loop\n  x: *loop\n", r"run\.yaml:1: a YAML anchor is used inside its own value"),
        (b"train:\n  seed: 1  # caf\xe9\n", r"run\.yaml:2: the config file is not UTF-8 text \(byte 0xe9"),
    ],
)
def test_config_traps_are_clear_errors(tmp_path: Path, text: bytes, needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        load_config(write(tmp_path / "run.yaml", text))


def test_yaml_merge_keys_and_reused_anchors_still_work(tmp_path: Path) -> None:
    p = write(
        tmp_path / "run.yaml",
        "x: &j {engine: scripted}\njudge: *j\nsimulator:\n  <<: *j\n  max_batch_size: 8\n",
    )
    with pytest.raises(ConfigError, match="x: got"):  # only the unknown top-level key is wrong
        load_config(p)


GROUP_BASELINE = ("grpo", "rapo", "rlver")  # their advantage compares the replies of a group


def test_the_group_algorithms_are_built_in() -> None:
    assert set(GROUP_BASELINE) <= set(algorithms.names())


@pytest.mark.parametrize("algo", GROUP_BASELINE)
def test_a_group_of_one_is_refused_for_every_algorithm(algo: str) -> None:
    with pytest.raises(ConfigError, match=rf"--set rollout.group_size: rollout.group_size: got 1; {algo}"):
        load_config(algo=algo, overrides=["rollout.group_size=1"])
    assert load_config(algo=algo, overrides=["rollout.group_size=2"]).rollout.group_size == 2


@pytest.mark.parametrize("algo", ["ppo", "sft"])
def test_ppo_and_sft_accept_a_group_of_one(algo: str) -> None:
    """PPO's value head is its baseline and SFT samples nothing: one reply per context is fine."""
    assert load_config(algo=algo, overrides=["rollout.group_size=1"]).rollout.group_size == 1


def test_rlver_ppo_accepts_a_group_of_one() -> None:
    """PPO's value head is the baseline, so one dialogue per profile trains; GRPO's group mean is not."""
    cfg = load_config(algo="rlver", overrides=["rlver.estimator=ppo", "rollout.group_size=1"])
    assert cfg.rollout.group_size == 1


def test_cli_refuses_a_group_of_one_with_exit_2(capsys) -> None:
    from rapo_echo.cli import main

    assert main(["train", "--set", "rollout.group_size=1"]) == 2
    assert "rollout.group_size: got 1" in capsys.readouterr().err


def test_a_model_spec_longer_than_a_file_name_is_a_message() -> None:
    from rapo_echo.models import resolve

    with pytest.raises(ModelResolutionError, match=r"cannot be a path \(File name too long\)"):
        resolve("x" * 300)


def test_deeply_nested_json_data_is_a_message(tmp_path: Path) -> None:
    from rapo_echo.data import load_scenarios

    p = write(tmp_path / "deep.jsonl", "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(DataError, match="nested too deeply"):
        load_scenarios(str(p))


# ---------------------------------------------------------------- 9: run directories
def test_run_dir_lock_refuses_a_second_owner_and_takes_over_a_stale_one(tmp_path: Path, caplog) -> None:
    from rapo_echo.rundir import LOCK_NAME, DirLock, lock_run_dir

    run = tmp_path / "run"
    lock = lock_run_dir(run, resume=False)
    assert (run / LOCK_NAME).read_text().startswith(f"pid={os.getpid()} ")
    with pytest.raises(ConfigError, match=rf"in use by process {os.getpid()} .*{LOCK_NAME}"):
        DirLock(run).acquire()
    lock.release()
    assert not (run / LOCK_NAME).exists()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    (run / LOCK_NAME).write_text(f"pid={dead.stdout.strip()} host={os.uname().nodename}\n")
    with caplog.at_level(logging.WARNING):
        DirLock(run).acquire().release()
    assert "stale lock" in caplog.text


def test_a_fresh_run_refuses_a_folder_that_is_not_empty(tmp_path: Path) -> None:
    from rapo_echo.rundir import check_run_dir

    run = tmp_path / "run"
    write(run.mkdir() or run / "metrics.jsonl", '{"step": 1}\n')
    with pytest.raises(
        ConfigError, match=r"not empty \(metrics\.jsonl\); continue the run there with --resume"
    ):
        check_run_dir(run, resume=False)
    check_run_dir(run, resume=True)


def test_an_unwritable_output_is_refused(tmp_path: Path) -> None:
    from rapo_echo.rundir import check_run_dir

    blocker = write(tmp_path / "file.txt", "x")
    with pytest.raises(ConfigError, match=r"--output .*file\.txt/run: cannot write there"):
        check_run_dir(blocker / "run", resume=False)


# ---------------------------------------------------------------- 8: eval summaries
def _esconv_rows(tmp_path: Path, n: int) -> str:
    rows = [
        {
            "emotion_type": "sadness",
            "problem_type": "job",
            "situation": f"s{i}",
            "dialog": [{"speaker": "usr", "text": f"low {i}"}, {"speaker": "sys", "text": "ok"}],
        }
        for i in range(n)
    ]
    return str(write(tmp_path / "esc.jsonl", "".join(json.dumps(r) + "\n" for r in rows)))


def test_eval_summary_covers_exactly_the_cases_asked_for(tmp_path: Path) -> None:
    from rapo_echo.benchmarks.base import EvalSettings, Roles
    from rapo_echo.benchmarks.runner import get_benchmark, run_eval
    from rapo_echo.engines.scripted import ScriptedEngine

    data, out, bench = _esconv_rows(tmp_path, 4), tmp_path / "out", get_benchmark("esconv-ref")
    full = run_eval(bench, Roles(ScriptedEngine()), EvalSettings(), out, data=data)
    assert full["n_cases"] == 4 and full["complete"]
    limited = run_eval(bench, Roles(ScriptedEngine()), EvalSettings(), out, data=data, limit=2)
    assert (limited["n_cases"], limited["n_expected"], limited["complete"]) == (2, 2, True)
    assert json.loads((out / "summary.json").read_text())["n_cases"] == 2
    assert [p.name for p in out.iterdir() if p.name.startswith(".")] == []  # the lock is gone


def test_tampered_result_metrics_name_the_case(tmp_path: Path) -> None:
    from rapo_echo.benchmarks.base import EvalSettings, Roles
    from rapo_echo.benchmarks.runner import compute_summary, get_benchmark, run_eval
    from rapo_echo.engines.scripted import ScriptedEngine

    data, out, bench = _esconv_rows(tmp_path, 2), tmp_path / "out", get_benchmark("esconv-ref")
    run_eval(bench, Roles(ScriptedEngine()), EvalSettings(), out, data=data)
    lines = (out / "results.jsonl").read_text().splitlines()
    second = json.loads(lines[1])
    second["info"]["reply"] = 42  # a hand-edited record
    write(out / "results.jsonl", lines[0] + "\n" + json.dumps(second) + "\n")
    with pytest.raises(
        DataError, match=rf"record of case '{second['id']}' has a malformed field.*delete its line"
    ):
        compute_summary(out)
    write(out / "results.jsonl", b'{"id": "esc-0-t1", "reply": "caf\xe9"}\n')
    with pytest.raises(DataError, match=r"results\.jsonl:1: the results file is not UTF-8"):
        compute_summary(out)


# ---------------------------------------------------------------- 11: prompt length
def test_policy_prompt_keeps_the_system_prompt_and_whole_turns(tiny_folder: Path) -> None:
    from rapo_echo.config import ModelConfig, RolloutConfig
    from rapo_echo.policy import Policy

    policy = Policy(
        ModelConfig(name=str(tiny_folder)),
        RolloutConfig(max_prompt_tokens=48, system_prompt="Be kind."),
        need_reference=False,
        device="cpu",
    )
    long_turn = " ".join(f"word{i}" for i in range(200))
    conv = [msg("user", "an old turn"), msg("assistant", "an old reply"), msg("user", long_turn + " END")]
    ids = policy.prompt_ids([msg("system", "Be kind."), *conv])
    text = policy.tokenizer.decode(ids)
    assert len(ids) <= 48 and text.startswith("<|im_start|>system\nBe kind.<|im_end|>")
    assert "an old turn" not in text and text.rstrip().endswith("<|im_start|>assistant")
    assert "END" in text and policy.take_truncations() == 1 and policy.take_truncations() == 0
    assert policy.prompt_ids([msg("user", "short")]) and policy.take_truncations() == 0


def test_fit_prompt_refuses_a_system_prompt_that_leaves_no_room() -> None:
    from rapo_echo.prompting import fit_prompt

    def words(conv):
        return [0 for m in conv for _ in m["content"].split()]

    with pytest.raises(
        ConfigError, match="rollout.max_prompt_tokens: 3 tokens cannot hold the system prompt"
    ):
        fit_prompt([msg("system", "one two three four"), msg("user", "hi")], words, 3)


def test_hf_engine_warns_when_a_prompt_exceeds_the_context(smol_tokenizer, caplog) -> None:
    from rapo_echo.engines.hf import HFEngine
    from rapo_echo.types import SamplingParams
    from tests.conftest import make_tiny_model

    model = make_tiny_model(smol_tokenizer)
    model.config.max_position_embeddings = 64
    engine = HFEngine(model, smol_tokenizer, name="judge")
    with caplog.at_level(logging.WARNING):
        engine.generate([[msg("user", "hello " * 80)]], SamplingParams(max_new_tokens=2, temperature=0))
    assert "judge: a prompt of" in caplog.text and "context of 64 tokens" in caplog.text


# ---------------------------------------------------------------- 12: serve
def test_serve_seed_range_docs_and_bearer_case(monkeypatch) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from rapo_echo.engines.scripted import ScriptedEngine
    from rapo_echo.serve import create_app

    body = {"messages": [{"role": "user", "content": "hi"}], "seed": 2**70}
    open_client = TestClient(create_app(ScriptedEngine(default="ok"), "m"))
    res = open_client.post("/v1/chat/completions", json=body)
    assert res.status_code == 400 and "seed" in res.json()["error"]["message"]
    assert open_client.get("/docs").status_code == 200  # no key: the API description is served
    keyed = TestClient(create_app(ScriptedEngine(default="ok"), "m", api_key="k-123"))
    for path in ("/docs", "/openapi.json", "/redoc"):
        assert keyed.get(path).status_code == 404
    body["seed"] = 7
    for header in ("bearer k-123", "BEARER k-123", "Bearer  k-123"):
        res = keyed.post("/v1/chat/completions", json=body, headers={"Authorization": header})
        assert res.status_code == 200, header
    res = keyed.post("/v1/chat/completions", json=body, headers={"Authorization": "Basic k-123"})
    assert res.status_code == 401

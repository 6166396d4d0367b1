"""O3: the exported OpenRLHF ``reward_func`` never raises. A judge endpoint that fails (real HTTP errors
from a local server, a port nobody listens on) costs the sample: it gets ``invalid_reward`` and counts in
``rapo/invalid`` / ``rapo/error``; every N failures in a row an ERROR names the endpoint. Before the fix
the endpoint's ``EndpointError`` escaped into OpenRLHF, which logs it at INFO and later dies with
``reward_model_group is required``."""

from __future__ import annotations

import importlib.util
import logging
import socket
from pathlib import Path

import pytest

from rapo_echo.integrations.openrlhf.reward_runtime import OpenRLHFReward
from rapo_echo.training.run_config import load_config
from tests.helpers.fake_openai import FakeAPI, Reply, StructuredAPI

LOGGER = "rapo_echo.integrations.openrlhf.reward_runtime"


def judge_config(tmp_path: Path, smol_path: str, url: str, **extra):
    flags = {
        "model.name": smol_path,
        "rewards": [{"name": "judge", "args": {"use_logprobs": "never"}}],
        "judge.engine": "openai",
        "judge.base_url": url,
        "judge.model": "judge-70b",
        "judge.max_retries": 0,
        "judge.timeout_s": 5.0,
        "output": str(tmp_path / "run"),
        **extra,
    }
    return load_config(None, flags=flags)


def one_query(tok) -> tuple[str, str]:
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "My dog died and nobody gets it."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    return prompt + "I'm so sorry, that is a real loss.<|im_end|>", prompt


def closed_port_url() -> str:
    with socket.socket() as s:  # bound, then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def logs(caplog, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == level]


def test_a_flaky_judge_costs_samples_never_the_job(tmp_path, smol_path, smol_tokenizer, caplog) -> None:
    state = {"down": False}
    api = StructuredAPI()  # up: answers the judge's score format (its maximum, 5 -> reward 1.0)

    def respond(seen, index):
        if seen.method == "POST" and state["down"]:
            return Reply(503, {"error": {"message": "overloaded"}})
        return api(seen, index)

    query, prompt = one_query(smol_tokenizer)
    with FakeAPI(respond) as fake, caplog.at_level(logging.WARNING, logger=LOGGER):
        reward = OpenRLHFReward.from_config(
            judge_config(tmp_path, smol_path, fake.url), smol_tokenizer, failures_before_error=3
        )
        ok = reward([query], [prompt], [""])
        assert ok["rewards"].tolist() == [1.0] and ok["extra_logs"]["rapo/error"].tolist() == [0.0]
        state["down"] = True
        for i in range(3):
            out = reward([query], [prompt], [""])  # HTTP 503: no exception
            assert out["rewards"].tolist() == [reward.invalid_reward] == [-1.0]
            assert out["scores"].tolist() == [0.0]
            logs_ = out["extra_logs"]
            assert logs_["rapo/invalid"].tolist() == logs_["rapo/error"].tolist() == [1.0]
            assert logs_["rapo/judge_invalid"].tolist() == [1.0] and logs_["rapo/judge"].tolist() == [0.0]
            assert set(logs_) == set(ok["extra_logs"])  # OpenRLHF concatenates the keys of every sample
            assert len(logs(caplog, logging.ERROR)) == (1 if i == 2 else 0)
        assert len(logs(caplog, logging.WARNING)) == 3 and "HTTP 503" in logs(caplog, logging.WARNING)[0]
        (error,) = logs(caplog, logging.ERROR)
        assert "3 samples in a row" in error and fake.url in error and "judge-70b" in error
        state["down"] = False
        assert reward([query], [prompt], [""])["rewards"].tolist() == [1.0]
        assert reward.failures.in_a_row == 0 and reward.failures.total == 3


def test_a_dead_endpoint_is_invalid_not_an_exception(tmp_path, smol_path, smol_tokenizer, caplog) -> None:
    url = closed_port_url()
    reward = OpenRLHFReward.from_config(
        judge_config(tmp_path, smol_path, url), smol_tokenizer, failures_before_error=1
    )
    query, prompt = one_query(smol_tokenizer)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        out = reward([query, query], [prompt, prompt], ["", ""])
    assert out["rewards"].tolist() == [-1.0, -1.0] and out["extra_logs"]["rapo/error"].tolist() == [1.0, 1.0]
    (error,) = logs(caplog, logging.ERROR)
    assert url in error and "2 samples in a row" in error


def test_unreadable_judge_answers_count_toward_the_error(tmp_path, smol_path, smol_tokenizer, caplog) -> None:
    """A judge that answers but never a score: invalid samples (no exception), and the ERROR all the same."""
    cfg = judge_config(
        tmp_path,
        smol_path,
        "unused",
        **{
            "judge.engine": "scripted",
            "judge.base_url": None,
            "judge.script": {"default": "I cannot decide.", "structured": False},
        },
    )
    reward = OpenRLHFReward.from_config(cfg, smol_tokenizer, failures_before_error=2)
    query, prompt = one_query(smol_tokenizer)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        for _ in range(2):
            out = reward([query], [prompt], [""])
            assert out["extra_logs"]["rapo/invalid"].tolist() == [1.0]
            assert out["extra_logs"]["rapo/error"].tolist() == [0.0]  # answered: not an endpoint error
    (error,) = logs(caplog, logging.ERROR)
    assert "no reward could score them" in error and "judge engine scripted" in error


def load_reward_file(bundle: Path):
    spec = importlib.util.spec_from_file_location("reward_func_o3", bundle / "reward_func.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # as OpenRLHF loads --reward.remote_url
    return module


def test_exported_reward_file_survives_a_down_judge_and_a_broken_bundle(
    tmp_path, smol_path, smol_tokenizer, caplog
) -> None:
    from rapo_echo.integrations.openrlhf import export_reward_file

    bundle = tmp_path / "bundle"
    export_reward_file(judge_config(tmp_path, smol_path, closed_port_url()), bundle, tokenizer=smol_tokenizer)
    text = (bundle / "reward_func.py").read_text()
    assert "FAILURES_BEFORE_ERROR = 8" in text and "never raises" in text.lower()
    query, prompt = one_query(smol_tokenizer)
    out = load_reward_file(bundle).reward_func([query], [prompt], [""])
    assert out["rewards"].tolist() == [-1.0] and out["extra_logs"]["rapo/error"].tolist() == [1.0]
    (bundle / "run_config.yaml").write_text("model: {name: 3\n")  # a bundle that cannot load
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        out = load_reward_file(bundle).reward_func([query], [prompt], [""])
    assert out["rewards"].tolist() == [-1.0] and out["extra_logs"]["rapo/invalid"].tolist() == [1.0]
    assert any("could not be built" in m and "run_config.yaml" in m for m in logs(caplog, logging.ERROR))


@pytest.mark.skipif(importlib.util.find_spec("openrlhf") is None, reason="openrlhf is not installed")
def test_a_down_judge_through_openrlhfs_single_turn_executor(tmp_path, smol_path, smol_tokenizer) -> None:
    """OpenRLHF's own executor gets a reward (not None) for a sample whose judge is down."""
    import asyncio
    from types import SimpleNamespace

    from openrlhf.utils.agent import SingleTurnAgentExecutor

    from rapo_echo.integrations.openrlhf import export_reward_file
    from tests.unit.integrations.openrlhf.test_openrlhf import FakeVLLM

    bundle = tmp_path / "bundle"
    export_reward_file(judge_config(tmp_path, smol_path, closed_port_url()), bundle, tokenizer=smol_tokenizer)
    executor = SingleTurnAgentExecutor(str(bundle / "reward_func.py"))
    _, prompt = one_query(smol_tokenizer)
    engine = FakeVLLM(smol_tokenizer, ["I'm so sorry, that is a real loss."])
    params = SimpleNamespace(max_tokens=64, logprobs=None)
    out = asyncio.run(executor.execute(prompt, "", params, 2048, smol_tokenizer, engine))
    assert float(out["reward"][0]) == -1.0 and float(out["extra_logs"]["rapo/error"][0]) == 1.0

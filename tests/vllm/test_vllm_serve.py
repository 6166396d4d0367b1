"""``vllm serve`` as the served simulator and judge (the real server on the embedded model, one per test
session): ``structured: auto`` detects vLLM and every format is enforced by the server, option scores come
from the server's top log-probs, and GRPO with a served judge, a RAPO step with a served simulator and judge,
and a SAGE evaluation finish with no invalid answer."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rapo_echo.engines.openai_engine import OpenAIEngine
from rapo_echo.types import SamplingParams
from tests.vllm.formats import FORMATS, PROMPTS

pytestmark = pytest.mark.vllm

TOP_LOGPROB_TOL = 1e-3  # the server's float32 log-probs against the hf engine's (measured < 1e-4)


@pytest.fixture(scope="module")
def served(vllm_server: str) -> OpenAIEngine:
    engine = OpenAIEngine(vllm_server, model=None, name="judge:openai", timeout_s=300, structured="auto")
    yield engine
    engine.close()


def test_structured_auto_detects_vllm_and_each_format_is_enforced(served) -> None:
    assert served.model == "judge"
    for fmt in FORMATS:
        params = SamplingParams(n=2, max_new_tokens=40, temperature=1.0, seed=5, answer_format=fmt)
        for group in served.generate(PROMPTS, params):
            for g in group:
                assert fmt.problem(g.text) is None, (fmt.kind, g.text)
        assert served._structured_ladder()[served._step] == "vllm", fmt.kind  # never stepped down
        assert served.structured_output == "server"


# Questions the embedded model answers with Yes or No: both are in the served top-20 of the first position
# (checked against the CPU build's server; the PROMPTS of formats.py start with "I", "My", ... and list
# neither, so the test compared nothing and failed)
YES_NO = [
    [{"role": "user", "content": "Answer with Yes or No only. Is the sky blue?"}],
    [
        {
            "role": "user",
            "content": "I feel a bit lonely since I moved to a new city. Do you understand me? "
            "Answer Yes or No.",
        }
    ],
]


def test_option_scores_come_from_the_servers_top_logprobs(served, smol_engine) -> None:
    """``choice_logprobs`` reads the first position's top-20 list and adds up the listed spellings of an
    option's first token (``"Yes"`` and ``" Yes"``): it lies between the ``hf`` engine's teacher-forced
    log-prob of the bare token and that of both spellings together."""
    options = ["Yes", "No"]
    theirs = served.choice_logprobs(YES_NO, options)
    assert served.supports_logprobs
    spellings = [o for x in options for o in (x, " " + x)]
    assert all(len(smol_engine.tokenizer(o, add_special_tokens=False)["input_ids"]) == 1 for o in spellings)
    ours = smol_engine.choice_logprobs(YES_NO, spellings)
    listed = 0
    for a, b in zip(ours, theirs):
        for o in options:
            if math.isfinite(b[o]):  # in the top 20
                listed += 1
                both = math.log(math.exp(a[o]) + math.exp(a[" " + o]))
                assert a[o] - TOP_LOGPROB_TOL <= b[o] <= both + TOP_LOGPROB_TOL, (o, a, b)
    assert listed > 0


def cli(*argv: str) -> int:
    from rapo_echo.cli import main

    return main(list(argv))


def metrics(run: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


SMALL = [
    "--set", "rollout.batch_size=2", "--set", "rollout.group_size=2", "--set", "rollout.max_new_tokens=8",
    "--set", "logging.progress=false", "--set", "logging.tensorboard=false", "--set", "train.save_every=100",
]  # fmt: skip


def served_role(role: str, url: str) -> list[str]:
    """A role on the served model; a long request deadline, since a loaded 2-core machine answers a batch
    of judge prompts slowly (on 2026-11-27, at load 25, requests passed the default 120 s)."""
    return [
        "--set", f"{role}.engine=openai", "--set", f"{role}.base_url={url}", "--set", f"{role}.model=judge",
        "--set", f"{role}.timeout_s=900",
    ]  # fmt: skip


def test_grpo_with_a_served_empathy_judge_has_no_invalid_answer(vllm_server, tmp_path) -> None:
    run = tmp_path / "grpo"
    code = cli(
        "train", "--algo", "grpo", "--reward", "empathy", "--max-steps", "1", "--output", str(run),
        *SMALL, *served_role("judge", vllm_server),
    )  # fmt: skip
    assert code == 0
    (m,) = metrics(run)
    judged = [k for k in m if k.startswith("reward/empathy")]
    assert judged, sorted(m)
    bad = {k: v for k, v in m.items() if "invalid" in k and v}
    assert not bad, bad


def test_rapo_step_with_served_simulator_and_judge(vllm_server, tmp_path) -> None:
    run = tmp_path / "rapo"
    code = cli(
        "train", "--algo", "rapo", "--max-steps", "1", "--output", str(run), *SMALL,
        "--set", "rapo.simulator.max_new_tokens=24", "--set", "rapo.simulator.thought_tokens=16",
        "--set", "rapo.judge.critique_tokens=24", "--set", "rapo.sd.enabled=false",
        *served_role("simulator", vllm_server), *served_role("judge", vllm_server),
    )  # fmt: skip
    assert code == 0
    (m,) = metrics(run)
    bad = {k: v for k, v in m.items() if "invalid" in k and v}
    assert not bad, bad


def test_sage_eval_with_a_served_simulator(vllm_server, tmp_path) -> None:
    out = tmp_path / "sage"
    code = cli(
        "eval", "--benchmark", "sage", "--limit", "1", "--policy", "default", "--simulator", vllm_server,
        "--judge", vllm_server, "--max-turns", "2", "--max-new-tokens", "16",
        "--simulator-max-new-tokens", "64", "--output", str(out),
    )  # fmt: skip
    assert code == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n_invalid"] == 0, summary

"""Training against a served simulator (an ``openai`` engine on a fake vLLM server): a request that fails
for good costs its dialogue, counted as ``invalid`` and ``remote/failed``, and the step goes on; an endpoint
that is down stops the run with a message naming it and the last checkpoint."""

from __future__ import annotations

import pytest

from rapo_echo.training.learner import TrainingError
from rapo_echo.training.run import Run
from tests.helpers.fake_openai import FakeAPI, ServedAPI, prompt_of
from tests.helpers.runs import metrics, run_config

FIRST_PROFILE = "Name: Dario"  # the first bundled SAGE profile (data.limit=2 takes it and one more)


def rlver_run(model, out, url: str):
    return run_config(
        model,
        out,
        "simulator.engine=openai",
        f"simulator.base_url={url}",
        "simulator.max_retries=1",
        "simulator.api_key_env=NO_SUCH_KEY_VARIABLE",
        "data.limit=2",
        "rollout.batch_size=2",
        "rollout.group_size=2",
        "rollout.max_new_tokens=6",
        "rlver.simulator.max_turns=2",
        "rlver.simulator.max_new_tokens=32",
        "train.max_steps=1",
        algo="rlver",
    )


def test_failed_simulator_requests_cost_their_dialogues_not_the_step(tmp_path, tiny_folder):
    # every request about the first profile fails (HTTP 500), every time: its two dialogues are lost
    served = ServedAPI(fail=lambda s: 500 if FIRST_PROFILE in prompt_of(s) else None)
    with FakeAPI(served) as api:
        run = tmp_path / "run"
        Run(rlver_run(tiny_folder, run, api.url)).train()
    [row] = metrics(run)
    assert row["invalid"] == 2 and row["valid"] == 2  # the other profile's two dialogues trained
    assert row["remote/failed"] == 2  # each lost dialogue's first analysis request, tried twice
    assert served.failed == 4 and (run / "final" / "config.json").is_file()


def test_an_endpoint_that_is_down_stops_the_run_naming_it(tmp_path, tiny_folder):
    with FakeAPI(ServedAPI(fail=lambda s: 503)) as api:
        run = tmp_path / "run"
        trainer = Run(rlver_run(tiny_folder, run, api.url))
        named = rf"step 1: simulator:openai: POST {api.url}/chat.*last checkpoint"
        with pytest.raises(TrainingError, match=named):
            trainer.train()
    assert not (run / "final").exists()

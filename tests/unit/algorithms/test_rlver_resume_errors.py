"""RLVER resume and simulator settings fail early and clearly (issue 31, item 15): resuming a PPO run
as GRPO (or the reverse) is a ConfigError before anything is touched, a damaged
``value_head.safetensors`` names the file and the way on, and ``rlver.simulator.initial_emotion``
outside the preset's range is refused when the config loads."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.training.run_config import load_config
from tests.unit.algorithms.test_rlver import rlver_cfg


def digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != ".rapo-echo.lock"
    }


@pytest.fixture(scope="module")
def ppo_run(tmp_path_factory, smol_tokenizer) -> tuple[Path, Path]:
    """A one-step RLVER PPO run on a tiny random model: (model folder, run folder)."""
    from rapo_echo.training.run import Run
    from tests.conftest import make_tiny_model

    base = tmp_path_factory.mktemp("rlver-resume")
    model = base / "tiny"
    make_tiny_model(smol_tokenizer).save_pretrained(model)
    smol_tokenizer.save_pretrained(model)
    run = base / "run"
    Run(rlver_cfg(model, run, "rlver.estimator=ppo", "train.max_steps=1")).train()
    return model, run


def test_resuming_ppo_as_grpo_is_refused_before_anything_is_touched(ppo_run):
    from rapo_echo.training.run import Run

    model, run = ppo_run
    before = digest(run)
    refused = (
        r"rlver.estimator: grpo cannot resume .*step-1: it was trained with rlver.estimator: ppo and holds "
        r"a value head.*Resume with rlver.estimator: ppo \(drop the --set\)"
    )
    with pytest.raises(ConfigError, match=refused):
        Run(rlver_cfg(model, run, "rlver.estimator=grpo", "train.max_steps=2"), resume=True)
    assert digest(run) == before


@pytest.mark.parametrize("written", ["grpo", "ppo, before the estimator was recorded"])
def test_the_other_direction_and_older_checkpoints(ppo_run, tmp_path, written):
    import json
    import shutil

    from rapo_echo.training.run import Run

    model, original = ppo_run
    run = tmp_path / "run"
    shutil.copytree(original, run)
    step = run / "checkpoints" / "step-1"
    state = json.loads((step / "trainer_state.json").read_text())
    if written == "grpo":  # what a GRPO run writes: its estimator, no value head
        state["algorithm"]["estimator"] = "grpo"
        (step / "model" / "value_head.safetensors").unlink()
        asked, was = "ppo", "grpo"
    else:  # no record: the value head on disk tells
        del state["algorithm"]["estimator"]
        asked, was = "grpo", "ppo"
    (step / "trainer_state.json").write_text(json.dumps(state))
    before = digest(run)
    match = rf"rlver.estimator: {asked} cannot resume .*: it was trained with rlver.estimator: {was} "
    with pytest.raises(ConfigError, match=match):
        Run(rlver_cfg(model, run, f"rlver.estimator={asked}", "train.max_steps=2"), resume=True)
    assert digest(run) == before


def test_a_damaged_value_head_names_the_file_and_the_way_on(ppo_run, tmp_path):
    import shutil

    from rapo_echo.training.run import Run

    model, original = ppo_run
    run = tmp_path / "run"
    shutil.copytree(original, run)
    head = run / "checkpoints" / "step-1" / "model" / "value_head.safetensors"
    head.write_bytes(b"\xff" * 8 + b"garbage")  # a header length far beyond the file: 'header too large'
    trainer = Run(rlver_cfg(model, run, "rlver.estimator=ppo", "train.max_steps=2"), resume=True)
    # safetensors' own words: "header too large" (0.8), "HeaderTooLarge" (0.4.3, pyproject's floor)
    reason = r"\(.*(?i:header ?too ?large)\)"
    with pytest.raises(
        RapoEchoError,
        match=rf"{head} cannot be read {reason}: the file is "
        "damaged; no earlier checkpoint exists: start the run again in a new --output",
    ):
        trainer._restore()
    shutil.copytree(run / "checkpoints" / "step-1", run / "checkpoints" / "step-0")  # an earlier one
    shutil.copy(
        original / "checkpoints" / "step-1" / "model" / head.name,
        head.parent.parent.parent / "step-0" / "model" / head.name,
    )
    with pytest.raises(
        RapoEchoError,
        match=rf"damaged; move {run / 'checkpoints' / 'step-1'} out of .*"
        r"the one before it \(step-0\)",
    ):
        trainer._restore()


@pytest.mark.parametrize(
    ("preset", "value", "allowed"),
    [("rlver", -50, "greater than 0"), ("rlver", 0, "greater than 0"), ("rlver", 100, "less than 100")],
)
def test_initial_emotion_out_of_range_is_refused_at_load(preset, value, allowed):
    sets = [f"rlver.simulator.preset={preset}", f"rlver.simulator.initial_emotion={value}"]
    with pytest.raises(ConfigError, match=rf"rlver.simulator.initial_emotion.*{allowed}"):
        load_config(algo="rlver", overrides=sets)


def test_initial_emotion_below_the_sage_floor_is_a_config_error(ppo_run):
    from rapo_echo.training.run import Run

    model, _ = ppo_run
    cfg = rlver_cfg(
        model,
        ppo_run[1].parent / "sage-floor",
        "rlver.simulator.preset=sage",
        "rlver.simulator.initial_emotion=5",
    )
    with pytest.raises(ConfigError, match=r"rlver.simulator.*initial_emotion 5.* below the floor 10"):
        Run(cfg)

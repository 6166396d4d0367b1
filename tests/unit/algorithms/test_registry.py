"""``--algo NAME``: built-ins and plugins through one door (entry points of ``rapo_echo.algorithms`` or
``module:Class``), declared algorithms only; each algorithm's section is its own, a saved config holds
the chosen one's only, and a config of an older version (every section) still resumes."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from pydantic import Field

from rapo_echo import algorithms
from rapo_echo.algorithms.base import Algorithm
from rapo_echo.algorithms.grpo import GRPO
from rapo_echo.checkpoint import check_heads
from rapo_echo.config import Strict, dump_config
from rapo_echo.errors import ConfigError
from rapo_echo.training.run_config import load_config
from tests.helpers.installed import two_packages_claim


class ShoutConfig(Strict):
    """A test algorithm's own switches."""

    volume: int = Field(3, ge=1, description="How loud.")


class Shout(GRPO):
    """A GRPO variant with a section of its own, named by path like a user's module would be."""

    name = "shout"
    config = ShoutConfig


class Unfinished(Algorithm):
    """Declares itself an algorithm but has no loss."""

    name = "unfinished"

    def rollout(self, scenarios, step):
        raise NotImplementedError


def test_the_built_ins_are_entry_points_of_rapo_echo() -> None:
    assert {"grpo", "rapo", "rlver"} <= set(algorithms.names(builtin=True))
    assert algorithms.get("rapo").__name__ == "RAPO"


def test_a_class_by_path_brings_its_own_section() -> None:
    cfg = load_config(algo=f"{__name__}:Shout", overrides=["shout.volume=5", "rewards=[{name: length}]"])
    assert cfg.shout.volume == 5 and cfg.algo == f"{__name__}:Shout"
    with pytest.raises(ConfigError, match="volume"):
        load_config(algo=f"{__name__}:Shout", overrides=["shout.volume=0"])


def test_only_declared_algorithms_are_used() -> None:
    with pytest.raises(ConfigError, match=r"'subprocess:Popen' is not an algorithm"):
        load_config(algo="subprocess:Popen")
    with pytest.raises(ConfigError, match=r"unknown algorithm 'nonesuch'; known: .*grpo.*rapo.*rlver"):
        load_config(algo="nonesuch")
    with pytest.raises(ConfigError, match=r"does not define loss"):
        load_config(algo=f"{__name__}:Unfinished")


def test_a_name_two_packages_claim_is_refused(monkeypatch) -> None:
    two_packages_claim("twice", monkeypatch)
    twice = r"'twice' is registered twice: a.x:One \(pkg-a\), b.y:Two \(pkg-b\)"
    with pytest.raises(ConfigError, match=twice):
        algorithms.get("twice")


def test_a_hook_reads_its_own_section_typed() -> None:
    from rapo_echo.algorithms.rapo_config import RapoConfig
    from rapo_echo.algorithms.rlver_config import RlverConfig

    cfg = load_config(algo="rlver", overrides=["rlver.estimator=ppo"])
    assert cfg.section("rlver", RlverConfig).estimator == "ppo"
    with pytest.raises(TypeError, match=r"\(algo: rlver\) has no 'rapo' section of RapoConfig"):
        cfg.section("rapo", RapoConfig)
    with pytest.raises(TypeError, match=r"has no 'train' section of RlverConfig"):  # another kind
        cfg.section("train", RlverConfig)


def test_a_saved_config_holds_the_chosen_algorithms_section_only(tmp_path: Path) -> None:
    for algo, own in (("rapo", {"rapo"}), ("rlver", {"rlver"}), ("grpo", set())):
        dump_config(load_config(algo=algo), tmp_path / f"{algo}.yaml")
        saved = yaml.safe_load((tmp_path / f"{algo}.yaml").read_text())
        assert {"rapo", "rlver"} & set(saved) == own, algo
        assert load_config(tmp_path / f"{algo}.yaml").model_dump() == load_config(algo=algo).model_dump()


def test_another_algorithms_section_is_refused_with_the_way_on(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("algo: rapo\nrlver:\n  thinking: true\n")
    refused = r"run.yaml:2: rlver: the section of --algo rlver, and this run is --algo rapo"
    with pytest.raises(ConfigError, match=refused):
        load_config(path)


def test_set_algo_chooses_the_algorithm_and_its_section() -> None:
    """``--set algo=rapo`` (and the API's overrides) load under RAPO with its section; it was refused as
    "the section of --algo rapo" because the algorithm was chosen before the overrides applied."""
    from rapo_echo.errors import ConfigError

    cfg = load_config(overrides=["algo=rapo", "rapo.sd.enabled=false"])
    assert cfg.algo == "rapo" and cfg.rapo.sd.enabled is False
    assert load_config(overrides={"algo": "rlver"}).algo == "rlver"
    with pytest.raises(ConfigError, match="disagree"):
        load_config(algo="grpo", overrides=["algo=rapo"])


def test_a_saved_config_of_an_older_version_still_resumes(tmp_path: Path) -> None:
    """Older versions saved every algorithm's section; ``--resume`` reads such a config.yaml with the
    other sections dropped, and the run's own section as it was."""
    from rapo_echo.training.train_cli import build_config

    old = load_config(algo="rapo", overrides=["rapo.sd.coef=0.25"]).model_dump(mode="json")
    old["rlver"] = load_config(algo="rlver").model_dump(mode="json")["rlver"]
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump(old))
    args = SimpleNamespace(
        model=None, max_steps=None, output=None, reward=None, config=None, algo=None, set=[], resume=str(run)
    )
    cfg = build_config(args)
    assert cfg.rapo.sd.coef == 0.25 and not hasattr(cfg, "rlver")
    with pytest.raises(ConfigError, match="rlver: the section of --algo rlver"):
        load_config(run / "config.yaml")  # as a user's own file it is refused


@pytest.mark.parametrize(
    ("recorded", "file", "value_head", "refused"),
    [
        (True, True, False, "holds a value head and this run trains none"),
        (False, False, True, "holds no value head and this run trains one"),
        (None, True, False, "holds a value head"),  # written before the record: the file tells
        (True, True, True, None),
    ],
)
def test_a_checkpoint_whose_heads_differ_is_refused(tmp_path, recorded, file, value_head, refused) -> None:
    ckpt = tmp_path / "step-1"
    (ckpt / "model").mkdir(parents=True)
    state = {"step": 1} if recorded is None else {"step": 1, "value_head": recorded}
    (ckpt / "trainer_state.json").write_text(json.dumps(state))
    if file:
        (ckpt / "model" / "value_head.safetensors").write_bytes(b"")
    if refused is None:
        check_heads(ckpt, value_head)
    else:
        with pytest.raises(ConfigError, match=refused):
            check_heads(ckpt, value_head)


def test_the_learner_knows_no_algorithm() -> None:
    """The training loop reads an algorithm through its interface only: it names none of the built-ins
    (as a word, in code or prose) and imports none of their modules."""
    import ast
    import re

    root = Path(__file__).resolve().parents[3] / "training"
    builtins = algorithms.names(builtin=True)
    for name in ("learner.py", "run.py", "plan.py", "run_log.py"):
        text = (root / name).read_text()
        words = {w.lower() for w in re.findall(r"[A-Za-z0-9_-]+", text)}  # rapo_echo, rapo-echo: one word
        assert not words & set(builtins), (name, words & set(builtins))
        imported = {
            node.module.rsplit(".", 1)[-1]
            for node in ast.walk(ast.parse(text))
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rapo_echo.algorithms.")
        }
        assert imported and not imported & set(builtins), (name, imported)

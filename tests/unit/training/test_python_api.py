"""The Python API (rapo_echo.train / evaluate / load_config): overrides as a mapping of dotted keys,
validated as the command line's are, errors naming the key; evaluate on a scripted engine; the package
import stays light."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import rapo_echo
from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.errors import ConfigError
from tests.helpers.data_files import esconv_file


def test_overrides_set_typed_values_over_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("algo: grpo\nrollout:\n  group_size: 8\nrewards: [{name: length}, {name: format}]\n")
    cfg = rapo_echo.load_config(
        path, overrides={"rollout.group_size": 4, "rewards.1.weight": 0.5, "train.lr": 2e-5}
    )
    assert cfg.rollout.group_size == 4 and cfg.train.lr == 2e-5
    assert [(r.name, r.weight) for r in cfg.rewards] == [("length", 1.0), ("format", 0.5)]
    assert isinstance(cfg, rapo_echo.RunConfig)


def test_a_config_given_as_a_mapping_is_the_files_tree() -> None:
    cfg = rapo_echo.load_config({"algo": "rapo", "rollout": {"batch_size": 3}})
    assert cfg.algo == "rapo" and cfg.rollout.batch_size == 3 and hasattr(cfg, "rapo")


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"rollout.group_sise": 4}, "overrides['rollout.group_sise']"),  # a misspelt key
        ({"rollout.group_size": "four"}, "overrides['rollout.group_size']"),  # a value of the wrong type
        ({"train.lr": float("nan")}, "train.lr"),  # refused as --set nan is
        ({"rollout.group_size": 1}, "rollout.group_size"),  # GRPO's own check, as on the command line
        ({"train lr": 1}, "overrides['train lr']"),  # not a dotted key
        ({"rewards.5.weight": 1}, "index '5'"),  # no such list item
    ],
)
def test_bad_overrides_are_refused_naming_the_key(overrides: dict, named: str) -> None:
    with pytest.raises(ConfigError) as err:
        rapo_echo.load_config(overrides=overrides)
    assert named in str(err.value)


def asks_something(prompts, completions, **columns):
    """A TRL-style reward function, at the top level of an importable module."""
    return [1.0 if "?" in c[0]["content"] else 0.0 for c in completions]


def test_what_a_trl_user_passes_is_taken(tmp_path: Path, monkeypatch) -> None:
    """A ``datasets.Dataset`` and a reward function were refused ("Input should be a valid string", "...
    a valid dictionary or instance of RewardSpec"; issue 49, item 4): the dataset is saved in the cache and
    named by its folder, the function by its import path, so config.yaml can hold them."""
    from datasets import Dataset

    from rapo_echo.data import scenarios_from_config
    from rapo_echo.rewards import RewardContext, RewardSet
    from rapo_echo.training.api import config_values

    monkeypatch.setenv("RAPO_ECHO_CACHE", str(tmp_path / "cache"))
    rows = [{"prompt": [{"role": "user", "content": f"I failed test {i}."}]} for i in range(3)]
    given = {"data.path": Dataset.from_list(rows), "rewards": [asks_something, {"name": "length"}]}
    overrides = {k: config_values(v, f"overrides[{k!r}]", k) for k, v in given.items()}
    folder = Path(overrides["data.path"])
    assert folder.parent == tmp_path / "cache" / "datasets" and (folder / "dataset_info.json").is_file()
    assert overrides["rewards"][0] == {"name": f"{__name__}:asks_something"}
    cfg = rapo_echo.load_config(overrides=overrides)
    read = [s.messages[0]["content"] for s in scenarios_from_config(cfg.data)]
    assert read == [r["prompt"][0]["content"] for r in rows]
    assert RewardSet.from_specs(cfg.rewards, RewardContext()).names == ["asks_something", "length"]
    again = config_values(Dataset.from_list(rows), "x", "data.path")
    assert again == str(folder)  # saved once, by its fingerprint
    with pytest.raises(ConfigError, match=r"overrides\['rewards'\]\[0\]: .*<lambda> cannot be named"):
        rapo_echo.train(output=tmp_path / "run", overrides={"rewards": [lambda prompts, completions: [0.0]]})
    assert not (tmp_path / "run").exists()


def test_train_refuses_bad_settings_before_loading_anything(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="overrides must be a mapping"):
        rapo_echo.train(overrides=["rollout.group_size=4"])
    with pytest.raises(ConfigError, match="resume=True continues output"):
        rapo_echo.train(resume=True)
    with pytest.raises(ConfigError, match="no config.yaml there"):
        rapo_echo.train(resume=tmp_path)
    with pytest.raises(ConfigError, match=r"overrides\['train.max_stepz'\]"):
        rapo_echo.train(output=tmp_path / "run", overrides={"train.max_stepz": 1})
    assert not (tmp_path / "run").exists()


def test_evaluate_runs_a_benchmark_on_an_engine_object(tmp_path: Path) -> None:
    out = tmp_path / "eval"
    policy = ScriptedEngine(default="I hear you.")
    summary = rapo_echo.evaluate(
        "esconv-ref", policy=policy, data=esconv_file(tmp_path), output=out, batch_size=2
    )
    assert summary["n_cases"] == 3 and summary["complete"]
    assert summary["metrics"]["distinct_1"] == pytest.approx(100 * 4 / 12)  # "i hear you ." x3
    assert json.loads((out / "summary.json").read_text())["metrics"] == summary["metrics"]
    assert sum(len(c["prompts"]) for c in policy.calls) == 3
    again = rapo_echo.evaluate(
        "esconv-ref", policy=policy, data=esconv_file(tmp_path), output=out, batch_size=2
    )
    assert again["metrics"] == summary["metrics"] and sum(len(c["prompts"]) for c in policy.calls) == 3


def test_evaluate_falls_back_to_the_bundled_data_as_eval_does(tmp_path: Path, caplog) -> None:
    """``rapo_echo.evaluate("esconv", ...)`` failed where ``rapo-echo eval`` read its bundled set (issue 49,
    item 3)."""
    out = tmp_path / "eval"
    with caplog.at_level("WARNING"):
        policy = ScriptedEngine(default="I hear you.")
        summary = rapo_echo.evaluate("esconv-ref", policy=policy, output=out, limit=2)
    assert summary["n_cases"] == 2 and summary["complete"]
    assert json.loads((out / "config.json").read_text())["data"] == "bundled:esconv_style_en.json"
    assert "no data given, so the bundled bundled:esconv_style_en.json" in caplog.text


def test_evaluate_refuses_unknown_settings_and_benchmarks(tmp_path: Path) -> None:
    policy = ScriptedEngine(default="ok")
    with pytest.raises(ConfigError, match="unknown setting max_turn; allowed: max_turns"):
        rapo_echo.evaluate("esconv-ref", policy=policy, output=tmp_path / "o", max_turn=2)
    with pytest.raises(ConfigError, match="benchmark 'esconf'; allowed: .*esconv"):
        rapo_echo.evaluate("esconf", policy=policy, output=tmp_path / "o")
    assert not (tmp_path / "o").exists()


def test_import_rapo_echo_stays_light_and_every_lazy_name_resolves() -> None:
    code = (
        "import sys, rapo_echo; heavy = [m for m in ('torch', 'transformers', 'rapo_echo.algorithms') "
        "if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
    for name in rapo_echo.LAZY_EXPORTS:
        assert getattr(rapo_echo, name).__name__ == name
    with pytest.raises(AttributeError, match="no attribute 'trian'"):
        rapo_echo.trian  # noqa: B018

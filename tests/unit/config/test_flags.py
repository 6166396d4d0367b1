"""Flags generated from a config section (rapo_echo.config.flags): one flag per field with its type,
default and help; --config and --set over them; errors naming the flag, the file's line or the --set."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Annotated, Any, Literal

import pytest
from pydantic import Field

from rapo_echo.config import Strict
from rapo_echo.config.flags import Flag, add_flags, section_from_args
from rapo_echo.errors import ConfigError


class Inner(Strict):
    """A nested section: no flag, set from the file or --set."""

    depth: int = Field(1, ge=1, description="How deep.")


class Demo(Strict):
    """Every kind of field a command has."""

    output: str = Field(description="Where to write.")
    limit: int | None = Field(None, ge=1, description="At most this many.")
    temperature: float = Field(0.7, ge=0.0, description="Sampling temperature.")
    size: int | Literal["auto"] = Field("auto", description="A number or auto.")
    mode: Literal["fast", "slow"] = Field("fast", description="How.")
    merge: bool = Field(False, description="Merge.")
    lora: Annotated[bool, Flag(off="--full")] = Field(True, description="LoRA, or --full.")
    user: list[str] = Field(default_factory=list, description="Repeatable.")
    kinds: Annotated[list[Literal["a", "b"]], Flag(sep=",")] = Field(["a"], description="Comma list.")
    scorer_name: Annotated[str, Flag("--scorer")] = Field("ours", description="Renamed flag, 100%.")
    extra: dict[str, Any] = Field(default_factory=dict, description="KEY=VALUE, repeatable.")
    inner: Inner = Field(default_factory=Inner, description="Nested.")


def parse(argv: list[str], config: bool = True) -> Demo:
    parser = argparse.ArgumentParser(prog="demo", exit_on_error=False)
    add_flags(parser, Demo, config=config)
    return section_from_args(Demo, parser.parse_args(argv))


def test_defaults_live_in_the_section() -> None:
    assert parse(["--output", "o"]) == Demo(output="o")


def test_each_kind_of_flag() -> None:
    d = parse(
        ["--output", "o", "--limit", "3", "--temperature", "0", "--size", "8", "--mode", "slow", "--merge",
         "--full", "--user", "x", "--user", "y", "--kinds", "a,b", "--scorer", "sotopia", "--extra", "k=0.5",
         "--extra", "{j: [1, 2]}"]
    )  # fmt: skip
    assert (d.limit, d.temperature, d.size, d.mode, d.merge, d.lora) == (3, 0.0, 8, "slow", True, False)
    assert (d.user, d.kinds, d.scorer_name) == (["x", "y"], ["a", "b"], "sotopia")
    assert d.extra == {"k": 0.5, "j": [1, 2]}
    assert parse(["--output", "o", "--no-merge", "--lora"]).lora is True
    assert parse(["--output", "o", "--kinds", "none"]).kinds == []


def test_the_file_then_the_flags_then_set(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("output: from-file\ntemperature: 0.2\nlimit: 5\ninner:\n  depth: 3\n")
    d = parse(["--config", str(f), "--temperature", "0.3", "--set", "limit=9", "--set", "inner.depth=4"])
    assert (d.output, d.temperature, d.limit, d.inner.depth) == ("from-file", 0.3, 9, 4)


@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_nonfinite_and_out_of_range_numbers_name_the_flag(value: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(["--output", "o", "--temperature", value])
    (line,) = str(err.value).splitlines()[1:]
    assert line.strip().startswith("flag --temperature: temperature: got ")


def test_text_that_is_not_the_type_names_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"flag --limit: limit: got '1.5'; expected a whole number"):
        parse(["--output", "o", "--limit", "1.5"])
    with pytest.raises(ConfigError, match=r"flag --size: size: got 'big'; expected a whole number or one of"):
        parse(["--output", "o", "--size", "big"])
    with pytest.raises(ConfigError, match=r"--extra: got '\[1\]'; expected KEY=VALUE or a mapping"):
        parse(["--output", "o", "--extra", "[1]"])
    with pytest.raises(ConfigError, match=r"--extra:1: invalid YAML"):
        parse(["--output", "o", "--extra", "{[1]"])


def test_errors_name_the_file_line_and_set(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("output: o\n\nlimit: 0\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: limit: got 0; Input should be greater"):
        parse(["--config", str(f)])
    with pytest.raises(ConfigError, match=r"--set mode: mode: got 'medium'; allowed values are"):
        parse(["--output", "o", "--set", "mode=medium"])
    with pytest.raises(ConfigError, match=r"tempreature: got 1; unknown key; did you mean temperature"):
        parse(["--output", "o", "--set", "tempreature=1"])


def test_a_missing_required_value_names_its_flag() -> None:
    with pytest.raises(ConfigError, match=r"--output: required \(or `output:` in the --config file\)"):
        parse([])


def test_help_shows_description_and_default(capsys) -> None:
    parser = argparse.ArgumentParser(prog="demo")
    add_flags(parser, Demo, config=False)
    text = parser.format_help()
    assert "--scorer SCORER_NAME" in text and "Renamed flag, 100%. (default: ours)" in " ".join(text.split())
    assert "{fast,slow}" in text and "--config" not in text and "--inner" not in text


def test_an_unknown_key_gets_no_run_config_hint(tmp_path: Path) -> None:
    # a command's section named TRL's spelling of a run-config key (`learning_rate` is `train.lr` there),
    # a key this section does not have
    f = tmp_path / "c.yaml"
    f.write_text("output: o\nlearning_rate: 0.1\n")
    with pytest.raises(ConfigError, match=r"c.yaml:2: learning_rate: got 0.1; unknown key") as err:
        parse(["--config", str(f)])
    assert "TRL" not in str(err.value) and "train.lr" not in str(err.value)

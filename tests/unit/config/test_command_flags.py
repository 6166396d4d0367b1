"""Every command's flags come from its section: a non-finite or out-of-range number is refused with an
error naming the flag (exit 2), before any model loads (issue 45; issue 46 lists the data commands')."""

from __future__ import annotations

from pathlib import Path

import pytest

from rapo_echo.cli import main

EVAL = ["eval", "--benchmark", "esconv", "--policy", "p"]
DATA = ("critique-rewrite", "references", "hard-prompts", "synthesize")
# (the command, the flag, a bad value: nan, inf or out of range)
CASES = [
    (EVAL, "--temperature", "nan"),
    (EVAL, "--temperature", "inf"),
    (EVAL, "--temperature", "-1"),
    (EVAL, "--simulator-temperature", "nan"),
    (EVAL, "--max-rpm", "inf"),
    (EVAL, "--max-tpm", "0"),
    (EVAL, "--max-turns", "0"),
    (EVAL, "--limit", "0"),
    (["eval", "--benchmark", "epm", "--policy", "p"], "--epm", "alpha=.nan"),
    # issue 46's data commands: tracebacks, and NaN written to config.json, before sections
    *[(["data", c], "--temperature", v) for c in DATA for v in ("nan", "inf", "-1")],
    (["data", "synthesize"], "--user-temperature", "nan"),
    (["data", "hard-prompts"], "--threshold", "nan"),
    (["data", "hard-prompts"], "--threshold", "1.5"),
    (["data", "critique-rewrite"], "--golden-min", "6"),
    (["data", "references"], "--batch-size", "0"),
    (["data", "references"], "--timeout-minutes", "nan"),
    (["data", "synthesize"], "--timeout-minutes", "0"),
    (["data", "hard-prompts"], "--reward-args", "{weight: .inf}"),
    (["train-judge", "--data", "x.jsonl"], "--lr", "inf"),
    (["train-judge", "--data", "x.jsonl"], "--eval-fraction", "nan"),
    (["train-judge", "--data", "x.jsonl"], "--eval-fraction", "1"),
    (["serve"], "--max-body-mb", "nan"),
    (["serve"], "--max-body-mb", "-1"),
    (["serve"], "--port", "70000"),
    (["chat"], "--temperature", "nan"),
    (["chat"], "--top-p", "inf"),
    (["train", "--dry-run"], "--gpu-memory", "nan"),
    (["train", "--dry-run"], "--gpus", "0"),
    (["openrlhf", "launch", "--bundle", "b"], "--vllm-memory", "nan"),
    (["openrlhf", "launch", "--bundle", "b"], "--nodes", "0"),
]


IDS = [f"{c[1] if c[0] in ('data', 'openrlhf') else c[0]} {f} {v}" for c, f, v in CASES]
WRITES = ("eval", "data", "train-judge", "train")  # the commands with an --output


@pytest.mark.parametrize(("command", "flag", "value"), CASES, ids=IDS)
def test_a_bad_number_is_refused_naming_the_flag(
    command: list[str], flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch
) -> None:
    import rapo_echo.engines as engines

    monkeypatch.setattr(engines, "engine_from_spec", lambda *a, **k: pytest.fail("a model was loaded"))
    out = tmp_path / "out"
    assert main([*command, flag, value, *(["--output", str(out)] if command[0] in WRITES else [])]) == 2
    err = capsys.readouterr().err
    assert f"{flag}" in err and err.startswith("rapo-echo: invalid config:\n"), err
    problems = err.splitlines()[1:]
    assert len(problems) == 1 and flag in problems[0], err
    assert not out.exists()

"""What judges and simulators share (rapo_echo/llm/answers.py, labels.py): one retry mechanism for all."""

from __future__ import annotations

import pytest

from rapo_echo.engines.scripted import ScriptedEngine
from rapo_echo.llm.answers import RETRY_TEMPERATURE, generate_parsed, retry_sampling
from rapo_echo.types import SamplingParams, msg


class RecordingEngine(ScriptedEngine):
    """Records (temperature, seed, stop) of every generate call."""

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.params: list[tuple[float, int | None, tuple[str, ...]]] = []

    def generate(self, prompts, params):
        self.params.append((params.temperature, params.seed, params.stop))
        return super().generate(prompts, params)


def digit(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


def test_retries_sample_hotter_with_a_new_seed_and_keep_the_rest():
    engine = RecordingEngine(replies=["no", "still no", "3"])
    first = SamplingParams(max_new_tokens=9, temperature=0.0, seed=5, stop=("\n",))
    (out,) = generate_parsed(engine, [[msg("user", "x")]], digit, first, max_retries=2)
    assert (out.value, out.attempts) == (3, 3)
    assert engine.params == [
        (0.0, 5, ("\n",)),
        (RETRY_TEMPERATURE, 6, ("\n",)),
        (RETRY_TEMPERATURE, 7, ("\n",)),
    ]


def test_retry_sampling_keeps_a_hotter_temperature_and_no_seed():
    hot = retry_sampling(SamplingParams(temperature=1.3, max_new_tokens=4), 2)
    assert (hot.temperature, hot.seed, hot.max_new_tokens) == (1.3, None, 4)


def test_explicit_retry_params_win():
    engine = RecordingEngine(replies=["no", "1"])
    retry = SamplingParams(temperature=0.25, seed=99)
    generate_parsed(engine, [[msg("user", "x")]], digit, SamplingParams(temperature=0.0), retry_params=retry)
    assert engine.params == [(0.0, None, ()), (0.25, 99, ())]


def test_retries_sample_hotter_with_the_next_seeds():
    engine = RecordingEngine(replies=["no", "no", "no"])
    (out,) = generate_parsed(
        engine, [[msg("user", "x")]], digit, SamplingParams(temperature=0.0, seed=1), max_retries=2
    )
    assert out.value is None and out.attempts == 3
    assert [t for t, _, _ in engine.params] == [0.0, RETRY_TEMPERATURE, RETRY_TEMPERATURE]
    assert [s for _, s, _ in engine.params] == [1, 2, 3]


@pytest.mark.parametrize("retries", [0, 1])
def test_no_retry_beyond_max(retries: int):
    engine = RecordingEngine(replies=["no"])
    generate_parsed(engine, [[msg("user", "x")]], digit, SamplingParams(), max_retries=retries)
    assert len(engine.params) == retries + 1

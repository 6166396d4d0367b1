"""The ``scalar_rm`` reward: a tiny random sequence-classification reward model scores batches exactly as
one by one, through its chat template; the normalisations by hand; bad args are config errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from rapo_echo.errors import ConfigError
from rapo_echo.models import tiny_config
from rapo_echo.rewards import RewardContext, build_reward
from rapo_echo.rewards.scalar_rm import ScalarRMReward, normalize_scores
from rapo_echo.types import Sample, Scenario


def tiny_rm(path: Path, tokenizer, num_labels: int = 1) -> Path:
    from transformers import LlamaForSequenceClassification

    torch.manual_seed(0)
    model = LlamaForSequenceClassification(tiny_config(tokenizer, hidden=32, num_labels=num_labels))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def samples() -> list[Sample]:
    a = Scenario("a", [{"role": "user", "content": "I lost my job today."}])
    b = Scenario("b", [{"role": "user", "content": "My friend ignores me."}])
    texts = [
        (a, 0, "I'm so sorry."),
        (a, 0, "That is a lot to take in; how are you holding up?"),
        (b, 1, "Ok."),
    ]
    return [Sample(sc, g, [], [], None, t) for sc, g, t in texts]


def test_the_normalisations_by_hand() -> None:
    raw, groups = [0.0, 2.0, -1.0], [0, 0, 1]
    assert normalize_scores(raw, groups, "none") == [0.0, 2.0, -1.0]
    sig = normalize_scores(raw, groups, "sigmoid")
    assert sig == pytest.approx([0.5, 1 / (1 + math.exp(-2)), 1 / (1 + math.e)])
    # group 0: mean 1, population std 1; group 1 alone: 0
    assert normalize_scores(raw, groups, "zscore-per-group") == pytest.approx(
        [-1 / (1 + 1e-6), 1 / (1 + 1e-6), 0.0]
    )
    assert normalize_scores([-800.0, 800.0], [0, 1], "sigmoid") == [0.0, 1.0]  # no overflow


def test_batches_score_as_one_by_one(tmp_path: Path, smol_tokenizer) -> None:
    folder = tiny_rm(tmp_path / "rm", smol_tokenizer)
    batched = ScalarRMReward(str(folder), normalize="none", batch_size=3, device="cpu")
    alone = ScalarRMReward(str(folder), normalize="none", batch_size=1, device="cpu")
    batch = samples()
    raw = batched.raw_scores(batch)
    assert raw == pytest.approx(alone.raw_scores(batch), abs=1e-5)
    assert len(set(raw)) == 3  # the replies differ, so do their scores
    # what is scored: the dialogue and the reply through the reward model's chat template
    text = smol_tokenizer.apply_chat_template(
        [*batch[1].scenario.messages, {"role": "assistant", "content": batch[1].text}], tokenize=False
    )
    assert batched.token_ids(batch[1]) == smol_tokenizer(text, add_special_tokens=False)["input_ids"]
    # by its built-in name, sigmoid by default
    reward = build_reward("scalar_rm", {"model": str(folder), "device": "cpu"}, RewardContext())
    assert reward(batch) == pytest.approx([1 / (1 + math.exp(-r)) for r in raw], abs=1e-6)


def test_bad_args_are_config_errors(tmp_path: Path, smol_tokenizer) -> None:
    with pytest.raises(ConfigError, match="normalize: got 'softmax'"):
        ScalarRMReward("unused", normalize="softmax")
    two = tiny_rm(tmp_path / "two", smol_tokenizer, num_labels=2)
    with pytest.raises(ConfigError, match="has 2 labels"):
        ScalarRMReward(str(two), device="cpu")
    with pytest.raises(ConfigError, match="could not be loaded"):
        ScalarRMReward(str(tmp_path / "missing"), device="cpu")


def test_zscore_per_group_over_groups_of_one_warns(tmp_path: Path, smol_tokenizer, caplog) -> None:
    # issue 46: PPO's group of one with zscore-per-group gave every reward 0 for the whole run, silently
    folder = tiny_rm(tmp_path / "rm", smol_tokenizer)
    reward = ScalarRMReward(str(folder), normalize="zscore-per-group", device="cpu")
    singles = [Sample(s.scenario, i, [], [], None, s.text) for i, s in enumerate(samples())]
    with caplog.at_level("WARNING", "rapo_echo.rewards.scalar_rm"):
        assert reward(singles) == [0.0, 0.0, 0.0]
        reward(singles)
    assert len(caplog.records) == 1 and "every reward is 0" in caplog.records[0].getMessage()
    caplog.clear()
    with caplog.at_level("WARNING", "rapo_echo.rewards.scalar_rm"):
        ScalarRMReward(str(folder), normalize="zscore-per-group", device="cpu")(samples())
    assert not caplog.records  # a group of two: nothing to say

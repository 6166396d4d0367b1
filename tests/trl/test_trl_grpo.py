"""The real TRL's ``GRPOTrainer`` (trl 1.16.0) trains the embedded model for 2 steps with rapo-echo's empathy
reward as a TRL reward function, and for 2 steps with rapo-echo's SAGE-style user as its ``rollout_func``:
whole dialogues whose user turns are masked from the loss (``env_mask``), read back from what TRL trains
on. Tiny settings: few completions of few tokens, no reference model."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rapo_echo.engines.scripted import ScriptedEngine, prompt_text
from tests.trl.conftest import grpo_args, need_trl

pytestmark = pytest.mark.trl

PROMPTS = [
    ("I failed my driving test today.", "Oh no, that sounds disappointing. How are you feeling about it?"),
    ("My best friend moved to another city.", "That must feel lonely. Do you want to tell me about them?"),
]
ANSWER = "Thanks, I feel a bit better."


def trained_on(trainer: Any) -> list[dict[str, Any]]:
    """Wrap the trainer's batch builder: every batch it trains on, as it built it."""
    seen: list[dict[str, Any]] = []
    build = trainer._generate_and_score_completions

    def spy(inputs: Any) -> Any:
        out = build(inputs)
        seen.append(out)
        return out

    trainer._generate_and_score_completions = spy
    return seen


def logged(trainer: Any, key: str) -> list[float]:
    return [float(h[key]) for h in trainer.state.log_history if key in h]


def test_grpo_trains_two_steps_with_our_empathy_reward(smol_path: str, tmp_path: Path) -> None:
    need_trl()
    from datasets import Dataset
    from trl import GRPOTrainer

    from rapo_echo.integrations.trl_rewards import trl_reward

    rows = [
        {"prompt": [{"role": "user", "content": text}], "reference": reference, "scenario_id": f"s{i}"}
        for i, (text, reference) in enumerate(PROMPTS)
    ]
    # the judge is the embedded model, named by its folder ("a folder" spec); the references come from
    # the dataset's column; one order and no injection probe keep it to one judge call per completion
    empathy = trl_reward(
        "empathy", judge=smol_path, args={"needs": False, "order": "fixed", "injection_probe": 0}
    )
    trainer = GRPOTrainer(
        model=smol_path,
        reward_funcs=[empathy],
        args=grpo_args(str(tmp_path), max_completion_length=8),
        train_dataset=Dataset.from_list(rows),
    )
    batches = trained_on(trainer)
    trainer.train()
    assert trainer.state.global_step == 2 and len(batches) == 2
    means = logged(trainer, "rewards/empathy/mean")
    assert len(means) == 2 and all(0.0 <= m <= 1.0 for m in means), means
    assert logged(trainer, "empathy/judge/position_bias/n")  # our reward's step metrics reach TRL's log
    assert all(math.isfinite(g) for g in logged(trainer, "grad_norm"))


def sage_user(prompt: Any) -> str:
    """The simulated user on a scripted engine: the analysis moves the emotion by +10 or -5 as its prompt
    (the dialogue, the newest reply last) is of even or odd length, so a group's dialogues differ and
    their advantages are not all 0; the user answers ANSWER."""
    text = prompt_text(prompt)
    if "emotion right now" in text:
        shift = 10 if len(text) % 2 == 0 else -5
        return json.dumps({"content": "c", "fit": "f", "mind": "m", "reaction": "r", "shift": shift})
    return ANSWER


def test_grpo_trains_two_steps_with_our_sage_user_as_its_environment(
    smol_path: str, served: Any, tmp_path: Path
) -> None:
    need_trl()
    from trl import GRPOTrainer

    from rapo_echo.data.sage_profiles import load_profiles
    from rapo_echo.integrations.trl_sage import SageRollout, sage_emotion

    # the user's engine is an OpenAI-compatible endpoint (what `vllm serve` gives), here rapo-echo's own
    # server in this process, in front of the scripted user
    url = served(ScriptedEngine(fn=sage_user, structured=False), "sage-user")
    sage = SageRollout(url, settings={"max_turns": 2, "emotion_readout": "text"}, turn_tokens=8)
    data = sage.dataset(load_profiles()[:2])
    trainer = GRPOTrainer(
        model=smol_path,
        reward_funcs=[sage_emotion],
        args=grpo_args(str(tmp_path), max_completion_length=40, learning_rate=1e-4),
        train_dataset=data,
        rollout_func=sage,
    )
    batches = trained_on(trainer)
    trainer.train()
    assert trainer.state.global_step == 2 and len(batches) == 2
    tok = trainer.processing_class
    for batch in batches:
        assert "tool_mask" in batch  # TRL took the rollout's env_mask
        for ids, attend, mask in zip(batch["completion_ids"], batch["completion_mask"], batch["tool_mask"]):
            ids, attend, mask = ids.tolist(), attend.tolist(), mask.tolist()
            user = tok.decode([t for t, a, m in zip(ids, attend, mask) if a and not m])
            policy = [t for t, a, m in zip(ids, attend, mask) if a and m]
            # two policy turns of at most 8 tokens; between them the user's turn, never trained on
            assert 0 < len(policy) <= 16
            assert ANSWER in user and ANSWER not in tok.decode(policy)
            assert user.count("<|im_start|>user") == 1 and user.endswith("<|im_start|>assistant\n")
    rewards = logged(trainer, "rewards/sage_emotion/mean")
    # RLVER's preset starts at 30; two turns of +10 or -5 each: the final emotion / 100 is 0.2 .. 0.5
    assert len(rewards) == 2 and all(0.2 - 1e-6 <= r <= 0.5 + 1e-6 for r in rewards), rewards
    assert logged(trainer, "sage/turns") == [2.0, 2.0]
    assert logged(trainer, "sage/end_max_turns") == [1.0, 1.0]

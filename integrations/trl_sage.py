"""rapo-echo's SAGE-style simulated user as TRL's ``rollout_func``: GRPO on whole dialogues, the user's
turns masked from the loss (TRL 1.16's ``GRPOTrainer(rollout_func=...)``, ``env_mask``); the use and the
dialogue are in docs/integrations.md, "TRL: the SAGE-style user as the environment".

A dialogue is one token sequence: the prompt, then the policy's sampled tokens and, between them, the
user's turns written with the template's markers (:class:`~rapo_echo.chat_template.ChatMarkers`) under
``env_mask`` 0; sampled text is never re-tokenised. The reward reaches the reward functions as the column
``sage_reward`` (with ``sage_turns`` and ``sage_end``). The rollout function sees the prompts only, so it
finds each prompt's profile by the prompt (:meth:`SageRollout.dataset` remembers them); a prompt it does
not know is an error.
"""

from __future__ import annotations

import copy
import json
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rapo_echo.algorithms.rlver_config import RLVER_SYSTEM_PROMPT
from rapo_echo.chat_template import ChatMarkers, render_prompt
from rapo_echo.data.sage_profiles import SageProfile, load_profiles
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.integrations.trl_rewards import Role, role_engine
from rapo_echo.simulators.sage import END_REASONS, SageDialogue, SageSettings, SageSimulator
from rapo_echo.types import Conversation, msg


@dataclass
class Dialogue:
    """One rollout: the simulated user's dialogue and its tokens (``context`` is what the next policy turn
    is sampled from)."""

    user: SageDialogue
    prompt: list[int]
    context: list[int]
    completion: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)


class SageRollout:
    """TRL's ``rollout_func`` with the SAGE-style user (module doc). ``preset`` (``rlver``: RLVER's
    training simulator, or ``sage``) and ``settings`` (:class:`~rapo_echo.simulators.sage.SageSettings`
    fields, e.g. ``max_turns``, ``plain_reply``) shape the user; ``system_prompt`` is the policy's."""

    def __init__(
        self,
        simulator: Role = "default",
        *,
        preset: str = "rlver",
        settings: dict[str, Any] | None = None,
        system_prompt: str | None = RLVER_SYSTEM_PROMPT,
        turn_tokens: int | None = None,
        seed: int = 0,
    ) -> None:
        base = {"emotion_readout": "auto", "plain_reply": True, **(settings or {})}
        try:
            self.settings = SageSettings.from_mapping({"preset": preset, **base}, "SageRollout settings")
        except DataError as exc:
            raise ConfigError(str(exc)) from None
        if turn_tokens is not None and turn_tokens < 1:
            raise ConfigError(f"SageRollout: turn_tokens must be >= 1, got {turn_tokens}")
        self.engine = role_engine(simulator)
        self.system_prompt = system_prompt
        self.turn_tokens = turn_tokens
        self.seed = seed
        self.profiles: dict[str, SageProfile] = {}
        self._markers: dict[int, ChatMarkers] = {}
        self.__name__ = "sage_rollout"

    # ------------------------------------------------------------------ the dataset
    def prompt(self, profile: SageProfile) -> Conversation:
        """The policy's prompt of a profile: the system prompt and the user's first talk."""
        head = [msg("system", self.system_prompt)] if self.system_prompt else []
        return head + ([msg("user", profile.first_talk)] if profile.first_talk else [])

    def dataset(self, profiles: str | Sequence[SageProfile] | None = None) -> Any:
        """A ``datasets.Dataset`` of prompts (``prompt``) and profiles (``profile``, JSON) for TRL, from our
        bundled English profiles, a profile file (RLVER / SAGE rows or ours) or profiles; remembers each
        prompt's profile. A profile without a first talk gets one the simulator writes now."""
        from datasets import Dataset

        found = list(profiles) if isinstance(profiles, Sequence) and not isinstance(profiles, str) else None
        chosen = found if found is not None else load_profiles(profiles)
        missing = [p for p in chosen if not p.first_talk]
        if missing:
            sim = SageSimulator(self.engine, self.settings, seed=self.seed)
            opened = sim.start(missing, [p.id or str(i) for i, p in enumerate(missing)])
            talks = {id(p): d.history[0]["content"] for p, d in zip(missing, opened) if not d.invalid}
            chosen = [replace(p, first_talk=talks[id(p)]) if id(p) in talks else p for p in chosen]
            chosen = [p for p in chosen if p.first_talk]
        rows = []
        for p in chosen:
            key = prompt_key(self.prompt(p))
            if key in self.profiles and self.profiles[key] != p:
                raise DataError(f"profiles {self.profiles[key].id!r} and {p.id!r} open with the same prompt")
            self.profiles[key] = p
            rows.append({"prompt": self.prompt(p), "profile": json.dumps(p.__dict__, ensure_ascii=False)})
        return Dataset.from_list(rows)

    def profile(self, prompt: Any, i: int) -> SageProfile:
        found = self.profiles.get(prompt_key(prompt))
        if found is None:
            raise DataError(
                f"SageRollout: prompt {i} is not one of SageRollout.dataset()'s; TRL hands a rollout "
                "function the prompts only, so the simulated user's profile is found by its prompt: build "
                "the train_dataset with dataset()"
            )
        return found

    # ------------------------------------------------------------------ the rollout
    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, Any]:
        if getattr(trainer, "use_vllm", False):
            raise ConfigError(
                "SageRollout generates the policy's turns with transformers; TRL's vLLM (use_vllm=True) is "
                "not supported inside the dialogue loop: set use_vllm=False"
            )
        tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
        markers = self._markers.setdefault(id(tok), ChatMarkers.from_tokenizer(tok))
        eos = set(trainer.eos_token_ids)
        budget = int(trainer.max_completion_length)
        per_turn = min(self.turn_tokens or budget, budget)
        sim = SageSimulator(self.engine, self.settings, seed=self.seed + int(trainer.state.global_step))
        profiles = [self.profile(p, i) for i, p in enumerate(prompts)]
        keys = [prompt_key(p) for p in prompts]
        users = sim.start(profiles, [f"{k[:12]}-{i}" for i, k in enumerate(keys)], keys)
        dialogues = []
        for d in users:
            ids = tok(render_prompt(tok, self._conversation(d)), add_special_tokens=False)["input_ids"]
            dialogues.append(Dialogue(d, list(ids), list(ids)))
        while True:
            live = [x for x in dialogues if not x.user.done]
            if not live:
                break
            room = [min(per_turn, budget - len(x.completion)) for x in live]
            turns = generate(trainer, [x.context for x in live], max(room), eos)
            replies = []
            for x, r, ids in zip(live, room, turns):
                ids = ids[:r]
                x.completion += ids
                x.context += ids
                x.mask += [1] * len(ids)
                replies.append(tok.decode(ids, skip_special_tokens=True).strip())
            sim.step([x.user for x in live], replies)
            for x in live:
                if not x.user.done:
                    self._user_turn(x, tok, markers, eos, budget)
        return self._output(dialogues, tok)

    def _conversation(self, d: SageDialogue) -> Conversation:
        head = [msg("system", self.system_prompt)] if self.system_prompt else []
        return head + (d.history[:1] or [msg("user", "")])  # an opening that never parsed: ends at once

    def _user_turn(self, x: Dialogue, tok: Any, markers: ChatMarkers, eos: set[int], budget: int) -> None:
        """Append the user's answer (masked), or end the dialogue when it would not leave the policy room
        for one more token."""
        ended = bool(x.completion) and x.completion[-1] in eos
        last = tok.decode(x.completion[-1:], skip_special_tokens=False) if ended else ""
        text = markers.feedback(last, x.user.history[-1]["content"])
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(x.completion) + len(ids) >= budget:
            x.user.end("token_budget")
            return
        x.completion += ids
        x.context += ids
        x.mask += [0] * len(ids)

    def _output(self, dialogues: list[Dialogue], tok: Any) -> dict[str, Any]:
        for x in dialogues:
            if not x.completion:  # an opening that never parsed: one masked token, so TRL has a completion
                x.completion, x.mask = [tok.eos_token_id], [0]
        return {
            "prompt_ids": [x.prompt for x in dialogues],
            "completion_ids": [x.completion for x in dialogues],
            "logprobs": None,  # TRL scores the sampled tokens itself
            "env_mask": [x.mask for x in dialogues],
            "sage_reward": [None if x.user.invalid else x.user.reward for x in dialogues],
            "sage_turns": [x.user.turns for x in dialogues],
            "sage_end": [x.user.reason for x in dialogues],
        }


def prompt_key(prompt: Any) -> str:
    """What identifies a prompt (messages or text) across TRL's copies of it."""
    return json.dumps(prompt, sort_keys=True, ensure_ascii=False)


def generate(trainer: Any, contexts: list[list[int]], max_new_tokens: int, eos: set[int]) -> list[list[int]]:
    """One policy turn for every context with the trainer's model and sampling settings (TRL's own
    ``transformers`` generation, unwrapped as TRL unwraps it): each reply's tokens, up to and including
    its first end-of-sequence token."""
    import torch
    from trl.models.utils import unwrap_model_for_generation

    tok = getattr(trainer.processing_class, "tokenizer", trainer.processing_class)
    width = max(len(c) for c in contexts)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in contexts])
    attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in contexts])
    config = copy.deepcopy(trainer.generation_config)
    config.max_new_tokens = max_new_tokens
    device = trainer.accelerator.device
    with (
        unwrap_model_for_generation(
            trainer.model_wrapped,
            trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation,
            generation_kwargs=trainer.generation_kwargs,
            gradient_checkpointing_kwargs=trainer.args.gradient_checkpointing_kwargs,
        ) as model,
        torch.no_grad(),
    ):
        out = model.generate(
            input_ids=input_ids.to(device), attention_mask=attention.to(device), generation_config=config
        )
    replies = []
    for row in out[:, width:].tolist():
        cut = next((j + 1 for j, t in enumerate(row) if t in eos), len(row))
        replies.append(row[:cut])
    return replies


def sage_emotion(
    completions: Sequence[Any],
    sage_reward: Sequence[float | None] | None = None,
    sage_turns: Sequence[int] | None = None,
    sage_end: Sequence[str | None] | None = None,
    log_metric: Any = None,
    **_: Any,
) -> list[float | None]:
    """TRL reward function: each dialogue's final emotion / 100 (``sage_reward``, from
    :class:`SageRollout`); logs the mean turns and the share of each end reason (``sage/...``)."""
    if sage_reward is None:
        raise ConfigError("sage_emotion reads the column sage_reward: pass rollout_func=SageRollout(...)")
    if log_metric is not None and sage_turns:
        log_metric("sage/turns", statistics.fmean(sage_turns))
        for reason in END_REASONS:
            log_metric(f"sage/end_{reason}", sum(r == reason for r in sage_end or []) / len(sage_turns))
    return list(sage_reward)

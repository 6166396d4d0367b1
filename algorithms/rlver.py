"""RLVER: reinforcement learning with verifiable emotion rewards (arXiv 2507.03112; docs/algorithms/rlver.md).

For each user profile the policy holds ``rollout.group_size`` whole dialogues with a SAGE-style
simulated user (:mod:`rapo_echo.simulators.sage`, ``rlver`` preset by default): the user opens (the
profile's ``first_talk``, or one opening the simulator writes and the whole group shares), the policy
replies, the simulator updates the emotion and answers, until the user says goodbye, the emotion leaves
its range, ``max_turns`` replies were made, or the token budget is spent. Every turn is one batched
engine call per role over all dialogues still running (:func:`~rapo_echo.llm.turns.advance_together`;
with a served simulator and ``rollout.overlap_remote``, the policy's turns overlap the simulator's
answers to other dialogues); each reply is handed to the simulator together with its own dialogue, so
dialogues that end early drop out without shifting the others.

Token in, token out: a dialogue is one token sequence, the first prompt (system + opening, through the
chat template) followed by the policy's sampled tokens and, between them, the user's turns written with
the template's markers (:class:`~rapo_echo.chat_template.ChatMarkers`). Each turn is sampled from
exactly that sequence, so training sees exactly what sampling saw; sampled text is never re-tokenised.
The loss mask is 1 on the policy's tokens only. Thinking mode (``rlver.thinking``): the policy writes
``<think>...</think>`` before each reply; the simulator sees the reply only and later turns keep only
the reply, so each policy turn is its own training row (prompt = what it was sampled from).

Reward: the final emotion / 100, floored at 0 (plus any reward plugins, scored per policy turn and
averaged over the dialogue's turns, e.g. ``think_format``); a dialogue whose simulator output never
parses is invalid: masked out and counted. Estimators: ``grpo`` (``loss.advantage`` over each profile's
dialogues) or ``ppo``, the multi-turn use of ``--algo ppo`` (:mod:`.ppo`: a value head on the policy's
last hidden state, GAE over the policy's tokens skipping the user's, clipped value loss;
``rlver.dense_reward`` adds each turn's emotion change / 100 at the turn's end).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from einops import rearrange

from rapo_echo.chat_template import ChatMarkers
from rapo_echo.checkpoint import VALUE_HEAD_FILE, load_trainer_state
from rapo_echo.data.sage_profiles import SageProfile
from rapo_echo.engines.concurrency import calls_concurrently
from rapo_echo.errors import ConfigError
from rapo_echo.llm.turns import advance_together
from rapo_echo.policy import pad_left_aligned
from rapo_echo.prompting import THINK_CLOSE, split_thinking
from rapo_echo.simulators.sage import EMOTION_MAX, SageDialogue, SageSimulator, final_reward, preset
from rapo_echo.types import Conversation, Generation, Sample, SamplingParams, Scenario, msg

from .base import (
    AlgoContext,
    Algorithm,
    MicroBatch,
    Needs,
    RoleRequest,
    Rollout,
    Totals,
    TrainItem,
    pad_rows,
)
from .grpo import advantage_stats, group_advantages, pg_loss, policy_gradient_needs, reward_stats
from .ppo import OLD_VALUES, estimate, fill_old_values, ppo_loss, set_value_fields, value_needs
from .rlver_config import RLVER_SYSTEM_PROMPT, RlverConfig
from .turn_rewards import turn_advantages

if TYPE_CHECKING:
    from rapo_echo.policy import TokenScores

    from .run_sections import RunConfig

    class RlverRunConfig(RunConfig):
        """The run config :func:`.run_config.run_config_class` builds for RLVER (the type checker's view)."""

        rlver: RlverConfig

EMOTION = "emotion"  # the name of the emotion reward in Sample.rewards
TURN_ADVANTAGES = "turn_advantages"  # ``reward: per_turn``: each response token's turn advantage


@dataclass
class PolicyTurn:
    """One sampled policy turn: the exact prompt it was sampled from, its tokens and log-probs."""

    prompt_ids: list[int]
    ids: list[int]
    logprobs: list[float]
    text: str  # the raw reply (thinking included)
    reply: str  # what the simulator saw
    ended: bool  # the turn sampled its end-of-turn token
    truncated: bool  # cut by the per-turn or the dialogue budget
    visible: int = 0  # thinking mode: ids[visible:] is the part later turns see


@dataclass
class Episode:
    """One dialogue's tokens: ``context`` is what the next policy turn is sampled from."""

    dialogue: SageDialogue
    group: int
    prompt_ids: list[int]
    context: list[int]
    mask: list[int] = field(default_factory=list)  # over context[len(prompt_ids):], 1 = policy token
    logprobs: list[float] = field(default_factory=list)  # aligned with mask (0 on the user's tokens)
    turns: list[PolicyTurn] = field(default_factory=list)

    @property
    def response(self) -> list[int]:
        return self.context[len(self.prompt_ids) :]

    @property
    def trainable(self) -> bool:
        """Whether the policy sampled any token in this dialogue."""
        return any(t.ids for t in self.turns)


def visible_start(ids: list[int], decode: Any) -> int:
    """Index of the first token after ``</think>`` when the sampled tokens split cleanly there (the
    decoded prefix ends exactly with the tag); otherwise 0 (later turns then keep the whole output).
    The shortest prefix holding the tag is found by bisection (a longer prefix holds it too)."""
    if THINK_CLOSE not in decode(ids):
        return 0
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if THINK_CLOSE in decode(ids[:mid]):
            hi = mid
        else:
            lo = mid + 1
    return lo if decode(ids[:lo]).rstrip().endswith(THINK_CLOSE) else 0


class RLVER(Algorithm):
    """Multi-turn RL against a simulated user whose final emotion is the reward."""

    name = "rlver"
    config = RlverConfig
    cfg: RlverRunConfig
    dialogue_prompts = True
    progress_keys = ("emotion/final", "reward/mean", "loss/total")

    @classmethod
    def needs(cls, cfg: RunConfig) -> Needs:
        """GRPO compares a profile's dialogues (a group of 2 or more); PPO adds a value head, which is its
        baseline (a group of 1 is fine), and GAE's per-token fields."""
        rc = cfg.section("rlver", RlverConfig)
        if rc.estimator == "ppo":
            return value_needs(cfg, roles=("simulator",))
        per_turn = rc.reward == "per_turn" and not rc.thinking  # thinking: a row per turn
        return policy_gradient_needs(cfg, fields=(TURN_ADVANTAGES,) if per_turn else (), roles=("simulator",))

    @classmethod
    def requests(cls, cfg: RunConfig) -> list[RoleRequest]:
        """The simulated user's turns: a reply and an emotion per turn of each dialogue still running."""
        n = cfg.rollout.batch_size * cfg.rollout.group_size
        sim = cfg.section("rlver", RlverConfig).simulator
        turns = sim.max_turns or preset(sim.preset).max_turns
        return [
            RoleRequest(
                "simulator", f"RLVER user turns (<= {turns} per dialogue, reply + emotion)", n * turns * 2
            )
        ]

    @classmethod
    def check_resume(cls, cfg: RunConfig, ckpt: Path) -> None:
        """Before anything loads: a checkpoint written with a value head (PPO) resumes only as PPO, and
        one without only as GRPO (the optimizer's parameter groups differ)."""
        estimator = cfg.section("rlver", RlverConfig).estimator
        recorded = load_trainer_state(ckpt).get("algorithm", {}).get("estimator")
        # the estimator this checkpoint was written with (older ones: whether it holds a value head)
        was = recorded or ("ppo" if (ckpt / "model" / VALUE_HEAD_FILE).is_file() else "grpo")
        if was == estimator:
            return
        held = "a value head, whose" if was == "ppo" else "no value head; its"
        raise ConfigError(
            f"rlver.estimator: {estimator} cannot resume the checkpoint {ckpt}: it was trained "
            f"with rlver.estimator: {was} and holds {held} optimizer state does not fit. Resume with "
            f"rlver.estimator: {was} (drop the --set), or start a new run in another --output to train "
            f"with {estimator}"
        )

    def state_dict(self) -> dict[str, Any]:
        """The estimator, so that a resume with the other one is refused before anything loads."""
        return {"estimator": self.cfg.rlver.estimator}

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        # rlver.md 2.3: KL-free, group of 4 dialogues per profile, RLVER's system prompt; our bundled
        # English profiles unless data.path names others (e.g. RLVER's train_profile.jsonl).
        return {
            "rewards": [],
            "loss": {"beta": 0.0},
            "rollout": {"group_size": 4, "max_new_tokens": 128, "system_prompt": RLVER_SYSTEM_PROMPT},
            "data": {"path": "bundled:sage_profiles_en.jsonl"},
        }

    def __init__(self, cfg: RunConfig, ctx: AlgoContext) -> None:
        super().__init__(cfg, ctx)
        if ctx.simulator is None:
            raise ValueError("RLVER needs a simulator engine")
        self.user_engine = ctx.simulator
        rc = cfg.section("rlver", RlverConfig)
        sc = rc.simulator
        overrides: dict[str, Any] = {  # SageSettings fields of their own types
            "max_turns": sc.max_turns,
            "initial_emotion": sc.initial_emotion,
            "end_at_max": sc.end_at_max_emotion,
        }
        try:
            self.sim_settings = dataclasses.replace(
                preset(sc.preset),
                **{k: v for k, v in overrides.items() if v is not None},
                closing_message=False,  # nothing trains on the user's words after the dialogue has ended
                temperature=sc.temperature,
                max_new_tokens=sc.max_new_tokens,
                max_retries=sc.max_retries,
                emotion_readout=sc.emotion_readout,
                plain_reply=sc.plain_reply,
            )
        except ValueError as exc:  # e.g. an initial emotion below the sage preset's floor
            raise ConfigError(f"rlver.simulator (preset {sc.preset}): {exc}") from None
        self.ppo = rc.estimator == "ppo"
        if self.ppo and ctx.policy.scorer.value_head is None:
            raise ValueError("RLVER with PPO needs a value head on the policy (Needs.value_head)")
        self.markers = ChatMarkers.from_tokenizer(ctx.policy.tokenizer)
        eos = getattr(ctx.policy.engine, "eos_ids", None)
        self.eos_ids = set(eos) if eos else {ctx.policy.tokenizer.eos_token_id}

    # ------------------------------------------------------------------ prompts and tokens
    def system_prompt(self) -> str | None:
        base = self.cfg.rollout.system_prompt
        if not self.cfg.rlver.thinking:
            return base
        return (
            f"{base}\n\n{self.cfg.rlver.thinking_instruction}"
            if base
            else self.cfg.rlver.thinking_instruction
        )

    def first_prompt(self, d: SageDialogue) -> list[int]:
        system = self.system_prompt()
        conv: Conversation = ([msg("system", system)] if system else []) + list(d.history)
        return self.ctx.policy.prompt_ids(conv)

    def decode(self, ids: list[int]) -> str:
        return self.ctx.policy.tokenizer.decode(ids, skip_special_tokens=False)

    def user_turn_ids(self, turn: PolicyTurn, message: str) -> list[int]:
        """The user's turn as the chat template writes it after a policy turn: what closes the policy's
        message (nothing more than the rest of the end-of-turn marker when its stop token was sampled),
        the user's message, and the opening of the next assistant turn."""
        last = self.decode(turn.ids[-1:]) if turn.ended else ""
        text = self.markers.feedback(last, message)
        return self.ctx.policy.tokenizer(text, add_special_tokens=False)["input_ids"]

    def sampling_params(self) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(
            max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p, top_k=r.top_k
        )

    # ------------------------------------------------------------------ rollout
    def rollout(self, scenarios: list[Scenario], step: int) -> Rollout:
        timings = {"generate": 0.0, "simulate": 0.0}
        t0 = time.perf_counter()
        sim = SageSimulator(self.user_engine, self.sim_settings, seed=self.cfg.train.seed + step)
        episodes, lost = self._start(sim, scenarios, step)
        timings["simulate"] += time.perf_counter() - t0

        def policy_turns(batch: list[Episode]) -> None:
            t = time.perf_counter()
            gens = self.ctx.policy.generator.generate_ids([e.context for e in batch], self.sampling_params())
            for e, g in zip(batch, gens):
                self._policy_turn(e, g[0])
            timings["generate"] += time.perf_counter() - t

        def user_turns(batch: list[Episode]) -> None:
            sim.step([e.dialogue for e in batch], [e.turns[-1].reply for e in batch])

        # every dialogue's next turn in flight at once; with a served simulator the policy's turns overlap
        # the simulator's answers to other dialogues (rapo_echo.llm.turns); "simulate": the wait not hidden
        t0, generated = time.perf_counter(), timings["generate"]
        overlap = self.cfg.rollout.overlap_remote and calls_concurrently(self.ctx.simulator)
        advance_together(
            episodes,
            policy_turns,
            user_turns,
            done=lambda e: e.dialogue.done,
            settle=self._user_turn,
            overlap=overlap,
        )
        timings["simulate"] += time.perf_counter() - t0 - (timings["generate"] - generated)
        t0 = time.perf_counter()
        samples = self._score(episodes, scenarios)
        timings["rewards"] = time.perf_counter() - t0
        if self.ppo:
            t0 = time.perf_counter()
            items, adv = self._ppo_items(episodes, samples)
            timings["values"] = time.perf_counter() - t0
        elif self.cfg.rlver.reward == "per_turn":
            items, adv = self._turn_items(episodes, samples)
        else:
            adv = group_advantages(self.cfg, [s.reward for s in samples], [s.group for s in samples])
            items = self._grpo_items(episodes, samples, adv)
            adv = [a for a, s in zip(adv, samples) if s.valid]
        metrics = {
            **reward_stats(samples, [EMOTION, *self.ctx.rewards.names]),
            **advantage_stats(adv),
            **self._dialogue_metrics(episodes, lost),
        }
        metrics["invalid"] += lost
        return Rollout(samples, items, metrics, timings, {"episodes": episodes})

    def _start(self, sim: SageSimulator, scenarios: list[Scenario], step: int) -> tuple[list[Episode], int]:
        """Open ``group_size`` dialogues per scenario; a group shares its opening (the profile's, or one
        the simulator writes once). Returns the episodes and how many dialogues were lost to an opening
        that never parsed."""
        profiles = [SageProfile.from_scenario(s) for s in scenarios]
        keys = [f"{step}-{gi}" for gi in range(len(scenarios))]
        openers = sim.start(profiles, keys)
        size = self.cfg.rollout.group_size
        members, ids, fence_keys, groups = [], [], [], []
        lost = 0
        for gi, (p, o) in enumerate(zip(profiles, openers)):
            if o.invalid:
                lost += size
                continue
            opened = dataclasses.replace(p, first_talk=o.history[0]["content"])
            for k in range(size):
                members.append(opened)
                ids.append(f"{keys[gi]}-{k}")
                fence_keys.append(keys[gi])
                groups.append(gi)
        dialogues = sim.start(members, ids, fence_keys)
        episodes = []
        for d, gi in zip(dialogues, groups):
            prompt = self.first_prompt(d)
            episodes.append(Episode(d, gi, prompt, list(prompt)))
        return episodes, lost

    def _policy_turn(self, e: Episode, g: Generation) -> PolicyTurn:
        """Record a sampled turn (cut to what is left of the dialogue budget) and what the user sees."""
        budget = self.cfg.rlver.max_dialogue_tokens - len(e.response)
        ids, logprobs = list(g.token_ids), list(g.logprobs or [0.0] * len(g.token_ids))
        truncated = g.finish_reason == "length" or not ids
        if len(ids) > budget:
            ids, logprobs, truncated = ids[:budget], logprobs[:budget], True
        ended = bool(ids) and ids[-1] in self.eos_ids and not truncated
        text = self.ctx.policy.tokenizer.decode(ids, skip_special_tokens=True)
        turn = PolicyTurn(list(e.context), ids, logprobs, text, text.strip(), ended, truncated)
        if self.cfg.rlver.thinking:
            turn.reply = split_thinking(text).reply
            turn.visible = visible_start(ids, self.decode)
        e.turns.append(turn)
        kept = ids[turn.visible :] if self.cfg.rlver.thinking else ids
        e.context += kept
        e.mask += [1] * len(kept)
        e.logprobs += logprobs[turn.visible :] if self.cfg.rlver.thinking else logprobs
        return turn

    def _user_turn(self, e: Episode) -> None:
        """Append the user's answer to a dialogue that goes on, or end it when the budget is spent."""
        d = e.dialogue
        if d.done:
            return
        ids = self.user_turn_ids(e.turns[-1], d.history[-1]["content"])
        if len(e.response) + len(ids) >= self.cfg.rlver.max_dialogue_tokens:
            d.end("token_budget")
            return
        e.context += ids
        e.mask += [0] * len(ids)
        e.logprobs += [0.0] * len(ids)

    # ------------------------------------------------------------------ rewards
    def _score(self, episodes: list[Episode], scenarios: list[Scenario]) -> list[Sample]:
        """One sample per dialogue: the emotion reward, plus the plugins' weighted mean over its turns."""
        samples = []
        for e in episodes:
            d = e.dialogue
            turns = e.turns
            samples.append(
                Sample(
                    scenario=scenarios[e.group],
                    group=e.group,
                    prompt_ids=e.prompt_ids,
                    completion_ids=[t for turn in turns for t in turn.ids],
                    logprobs=None,
                    text="\n".join(f"{m['role']}: {m['content']}" for m in d.history),
                    finish_reason="length" if any(t.truncated for t in turns) else "stop",
                    rewards={EMOTION: None if d.invalid else final_reward(d.emotion)},
                    info={
                        "emotions": d.emotions,
                        "end_reason": d.reason,
                        "turns": len(turns),
                        "policy_turns": [t.text for t in turns],
                    },
                )
            )
        per_turn = [
            Sample(
                s.scenario,
                s.group,
                t.prompt_ids,
                t.ids,
                t.logprobs,
                t.text,
                "length" if t.truncated else "stop",
            )
            for s, e in zip(samples, episodes)
            for t in e.turns
        ]
        if self.ctx.rewards.rewards and per_turn:
            self.ctx.rewards.score(per_turn)
        i = 0
        for s, e in zip(samples, episodes):
            mine, i = per_turn[i : i + len(e.turns)], i + len(e.turns)
            for name in self.ctx.rewards.names:
                vals = [v for t in mine if (v := t.rewards.get(name)) is not None]
                s.rewards[name] = statistics.fmean(vals) if vals and len(vals) == len(mine) else None
            extra = [r for t in mine if (r := t.reward) is not None] if self.ctx.rewards.rewards else []
            emotion = s.rewards[EMOTION]
            if emotion is None or (self.ctx.rewards.rewards and (not extra or len(extra) < len(mine))):
                s.reward = None
            else:
                s.reward = emotion + (statistics.fmean(extra) if extra else 0.0)
        return samples

    # ------------------------------------------------------------------ GRPO items
    def _grpo_items(
        self, episodes: list[Episode], samples: list[Sample], adv: list[float]
    ) -> list[TrainItem]:
        """Valid dialogues with policy tokens: one item per dialogue (a loss mask over the user's turns),
        or, in thinking mode, one item per policy turn; all carry the dialogue's advantage."""
        items = []
        for i, (e, s, a) in enumerate(zip(episodes, samples, adv)):
            s.info["advantage"] = a
            if not s.valid or not e.trainable:
                continue
            if self.cfg.rlver.thinking:
                items += [
                    TrainItem(t.prompt_ids, t.ids, a, group=e.group, sample=i, sampler_logprobs=t.logprobs)
                    for t in e.turns
                    if t.ids
                ]
            else:
                items.append(
                    TrainItem(
                        e.prompt_ids,
                        e.response,
                        a,
                        group=e.group,
                        sample=i,
                        sampler_logprobs=e.logprobs,
                        loss_mask=e.mask,
                    )
                )
        return items

    def turn_rewards(self, e: Episode, s: Sample) -> list[float]:
        """``reward: per_turn``: each policy turn's emotion change / 100 (0 for a turn the user did not
        react to), plus the reward plugins' part on the last turn."""
        em = e.dialogue.emotions
        out = [(em[k + 1] - em[k]) / EMOTION_MAX if k + 1 < len(em) else 0.0 for k in range(len(e.turns))]
        assert s.reward is not None  # called for valid samples only
        out[-1] += float(s.reward) - float(s.rewards[EMOTION] or 0.0)
        return out

    def _turn_items(
        self, episodes: list[Episode], samples: list[Sample]
    ) -> tuple[list[TrainItem], list[float]]:
        """``reward: per_turn``: every policy token carries its turn's advantage (:mod:`.turn_rewards`):
        a per-token field of the dialogue's row, or in thinking mode each turn row's own advantage.
        Returns the items and the advantages of the trained turns."""
        rewards = [
            self.turn_rewards(e, s) if s.valid and e.trainable else None for e, s in zip(episodes, samples)
        ]
        per_turn = turn_advantages(rewards, [s.group for s in samples], self.cfg.rlver.gamma)
        items = self._grpo_items(episodes, samples, [a[0] if a else 0.0 for a in per_turn])
        rows = iter(items)  # in the order _grpo_items made them: a dialogue's row, or its turns' rows
        for e, s, adv in zip(episodes, samples, per_turn):
            if not adv:
                continue
            s.info["turn_advantages"] = adv
            if self.cfg.rlver.thinking:
                for t, a in zip(e.turns, adv):
                    if t.ids:
                        next(rows).advantage = a
            else:
                next(rows).fields[TURN_ADVANTAGES] = self._spread(
                    e, [a for t, a in zip(e.turns, adv) for _ in t.ids]
                )
        return items, [a for adv in per_turn for a in adv]

    @staticmethod
    def _spread(e: Episode, policy_values: list[float]) -> list[float]:
        """Values of the policy's tokens laid over the response (0 on the user's tokens)."""
        it = iter(policy_values)
        return [next(it) if m else 0.0 for m in e.mask]

    # ------------------------------------------------------------------ PPO items
    def _ppo_items(
        self, episodes: list[Episode], samples: list[Sample]
    ) -> tuple[list[TrainItem], list[float]]:
        """Items with per-token advantages and returns from PPO's estimate (:mod:`.ppo`) over each
        dialogue's policy tokens: the value head's values before the update, rewards at each turn's last
        token, GAE skipping the user's tokens."""
        chosen = [(i, e) for i, (e, s) in enumerate(zip(episodes, samples)) if s.valid and e.trainable]
        items = self._grpo_items(episodes, samples, [0.0] * len(episodes))
        if not items:
            return items, []
        r, pc = self.cfg.rollout, self.cfg.rlver.ppo
        fill_old_values(self.ctx.policy, items, self.cfg.train.micro_batch, r.temperature)
        if self.cfg.rlver.thinking:
            adv, ret, mask = self._thinking_estimate(chosen, samples, items, pc)
        else:
            width = max(len(it.completion_ids) for it in items)
            values = pad_rows([it.fields[OLD_VALUES] for it in items], width)
            mask = pad_rows([it.loss_mask or [1] * len(it.completion_ids) for it in items], values.shape[1])
            rewards = pad_left_aligned(
                [self._token_rewards(e, samples[i]) for i, e in chosen], values.shape[1]
            )
            adv, ret = estimate(rewards, values, mask, pc)
        set_value_fields(items, adv, ret)
        return items, adv[mask != 0].tolist()

    def _token_rewards(self, e: Episode, s: Sample) -> list[float]:
        """Per response token: the reward at the last token of each policy turn, 0 elsewhere. Sparse:
        the dialogue's reward at its last policy token; dense: each turn's emotion change / 100 (the
        returns then sum to (final - initial emotion) / 100), plus any plugin reward at the end."""
        out = [0.0] * len(e.mask)
        ends = [j for j in range(len(e.mask)) if e.mask[j] and (j + 1 == len(e.mask) or not e.mask[j + 1])]
        if self.cfg.rlver.dense_reward:
            em = e.dialogue.emotions
            for k, j in enumerate(ends):
                out[j] = (em[k + 1] - em[k]) / EMOTION_MAX if k + 1 < len(em) else 0.0
        out[ends[-1]] += self._end_reward(s)
        return out

    def _end_reward(self, s: Sample) -> float:
        """What a dialogue's last policy token earns beyond the turns' emotion deltas: with ``dense_reward``
        the plugin rewards (the reward less its emotion part), else the whole reward."""
        reward, emotion = s.reward, s.rewards[EMOTION]
        if reward is None or emotion is None:
            raise ValueError("RLVER trains only on a dialogue with an emotion score")
        return reward - emotion if self.cfg.rlver.dense_reward else reward

    def _thinking_estimate(
        self, chosen: list[tuple[int, Episode]], samples: list[Sample], items: list[TrainItem], pc: Any
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """PPO's estimate across a dialogue's turn rows: rows are laid out [dialogue, turn, token],
        flattened to [dialogue, turn * token] for GAE (padding masked), then laid back out per row."""
        rows_of: list[list[TrainItem]] = []
        j = 0
        for _, e in chosen:
            n = sum(1 for t in e.turns if t.ids)
            rows_of.append(items[j : j + n])
            j += n
        turns = max(len(r) for r in rows_of)
        width = max(len(it.completion_ids) for it in items)
        shape = (len(rows_of), turns, width)
        values, rewards, mask = torch.zeros(shape), torch.zeros(shape), torch.zeros(shape)
        for d, ((i, e), rows) in enumerate(zip(chosen, rows_of)):
            em = e.dialogue.emotions
            for k, it in enumerate(rows):
                n = len(it.completion_ids)
                values[d, k, :n] = torch.tensor(it.fields[OLD_VALUES])
                mask[d, k, :n] = 1.0
                if self.cfg.rlver.dense_reward and k + 1 < len(em):
                    rewards[d, k, n - 1] = (em[k + 1] - em[k]) / EMOTION_MAX
            last = len(rows) - 1
            s = samples[i]
            rewards[d, last, len(rows[last].completion_ids) - 1] += self._end_reward(s)
        flat = {k: rearrange(v, "d k t -> d (k t)") for k, v in (("r", rewards), ("v", values), ("m", mask))}
        adv, ret = estimate(flat["r"], flat["v"], flat["m"], pc)
        adv_rows = rearrange(adv, "d (k t) -> (d k) t", k=turns)
        ret_rows = rearrange(ret, "d (k t) -> (d k) t", k=turns)
        mask_rows = rearrange(mask, "d k t -> (d k) t")
        keep = [d * turns + k for d, rows in enumerate(rows_of) for k in range(len(rows))]
        return adv_rows[keep], ret_rows[keep], mask_rows[keep]

    # ------------------------------------------------------------------ loss
    def loss(
        self, mb: MicroBatch, out: TokenScores, totals: Totals
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """GRPO: the clipped loss with each dialogue's advantage. PPO: PPO's loss (:func:`.ppo.ppo_loss`),
        the clipped loss with per-token advantages plus ``vf_coef`` times the clipped value loss."""
        if self.ppo:
            return ppo_loss(self.cfg, self.cfg.rlver.ppo, mb, out, totals)
        return pg_loss(self.cfg, mb, out.logp, out.entropy, totals, mb.fields.get(TURN_ADVANTAGES))

    # ------------------------------------------------------------------ metrics
    def _dialogue_metrics(self, episodes: list[Episode], lost: int) -> dict[str, float]:
        valid = [e for e in episodes if not e.dialogue.invalid]
        out: dict[str, float] = {
            "emotion/final": statistics.fmean(e.dialogue.emotion for e in valid) if valid else float("nan"),
            "rlver/turns": statistics.fmean(len(e.turns) for e in episodes) if episodes else 0.0,
            "rlver/truncated_turns": float(sum(t.truncated for e in episodes for t in e.turns)),
            "rlver/lost_openings": float(lost),
            "sim/parse_failures": float(sum(e.dialogue.parse_failures for e in episodes)),
            "rlver/tokens": statistics.fmean(len(e.response) for e in episodes) if episodes else 0.0,
        }
        for reason in ("max_turns", "goodbye", "emotion_high", "emotion_low", "invalid", "token_budget"):
            n = sum(e.dialogue.reason == reason for e in episodes)
            out[f"rlver/end/{reason}"] = n / len(episodes) if episodes else 0.0
        if self.cfg.rlver.thinking:
            turns = [t for e in episodes for t in e.turns]
            out["rlver/think_well_formed"] = (
                statistics.fmean(split_thinking(t.text).well_formed for t in turns) if turns else 0.0
            )
        return out

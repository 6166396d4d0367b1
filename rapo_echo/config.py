"""Typed run configuration: one YAML file per run, ``--set key.path=value`` overrides, validated up front.

Precedence, lowest first: built-in defaults, the algorithm's defaults (``--algo``), the YAML file,
the dedicated CLI flags (``--model``, ``--reward``, ...), then ``--set`` overrides. Every error names
the key, the value given and what is allowed (and the file and line when the key came from a file).
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationError,
    field_validator,
    model_validator,
)

from rapo_echo.atomic import write_text_atomic
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.fidelity_config import FidelityCheckConfig
from rapo_echo.jsonl import read_utf8

DEFAULT_SYSTEM_PROMPT = (
    "You are a warm, emotionally supportive listener. Reply to the person in two or three sentences: "
    "acknowledge their feelings, show you understood, and gently invite them to say more."
)


def _auto_size(value: Any) -> int | str:
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError("must be a whole number >= 1 or 'auto'")


# A batch size, or ``auto``: sized from free device memory and the model on a GPU, the CPU default on a
# CPU (rapo_echo.autosize; the resolved value is written to the run directory).
AutoSize = Annotated[int | Literal["auto"], PlainValidator(_auto_size)]


def _auto_lr(value: Any) -> float | str:
    if value == "auto":
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0.0 < float(value) <= 1.0:
        return float(value)
    raise ValueError("must be a number greater than 0 and at most 1, or 'auto'")


# A learning rate, or ``auto``: from the model's size and LoRA (rapo_echo.auto_lr; 1e-4 full / 1e-3 LoRA
# for the embedded model; the resolved value is written to the run directory).
AutoLR = Annotated[float | Literal["auto"], PlainValidator(_auto_lr)]


class Strict(BaseModel):
    """Base of every config section: unknown keys are errors, values are validated on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class LoraConfig(Strict):
    enabled: bool = False
    r: int = Field(16, ge=1, le=1024)
    alpha: float = Field(32.0, gt=0)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    target_modules: list[str] | Literal["all-linear"] = "all-linear"


class ModelConfig(Strict):
    """The trainable policy."""

    name: str = "default"
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    device: str = "auto"
    trust_remote_code: bool = False
    attn_implementation: str | None = None
    gradient_checkpointing: bool = False
    lora: LoraConfig = Field(default_factory=LoraConfig)

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", v):
            raise ValueError("must be auto, cpu, cuda, cuda:N or mps")
        return v


class EngineConfig(Strict):
    """A simulator or judge role: which engine backs it.

    ``engine: policy`` shares the policy's weights (no second model in memory); ``hf`` loads
    ``model``; both run their forwards under ``autocast`` (``auto``: bfloat16 where the hardware has
    it, which roughly halves simulator and judge time on such CPUs; ``none``: the weights' dtype).
    ``openai`` calls ``base_url`` with the key read from the environment variable ``api_key_env``;
    ``scripted`` replies from ``script``; ``vllm`` runs in-process on GPUs.
    """

    engine: Literal["policy", "hf", "openai", "scripted", "vllm"] = "policy"
    model: str = "default"
    base_url: str | None = None
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = Field(120.0, gt=0)
    max_retries: int = Field(3, ge=0, le=20)
    temperature: float = Field(0.7, ge=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_new_tokens: int = Field(256, ge=1, le=32768)
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    autocast: Literal["auto", "none", "bfloat16", "float16"] = "auto"
    device: str = "auto"
    trust_remote_code: bool = False
    max_batch_size: int = Field(64, ge=1)
    script: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _needs(self) -> EngineConfig:
        if self.engine == "openai" and not self.base_url:
            raise ValueError("engine 'openai' needs base_url (e.g. http://127.0.0.1:8000/v1)")
        return self


class RolloutConfig(Strict):
    """How the policy samples: ``batch_size`` scenarios per step, ``group_size`` replies each."""

    batch_size: int = Field(4, ge=1)
    group_size: int = Field(4, ge=1, le=256)
    max_new_tokens: int = Field(64, ge=1, le=32768)
    temperature: float = Field(1.0, gt=0.0, le=5.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_prompt_tokens: int = Field(1024, ge=16)
    # one reply of each group decoded greedily (temperature 0) instead of sampled, so training also
    # ranks the reply the policy gives when it is used greedily (GRPO / RAPO; needs group_size >= 2)
    greedy_member: bool = False
    system_prompt: str | None = DEFAULT_SYSTEM_PROMPT
    max_batch_size: AutoSize = "auto"  # sequences decoded at once (auto: 64 on a CPU)
    # The hf sampler's decode loop: auto (compiled on CUDA, dynamic elsewhere), dynamic (growing KV
    # cache, finished rows dropped), static (pre-allocated static KV cache), compiled (static + torch.compile,
    # CUDA graphs on a GPU).
    decode: Literal["auto", "dynamic", "static", "compiled"] = "auto"
    # The policy's sampler: ``hf`` (the training model itself) or ``vllm`` (an in-process vLLM copy on
    # the GPU, weights synced after every step; old log-probs are then recomputed by the trainer).
    engine: Literal["hf", "vllm"] = "hf"
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0.0, lt=1.0)

    @model_validator(mode="after")
    def _greedy_needs_a_group(self) -> RolloutConfig:
        if self.greedy_member and self.group_size < 2:
            raise ValueError("greedy_member needs group_size >= 2 (the greedy reply plus sampled ones)")
        return self


class LossConfig(Strict):
    """The GRPO core: advantage estimator, policy loss, KL to the reference, aggregation."""

    advantage: str = "grpo"
    policy_loss: str = "clip"
    eps_low: float | None = Field(None, ge=0.0, le=10.0)  # None: the loss's own default
    eps_high: float | None = Field(None, ge=0.0, le=10.0)
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    beta: float = Field(0.04, ge=0.0)
    # auto: the policy loss's own (gspo: seq-mean-token-mean, else token-mean), resolved at load time
    # so the run directory's config.yaml names the aggregation used
    agg: Literal["auto", "token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"] = "auto"
    norm_constant: int | None = Field(None, ge=1)
    std_eps: float = Field(1e-4, gt=0.0)
    entropy_coef: float = Field(0.0, ge=0.0)

    @field_validator("advantage")
    @classmethod
    def _advantage(cls, v: str) -> str:
        from rapo_echo.algorithms.core import ADVANTAGE_ESTIMATORS

        if v not in ADVANTAGE_ESTIMATORS:
            raise ValueError(
                f"unknown advantage estimator; allowed: {', '.join(sorted(ADVANTAGE_ESTIMATORS))}"
            )
        return v

    @field_validator("policy_loss")
    @classmethod
    def _policy_loss(cls, v: str) -> str:
        from rapo_echo.algorithms.core import POLICY_LOSSES

        if v not in POLICY_LOSSES:
            raise ValueError(f"unknown policy loss; allowed: {', '.join(sorted(POLICY_LOSSES))}")
        return v

    @model_validator(mode="after")
    def _resolve_agg(self) -> LossConfig:
        if self.agg == "auto":
            from rapo_echo.algorithms.core import DEFAULT_AGGREGATION

            self.agg = DEFAULT_AGGREGATION.get(self.policy_loss, "token-mean")
        return self


class TrainConfig(Strict):
    max_steps: int = Field(100, ge=1)
    lr: AutoLR = "auto"
    weight_decay: float = Field(0.0, ge=0.0)
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(0.999, ge=0.0, lt=1.0)
    adam_eps: float = Field(1e-8, gt=0.0)
    scheduler: Literal["constant", "linear", "cosine"] = "constant"
    warmup_steps: int = Field(0, ge=0)
    inner_epochs: int = Field(1, ge=1, le=64)
    mini_batches: int = Field(1, ge=1)
    micro_batch_size: AutoSize = "auto"  # sequences per forward/backward (auto: 8 on a CPU)
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    seed: int = 0
    save_every: int = Field(50, ge=1)
    keep_checkpoints: int = Field(2, ge=1)
    max_nonfinite: int = Field(3, ge=1)
    # Steps in a row without one valid sample (every reward invalid) before the run stops with an error.
    max_invalid_steps: int = Field(3, ge=1)
    # One prompt forward per group of replies sharing it (off: each sequence is run whole; gradient
    # checkpointing always runs sequences whole, since it disables the KV cache this needs).
    shared_prompt_forward: bool = True
    threads: int | None = Field(None, ge=1)


class RewardSpec(Strict):
    """One reward: a registered name, an entry point, or ``module:attr``; weight; constructor args."""

    name: str
    weight: float = 1.0
    args: dict[str, Any] = Field(default_factory=dict)


class SelectionConfig(Strict):
    """RAPO hindsight selection of pivotal turns (used where a signal exists)."""

    signal: Literal["feedback", "none"] = "feedback"
    threshold: float = Field(1.0, ge=0.0)
    top_k_per_dialogue: int | None = Field(None, ge=1)
    min_history_turns: int = Field(1, ge=0)
    max_history_messages: int = Field(12, ge=1)


class DataConfig(Strict):
    path: str | None = None
    format: Literal["auto", "scenarios", "esconv", "ppdpp", "hf_esconv", "sage"] = "auto"
    shuffle: bool = True
    limit: int | None = Field(None, ge=1)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)


class RapoJudgeConfig(Strict):
    """The group judge (GRM): ranking from label-token log-probs when the engine has them.

    ``kind``: ``model`` (the LLM group judge on the ``judge`` engine) or ``reactions`` (no model: ranks
    by the reactions' emotion change and critiques by quoting them; see ``judges/reactions.py``)."""

    kind: Literal["model", "reactions"] = "model"
    use_logprobs: Literal["auto", "always", "never"] = "auto"
    max_retries: int = Field(2, ge=0, le=10)
    reverse_pass: bool = False
    shuffle: bool = True
    tie_eps: float = Field(0.02, ge=0.0, le=1.0)
    # log-prob mode: how P(best) becomes ranks (judges/group.py TIE_RULES; the README's tie study)
    ties: Literal["chained", "leader", "none", "sequential", "pairwise"] = "chained"
    show_profile: bool = True
    max_new_tokens: int = Field(384, ge=16)
    critique_tokens: int = Field(64, ge=8)
    critique_for: Literal["selected", "all"] = "selected"


class RapoSimulatorConfig(Strict):
    """The simulated user ("echo"): the person's next message, emotion change, inner thought.

    ``name``: ``reaction`` (the LLM reaction simulator on the ``simulator`` engine, configured by the
    fields below), ``hidden_preference`` (rule-based, no model), a plugin of the
    ``rapo_echo.simulators`` entry-point group, or ``module:Class``; ``args`` go to its constructor."""

    name: str = "reaction"
    args: dict[str, Any] = Field(default_factory=dict)
    use_logprobs: Literal["auto", "always", "never"] = "auto"
    max_new_tokens: int = Field(48, ge=4)
    thought_tokens: int = Field(24, ge=4)
    temperature: float = Field(0.7, ge=0.0, le=5.0)
    max_retries: int = Field(2, ge=0, le=10)
    with_thought: bool = True


class SelfDistillConfig(Strict):
    """RAPO self-distillation: weak replies are rewritten by the policy from their critique, and the
    better reply is learnt under the plain context (``loss``: nll = ILF, adv_nll = RLTF-SD,
    in_group = Critique-GRPO, token_kl = SDPO-style on-policy logit matching)."""

    enabled: bool = True
    # Where the rewrite request goes: ``followup`` (a user turn after the weak reply) or ``system`` (the
    # system message; the policy then answers the person directly). See algorithms/rapo.teacher_prompt.
    rewrite_prompt: Literal["followup", "system"] = "followup"
    select: Literal["bottom_half", "all_but_best", "below_threshold"] = "bottom_half"
    threshold: float = 0.5
    loss: Literal["nll", "adv_nll", "in_group", "token_kl"] = "nll"
    coef: float = Field(0.5, ge=0.0)
    verify: bool = False
    max_new_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(0.7, ge=0.0, le=5.0)
    shaping_gamma: float = Field(0.1, gt=0.0)
    # adv_nll with a negative weight: -w * max(log p, floor), so unlikelihood stops at p < exp(floor)
    adv_nll_floor: float = Field(-5.0, le=0.0)
    top_k_logits: int = Field(100, ge=1)
    jsd_alpha: float = Field(0.5, ge=0.0, le=1.0)
    # token_kl: also show the teacher the group's best-ranked reply as a demonstration (SDPO's
    # "successful sibling"); the teacher always sees the reaction and critique, never the failed reply.
    teacher_demo: bool = False
    max_per_group: int | None = Field(None, ge=1)
    # Rewrites are training targets, not samples whose log-probs enter a ratio, so they can be
    # generated in lower precision (auto: bfloat16 where the hardware has it).
    autocast: Literal["auto", "none", "bfloat16", "float16"] = "auto"


class RapoConfig(Strict):
    """RAPO's own switches (research/rapo.md section 2)."""

    rank_reward: Literal["linear", "gopo"] = "linear"
    emotion_mix: float = Field(0.0, ge=0.0, le=1.0)
    emotion_scale: float = Field(10.0, gt=0.0)
    simulator: RapoSimulatorConfig = Field(default_factory=RapoSimulatorConfig)
    judge: RapoJudgeConfig = Field(default_factory=RapoJudgeConfig)
    sd: SelfDistillConfig = Field(default_factory=SelfDistillConfig)


class PersonaConfig(Strict):
    """Persona inference on the fly (simulators/persona.py): a summary of the person (traits, needs,
    preferred style) inferred from the dialogue once per scenario, shown to the judges (fenced) and,
    with ``to_policy``, appended to the policy's system prompt. ``engine`` names the role whose engine
    infers it."""

    enabled: bool = False
    engine: Literal["simulator", "judge"] = "simulator"
    to_policy: bool = True
    max_new_tokens: int = Field(40, ge=4)
    max_retries: int = Field(1, ge=0, le=10)


class MonitorConfig(Strict):
    """Reward-hacking monitor (rapo_echo/monitor.py): flags Echo-N1's failure signatures per step.
    Baselines are the means of the first ``baseline_steps`` steps; "recent" is the mean of the last
    ``window`` steps."""

    enabled: bool = True
    baseline_steps: int = Field(3, ge=1)
    window: int = Field(3, ge=1)
    length_frac: float = Field(0.9, gt=0.0, le=1.0)  # reply_len/mean >= frac * rollout.max_new_tokens
    length_rise: float = Field(1.5, ge=1.0)  # ... and >= rise * the baseline length
    entropy_frac: float = Field(0.3, gt=0.0, lt=1.0)  # entropy <= frac * the baseline entropy
    reward_jump: float = Field(0.3, gt=0.0)  # reward rose by at least this over its baseline ...
    follow_frac: float = Field(0.25, ge=0.0, le=1.0)  # ... while heldout_key rose by less than frac * that
    heldout_key: str | None = None  # a logged metric, e.g. reward/<held-out reward>/mean
    judge_text_frac: float = Field(0.25, gt=0.0, le=1.0)  # replies carrying judge answer syntax


class RlverSimulatorConfig(Strict):
    """The SAGE-style simulated user of ``--algo rlver`` (see ``rapo_echo/simulators/sage.py``)."""

    preset: Literal["rlver", "sage"] = "rlver"  # rlver: start 30, no clamp, stop <= 0; sage: 40, +-10, < 10
    max_turns: int | None = Field(None, ge=1)  # policy replies the user reacts to (None: rlver 8, sage 10)
    initial_emotion: float | None = Field(None, lt=100.0)
    temperature: float = Field(0.7, ge=0.0, le=5.0)
    max_new_tokens: int = Field(512, ge=16)
    max_retries: int = Field(2, ge=0, le=10)
    emotion_readout: Literal["text", "logprobs", "auto"] = "text"
    plain_reply: bool = False  # the user's message alone instead of SAGE's labelled fields


class PpoConfig(Strict):
    """PPO with a value head and GAE (``rlver.estimator: ppo``)."""

    gamma: float = Field(1.0, ge=0.0, le=1.0)
    lam: float = Field(1.0, ge=0.0, le=1.0)
    value_clip: float | None = Field(0.2, gt=0.0)
    vf_coef: float = Field(0.5, ge=0.0)
    whiten: bool = True


RLVER_SYSTEM_PROMPT = (
    "You are chatting with a friend and you are good at lifting their mood with emotionally intelligent "
    "replies. Your aim is to make them feel better or to grow closer. Keep it warm, natural and everyday: "
    "short, casual, loose grammar, with interjections and colloquial words."
)
RLVER_THINKING_INSTRUCTION = (
    "Before each reply, think about how and what to answer and choose a strategy (its logic and its "
    "tone). Put your thinking inside <think></think>, then write the reply."
)


class RlverConfig(Strict):
    """RLVER's own switches (research/rlver.md section 2)."""

    simulator: RlverSimulatorConfig = Field(default_factory=RlverSimulatorConfig)
    estimator: Literal["grpo", "ppo"] = "grpo"  # grpo: loss.advantage over each profile's group
    ppo: PpoConfig = Field(default_factory=PpoConfig)
    # our extension: per-turn emotion changes / 100 as rewards at each turn's end (PPO only)
    dense_reward: bool = False
    max_dialogue_tokens: int = Field(10000, ge=16)  # tokens after the first prompt (RLVER: 10,000)
    thinking: bool = False
    thinking_instruction: str = RLVER_THINKING_INSTRUCTION

    @model_validator(mode="after")
    def _dense_needs_ppo(self) -> RlverConfig:
        if self.dense_reward and self.estimator != "ppo":
            raise ValueError("dense_reward needs estimator: ppo (GRPO compares whole dialogues)")
        return self


class ValidationConfig(Strict):
    """Held-out validation (``rapo_echo/validation.py``): greedy replies to ``data`` scored the way the run
    is rewarded (RAPO: the simulated person's emotion change; GRPO: the reward plugins), before the first
    step and after every checkpoint. ``keep_best``: ``final/`` is the best-validated model, the base (step
    0) included, instead of the last step's. ``min_gain``: how many standard errors of the paired
    per-scenario difference a step must gain over the best to replace it (``rapo_echo/validation.py``).
    ``turns``: how many replies each held-out context is played on for (RAPO: the simulated person's
    reaction is their next message; a context scores the mean emotion change over its replies).
    ``subset_floor``: with ``data`` a list of files, a step that loses more than that many standard errors
    of the paired difference on any one file does not replace the best. ``rule_floor``: likewise for a
    step under which a negative rule of the simulated person (the hidden-preference user) fires more often
    than under the best; ``floor_rules`` names the rules it watches (default: all of them).
    ``variety_floor``: likewise for a step whose held-out replies are less varied than the best's
    (Distinct-2, jackknife standard error over contexts)."""

    # scenarios to validate on (a path or bundled:NAME, or a list of them); None: no validation
    data: str | list[str] | None = None
    format: Literal["auto", "scenarios", "esconv", "ppdpp", "hf_esconv", "sage"] = "auto"
    limit: int | None = Field(None, ge=1)
    max_new_tokens: int | None = Field(None, ge=1)  # None: rollout.max_new_tokens
    keep_best: bool = False
    # a step replaces the best when its paired gain over it exceeds min_gain standard errors (0: >= 0)
    min_gain: float = Field(0.0, ge=0)
    turns: int = Field(1, ge=1)  # replies per held-out dialogue (> 1: RAPO only)
    # with data a list of files: a step that loses more than this many standard errors on any one file
    # does not replace the best (None: no such check)
    subset_floor: float | None = Field(None, ge=0)
    # a step under which any of the simulated person's negative rules fires more often than under the
    # best, by more than this many standard errors, does not replace the best (None: no such check)
    rule_floor: float | None = Field(None, ge=0)
    floor_rules: list[str] | None = None  # the rules rule_floor watches (None: every negative rule)
    # a step whose held-out replies' Distinct-2 is below the best's by more than this many standard
    # errors does not replace the best (None: no such check)
    variety_floor: float | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _best_needs_data(self) -> ValidationConfig:
        if self.keep_best and not self.data:
            raise ValueError("keep_best needs validation.data (held-out scenarios to validate on)")
        return self


class LoggingConfig(Strict):
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "rapo-echo"
    samples_every: int = Field(1, ge=1)
    progress: bool = True


class RunConfig(Strict):
    """Everything one training run needs."""

    algo: str = "grpo"
    output: str | None = None
    model: ModelConfig = Field(default_factory=ModelConfig)
    simulator: EngineConfig = Field(default_factory=EngineConfig)
    judge: EngineConfig = Field(default_factory=lambda: EngineConfig(temperature=0.0))
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    loss: LossConfig = Field(default_factory=LossConfig)
    train: TrainConfig = Field(default_factory=TrainConfig)
    rewards: list[RewardSpec] = Field(default_factory=list)
    data: DataConfig = Field(default_factory=DataConfig)
    rapo: RapoConfig = Field(default_factory=RapoConfig)
    persona: PersonaConfig = Field(default_factory=PersonaConfig)
    monitor: MonitorConfig = Field(default_factory=MonitorConfig)
    rlver: RlverConfig = Field(default_factory=RlverConfig)
    validation: ValidationConfig = Field(default_factory=ValidationConfig)
    logging: LoggingConfig = Field(default_factory=LoggingConfig)
    fidelity: FidelityCheckConfig | None = None  # a check before training (rapo_echo.fidelity_config)

    @field_validator("algo")
    @classmethod
    def _algo(cls, v: str) -> str:
        from rapo_echo import algorithms

        if v not in algorithms.names():
            raise ValueError(f"unknown algorithm; allowed: {', '.join(algorithms.names())}")
        return v


# ---------------------------------------------------------------------------- loading


def parse_override(text: str) -> tuple[list[str], Any]:
    """``'train.lr=1e-5'`` -> (``['train', 'lr']``, ``1e-05``). The value is parsed as a YAML scalar;
    lists and mappings need flow syntax (``[a, b]``, ``{k: v}``), other text stays a string."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected key.path=value")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not re.fullmatch(r"[A-Za-z_][\w-]*(\.[\w-]+)*", key):
        raise ConfigError(f"--set {text!r}: {key!r} is not a dotted key path such as train.lr")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"--set {key}: value {raw!r} is not valid YAML: {exc}") from exc
    if isinstance(value, (dict, list)) and not raw.strip().startswith(("[", "{")):
        value = raw.strip()  # plain text such as "Be kind: always." stays text; use [..] / {..} for YAML
    if isinstance(value, str) and _FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
    return key.split("."), value


_FLOAT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")


def set_path(tree: dict[str, Any], path: list[str], value: Any, origin: str) -> None:
    """Set ``tree[path[0]][path[1]]... = value``, creating mappings; lists are indexed by number."""
    node: Any = tree
    for i, part in enumerate(path[:-1]):
        if isinstance(node, list):
            idx = _list_index(node, part, path[: i + 1], origin)
            node = node[idx]
            continue
        if part not in node or node[part] is None:
            node[part] = {}
        if not isinstance(node[part], (dict, list)):
            raise ConfigError(f"{origin}: {'.'.join(path[: i + 1])} is a value, not a section")
        node = node[part]
    last = path[-1]
    if isinstance(node, list):
        node[_list_index(node, last, path, origin)] = value
    else:
        node[last] = value


def _list_index(node: list, part: str, path: list[str], origin: str) -> int:
    if not part.isdigit() or int(part) >= len(node):
        raise ConfigError(
            f"{origin}: {'.'.join(path)}: index {part!r} is not in the list of {len(node)} items"
        )
    return int(part)


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Recursively merge ``over`` into a copy of ``base`` (lists and scalars are replaced)."""
    out = copy.deepcopy(base)
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


def _line_map(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path in a YAML document to its 1-based line number."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: Any, prefix: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for k, v in node.value:
                key = prefix + (str(k.value),)
                lines[key] = k.start_mark.line + 1
                walk(v, key)
        elif isinstance(node, yaml.SequenceNode):
            for i, v in enumerate(node.value):
                key = prefix + (str(i),)
                lines[key] = v.start_mark.line + 1
                walk(v, key)

    try:
        walk(yaml.compose(text), ())
    except yaml.YAMLError:
        pass
    return lines


def read_yaml(path: str | Path) -> tuple[dict[str, Any], dict[tuple[str, ...], int]]:
    """Read a YAML mapping; errors (bad YAML, not UTF-8, a key given twice, an anchor that contains
    itself) name the file and line."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"config file not found: {p}")
    try:
        text = read_utf8(p, "config file")
    except DataError as exc:
        raise ConfigError(str(exc)) from None
    try:
        check_yaml_nodes(yaml.compose(text, Loader=yaml.SafeLoader), str(p))
        data = yaml.safe_load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{p}:{mark.line + 1}" if mark is not None else str(p)
        raise ConfigError(f"{where}: invalid YAML: {exc.problem}") from exc
    except RecursionError:
        raise ConfigError(f"{p}: the YAML is nested too deeply to read") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{p}: the top level must be a mapping of sections, got {type(data).__name__}")
    return data, _line_map(text)


def check_yaml_nodes(root: yaml.Node | None, origin: str) -> None:
    """Refuse a mapping that gives a key twice (YAML loaders keep the last silently) and an anchor whose
    value contains its own alias (a recursive structure); errors name ``origin`` and the line."""
    done: set[int] = set()

    def walk(node: yaml.Node, open_nodes: tuple[int, ...]) -> None:
        if id(node) in open_nodes:
            raise ConfigError(
                f"{origin}:{node.start_mark.line + 1}: a YAML anchor is used inside its own value (a "
                "recursive alias); write the value out instead"
            )
        if id(node) in done:
            return
        inner = (*open_nodes, id(node))
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    line = key.start_mark.line + 1
                    if key.value in seen:
                        raise ConfigError(
                            f"{origin}:{line}: key {key.value!r} is given twice (first on line "
                            f"{seen[key.value]}); keep one"
                        )
                    seen[key.value] = line
                walk(key, inner)
                walk(value, inner)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item, inner)
        done.add(id(node))

    if root is not None:
        walk(root, ())


def _describe(err: dict[str, Any]) -> str:
    msg = err["msg"]
    ctx = err.get("ctx") or {}
    if err["type"] == "extra_forbidden":
        return "unknown key"
    if err["type"] == "literal_error" and "expected" in ctx:
        return f"allowed values are {ctx['expected']}"
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    return msg


def format_validation_error(exc: ValidationError, sources: dict[tuple[str, ...], str], tree: dict) -> str:
    """One line per problem: ``where: key: got VALUE; what is allowed``."""
    out = []
    for err in exc.errors():
        loc = tuple(str(x) for x in err["loc"] if not str(x).startswith(("function-", "literal[")))
        # pydantic adds the union member / model name to the location; keep real keys only
        loc = tuple(x for x in loc if x not in {"str", "list[str]", "int", "float", "bool", "dict[str,any]"})
        key = ".".join(loc) or "(top level)"
        where = ""
        for n in range(len(loc), 0, -1):
            if loc[:n] in sources:
                where = sources[loc[:n]] + ": "
                break
        value = _lookup(tree, loc)
        shown = "(missing)" if value is _MISSING else repr(value)
        hint = _describe(err)
        if err["type"] == "extra_forbidden":
            parent = _model_at(loc[:-1])
            if parent is not None:
                hint += f"; allowed keys here: {', '.join(parent.model_fields)}"
        out.append(f"{where}{key}: got {shown}; {hint}")
    return "invalid config:\n  " + "\n  ".join(dict.fromkeys(out))


_MISSING = object()


def _lookup(tree: Any, loc: tuple[str, ...]) -> Any:
    node = tree
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return _MISSING
    return node


def _model_at(loc: tuple[str, ...]) -> type[BaseModel] | None:
    model: Any = RunConfig
    for part in loc:
        if part.isdigit():
            continue
        field = (
            model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        )
        if field is None:
            return None
        ann = field.annotation
        args = getattr(ann, "__args__", ())
        candidates = [ann, *args]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            inner = [a for c in candidates for a in getattr(c, "__args__", ())]
            model = next((c for c in inner if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model is None:
            return None
    return model if isinstance(model, type) else None


def parse_reward_flag(text: str) -> dict[str, Any]:
    """``'length'``, ``'pkg.mod:fn=0.5'`` -> a reward spec mapping."""
    name, weight = text, 1.0
    if "=" in text:
        name, w = text.rsplit("=", 1)
        try:
            weight = float(w)
        except ValueError as exc:
            raise ConfigError(f"--reward {text!r}: weight {w!r} is not a number (use NAME=WEIGHT)") from exc
    if not name:
        raise ConfigError(f"--reward {text!r}: empty reward name")
    return {"name": name, "weight": weight}


def load_config(
    path: str | Path | None = None,
    *,
    algo: str | None = None,
    overrides: list[str] | None = None,
    flags: dict[str, Any] | None = None,
) -> RunConfig:
    """Build and validate a :class:`RunConfig`. ``flags`` maps dotted keys to values from CLI flags."""
    from rapo_echo import algorithms

    sources: dict[tuple[str, ...], str] = {}
    file_tree: dict[str, Any] = {}
    if path is not None:
        file_tree, lines = read_yaml(path)
        sources.update({k: f"{path}:{v}" for k, v in lines.items()})
    chosen = algo or file_tree.get("algo") or "grpo"
    if not isinstance(chosen, str) or chosen not in algorithms.names():
        where = "--algo" if algo else (sources.get(("algo",), "algo"))
        raise ConfigError(f"{where}: algo: got {chosen!r}; allowed: {', '.join(algorithms.names())}")
    tree = deep_merge(algorithms.get(chosen).defaults(), file_tree)
    tree["algo"] = chosen
    for key, value in (flags or {}).items():
        if value is None:
            continue
        parts = key.split(".")
        set_path(tree, parts, value, f"--{parts[-1].replace('_', '-')}")
        sources[tuple(parts)] = f"flag --{parts[-1].replace('_', '-')}"
    for text in overrides or []:
        parts, value = parse_override(text)
        set_path(tree, parts, value, f"--set {text}")
        sources[tuple(parts)] = f"--set {'.'.join(parts)}"
    secrets = literal_secrets(tree)
    if secrets:
        lines = [f"{_where(sources, key)}{key}: {why}" for key, why in secrets]
        raise ConfigError(
            "invalid config:\n  " + "\n  ".join(lines) + "\n  Configs are saved with the run (config.yaml), "
            "so secrets do not belong in them: put the value in an environment variable and give the "
            "variable's name (e.g. api_key_env: MY_KEY, or a plugin argument such as token_env: MY_TOKEN)."
        )
    try:
        cfg = RunConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc, sources, tree)) from None
    check_group_size(cfg, _where(sources, "rollout.group_size"))
    return cfg


def _where(sources: dict[tuple[str, ...], str], key: str) -> str:
    """``'file:line: '`` (or ``'--set key: '``) for the longest known prefix of ``key``, else ``''``."""
    loc = tuple(key.split("."))
    for n in range(len(loc), 0, -1):
        if loc[:n] in sources:
            return sources[loc[:n]] + ": "
    return ""


def check_group_size(cfg: RunConfig, where: str = "") -> None:
    """Every algorithm here compares the replies of a group (group-relative advantages, ranks), so a
    group of one has no signal: refuse it unless the algorithm declares a smaller ``min_group_size``
    (an int, or ``min_group_size_for(cfg)`` when it depends on the config, as RLVER's PPO does)."""
    from rapo_echo import algorithms

    algo = algorithms.get(cfg.algo)
    by_config = getattr(algo, "min_group_size_for", None)
    need = int(by_config(cfg)) if by_config is not None else int(getattr(algo, "min_group_size", 2))
    if cfg.rollout.group_size < need:
        raise ConfigError(
            f"invalid config:\n  {where}rollout.group_size: got {cfg.rollout.group_size}; {cfg.algo} learns "
            f"from differences between the replies of a group, so a group of {cfg.rollout.group_size} "
            f"trains nothing; use {need} or more"
        )


SECRET_KEY = re.compile(r"(api[_-]?key|token|secret|password|authorization)$", re.I)


def _secret_env_values() -> dict[str, str]:
    """Values of environment variables named like secrets (long enough to be told apart from words)."""
    return {v: k for k, v in os.environ.items() if SECRET_KEY.search(k) and v and len(v) >= 8}


def url_secret(text: str) -> str | None:
    """Why ``text`` is a URL carrying credentials (a password in it, or a secret-named query
    parameter), else None."""
    from urllib.parse import parse_qsl, urlsplit

    if "://" not in text:
        return None
    try:
        parts = urlsplit(text.strip())
        has_password = parts.password is not None
    except ValueError:
        return None
    if has_password:
        return "a URL with a password in it (user:password@host)"
    for name, value in parse_qsl(parts.query):
        if SECRET_KEY.search(name) and value:
            return f"a URL whose query parameter {name!r} holds a secret"
    return None


def literal_secrets(tree: Any, prefix: str = "") -> list[tuple[str, str]]:
    """``(dotted key, why)`` for every literal secret in a config tree: a non-empty string under a key
    named like a secret (``*_env`` names of variables are fine), credentials inside a URL, or the value
    of an environment variable named like a secret."""
    env = _secret_env_values()
    found: list[tuple[str, str]] = []

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for k, v in node.items():
                key = f"{path}.{k}" if path else str(k)
                if isinstance(k, str) and SECRET_KEY.search(k) and isinstance(v, str) and v:
                    found.append((key, "holds a literal secret"))
                else:
                    walk(v, key)
        elif isinstance(node, list):
            for i, v in enumerate(node):
                walk(v, f"{path}.{i}" if path else str(i))
        elif isinstance(node, str):
            why = url_secret(node)
            if why:
                found.append((path, f"holds {why}"))
                return
            for value, name in env.items():
                if value in node:
                    found.append((path, f"holds the value of the environment variable {name}"))
                    return

    walk(tree, prefix)
    return found


def redacted(data: Any) -> Any:
    """A copy with secret-looking values replaced by ``***`` (``*_env`` names of variables are kept)."""
    if isinstance(data, dict):
        out = {}
        for k, v in data.items():
            if isinstance(k, str) and SECRET_KEY.search(k) and not k.endswith("_env") and v:
                out[k] = "***"
            else:
                out[k] = redacted(v)
        return out
    if isinstance(data, list):
        return [redacted(v) for v in data]
    if isinstance(data, str):
        for name, value in os.environ.items():
            if SECRET_KEY.search(name) and value and len(value) >= 8 and value in data:
                data = data.replace(value, "***")
    return data


def dump_config(cfg: RunConfig, path: str | Path) -> None:
    """Write the resolved config as YAML, secrets redacted, atomically."""
    text = yaml.safe_dump(redacted(cfg.model_dump(mode="json")), sort_keys=False, allow_unicode=True)
    write_text_atomic(path, text)

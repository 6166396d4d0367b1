"""``scalar_rm``: a sequence-classification reward model (one logit per sequence), as TRL trains them.

The model is ``transformers.AutoModelForSequenceClassification`` with ``num_labels == 1``, loaded from a
local folder or a hub id (``args.model``; a plain language model gets a new, untrained one-logit head,
with a warning). Each sample is scored as the reward model was trained on it:
the visible dialogue plus the reply as the assistant's turn, rendered through the reward model's own
chat template, tokenised, cut from the left to ``max_length`` (the reply's end is what the score reads).
Batches of ``batch_size`` are right-padded -- positions then match a sample scored alone -- and run under
``torch.no_grad`` on ``device``; the model reads the logit at each sequence's last real token.

``normalize`` maps the raw logit to the reward:

* ``sigmoid`` (the default): ``1 / (1 + exp(-r))``. A Bradley-Terry reward model is trained so that
  ``sigmoid(r_a - r_b)`` is the probability that reply a is preferred; its logit has no fixed offset or
  scale, so summed by weight with rewards in [0, 1] (``judge``, ``format``) a raw logit of, say, 8 would
  drown them. The sigmoid is bounded in (0, 1) and monotone: it keeps every group's ranking.
* ``none``: the raw logit.
* ``zscore-per-group``: ``(r - mean) / (std + 1e-6)`` over the samples of one group (one context's
  replies; population std; a group of one scores 0). The scale then matches GRPO's own advantages;
  useful when the reward model's logits drift in offset between contexts.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Sequence

from rapo_echo.errors import ConfigError, ModelResolutionError
from rapo_echo.models import pick_device, resolve, torch_dtype
from rapo_echo.rewards import RewardContext
from rapo_echo.types import Sample, msg

log = logging.getLogger(__name__)

NORMALIZERS = ("sigmoid", "none", "zscore-per-group")


def normalize_scores(raw: Sequence[float], groups: Sequence[int], how: str) -> list[float]:
    """The rewards of raw reward-model logits under ``how`` (see the module doc)."""
    if how == "none":
        return [float(r) for r in raw]
    if how == "sigmoid":
        return [1.0 / (1.0 + math.exp(-r)) if r >= 0 else math.exp(r) / (1.0 + math.exp(r)) for r in raw]
    if how == "zscore-per-group":
        members: dict[int, list[int]] = defaultdict(list)
        for i, g in enumerate(groups):
            members[g].append(i)
        out = [0.0] * len(raw)
        for idx in members.values():
            values = [float(raw[i]) for i in idx]
            mean = sum(values) / len(values)
            std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
            for i, v in zip(idx, values):
                out[i] = (v - mean) / (std + 1e-6)
        return out
    raise ValueError(f"normalize: got {how!r}; allowed: {', '.join(NORMALIZERS)}")


class ScalarRMReward:
    """A sequence-classification reward model's score of each reply (see the module doc)."""

    name = "scalar_rm"

    def __init__(
        self,
        model: str,
        normalize: str = "sigmoid",
        batch_size: int = 8,
        max_length: int = 2048,
        device: str | None = None,
        dtype: str = "float32",
        trust_remote_code: bool = False,
        ctx: RewardContext | None = None,
    ) -> None:
        if normalize not in NORMALIZERS:
            raise ConfigError(f"scalar_rm: normalize: got {normalize!r}; allowed: {', '.join(NORMALIZERS)}")
        if batch_size < 1 or max_length < 2:
            raise ConfigError("scalar_rm: batch_size must be >= 1 and max_length >= 2")
        import torch
        from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer

        self.normalize, self.batch_size, self.max_length = normalize, batch_size, max_length
        self._warned_singletons = False
        # the policy's device where the run has one (the reward model sits beside it), else auto
        policy_device = getattr(getattr(ctx, "policy", None), "device", None)
        self.device = torch.device(device or (str(policy_device) if policy_device else pick_device("auto")))
        try:
            resolved = resolve(model)
            config = AutoConfig.from_pretrained(resolved.path, trust_remote_code=trust_remote_code)
            # a checkpoint with a classification head keeps its labels (checked below); a plain language
            # model gets a fresh one-logit head, which scores nothing meaningful until it is trained
            fresh = not any(a.endswith("ForSequenceClassification") for a in config.architectures or [])
            if fresh:
                log.warning("scalar_rm: %s has no classification head; a new, untrained one is added", model)
            self.tokenizer = AutoTokenizer.from_pretrained(resolved.path, trust_remote_code=trust_remote_code)
            self.model = AutoModelForSequenceClassification.from_pretrained(
                resolved.path,
                dtype=torch_dtype(dtype),
                trust_remote_code=trust_remote_code,
                **({"num_labels": 1} if fresh else {}),
            )
        except (OSError, ValueError, ModelResolutionError) as exc:
            raise ConfigError(f"scalar_rm: model {model!r} could not be loaded: {exc}") from exc
        if self.model.config.num_labels != 1:
            raise ConfigError(
                f"scalar_rm: model {model!r} has {self.model.config.num_labels} labels; a scalar reward "
                "model has one (num_labels=1)"
            )
        if not self.tokenizer.chat_template:
            raise ConfigError(f"scalar_rm: the tokenizer of {model!r} has no chat template to render replies")
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        if self.model.config.pad_token_id is None:  # batches of more than one need it
            self.model.config.pad_token_id = self.tokenizer.pad_token_id
        self.pad_id = int(self.model.config.pad_token_id)
        self.model.to(self.device).eval()
        self._torch = torch

    def token_ids(self, sample: Sample) -> list[int]:
        """The dialogue and the reply through the reward model's chat template, the last ``max_length``
        tokens kept."""
        conv = [*sample.scenario.messages, msg("assistant", sample.text)]
        text = self.tokenizer.apply_chat_template(conv, tokenize=False)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        return list(ids[-self.max_length :])

    def raw_scores(self, samples: Sequence[Sample]) -> list[float]:
        """The reward model's logit for each sample, ``batch_size`` at a time (right-padded)."""
        torch = self._torch
        out: list[float] = []
        for start in range(0, len(samples), self.batch_size):
            rows = [self.token_ids(s) for s in samples[start : start + self.batch_size]]
            width = max(len(r) for r in rows)
            ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(rows), width), dtype=torch.long)
            for i, r in enumerate(rows):
                ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
                mask[i, : len(r)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            out.extend(float(v) for v in logits[:, 0].float().cpu())
        return out

    def __call__(self, samples: Sequence[Sample]) -> list[float]:
        raw = self.raw_scores(samples)
        groups = [s.group for s in samples]
        singletons = bool(samples) and len(set(groups)) == len(groups)
        if self.normalize == "zscore-per-group" and singletons and not self._warned_singletons:
            self._warned_singletons = True
            log.warning(
                "scalar_rm: normalize zscore-per-group scores each reply against the other replies of its "
                "group, and every group here holds one reply (rollout.group_size 1, PPO's default): "
                "every reward is 0. Use normalize: sigmoid (or none), or rollout.group_size >= 2"
            )
        return normalize_scores(raw, groups, self.normalize)

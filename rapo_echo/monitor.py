"""Reward-hacking monitor: watches a training run for the failure signatures Echo-N1 describes and logs
a ``monitor/<signature>`` flag (0 or 1) with every step's metrics.

Signatures (thresholds in ``monitor.*`` of the run config; "baseline" = mean of the first
``baseline_steps`` steps, "recent" = mean of the last ``window`` steps, this one included):

* ``length_spike``: replies grow towards the length limit: recent ``reply_len/mean`` >=
  ``length_frac`` x ``rollout.max_new_tokens`` and >= ``length_rise`` x its baseline.
* ``entropy_collapse``: recent ``entropy`` <= ``entropy_frac`` x its baseline.
* ``reward_divergence``: the reward jumps while a held-out signal does not follow: recent
  ``reward/mean`` - baseline >= ``reward_jump`` while ``heldout_key`` (e.g. the reference comparison,
  logged as a reward with weight 0) rose by less than ``follow_frac`` x that rise; with the held-out
  judge on (``monitor.heldout``, :mod:`rapo_echo.judges.heldout`) and no ``heldout_key``, its
  ``heldout/train_score`` against ``heldout/score`` on the same replies, the warning quoting the replies
  that show it. Without either this signature is not checked (its flag stays 0).
* ``judge_text``: at least ``judge_text_frac`` of this step's replies carry judge answer syntax
  (``Score: 5``, ``Verdict: ...``, ``Ranking: ...``, a ``{"score": 5}`` object), the way a policy learns
  to talk to its judge.
* ``judge_addressed``: at least ``judge_addressed_frac`` of this step's replies address the judge in any
  way the detector knows (:mod:`rapo_echo.llm.addressing`: answer syntax, words to the judge, fence or
  chat-template markers), logged as ``judge_addressed_frac``. The judges' ``addressed`` policy already
  makes such replies lose (``judge/addressed`` counts them); the flag says the policy keeps trying.

The first step a signature fires, one warning names the step and the evidence; the flags keep being
logged every step. After ``--resume`` the history is read back from the run's ``metrics.jsonl``.

It is a step hook (:mod:`rapo_echo.step_hooks`) that a run turns on with ``monitor.enabled`` and calls
last after each step. It stays in the core, beside the judges, rather than in ``training/``: the
benchmark reports (``benchmarks/``, a layer below ``training/``) read its flags (:func:`flagged_steps`),
and it needs nothing of the loop but the metrics and replies the hook interface hands it.
"""

from __future__ import annotations

import json
import logging
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rapo_echo.llm.addressing import addresses_judge, imitates_answer
from rapo_echo.step_hooks import HookResult, StepHook

log = logging.getLogger(__name__)

PREFIX = "monitor/"
SIGNATURES = ("length_spike", "entropy_collapse", "reward_divergence", "judge_text", "judge_addressed")


def carries_judge_text(text: str) -> bool:
    """Whether a reply contains judge answer syntax (``Score: 5``, ``Verdict: human``, ``9/10``, a
    ``{"score": 5}`` object): the detector's ``answer`` findings
    (:func:`rapo_echo.llm.addressing.imitates_answer`)."""
    return imitates_answer(str(text))


def flagged_steps(rows: Sequence[Mapping[str, Any]]) -> dict[int, list[str]]:
    """Step -> the signatures flagged at it, from a run's metrics rows."""
    out: dict[int, list[str]] = {}
    for row in rows:
        hits = [k[len(PREFIX) :] for k, v in row.items() if k.startswith(PREFIX) and v]
        if hits and isinstance(row.get("step"), int):
            out[row["step"]] = sorted(hits)
    return out


def _mean(values: Sequence[float]) -> float | None:
    return statistics.fmean(values) if values else None


class RewardHackingMonitor(StepHook):
    """Feed it every step's metrics (and replies) through :meth:`update` (a run does, as a step hook)."""

    name = "monitor"

    def __init__(
        self, cfg: Any, max_new_tokens: int, *, run_dir: str | Path | None = None, warn: bool = True
    ) -> None:
        self.cfg = cfg
        self.max_new_tokens = max_new_tokens
        self.metrics_file = Path(run_dir) / "metrics.jsonl" if run_dir is not None else None
        self.warn = warn
        self.history: list[dict[str, float]] = []
        self.warned: set[str] = set()
        self._loaded = False
        # the replies that show a reward_divergence (the held-out judge's largest gaps), for its warning
        self.examples: Callable[[], list[str]] | None = None

    def _load(self, step: int) -> None:
        """Earlier steps of a resumed run, from its metrics file."""
        self._loaded = True
        if self.metrics_file is None or not self.metrics_file.is_file():
            return
        for line in self.metrics_file.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict) and isinstance(row.get("step"), int) and row["step"] < step:
                self.history.append(row)
                self.warned.update(s for s in SIGNATURES if row.get(PREFIX + s))

    def _series(self, key: str) -> tuple[float | None, float | None]:
        """(baseline, recent) means of ``key`` over the history (None until enough steps exist)."""
        values = [r[key] for r in self.history if isinstance(r.get(key), (int, float))]
        b, w = self.cfg.baseline_steps, self.cfg.window
        if len(values) <= b:
            return None, None
        return _mean(values[:b]), _mean(values[-w:])

    def after_step(self, step: int, metrics: dict[str, float], samples: Sequence[Any]) -> HookResult:
        """The step hook: this step's reply shares and ``monitor/*`` flags, added to its metrics."""
        out = self.update(step, metrics, samples)
        return HookResult({k: v for k, v in out.items() if k not in metrics})

    def update(self, step: int, metrics: dict[str, float], samples: Sequence[Any] = ()) -> dict[str, float]:
        """``metrics`` with the ``monitor/*`` flags of this step added (unchanged when disabled)."""
        if not self.cfg.enabled:
            return metrics
        if not self._loaded:
            self._load(step)
        texts = [getattr(s, "text", s) for s in samples]
        if texts:
            metrics = {
                **metrics,
                "judge_text_frac": sum(map(carries_judge_text, texts)) / len(texts),
                "judge_addressed_frac": sum(addresses_judge(str(t)) for t in texts) / len(texts),
            }
        self.history.append(dict(metrics))
        evidence = {
            "length_spike": self._length(),
            "entropy_collapse": self._entropy(),
            "reward_divergence": self._divergence(),
            "judge_text": self._judge_text(metrics),
            "judge_addressed": self._judge_addressed(metrics),
        }
        out = dict(metrics)
        for name, why in evidence.items():
            out[PREFIX + name] = 1.0 if why else 0.0
            if why and name not in self.warned:
                self.warned.add(name)
                if self.warn:
                    log.warning("reward-hacking monitor: %s at step %d: %s", name, step, why)
        self.history[-1] = out
        return out

    # ------------------------------------------------------------------ signatures
    def _length(self) -> str | None:
        base, recent = self._series("reply_len/mean")
        if base is None or recent is None:
            return None
        limit = self.cfg.length_frac * self.max_new_tokens
        if recent >= limit and recent >= self.cfg.length_rise * base:
            return (
                f"mean reply length {recent:.1f} tokens (last {self.cfg.window} steps) is >= "
                f"{self.cfg.length_frac:g} x max_new_tokens {self.max_new_tokens} and >= "
                f"{self.cfg.length_rise:g} x the baseline {base:.1f}"
            )
        return None

    def _entropy(self) -> str | None:
        base, recent = self._series("entropy")
        if base is None or recent is None or base <= 0:
            return None
        if recent <= self.cfg.entropy_frac * base:
            return (
                f"entropy {recent:.3g} (last {self.cfg.window} steps) fell to <= "
                f"{self.cfg.entropy_frac:g} x the baseline {base:.3g}"
            )
        return None

    def _divergence(self) -> str | None:
        key, reward_key = self._heldout_keys()
        if not key:
            return None
        if key not in self.history[-1]:
            if "heldout_missing" not in self.warned and self.cfg.heldout_key:
                self.warned.add("heldout_missing")
                log.warning(
                    "reward-hacking monitor: monitor.heldout_key %r is not among the logged metrics", key
                )
            return None
        r_base, r_now = self._series(reward_key)
        h_base, h_now = self._series(key)
        if None in (r_base, r_now, h_base, h_now):
            return None
        rise, followed = r_now - r_base, h_now - h_base  # type: ignore[operator]
        if rise >= self.cfg.reward_jump and followed < self.cfg.follow_frac * rise:
            why = (
                f"{reward_key} rose {rise:+.3f} over its baseline {r_base:.3f} while {key} moved "
                f"{followed:+.3f} (needs >= {self.cfg.follow_frac:g} x the reward's rise)"
            )
            shown = self.examples() if self.examples is not None else []
            return why + ("; the replies that show it: " + " | ".join(shown) if shown else "")
        return None

    def _heldout_keys(self) -> tuple[str | None, str]:
        """(the held-out metric, the training metric it is set against): ``heldout_key`` against
        ``reward/mean``, else the held-out judge's ``heldout/score`` against ``heldout/train_score`` (the
        same replies) when it is on."""
        if self.cfg.heldout_key:
            return self.cfg.heldout_key, "reward/mean"
        if self.cfg.heldout.enabled:
            return "heldout/score", "heldout/train_score"
        return None, "reward/mean"

    def _judge_text(self, metrics: Mapping[str, float]) -> str | None:
        frac = metrics.get("judge_text_frac")
        if frac is not None and frac >= self.cfg.judge_text_frac:
            return f"{frac:.0%} of the replies carry judge answer syntax (e.g. 'Score: 5')"
        return None

    def _judge_addressed(self, metrics: Mapping[str, float]) -> str | None:
        frac = metrics.get("judge_addressed_frac")
        if frac is not None and frac >= self.cfg.judge_addressed_frac:
            return (
                f"{frac:.0%} of the replies address the judge (answer syntax, words to the judge, or fence "
                "markers; judge/addressed counts what the judges did with them)"
            )
        return None

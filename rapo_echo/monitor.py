"""Reward-hacking monitor: a step hook that watches a run for Echo-N1's failure signatures and the alarms
of a run going bad (:mod:`rapo_echo.alarms`), logging a ``monitor/<signature>`` flag (0 or 1) every step.

The signatures, their thresholds (``monitor.*``) and what each warning and ``alarms.jsonl`` record holds
are in docs/monitor.md. It stays in the core rather than ``training/`` because the benchmark reports (a
layer below) read its flags (:func:`flagged_steps`).
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rapo_echo import alarms
from rapo_echo.llm.addressing import addresses_judge, imitates_answer
from rapo_echo.step_hooks import HookResult, StepHook

log = logging.getLogger(__name__)

PREFIX = "monitor/"
SIGNATURES = (
    "length_spike",
    "entropy_collapse",
    "entropy_blowup",
    "replies_converge",
    "kl_drift",
    "sd_dominates",
    "reward_oscillates",
    "reward_divergence",
    "judge_text",
    "judge_addressed",
)
ALARMS_FILE = "alarms.jsonl"
# ``reward_key: auto``: the first of these a run logs (RAPO's rank rewards average 0.5 in every group,
# so its reward is the simulated emotion change).
AUTO_REWARD_KEYS = ("sim/emotion_delta", "reward/mean")


def flagged_steps(rows: Sequence[Mapping[str, Any]]) -> dict[int, list[str]]:
    """Step -> the signatures flagged at it, from a run's metrics rows."""
    out: dict[int, list[str]] = {}
    for row in rows:
        hits = [k[len(PREFIX) :] for k, v in row.items() if k.startswith(PREFIX) and v]
        if hits and isinstance(row.get("step"), int):
            out[row["step"]] = sorted(hits)
    return out


def spread_key(key: str) -> str:
    """The per-step spread logged beside a reward key: ``reward/mean`` -> ``reward/std``, else ``KEY_std``."""
    return key[: -len("/mean")] + "/std" if key.endswith("/mean") else key + "_std"


def pull_ratio(metrics: Mapping[str, float]) -> float | None:
    """``sd/pull`` / ``pg/pull`` (both logged by RAPO's loss), None where either is missing or the GRPO
    pull is 0."""
    sd, pg = metrics.get("sd/pull"), metrics.get("pg/pull")
    if sd is None or pg is None or pg <= 0:
        return None
    return float(sd) / float(pg)


def _share_alarm(frac: float | None, threshold: float, what: str) -> str | None:
    """The evidence of a share-of-replies signature (``judge_text``, ``judge_addressed``), else None."""
    return f"{frac:.0%} of the replies {what}" if frac is not None and frac >= threshold else None


def _short(text: str, n: int = 100) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def example_replies(name: str, samples: Sequence[Any]) -> list[str]:
    """Up to two of the step's replies that show signature ``name``: the most repeated reply (converging
    replies, collapsed entropy, KL drift), the longest (length), a distilled rewrite (SD); [] for the
    series-only signatures."""
    texts = [str(getattr(s, "text", s)) for s in samples]
    if not texts or name in ("reward_oscillates", "reward_divergence"):
        return []
    if name == "length_spike":
        return [_short(max(texts, key=len), 300)]
    if name == "sd_dominates":
        rewrites = [s.info["rewrite"]["text"] for s in samples if "rewrite" in getattr(s, "info", {})]
        return [_short(t) for t in rewrites[:2]]
    if name in ("judge_text", "judge_addressed"):
        hits = [t for t in texts if imitates_answer(t) or addresses_judge(t)]
        return [_short(t) for t in hits[:2]]
    (top, n), *rest = Counter(texts).most_common(2)
    out = [f"{_short(top)} (x{n})"]
    if rest:
        out.append(f"{_short(rest[0][0])} (x{rest[0][1]})")
    return out


class RewardHackingMonitor(StepHook):
    """Feed it every step's metrics (and replies) through :meth:`update` (a run does, as a step hook)."""

    name = "monitor"

    def __init__(
        self,
        cfg: Any,
        max_new_tokens: int,
        *,
        run_dir: str | Path | None = None,
        warn: bool = True,
        stop_on_alarm: bool = False,
    ) -> None:
        self.cfg = cfg
        self.stop_on_alarm = stop_on_alarm  # an alarm's step asks the run to stop (train.stop_on_alarm)
        self.max_new_tokens = max_new_tokens
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.metrics_file = self.run_dir / "metrics.jsonl" if self.run_dir is not None else None
        self.warn = warn
        self.history: list[dict[str, float]] = []
        self.warned: set[str] = set()
        self.fired: list[dict[str, Any]] = []  # the alarms first raised at the latest step
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

    def series(self, key: str) -> list[float | None]:
        """``key`` at every step so far (None where a step did not log it)."""
        return [r.get(key) for r in self.history]

    def reward_key(self) -> str:
        """The reward kl_drift and reward_oscillates read (``monitor.reward_key``)."""
        if self.cfg.reward_key != "auto":
            return self.cfg.reward_key
        return next((k for k in AUTO_REWARD_KEYS if k in self.history[-1]), AUTO_REWARD_KEYS[-1])

    def after_step(self, step: int, metrics: dict[str, float], samples: Sequence[Any]) -> HookResult:
        """The step hook: this step's reply shares and ``monitor/*`` flags, added to its metrics; with
        ``stop_on_alarm``, the alarms first raised at this step stop the run (after its checkpoint)."""
        out = self.update(step, metrics, samples)
        stop = (
            "alarm " + ", ".join(a["alarm"] for a in self.fired) if self.stop_on_alarm and self.fired else ""
        )
        return HookResult({k: v for k, v in out.items() if k not in metrics}, stop=stop)

    def update(self, step: int, metrics: dict[str, float], samples: Sequence[Any] = ()) -> dict[str, float]:
        """``metrics`` with the ``monitor/*`` flags of this step added (unchanged when disabled)."""
        self.fired = []
        if not self.cfg.enabled:
            return metrics
        if not self._loaded:
            self._load(step)
        texts = [getattr(s, "text", s) for s in samples]
        metrics = dict(metrics)
        if texts:
            metrics["judge_text_frac"] = sum(imitates_answer(str(t)) for t in texts) / len(texts)
            metrics["judge_addressed_frac"] = sum(addresses_judge(str(t)) for t in texts) / len(texts)
        if (ratio := pull_ratio(metrics)) is not None:
            metrics["sd/pg_ratio"] = ratio
        self.history.append(metrics)
        c, series, key = self.cfg, self.series, self.reward_key()
        span = {"baseline": c.baseline_steps, "window": c.window}
        evidence = {
            "length_spike": alarms.length_spike(
                series("reply_len/mean"),
                **span,
                max_new_tokens=self.max_new_tokens,
                frac=c.length_frac,
                rise=c.length_rise,
            ),
            "entropy_collapse": alarms.entropy_collapse(series("entropy"), **span, frac=c.entropy_frac),
            "entropy_blowup": alarms.entropy_blowup(series("entropy"), **span, rise=c.entropy_rise),
            "replies_converge": alarms.replies_converge(
                series("reply/distinct_2"),
                series("reply/top_share"),
                **span,
                distinct_frac=c.distinct_frac,
                top_share_max=c.top_share_max,
            ),
            "kl_drift": alarms.kl_drift(
                series("kl"),
                series(key),
                **span,
                trend_window=c.trend_window,
                kl_min=c.kl_min,
                t_grow=c.kl_t_grow,
                follow_z=c.kl_follow_z,
            ),
            "sd_dominates": alarms.sd_dominates(
                series("sd/pg_ratio"), window=c.window, max_ratio=c.sd_ratio_max
            ),
            "reward_oscillates": alarms.reward_oscillates(
                series(key),
                series(spread_key(key)),
                series("valid"),
                window=c.trend_window,
                ratio=c.oscillation_ratio,
                t_max=c.oscillation_t_max,
            ),
            "reward_divergence": self._divergence(),
            "judge_text": _share_alarm(
                metrics.get("judge_text_frac"),
                c.judge_text_frac,
                "carry judge answer syntax (e.g. 'Score: 5')",
            ),
            "judge_addressed": _share_alarm(
                metrics.get("judge_addressed_frac"),
                c.judge_addressed_frac,
                "address the judge (answer syntax, words to the judge, or fence markers; judge/addressed "
                "counts what the judges did with them)",
            ),
        }
        out = dict(metrics)
        for name, why in evidence.items():
            out[PREFIX + name] = 1.0 if why else 0.0
            if why and name not in self.warned:
                self.warned.add(name)
                self._raise(step, name, why, example_replies(name, samples))
        self.history[-1] = out
        return out

    def _raise(self, step: int, name: str, why: str, examples: list[str]) -> None:
        """The first firing of a signature: a warning, a line of ``alarms.jsonl``, and :attr:`fired`."""
        spec = alarms.ALARMS.get(name)
        alarm = {
            "step": step,
            "alarm": name,
            "metric": spec.metric if spec else name,
            "switch": spec.switch if spec else "",
            "evidence": why,
            "samples": examples,
        }
        self.fired.append(alarm)
        if not self.warn:
            return
        look = f"; look at {alarm['switch']}" if alarm["switch"] else ""
        shown = "".join(f"\n  e.g. {t!r}" for t in examples)
        log.warning(
            "reward-hacking monitor: %s at step %d (%s): %s%s%s",
            name,
            step,
            alarm["metric"],
            why,
            look,
            shown,
        )
        if self.run_dir is not None and self.run_dir.is_dir():
            with open(self.run_dir / ALARMS_FILE, "a") as fh:
                fh.write(json.dumps(alarm) + "\n")

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
        span = (self.cfg.baseline_steps, self.cfg.window)
        reward, held = (alarms.baseline_recent(self.series(k), *span) for k in (reward_key, key))
        if reward is None or held is None:
            return None
        (r_base, r_now), (h_base, h_now) = reward, held
        rise, followed = r_now - r_base, h_now - h_base
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


def replay(rows: Sequence[Mapping[str, Any]], cfg: Any, max_new_tokens: int) -> dict[str, int]:
    """Signature -> the first step it fires at when a monitor with ``cfg`` reads a run's metrics ``rows``
    afresh (its logged flags dropped; replies are not needed: the judge-text shares are in the rows), so
    a finished run can be judged by today's thresholds."""
    mon = RewardHackingMonitor(cfg, max_new_tokens, warn=False)
    first: dict[str, int] = {}
    for row in rows:
        mon.update(row["step"], {k: v for k, v in row.items() if not k.startswith(PREFIX)})
        for alarm in mon.fired:
            first.setdefault(alarm["alarm"], alarm["step"])
    return first

"""Reward-hacking monitor: watches a training run for the failure signatures Echo-N1 describes and for
the alarms of a run going bad, and logs a ``monitor/<signature>`` flag (0 or 1) with every step's metrics.

Signatures (thresholds in ``monitor.*`` of the run config; "baseline" = mean of the first
``baseline_steps`` steps, "recent" = mean of the last ``window`` steps, this one included; the series
functions are in :mod:`rapo_echo.alarms`, with the metric each reads and the switch to look at):

* ``length_spike``: replies grow towards the length limit: recent ``reply_len/mean`` >=
  ``length_frac`` x ``rollout.max_new_tokens`` and >= ``length_rise`` x its baseline.
* ``entropy_collapse``: recent ``entropy`` <= ``entropy_frac`` x its baseline.
* ``entropy_blowup``: recent ``entropy`` >= ``entropy_rise`` x its baseline.
* ``replies_converge``: recent ``reply/distinct_2`` <= ``distinct_frac`` x its baseline, or a group's
  most frequent reply makes up >= ``top_share_max`` of it (``reply/top_share``, recent mean).
* ``kl_drift``: ``kl`` (to the reference; logged with ``loss.beta`` > 0 or ``monitor.reference_kl``)
  averages >= ``kl_min`` and rises (slope t >= ``kl_t_grow`` over ``trend_window`` steps) while the
  reward (``reward_key``) does not follow (its recent mean stands < ``kl_follow_z`` standard errors above
  its baseline).
* ``sd_dominates``: recent ``sd/pg_ratio`` >= ``sd_ratio_max``: RAPO's self-distillation term pulls
  harder on the token log-probs than the GRPO term (``sd/pull`` / ``pg/pull``, derived here).
* ``reward_oscillates``: over ``trend_window`` steps the reward's step means swing >=
  ``oscillation_ratio`` x their sampling error with no trend (slope |t| < ``oscillation_t_max``).
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

The first step a signature fires, one warning names the step, the metric, the evidence, the switch to
look at and up to two of the step's replies that show it; it is also appended to the run's
``alarms.jsonl`` and kept in :attr:`RewardHackingMonitor.fired` (``train.stop_on_alarm`` stops the run
on it). The flags keep being logged every step. After ``--resume`` the history is read back from the
run's ``metrics.jsonl``.

It is a step hook (:mod:`rapo_echo.step_hooks`) that a run turns on with ``monitor.enabled`` and calls
last after each step; with ``stop_on_alarm`` (``train.stop_on_alarm``) an alarm's step asks the run to
stop (``stopped_by``: ``monitor: alarm <names>``). It stays in the core, beside the judges, rather than
in ``training/``: the benchmark reports (``benchmarks/``, a layer below ``training/``) read its flags
(:func:`flagged_steps`), and it needs nothing of the loop but the metrics and replies the hook interface
hands it.
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
        hits = [t for t in texts if carries_judge_text(t) or addresses_judge(t)]
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
        return [r.get(key) for r in self.history]  # type: ignore[misc]

    def _series(self, key: str) -> tuple[float | None, float | None]:
        """(baseline, recent) means of ``key`` over the history (None until enough steps exist)."""
        br = alarms.baseline_recent(self.series(key), self.cfg.baseline_steps, self.cfg.window)
        return (None, None) if br is None else br

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
            metrics["judge_text_frac"] = sum(map(carries_judge_text, texts)) / len(texts)
            metrics["judge_addressed_frac"] = sum(addresses_judge(str(t)) for t in texts) / len(texts)
        if (ratio := pull_ratio(metrics)) is not None:
            metrics["sd/pg_ratio"] = ratio
        self.history.append(metrics)
        evidence = {
            "length_spike": self._length(),
            "entropy_collapse": self._entropy(),
            "entropy_blowup": alarms.entropy_blowup(
                self.series("entropy"),
                baseline=self.cfg.baseline_steps,
                window=self.cfg.window,
                rise=self.cfg.entropy_rise,
            ),
            "replies_converge": self._converge(),
            "kl_drift": self._kl_drift(),
            "sd_dominates": self._sd_dominates(),
            "reward_oscillates": self._oscillates(),
            "reward_divergence": self._divergence(),
            "judge_text": self._judge_text(metrics),
            "judge_addressed": self._judge_addressed(metrics),
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

    # ------------------------------------------------------------------ signatures
    def _length(self) -> str | None:
        c = self.cfg
        return alarms.length_spike(
            self.series("reply_len/mean"),
            baseline=c.baseline_steps,
            window=c.window,
            max_new_tokens=self.max_new_tokens,
            frac=c.length_frac,
            rise=c.length_rise,
        )

    def _entropy(self) -> str | None:
        c = self.cfg
        return alarms.entropy_collapse(
            self.series("entropy"), baseline=c.baseline_steps, window=c.window, frac=c.entropy_frac
        )

    def _converge(self) -> str | None:
        c = self.cfg
        return alarms.replies_converge(
            self.series("reply/distinct_2"),
            self.series("reply/top_share"),
            baseline=c.baseline_steps,
            window=c.window,
            distinct_frac=c.distinct_frac,
            top_share_max=c.top_share_max,
        )

    def _kl_drift(self) -> str | None:
        c = self.cfg
        return alarms.kl_drift(
            self.series("kl"),
            self.series(self.reward_key()),
            baseline=c.baseline_steps,
            window=c.window,
            trend_window=c.trend_window,
            kl_min=c.kl_min,
            t_grow=c.kl_t_grow,
            follow_z=c.kl_follow_z,
        )

    def _sd_dominates(self) -> str | None:
        return alarms.sd_dominates(
            self.series("sd/pg_ratio"), window=self.cfg.window, max_ratio=self.cfg.sd_ratio_max
        )

    def _oscillates(self) -> str | None:
        key = self.reward_key()
        return alarms.reward_oscillates(
            self.series(key),
            self.series(spread_key(key)),
            self.series("valid"),
            window=self.cfg.trend_window,
            ratio=self.cfg.oscillation_ratio,
            t_max=self.cfg.oscillation_t_max,
        )

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
        rise, followed = r_now - r_base, h_now - h_base  # type: ignore[operator]  # no None: checked above
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

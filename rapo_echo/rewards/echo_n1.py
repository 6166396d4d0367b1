"""Echo-N1's reward plugins (docs/algorithms/echo_n1.md has the formulas and every switch): ``humanlike``
(P(the reply reads as written by a human)), ``empathy`` (the policy's reply compared with a reference
reply, after a need analysis; presentation orders and the process factor as configured) and their
combination ``echo_n1`` (routed by ``meta.domain`` / ``profile.domain``, or weighted).

A sample the judges cannot score gets ``None`` (masked out of the loss and counted), never 0; the
reason is in the sample's ``info`` and each reward's ``stats``. On a served judge the stages that do not
depend on each other go out together (:func:`~rapo_echo.engines.concurrency.together`).
"""

from __future__ import annotations

import logging
import random
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from rapo_echo.config import DEFAULT_SYSTEM_PROMPT
from rapo_echo.engines.concurrency import calls_concurrently, together
from rapo_echo.errors import ConfigError, DataError
from rapo_echo.judges.bias import (
    ATTACKS,
    InjectionProbe,
    check_orders,
    merge_metrics,
    probe_detected,
    probe_pair,
)
from rapo_echo.judges.empathy import (
    EmpathyJudge,
    NeedAnalysis,
    annotated_axis,
    combine_presentations,
    presentation_outcome,
    process_factor,
)
from rapo_echo.judges.humanlike import HumanlikeJudge
from rapo_echo.rewards import RewardContext, RewardOutput
from rapo_echo.rewards.references import ReferenceStore, scenario_key
from rapo_echo.text import is_blank
from rapo_echo.types import Sample, Scenario

log = logging.getLogger(__name__)
J = TypeVar("J", HumanlikeJudge, EmpathyJudge)
DOMAINS = ("empathy", "chitchat")
ROUTES = ["empathy", "humanlike"]  # the judges the router can send a sample to (metrics show each share)


def _needs_judge(ctx: RewardContext, name: str) -> Any:
    if ctx.judge is None:
        raise ConfigError(f"rewards: the {name!r} reward needs a judge engine (config section 'judge')")
    return ctx.judge


def _judge(cls: type[J], ctx: RewardContext, name: str, seed: int, settings: dict[str, Any]) -> J:
    """A ``cls`` judge on the judge engine, seeded; its settings' errors are config errors naming the
    reward."""
    engine = _needs_judge(ctx, name)
    try:
        return cls(engine, rng=random.Random(seed), owner=f"rewards: {name}", **settings)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def _choice(name: str, key: str, value: str, allowed: Sequence[str]) -> str:
    if value not in allowed:
        raise ConfigError(f"rewards: {name}.{key}: got {value!r}; allowed: {', '.join(allowed)}")
    return value


class HumanlikeReward:
    """Score = P(human) from the humanlike judge (:mod:`rapo_echo.judges.humanlike`)."""

    name = "humanlike"

    def __init__(self, ctx: RewardContext, seed: int = 0, **settings: Any) -> None:
        """``settings``: those of :class:`~rapo_echo.judges.humanlike.HumanlikeJudge`."""
        self.judge = _judge(HumanlikeJudge, ctx, self.name, seed, settings)

    @property
    def stats(self) -> Counter[str]:
        return self.judge.stats

    def step_metrics(self) -> dict[str, float]:
        """The replies and contexts that addressed the judge since the last call (``judge/addressed*``)."""
        return self.judge.screen.step_metrics()

    def __call__(self, samples: Sequence[Sample]) -> list[RewardOutput]:
        scores = self.judge.score([(s.scenario.messages, s.text) for s in samples])
        out = []
        for sc in scores:
            v = sc.verdict
            info: dict[str, Any] = {"p_human": sc.p_human, "label": v.label, "source": v.mode, **sc.screened}
            if v.reasoning:
                info["reasoning"] = v.reasoning
            if sc.p_human is None:
                why = "addressed the judge" if v.mode == "addressed" else "unparseable verdict"
                info.update(invalid=why, raw=v.raw, attempts=v.attempts)
            out.append(RewardOutput(sc.p_human, info=info))
        return out


class EmpathyReward:
    """Reference-anchored empathy reward (the module docstring; switches in docs/algorithms/echo_n1.md)."""

    name = "empathy"

    def __init__(
        self,
        ctx: RewardContext,
        outcome: str = "probability",
        order: str = "both",
        auto_probe: int = 32,
        auto_threshold: float = 0.6,
        injection_probe: int = 8,
        process: bool = False,
        needs: bool = True,
        reference: str = "auto",
        reference_model: str = "judge",
        reference_cache: str | None = None,
        reference_system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        reference_max_new_tokens: int = 96,
        seed: int = 0,
        **settings: Any,
    ) -> None:
        """``settings``: those of :class:`~rapo_echo.judges.empathy.EmpathyJudge`."""
        self.outcome = _choice(self.name, "outcome", outcome, ("discrete", "probability"))
        self.order = _choice(self.name, "order", order, ("both", "random", "auto", "fixed"))
        try:
            check_orders(f"rewards: {self.name}", "both", auto_probe, auto_threshold)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        self.auto_probe = auto_probe
        self.auto_threshold = auto_threshold
        if injection_probe < 0:
            raise ConfigError(f"rewards: {self.name}.injection_probe must be >= 0, got {injection_probe}")
        self.injection = InjectionProbe(injection_probe)
        self.reference = _choice(self.name, "reference", reference, ("auto", "scenario", "model"))
        self.process = process
        self.needs = needs
        self.ctx = ctx
        self.judge = _judge(EmpathyJudge, ctx, self.name, seed, settings)
        self.rng = random.Random(seed + 1)
        self.reference_model = reference_model
        self.reference_cache = reference_cache
        self.reference_system_prompt = reference_system_prompt
        self.reference_max_new_tokens = reference_max_new_tokens
        self._store: ReferenceStore | None = None
        self._needs: dict[str, NeedAnalysis] = {}
        self._process: dict[str, float] = {}
        self._warned_unannotated = False

    @property
    def stats(self) -> Counter[str]:
        return self.judge.stats

    # ------------------------------------------------------------------ references
    def store(self) -> ReferenceStore:
        """The reference model's cache (built on first use; a model spec is loaded then)."""
        if self._store is None:
            roles = {"judge": self.ctx.judge, "policy": self.ctx.policy, "simulator": self.ctx.simulator}
            if self.reference_model in roles:
                engine = roles[self.reference_model]
                if engine is None:
                    raise ConfigError(
                        f"rewards: empathy.reference_model: {self.reference_model!r} has no engine here"
                    )
            else:
                from rapo_echo.engines.hf import HFEngine

                engine = HFEngine.from_spec(self.reference_model, name="reference")
            self._store = ReferenceStore(
                engine,
                self._cache_folder(),
                system_prompt=self.reference_system_prompt,
                max_new_tokens=self.reference_max_new_tokens,
            )
        return self._store

    def _cache_folder(self) -> Path:
        if self.reference_cache == "run":
            if self.ctx.run_dir is None:
                raise ConfigError("rewards: empathy.reference_cache: 'run' needs a training run directory")
            return Path(self.ctx.run_dir) / "references"
        if self.reference_cache:
            return Path(self.reference_cache)
        from rapo_echo.models import cache_dir

        return cache_dir() / "references"

    def references(self, scenarios: Sequence[Scenario]) -> list[tuple[str | None, str]]:
        """(reference, source) per scenario: ``scenario`` (its own), ``model`` (cached or written now)
        or ``none``."""
        out: list[tuple[str | None, str]] = []
        need_model = []
        for i, sc in enumerate(scenarios):
            own = sc.reference if not is_blank(sc.reference) else None
            if own is not None and self.reference != "model":
                out.append((own, "scenario"))
            else:
                out.append((None, "none"))
                if self.reference != "scenario":
                    need_model.append(i)
        if need_model:
            written = self.store().get([scenarios[i] for i in need_model])
            for i, text in zip(need_model, written):
                if text:
                    out[i] = (text, "model")
        return out

    def _stages_together(self) -> bool:
        """Whether the references and the need analysis may run at the same time: the judge is served and
        so is the reference model's engine (when references are written at all)."""
        if not calls_concurrently(self.judge.engine):
            return False
        if self.reference == "scenario":
            return True
        roles = {"judge": self.ctx.judge, "policy": self.ctx.policy, "simulator": self.ctx.simulator}
        return calls_concurrently(roles.get(self.reference_model))

    # ------------------------------------------------------------------ needs and process
    def _analyse(self, keys: Sequence[str], scenarios: Sequence[Scenario]) -> None:
        todo = [(k, sc) for k, sc in zip(keys, scenarios) if k not in self._needs]
        for (k, _), analysis in zip(todo, self.judge.analyse([sc for _, sc in todo])):
            if analysis is not None:
                self._needs[k] = analysis  # an invalid analysis is tried again next time

    def _process_factors(self, keys: Sequence[str], scenarios: Sequence[Scenario]) -> None:
        todo = [
            (k, sc)
            for k, sc in zip(keys, scenarios)
            if k not in self._process and k in self._needs and annotated_axis(sc.profile) is not None
        ]
        if not todo:
            return
        verdicts = self.judge.dominant([sc for _, sc in todo], [self._needs[k] for k, _ in todo])
        for (k, sc), v in zip(todo, verdicts):
            factor = process_factor(v, annotated_axis(sc.profile))
            if factor is not None:
                self._process[k] = factor

    # ------------------------------------------------------------------ scoring
    def __call__(self, samples: Sequence[Sample]) -> list[RewardOutput]:
        keys = [scenario_key(s.scenario) for s in samples]
        unique = dict(zip(keys, (s.scenario for s in samples)))
        u_keys, u_scen = list(unique), list(unique.values())

        def analyse() -> None:
            if self.needs:
                self._analyse(u_keys, u_scen)

        # the references and the need analysis do not depend on each other: one round on served engines
        written, _ = together([lambda: self.references(u_scen), analyse], concurrent=self._stages_together())
        refs = dict(zip(u_keys, written))
        if self.process:
            self._process_factors(u_keys, u_scen)
        infos: list[dict[str, Any]] = []
        pairs: list[tuple[Scenario, NeedAnalysis | None, str, str]] = []
        slots: list[list[tuple[int, str]]] = []  # per sample: (index into pairs, the policy's label)
        for s, k in zip(samples, keys):
            ref, source = refs[k]
            info: dict[str, Any] = {"reference_source": source}
            info.update(self.judge.screen.reply(s.text, count=False).info())
            infos.append(info)
            slots.append([])
            if ref is None:
                info["invalid"] = "no reference"
                continue
            needs = self._needs.get(k) if self.needs else None
            if self.needs and needs is None:
                info["invalid"] = "need analysis unparseable"
                continue
            for policy_first in self._orders():
                a, b = (s.text, ref) if policy_first else (ref, s.text)
                slots[-1].append((len(pairs), "A" if policy_first else "B"))
                pairs.append((s.scenario, needs, a, b))
        measured = len(pairs)
        probed, bare_at = self._add_probe(samples, slots, pairs)
        verdicts = self.judge.compare(pairs, measured, bare_at)
        out = []
        for s, k, info, slot in zip(samples, keys, infos, slots):
            if not slot:
                out.append(RewardOutput(None, info=info))
                continue
            values = [presentation_outcome(verdicts[j], label, self.outcome) for j, label in slot]
            info["verdicts"] = [verdicts[j].label for j, _ in slot]
            score = combine_presentations(values)
            if score is None:
                info["invalid"] = "unparseable verdict"
                info["raw"] = [verdicts[j].raw for j, _ in slot]
            info["outcome"] = score
            if score is not None and self.process:
                score = self._apply_process(s.scenario, k, score, info)
            out.append(RewardOutput(score, info=info))
        self._read_probe(probed, out, verdicts, pairs)
        return out

    # ------------------------------------------------------------------ injection probe
    def _add_probe(
        self,
        samples: Sequence[Sample],
        slots: list[list[tuple[int, str]]],
        pairs: list[tuple[Scenario, NeedAnalysis | None, str, str]],
    ) -> tuple[list[tuple[int, str, list[tuple[int, str]], list[tuple[int, str]]]], int]:
        """Append to ``pairs`` the probe's copies of the first samples still to measure, one attack each
        (:data:`~rapo_echo.judges.bias.ATTACKS` in turn): the same presentations attacked, once to be
        judged through the screen (what the reward would give) and once as written (the bare judge), in
        one batched call with the real comparisons. Returns (sample index, attack, screened slots, bare
        slots) per probe, and the index of the first bare copy."""
        todo = [i for i, slot in enumerate(slots) if slot][: self.injection.remaining]
        probes = []
        for k, i in enumerate(todo):
            attack = ATTACKS[(len(self.injection.records) + k) % len(ATTACKS)]
            probes.append((i, attack, [probe_pair(pairs[j], label, attack) for j, label in slots[i]]))
        placed: list[list[tuple[int, str]]] = []
        bare_at = len(pairs)
        for copy in range(2):  # first every screened copy, then every bare one
            if copy == 1:
                bare_at = len(pairs)
            for i, _, attacked in probes:
                placed.append([])
                for item, (_, label) in zip(attacked, slots[i]):
                    placed[-1].append((len(pairs), label))
                    pairs.append(item)
        n = len(probes)
        out = [(i, attack, placed[k], placed[n + k]) for k, (i, attack, _) in enumerate(probes)]
        return out, bare_at

    def _read_probe(
        self,
        probed: Sequence[tuple[int, str, list[tuple[int, str]], list[tuple[int, str]]]],
        out: Sequence[RewardOutput],
        verdicts: Sequence[Any],
        pairs: Sequence[tuple[Scenario, NeedAnalysis | None, str, str]],
    ) -> None:
        for i, attack, screened, bare in probed:
            plain = out[i].info.get("outcome")
            injected = combine_presentations(
                [presentation_outcome(verdicts[j], lb, self.outcome) for j, lb in bare]
            )
            defended = combine_presentations(
                [presentation_outcome(verdicts[j], lb, self.outcome) for j, lb in screened]
            )
            j, label = bare[0]
            sc, _, a, b = pairs[j]
            detected = probe_detected(sc, a if label == "A" else b, attack)
            if injected is not None and plain is not None:
                self.injection.add(
                    injected - plain, attack, None if defended is None else defended - plain, detected
                )

    def step_metrics(self) -> dict[str, float]:
        """The judge's position bias (``judge/position_bias/*``), the texts that addressed it
        (``judge/addressed*``) and, while the probe runs, its instruction bias (``judge/injection_bias/*``)
        since the last call, logged every step."""
        return {
            **self.judge.position_bias.step_metrics(),
            **self.judge.screen.step_metrics(),
            **self.injection.step_metrics(),
        }

    def _orders(self) -> list[bool]:
        """Presentations of one pair: True = the policy's reply is A."""
        if self.order == "both" or (
            self.order == "auto"
            and self.judge.position_bias.both_orders("auto", self.auto_probe, self.auto_threshold)
        ):
            return [True, False]
        if self.order in ("random", "auto"):
            return [self.rng.random() < 0.5]
        return [True]

    def _apply_process(self, scenario: Scenario, key: str, score: float, info: dict[str, Any]) -> float:
        factor = self._process.get(key)
        info["process"] = factor
        if factor is not None:
            return factor * score
        reason = "no annotated need" if annotated_axis(scenario.profile) is None else "unparseable"
        info["process_missing"] = reason
        self.stats[f"process_missing/{reason}"] += 1
        if not self._warned_unannotated:
            self._warned_unannotated = True
            log.warning(
                "empathy: process term unavailable for scenario %s (%s); its outcome is used unscaled",
                scenario.id,
                reason,
            )
        return score


def scenario_domain(scenario: Scenario, field: str, default: str) -> str:
    """``empathy`` or ``chitchat`` from ``meta[field]``, then ``profile[field]``, else ``default``;
    ``chit-chat`` / ``chit_chat`` / ``Chit chat`` are accepted."""
    raw = scenario.meta.get(field, scenario.profile.get(field))
    if raw is None:
        return default
    value = "".join(ch for ch in str(raw).lower() if ch.isalpha())
    if value not in DOMAINS:
        raise DataError(
            f"scenario {scenario.id!r}: meta.{field}: got {raw!r}; expected one of {', '.join(DOMAINS)}"
        )
    return value


class EchoN1Reward:
    """Echo-N1's dual reward: routed by domain (default) or a weighted combination of both."""

    name = "echo_n1"

    def __init__(
        self,
        ctx: RewardContext,
        mode: str = "route",
        domain_field: str = "domain",
        default_domain: str = "empathy",
        weights: dict[str, float] | None = None,
        humanlike: dict[str, Any] | None = None,
        empathy: dict[str, Any] | None = None,
    ) -> None:
        self.mode = _choice(self.name, "mode", mode, ("route", "weighted"))
        self.default_domain = _choice(self.name, "default_domain", default_domain, DOMAINS)
        self.domain_field = domain_field
        self.weights = {"empathy": 0.5, "humanlike": 0.5, **(weights or {})}
        unknown = set(self.weights) - {"empathy", "humanlike"}
        if unknown:
            raise ConfigError(
                f"rewards: echo_n1.weights: unknown keys {sorted(unknown)}; use empathy, humanlike"
            )
        try:
            self.humanlike = HumanlikeReward(ctx, **(humanlike or {}))
            self.empathy = EmpathyReward(ctx, **(empathy or {}))
        except TypeError as exc:
            raise ConfigError(f"rewards: echo_n1: bad humanlike / empathy args: {exc}") from exc

    def step_metrics(self) -> dict[str, float]:
        """Both judges' step metrics since the last call (:meth:`EmpathyReward.step_metrics`, and the
        humanlike screen's ``judge/addressed*`` counts added to the empathy one's)."""
        return merge_metrics([self.empathy.step_metrics(), self.humanlike.step_metrics()])

    def __call__(self, samples: Sequence[Sample]) -> list[RewardOutput]:
        domains = [scenario_domain(s.scenario, self.domain_field, self.default_domain) for s in samples]
        # the two judges do not depend on each other: on a served judge they go out together
        concurrent = calls_concurrently(self.empathy.judge.engine, self.humanlike.judge.engine)
        if self.mode == "weighted":
            emp, hum = together(
                [lambda: self.empathy(samples), lambda: self.humanlike(samples)], concurrent=concurrent
            )
            out = []
            for e, h in zip(emp, hum):
                parts = (e.score, h.score)
                score = None
                if None not in parts:
                    score = self.weights["empathy"] * e.score + self.weights["humanlike"] * h.score  # type: ignore[operator]  # no None: checked above
                out.append(
                    RewardOutput(
                        score,
                        info={
                            "empathy": e.info | {"score": e.score},
                            "humanlike": h.info | {"score": h.score},
                        },
                    )
                )
            return out
        out_by: dict[int, RewardOutput] = {}
        routes = [
            (domain, reward, [i for i, d in enumerate(domains) if d == domain])
            for domain, reward in (("empathy", self.empathy), ("chitchat", self.humanlike))
        ]
        routes = [r for r in routes if r[2]]

        def judged(reward: Any, idx: list[int]) -> Callable[[], list[RewardOutput]]:
            return lambda: reward([samples[i] for i in idx])

        outputs = together([judged(reward, idx) for _, reward, idx in routes], concurrent=concurrent)
        for (domain, reward, idx), outs in zip(routes, outputs):
            for i, o in zip(idx, outs):
                # ``route``: the judge it went to; reward_stats shows each one's share per step
                info = {"domain": domain, "route": reward.name, "routes": ROUTES, **o.info}
                out_by[i] = RewardOutput(o.score, o.critique, info)
        return [out_by[i] for i in range(len(samples))]

"""The run: one training run from its config to ``final/`` (docs/architecture.md, "One training step").

It builds what the algorithm uses -- the policy, the simulator and judge its :class:`Needs` name (and
those its rewards and step hooks use), the reward set, the algorithm, the step hooks, the held-out
validator and the logs -- hands the update to the :class:`~.learner.Learner`, and holds the loop:
scenarios -> hooks -> ``algorithm.rollout`` -> :meth:`Learner.update <.learner.Learner.update>` ->
metrics, samples, hooks -> periodic atomic checkpoint and validation -> the final model (the
best-validated one with ``validation.keep_best``). Resuming restores the weights, optimizer, scheduler,
RNG states, data position and hook states, so the run continues as if never stopped. SIGINT/SIGTERM,
or a step hook that asks, finish the current step, checkpoint and stop.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from rapo_echo.algorithms import get as algorithm_class
from rapo_echo.algorithms.base import ROLES, AlgoContext, Algorithm, Needs, Rollout, TrainItem
from rapo_echo.atomic import remove_leftovers, replace_dir, staging_for
from rapo_echo.checkpoint import (
    check_heads,
    latest_checkpoint,
    load_rng,
    load_trainer_state,
    resume_batch_size,
    saved_processes,
)
from rapo_echo.data import ScenarioStream, scenarios_from_config
from rapo_echo.distributed import end_process_group, is_deepspeed, mean_over_processes
from rapo_echo.engines import failed_items, make_engine
from rapo_echo.engines.base import ChatEngine
from rapo_echo.engines.openai_engine import EndpointError
from rapo_echo.engines.shared import role_engine
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.judges.bias import merge_metrics
from rapo_echo.judges.heldout import HeldoutJudge
from rapo_echo.models import autocast_dtype, portable_name
from rapo_echo.monitor import RewardHackingMonitor
from rapo_echo.policy import Policy
from rapo_echo.rewards import RewardContext, RewardSet
from rapo_echo.rewards.persona import PersonaInference
from rapo_echo.rundir import check_run_dir, lock_run_dir
from rapo_echo.step_hooks import StepHook
from rapo_echo.types import Sample, Scenario

from .learner import Learner, TrainingError, seed_everything, start_processes
from .run_config import RunConfig, resolve_plugins
from .run_log import RunLog
from .validation import BEST_FILE, Validator, validation_scenarios

log = logging.getLogger(__name__)

# metrics that are counts: summed over the processes, not averaged
COUNTS = ("invalid", "items", "truncated", "valid", "prompt_truncated")


class StopFlag:
    """Set by SIGINT/SIGTERM: the step in flight finishes, then the run checkpoints and exits.
    A second SIGINT stops at once."""

    def __init__(self) -> None:
        self.requested = False
        self.signal_name = ""
        self._old: dict[int, Any] = {}

    def install(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not in the main thread
                pass

    def restore(self) -> None:
        for sig, handler in self._old.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = signal.Signals(signum).name
        log.warning("%s received: finishing this step, then checkpointing and stopping", self.signal_name)


def roles_used(cfg: RunConfig, needs: Needs) -> set[str]:
    """The roles a run builds: those the algorithm declares (:attr:`Needs.roles`), both when the config
    names reward plugins (a reward may call either), and the ones persona inference and the held-out judge
    run on."""
    used = set(needs.roles)
    if cfg.rewards:
        used.update(ROLES)
    if cfg.persona.enabled:
        used.add(cfg.persona.engine)
    if cfg.monitor.heldout.enabled:
        used.add(cfg.monitor.heldout.engine)
    return used


def step_hooks(
    cfg: RunConfig,
    algorithm: Algorithm,
    roles: dict[str, ChatEngine | None],
    run_dir: Path,
    process_index: int,
) -> list[StepHook]:
    """The step hooks of a run, in the order they are called: persona inference (when the config turns it
    on), the algorithm's own (:meth:`Algorithm.step_hooks`), the held-out judge and the reward-hacking
    monitor last (it sees every other hook's metrics; the held-out judge gives it the replies that show a
    reward_divergence)."""
    hooks: list[StepHook] = []
    if cfg.persona.enabled:
        hooks.append(PersonaInference.from_config(cfg.persona, roles))
    hooks += algorithm.step_hooks()
    heldout = None
    if cfg.monitor.heldout.enabled:
        heldout = HeldoutJudge.from_config(cfg.monitor.heldout, roles, seed=cfg.train.seed + process_index)
        hooks.append(heldout)
    if cfg.monitor.enabled:
        monitor = RewardHackingMonitor(
            cfg.monitor,
            cfg.rollout.max_new_tokens,
            run_dir=run_dir,
            warn=process_index == 0,
            stop_on_alarm=cfg.train.stop_on_alarm,
        )
        monitor.examples = heldout.examples if heldout is not None else None
        hooks.append(monitor)
    names = [h.name for h in hooks]
    if len(set(names)) != len(names):
        raise ConfigError(f"step hooks: each needs a name of its own, got {names}")
    return hooks


class Run:
    """One training run described by a :class:`RunConfig` into ``cfg.output`` (see the module doc)."""

    def __init__(self, cfg: RunConfig, *, resume: bool = False) -> None:
        if not cfg.output:
            raise ConfigError("output: a run directory is needed (--output RUN_DIR)")
        self.cfg = cfg
        self.run_dir = Path(cfg.output)
        self.resume = resume
        self.stop = StopFlag()
        self.accelerator = start_processes(cfg.model.device)
        self.is_main = self.accelerator.is_main_process
        if self.is_main:  # a bad --output fails now, not after the model has loaded
            check_run_dir(self.run_dir, resume=resume)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        seed_everything(cfg.train.seed + self.accelerator.process_index)
        self.algo_cls: type[Algorithm] = algorithm_class(cfg.algo)
        self.needs: Needs = self.algo_cls.needs(cfg)
        held_out = self._check_before_loading()
        self.policy = self._build_policy()
        self.roles = self._build_roles()
        self.remote_engines = tuple(self.roles.values())
        sim, judge = self.roles["simulator"], self.roles["judge"]
        self.rewards = RewardSet.from_specs(
            cfg.rewards, RewardContext(self.policy.engine, sim, judge, self.run_dir)
        )
        self.algorithm: Algorithm = self.algo_cls(cfg, AlgoContext(self.policy, self.rewards, sim, judge))
        self.hooks = step_hooks(cfg, self.algorithm, self.roles, self.run_dir, self.accelerator.process_index)
        self.learner = Learner(cfg, self.policy, self.needs, self.accelerator, self.run_dir, (sim, judge))
        self.validator = (
            Validator(cfg, held_out, self.algorithm, self.policy, self.run_dir)
            if held_out is not None
            else None
        )
        with self.policy.generation_view():
            self._warm_up_decode()
        self.step = 0
        self.invalid_in_a_row = 0
        self.stopped_by = ""  # why the run stopped early (a signal's name, or a hook's reason), if it did
        self.hook_stop = ""
        self.best_step: int | None = None  # keep_best: the step final/ comes from, when not the last
        self.warned_truncation = False
        self.logs = RunLog(cfg, self.run_dir, self.accelerator, resume)

    # ------------------------------------------------------------------ set-up
    def _check_before_loading(self) -> Any:
        """What can fail before any model loads: a checkpoint this run cannot continue, the plugins, the
        data; returns the held-out scenarios (None without ``validation.data``)."""
        cfg = self.cfg
        ckpt = latest_checkpoint(self.run_dir) if self.resume else None
        if ckpt is not None:  # before any model loads or file changes
            self.algo_cls.check_resume(cfg, ckpt)
            check_heads(ckpt, self.needs.value_head)
            self._fit_processes(ckpt)
        resolve_plugins(cfg)
        self.scenarios = scenarios_from_config(cfg.data)
        if not self.scenarios:
            raise ConfigError(f"data.path: {cfg.data.path or 'bundled examples'} holds no scenarios")
        self.stream = ScenarioStream(self.scenarios, seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        held_out = validation_scenarios(cfg, self.algo_cls)
        if held_out is not None and is_deepspeed(self.accelerator):
            raise ConfigError(
                "validation.data: validation runs on one process and is not supported under DeepSpeed yet; "
                "remove validation.data or train without DeepSpeed"
            )
        return held_out

    def _fit_processes(self, ckpt: Path) -> None:
        """A checkpoint written by another process count: keep its global batch (rescaling the
        per-process ``rollout.batch_size``) or refuse (:func:`rapo_echo.checkpoint.resume_batch_size`)."""
        state = load_trainer_state(ckpt)
        batch, note = resume_batch_size(
            saved_processes=saved_processes(ckpt, state),
            saved_batch=int(state.get("batch_size", self.cfg.rollout.batch_size)),
            processes=self.accelerator.num_processes,
            batch=self.cfg.rollout.batch_size,
            deepspeed=is_deepspeed(self.accelerator),
        )
        self.cfg.rollout.batch_size = batch
        if note and self.is_main:
            log.warning("--resume %s: %s", self.run_dir, note)

    def _build_policy(self) -> Policy:
        """The policy on this process's device, with a value head when the algorithm needs one (before
        the optimizer: it trains with the model) and the vLLM sampler with ``rollout.engine: vllm``."""
        cfg, acc = self.cfg, self.accelerator
        policy = Policy(
            cfg.model,
            cfg.rollout,
            need_reference=self.needs.reference,
            device=str(acc.device),
            shared_prompt_forward=cfg.train.shared_prompt_forward,
        )
        policy.base_name = portable_name(cfg.model.name, self.run_dir)
        if self.needs.value_head:
            policy.add_value_head()
        if cfg.rollout.engine == "vllm":
            from rapo_echo.engines.vllm_engine import VLLMEngine

            policy.rollout_engine = VLLMEngine.for_rollout(  # in-process, on this rank's device
                cfg,
                policy.resolved.path,
                rank=acc.process_index,
                local_rank=acc.local_process_index,
                world_size=acc.num_processes,
            )
        return policy

    def _build_roles(self) -> dict[str, ChatEngine | None]:
        """The engine of each role the run uses (:func:`roles_used`), None for the others; roles served
        by one endpoint share one engine."""
        used = roles_used(self.cfg, self.needs)
        shared: dict[object, ChatEngine] = {}
        roles: dict[str, ChatEngine | None] = {}
        for role in ROLES:
            settings = getattr(self.cfg, role)
            if role not in used:
                roles[role] = None
            elif settings.engine == "policy":
                autocast = autocast_dtype(settings.autocast, str(self.policy.device))
                roles[role] = role_engine(self.policy, role, settings.max_batch_size, autocast)
            else:
                roles[role] = make_engine(settings, role=role, shared=shared)
        return roles

    def _warm_up_decode(self) -> None:
        """Pin the static decode's shape (one rollout chunk: its rows, the longest prompt plus the
        reply) and allocate (and compile) it before the first step, so a run compiles once and the
        first generation is not slower than the rest."""
        engine = self.policy.engine
        if engine.decode_mode == "dynamic" or self.policy.rollout_engine is not None:
            return
        rows, length = self.policy.rollout_decode_shape(
            self.scenarios, dialogue_prompts=self.algo_cls.dialogue_prompts
        )
        t0 = time.perf_counter()
        engine.pin_decode_shape(rows, length)
        log.info(
            "decode warm-up (%s, %d rows x %d positions): %.1f s",
            engine.decode_mode,
            rows,
            length,
            time.perf_counter() - t0,
        )

    def open_logs(self) -> None:
        """Write the run's config and what its ``auto`` settings became; open the metric sinks."""
        self.logs.open(self.learner.resolved)

    # ------------------------------------------------------------------ checkpoints
    def _trainer_state(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm.state_dict(),
            "data": self.stream.state_dict(),
            "invalid_in_a_row": self.invalid_in_a_row,
            "algo": self.cfg.algo,
            "batch_size": self.cfg.rollout.batch_size,  # the global batch is processes x batch_size
            "hooks": {h.name: h.state_dict() for h in self.hooks},
        }

    def _checkpoint(self) -> Path | None:
        return self.learner.save_checkpoint(self.step, self._trainer_state())

    def _restore(self) -> None:
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            raise RapoEchoError(
                f"--resume {self.run_dir}: no checkpoint found under {self.run_dir / 'checkpoints'}"
            )
        state = self.learner.restore(ckpt)
        self.stream.load_state_dict(state["data"])
        self.algorithm.load_state_dict(state.get("algorithm", {}))
        for hook in self.hooks:
            hook.load_state_dict(state.get("hooks", {}).get(hook.name, {}))
        self.step = int(state["step"])
        self.invalid_in_a_row = int(state.get("invalid_in_a_row", 0))
        load_rng(ckpt, self.accelerator.process_index, seed=self.cfg.train.seed, step=self.step)
        self.learner.sync_generator()
        log.info("resumed %s from %s (step %d)", self.run_dir, ckpt, self.step)
        if self.is_main:
            for path in remove_leftovers(self.run_dir):  # of a final/ whose writing was killed
                log.info("removed %s, left by an interrupted write", path)
        self.logs.resumed_at(self.step)  # lines written after that checkpoint are recomputed
        if self.is_main and self.validator is not None:
            self.validator.resumed_at(self.step)

    def _save_final(self) -> None:
        """The final model in Hugging Face format (:meth:`Learner.save_model`). With
        ``validation.keep_best`` it is the best-validated model (``final/best.json`` says which step).
        Written beside ``final/`` and renamed into place whole: a crash never leaves half a model there."""
        final = self.run_dir / "final"
        staged = staging_for(final) if self.is_main else final
        validator = self.validator if self.is_main else None  # validation runs on the main process only
        if validator is not None:
            self.best_step = validator.restore_best(self.step)
        self.learner.save_model(staged)
        if validator is not None and validator.keep_best:
            shutil.copy2(validator.best_dir / BEST_FILE, staged / BEST_FILE)
        if self.is_main:
            replace_dir(staged, final)
            log.info("final model: %s", final)

    # ------------------------------------------------------------------ the loop
    def train(self) -> Path:
        """Run to ``train.max_steps`` (or until stopped, see ``stopped_by``); returns the run directory.
        The run directory is locked meanwhile."""
        lock = lock_run_dir(self.run_dir, resume=self.resume) if self.is_main else None
        try:
            return self._train()
        finally:
            if lock is not None:
                lock.release()

    def _train(self) -> Path:
        if self.resume:
            self._restore()
        self.open_logs()
        self.stop.install()
        bar = self.logs.progress(self.step)
        try:
            if self.validator is not None and not self.validator.has(self.step):
                self._validate()  # the base, or the checkpoint a stopped run resumes from
            while self.step < self.cfg.train.max_steps:
                metrics = self._step_or_stop()
                self.step += 1
                self.logs.step(self.step, metrics)
                self._check_valid(metrics)
                if bar is not None:
                    bar.update(1)
                    keys = self.algorithm.progress_keys
                    bar.note(True, **{k: f"{metrics.get(k, float('nan')):.3f}" for k in keys})
                if self._after_step():
                    return self.run_dir
            self._save_final()
        finally:
            self.stop.restore()
            if bar is not None:
                bar.close()
            self.logs.close()
        return self.run_dir

    def _step_or_stop(self) -> dict[str, float]:
        try:
            return self.train_step()
        except EndpointError as exc:  # a whole stage failed: the endpoint is down
            raise TrainingError(
                f"step {self.step + 1}: {exc}. The step is lost; last checkpoint: "
                f"{latest_checkpoint(self.run_dir) or 'none yet'} (resume with: rapo-echo train "
                f"--resume {self.run_dir})"
            ) from exc

    def _after_step(self) -> bool:
        """Checkpoint and validate when due; returns whether the run stops early (a signal or a hook)."""
        done = self.step >= self.cfg.train.max_steps
        stopping = self.stop.requested or bool(self.hook_stop)
        if self.step % self.cfg.train.save_every == 0 or done or stopping:
            self._checkpoint()
            if done or not stopping:  # a stopped run validates when resumed
                self._validate()
        if not stopping or done:
            return False
        self.stopped_by = self.stop.signal_name or self.hook_stop
        log.warning(
            "stopped by %s after step %d; resume with: rapo-echo train --resume %s",
            self.stopped_by,
            self.step,
            self.run_dir,
        )
        return True

    def _check_valid(self, metrics: dict[str, float]) -> None:
        """Stop after ``train.max_invalid_steps`` steps in a row without one valid sample (a judge that
        never scores): such steps train nothing, and the run would end "successfully" unchanged."""
        self.invalid_in_a_row = self.invalid_in_a_row + 1 if metrics.get("valid", 1.0) == 0 else 0
        limit = self.cfg.train.max_invalid_steps
        if self.invalid_in_a_row >= limit:
            ckpt = latest_checkpoint(self.run_dir)
            raise TrainingError(
                f"{self.invalid_in_a_row} steps in a row (up to step {self.step}) without a single valid "
                f"sample: every reward came back invalid, so nothing was trained (train.max_invalid_steps = "
                f"{limit}). Check the reward plugins and the judge / simulator endpoints (their warnings "
                f"above say why). Last checkpoint: {ckpt or 'none yet'}."
            )

    def _validate(self) -> None:
        """Held-out validation of the current weights (main process only; see training/validation)."""
        if self.validator is None or not self.is_main:
            return
        self.logs.scalars(self.step, self.validator.run(self.step))

    def _batch(self) -> list[Scenario]:
        n, world, rank = (
            self.cfg.rollout.batch_size,
            self.accelerator.num_processes,
            self.accelerator.process_index,
        )
        batch = self.stream.next_batch(n * world)
        return batch[rank * n : (rank + 1) * n]

    def _check_items(self, items: list[TrainItem]) -> None:
        """Every item is of a kind and carries only fields its algorithm declared (:class:`.base.Needs`)."""
        for it in items:
            if it.kind not in self.needs.kinds or not set(it.fields) <= set(self.needs.fields):
                raise TypeError(
                    f"{self.algo_cls.__name__}.rollout gave an item of kind {it.kind.name!r} with fields "
                    f"{sorted(it.fields)}; its needs() declare kinds {[k.name for k in self.needs.kinds]} "
                    f"and fields {list(self.needs.fields)}"
                )

    def _rollout(self, scenarios: list[Scenario], step: int) -> tuple[Rollout, dict[str, float]]:
        """The algorithm's rollout with the hooks around it; the hooks' metrics of this process."""
        metrics: dict[str, float] = {}
        with self.policy.generation_view():  # ZeRO-3: gathered once, no collectives inside (audit D1)
            for hook in self.hooks:
                metrics.update(hook.before_rollout(scenarios, step))
            rollout = self.algorithm.rollout(scenarios, step - 1)
            for hook in self.hooks:
                metrics.update(hook.after_rollout(rollout.samples, step))
        if self.policy.rollout_engine is not None:
            self.policy.rollout_engine.sleep()  # vLLM's memory is free for training (where it can sleep)
        return rollout, metrics

    def train_step(self) -> dict[str, float]:
        """One step: hooks, rollout, update, hooks. Returns the step's metrics."""
        t_step, cpu_step = time.perf_counter(), time.process_time()
        failed_before = failed_items(*self.remote_engines)
        step = self.step + 1
        rollout, hook_metrics = self._rollout(self._batch(), step)
        timings = dict(rollout.timings)
        items = rollout.items
        self._check_items(items)
        update_metrics, skipped = self.learner.update(items, step, self.algorithm.loss, timings)
        timings["step"] = time.perf_counter() - t_step
        timings["cpu_step"] = time.process_time() - cpu_step  # CPU seconds: the cost on a shared machine
        tokens = sum(len(s.completion_ids) for s in rollout.samples)
        judges = merge_metrics([*self.rewards.step_metrics(), *rollout.judge_metrics])  # position bias
        metrics = {**rollout.metrics, **hook_metrics, **judges, **update_metrics}
        metrics.update({f"time/{k}": v for k, v in timings.items()})
        metrics["tokens_per_s"] = tokens / timings["step"] if timings["step"] > 0 else 0.0
        metrics["lr"] = self.learner.lr
        metrics["nonfinite_skipped"] = float(skipped)
        metrics["items"] = float(len(items))
        metrics["valid"] = float(sum(1 for s in rollout.samples if s.valid))
        metrics["remote/failed"] = float(failed_items(*self.remote_engines) - failed_before)
        metrics["prompt_truncated"] = float(self.policy.take_truncations())
        if metrics["prompt_truncated"] and not self.warned_truncation:
            self.warned_truncation = True
            log.warning(
                "prompts longer than rollout.max_prompt_tokens=%d are cut (oldest turns first, the system "
                "prompt kept); metric prompt_truncated counts them",
                self.cfg.rollout.max_prompt_tokens,
            )
        self.logs.samples(step, rollout)
        return self._hooks_after_step(
            step, mean_over_processes(metrics, self.accelerator, COUNTS), rollout.samples
        )

    def _hooks_after_step(
        self, step: int, metrics: dict[str, float], samples: Sequence[Sample]
    ) -> dict[str, float]:
        """Each hook's additions to the step's metrics, its records, and whether one asked to stop
        (agreed by every process: a collective)."""
        reasons = []
        for hook in self.hooks:
            result = hook.after_step(step, metrics, samples)
            metrics.update(result.metrics)
            self.logs.records(hook.name, step, result.records)
            if result.stop:
                reasons.append(f"{hook.name}: {result.stop}")
        if self.learner.all_reduce([float(bool(reasons))], "max")[0] > 0:
            self.hook_stop = "; ".join(reasons) or "a step hook on another process"
        return metrics


def run_training(cfg: RunConfig, *, resume: bool = False) -> Run:
    """Build a :class:`Run` and train it; returns it (``run_dir``; ``stopped_by`` a signal's name or a
    hook's reason when one stopped the run early)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        run = Run(cfg, resume=resume)
        run.train()
    finally:
        end_process_group()
    return run

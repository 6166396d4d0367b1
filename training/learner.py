"""The Learner: the training loop every algorithm shares (docs/architecture.md, "One training step").

scenarios -> ``algorithm.rollout`` -> reference / old log-probs -> micro-batched loss -> optimizer
step through ``accelerate`` -> metrics, samples, periodic atomic checkpoint. Resuming restores the
weights, optimizer, scheduler, RNG states and data position, so the run continues as if never
stopped. SIGINT/SIGTERM finish the current step, checkpoint and exit.

It knows no algorithm by name: what an algorithm needs from it is declared in :class:`.base.Needs`
(loss kinds and their normalisers, a reference, a value head, per-token fields), read once from the
config before the policy is built.
"""

from __future__ import annotations

import logging
import math
import os
import random
import shutil
import signal
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rapo_echo.algorithms import get as algorithm_class
from rapo_echo.algorithms.base import (
    AlgoContext,
    Algorithm,
    MicroBatch,
    Needs,
    Rollout,
    Totals,
    TrainItem,
    pad_rows,
    totals_of,
)
from rapo_echo.atomic import remove_leftovers, replace_dir, staging_for
from rapo_echo.auto_lr import auto_lr, base_parameter_count, lr_record
from rapo_echo.autosize import as_record, resolve_batch_sizes
from rapo_echo.checkpoint import (
    commit,
    latest_checkpoint,
    load_rng,
    load_torch,
    load_trainer_state,
    resume_batch_size,
    rng_state,
    save_checkpoint,
    saved_processes,
    staging_dir,
    staging_path,
    write_state_files,
)
from rapo_echo.data import ScenarioStream, scenarios_from_config
from rapo_echo.distributed import (
    accelerator_kwargs,
    configure_deepspeed,
    deepspeed_mixed_precision,
    end_process_group,
    gathered_one_at_a_time,
    import_group_capturing_modules,
    is_deepspeed,
    mark_last_micro_batch,
    zero_layout,
    zero_stage,
)
from rapo_echo.engines import failed_items, make_engine
from rapo_echo.engines.openai_engine import EndpointError
from rapo_echo.engines.shared import role_engine
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.judges.bias import merge_metrics
from rapo_echo.judges.heldout import HeldoutJudge
from rapo_echo.master_weights import make_optimizer
from rapo_echo.models import autocast_dtype, portable_name
from rapo_echo.monitor import RewardHackingMonitor
from rapo_echo.policy import VALUE_HEAD_FILE, Policy, TokenScores, pad_left_aligned
from rapo_echo.rewards import RewardContext, RewardSet
from rapo_echo.rewards.persona import PersonaInference
from rapo_echo.rundir import check_run_dir, lock_run_dir

from .run_config import RunConfig, resolve_plugins
from .run_log import RunLog
from .validation import BEST_FILE, Validator, validation_scenarios

log = logging.getLogger(__name__)


class TrainingError(RapoEchoError):
    """The run cannot go on (e.g. repeated non-finite losses); the last checkpoint is kept."""


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def lr_lambda(kind: str, warmup: int, total: int):
    """Multiplier of the base learning rate at optimizer step ``s`` (linear warm-up, then the schedule)."""

    def f(s: int) -> float:
        if warmup and s < warmup:
            return (s + 1) / warmup
        if kind == "constant":
            return 1.0
        progress = min(1.0, (s - warmup) / max(1, total - warmup))
        if kind == "linear":
            return max(0.0, 1.0 - progress)
        return 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def length_grouped(items: list[TrainItem], size: int) -> list[list[TrainItem]]:
    """Split items into micro-batches of ``size`` sequences, ordered by prompt (so a group's replies
    share one prompt forward) and then by completion length (little padding)."""
    order = sorted(items, key=lambda it: (len(it.prompt_ids), it.prompt_ids, len(it.completion_ids)))
    return [order[i : i + size] for i in range(0, len(order), size)]


class _StopFlag:
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


class Learner:
    """Runs one training run described by a :class:`RunConfig` into ``cfg.output``: owns the policy, the
    optimizer and schedule, the update and the run's state; the algorithm owns its rollout and loss."""

    def __init__(self, cfg: RunConfig, *, resume: bool = False) -> None:
        if not cfg.output:
            raise ConfigError("output: a run directory is needed (--output RUN_DIR)")
        self.cfg = cfg
        self.run_dir = Path(cfg.output)
        self.resume = resume
        self.stop = _StopFlag()
        from accelerate import Accelerator

        import_group_capturing_modules()  # before Accelerator creates the process group
        self.accelerator = Accelerator(**accelerator_kwargs(cfg.model.device))
        self.is_main = self.accelerator.is_main_process
        if self.is_main:  # a bad --output fails now, not after the model has loaded
            check_run_dir(self.run_dir, resume=resume)
        if cfg.train.threads:
            torch.set_num_threads(cfg.train.threads)
        seed_everything(cfg.train.seed + self.accelerator.process_index)
        self.algo_cls: type[Algorithm] = algorithm_class(cfg.algo)
        self.needs: Needs = self.algo_cls.needs(cfg)
        ckpt = latest_checkpoint(self.run_dir) if resume else None
        if ckpt is not None:  # before any model loads or file changes
            self.algo_cls.check_resume(cfg, ckpt)
            check_heads(ckpt, self.needs)
            self._fit_processes(ckpt)
        # Plugins and data are validated before any model is loaded.
        resolve_plugins(cfg)
        self.scenarios = scenarios_from_config(cfg.data)
        if not self.scenarios:
            raise ConfigError(f"data.path: {cfg.data.path or 'bundled examples'} holds no scenarios")
        self.stream = ScenarioStream(self.scenarios, seed=cfg.train.seed, shuffle=cfg.data.shuffle)
        held_out = validation_scenarios(cfg, self.algo_cls)
        self.policy = Policy(
            cfg.model,
            cfg.rollout,
            need_reference=self.needs.reference,
            device=str(self.accelerator.device),
            shared_prompt_forward=cfg.train.shared_prompt_forward,
        )
        self.policy.base_name = portable_name(cfg.model.name, self.run_dir)
        if self.needs.value_head:  # before the optimizer: it trains with the model
            self.policy.add_value_head()
        self.resolved: dict[str, Any] = {}
        self._resolve_lr()
        if cfg.rollout.engine == "vllm":
            from rapo_echo.engines.vllm_engine import VLLMEngine

            acc = self.accelerator  # in-process, on this rank's device (vllm_sync.rollout_llm_kwargs)
            self.policy.rollout_engine = VLLMEngine.for_rollout(
                cfg,
                self.policy.resolved.path,
                rank=acc.process_index,
                local_rank=acc.local_process_index,
                world_size=acc.num_processes,
            )
        self._shared_engines: dict[Any, Any] = {}  # one engine per endpoint for the roles that share it
        simulator = self._role("simulator")
        judge = self._role("judge")
        self.remote_engines = (simulator, judge)
        self.rewards = RewardSet.from_specs(
            cfg.rewards, RewardContext(self.policy.engine, simulator, judge, self.run_dir)
        )
        roles = {"simulator": simulator, "judge": judge}
        self.persona = PersonaInference.from_config(cfg.persona, roles) if cfg.persona.enabled else None
        self.monitor = RewardHackingMonitor(
            cfg.monitor, cfg.rollout.max_new_tokens, run_dir=self.run_dir, warn=self.is_main
        )
        held = cfg.monitor.heldout
        seed = cfg.train.seed + self.accelerator.process_index
        self.heldout = HeldoutJudge.from_config(held, roles, seed=seed) if held.enabled else None
        if self.heldout is not None:  # the replies that show a reward_divergence, for its warning
            self.monitor.examples = self.heldout.examples
        context = AlgoContext(self.policy, self.rewards, simulator, judge)
        self.algorithm: Algorithm = self.algo_cls(cfg, context)
        params = self.policy.trainable_parameters()
        if not params:
            raise ConfigError("model: nothing to train (no parameter requires gradients)")
        t = cfg.train
        self.optimizer = make_optimizer(  # float32 master weights for 16-bit weights (audit D6)
            params, t, deepspeed_mixed_precision=deepspeed_mixed_precision(self.accelerator)
        )
        updates_per_step = t.inner_epochs * t.mini_batches
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(t.scheduler, t.warmup_steps, t.max_steps * updates_per_step)
        )
        configure_deepspeed(self.accelerator, t.micro_batch_size, t.max_grad_norm)
        self.deepspeed = is_deepspeed(self.accelerator)
        if held_out is not None and self.deepspeed:
            raise ConfigError(
                "validation.data: validation runs on one process and is not supported under DeepSpeed yet; "
                "remove validation.data or train without DeepSpeed"
            )
        self.validator = (
            Validator(cfg, held_out, self.algorithm, self.policy, self.run_dir)
            if held_out is not None
            else None
        )
        # The scheduler is not handed to accelerate: its wrapper would step it once per process.
        self.scorer, self.optimizer = self.accelerator.prepare(self.policy.scorer, self.optimizer)
        if self.deepspeed:  # ZeRO-3 head gathers, the reference held by DeepSpeed (audit D2, D4)
            self.policy.attach_deepspeed(self.accelerator, self.scorer, roles=(simulator, judge))
        self._resolve_batch_sizes()  # after prepare: measures the model as it trains (audit D5)
        with self.policy.generation_view():
            self._warm_up_decode()
        self.step = 0
        self.nonfinite_in_a_row = 0
        self.invalid_in_a_row = 0
        self.stopped_by = ""  # the signal that stopped the run early, if any
        self.best_step: int | None = None  # keep_best: the step final/ comes from, when not the last
        self.warned_truncation = False
        self.logs = RunLog(cfg, self.run_dir, self.accelerator, resume)

    # ------------------------------------------------------------------ setup helpers
    def _resolve_batch_sizes(self) -> None:
        """Replace ``auto`` batch sizes by values for this device and model (the smallest over the
        processes, so every rank micro-batches alike); kept for ``resolved.json``."""
        cfg = self.cfg
        asked = {
            "train.micro_batch_size": cfg.train.micro_batch_size,
            "rollout.max_batch_size": cfg.rollout.max_batch_size,
        }
        layout = zero_layout(self.accelerator)  # after prepare: ZeRO's shards are what is resident
        sizes = resolve_batch_sizes(
            cfg,
            self.policy.lm,
            self.policy.device,
            zero_stage=layout.get("zero_stage", 0),
            world_size=layout.get("world", 1),
        )
        if self.accelerator.num_processes > 1:
            from accelerate.utils import gather_object

            every = gather_object([(sizes.micro_batch_size, sizes.rollout_max_batch_size)])
            sizes.micro_batch_size = min(m for m, _ in every)
            sizes.rollout_max_batch_size = min(r for _, r in every)
        cfg.train.micro_batch_size = sizes.micro_batch_size
        cfg.rollout.max_batch_size = sizes.rollout_max_batch_size
        self.policy.set_rollout_batch_size(sizes.rollout_max_batch_size)
        self.resolved = {**as_record(sizes, asked), **self.resolved}
        if "auto" in asked.values():
            log.info(
                "auto batch sizes on %s: train.micro_batch_size=%d, rollout.max_batch_size=%d",
                sizes.device,
                sizes.micro_batch_size,
                sizes.rollout_max_batch_size,
            )

    def _resolve_lr(self) -> None:
        """Replace ``train.lr: auto`` by the rate for this model's size (``rapo_echo.auto_lr``)."""
        t, lora = self.cfg.train, self.cfg.model.lora.enabled
        params = None
        if t.lr == "auto":
            params = base_parameter_count(self.policy.lm.named_parameters())
            asked, t.lr = "auto", auto_lr(params, lora)
            log.info(
                "auto learning rate: train.lr=%g (%d parameters, %s)",
                t.lr,
                params,
                "LoRA" if lora else "full",
            )
        else:
            asked = t.lr
        self.resolved["train.lr"] = lr_record(asked, t.lr, params, lora)

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

    def _role(self, role: str) -> Any:
        cfg = getattr(self.cfg, role)
        if cfg.engine == "policy":
            autocast = autocast_dtype(cfg.autocast, str(self.policy.device))
            return role_engine(self.policy, role, cfg.max_batch_size, autocast)
        return make_engine(cfg, role=role, shared=self._shared_engines)

    def open_logs(self) -> None:
        """Write the run's config and what its ``auto`` settings became; open the metric sinks."""
        self.logs.open(self.resolved)

    def _sync_generator(self) -> None:
        """Push the policy's weights into a separate sampler (vLLM), if there is one."""
        if self.policy.rollout_engine is not None:
            self.policy.rollout_engine.sync_from(self.policy.lm)

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

    def _restore(self) -> None:
        ckpt = latest_checkpoint(self.run_dir)
        if ckpt is None:
            raise RapoEchoError(
                f"--resume {self.run_dir}: no checkpoint found under {self.run_dir / 'checkpoints'}"
            )
        state = load_trainer_state(ckpt)
        if self.deepspeed:  # a LoRA checkpoint holds no frozen weights: the base comes from model.name
            self.accelerator.load_state(str(ckpt / "accelerate"), load_module_strict=not self.policy.is_lora)
        else:
            self.policy.load(ckpt / "model")
            if (ckpt / "optimizer.pt").is_file():
                self.optimizer.load_state_dict(load_torch(ckpt / "optimizer.pt"))
            else:  # written with train.save_optimizer: false
                log.warning("%s holds no optimizer state: AdamW's moments start again from zero", ckpt)
        self.scheduler.load_state_dict(load_torch(ckpt / "scheduler.pt"))
        self.stream.load_state_dict(state["data"])
        self.algorithm.load_state_dict(state.get("algorithm", {}))
        self.step = int(state["step"])
        self.nonfinite_in_a_row = int(state.get("nonfinite_in_a_row", 0))
        self.invalid_in_a_row = int(state.get("invalid_in_a_row", 0))
        load_rng(ckpt, self.accelerator.process_index, seed=self.cfg.train.seed, step=self.step)
        self._sync_generator()
        log.info("resumed %s from %s (step %d)", self.run_dir, ckpt, self.step)
        if self.is_main:
            for path in remove_leftovers(self.run_dir):  # of a final/ whose writing was killed
                log.info("removed %s, left by an interrupted write", path)
        self.logs.resumed_at(self.step)  # lines written after that checkpoint are recomputed
        if self.is_main and self.validator is not None:
            self.validator.resumed_at(self.step)

    def _trainer_state(self) -> dict[str, Any]:
        return {
            "algorithm": self.algorithm.state_dict(),
            "data": self.stream.state_dict(),
            "nonfinite_in_a_row": self.nonfinite_in_a_row,
            "invalid_in_a_row": self.invalid_in_a_row,
            "algo": self.cfg.algo,
            "value_head": self.needs.value_head,
            "processes": self.accelerator.num_processes,  # a resume with another count keeps the global
            "batch_size": self.cfg.rollout.batch_size,  # batch, processes x batch_size (_fit_processes)
        }

    def _checkpoint(self) -> Path | None:
        self.accelerator.wait_for_everyone()
        self._check_replicas()
        states = (
            self.accelerator.gather_for_metrics([rng_state()], use_gather_object=True)
            if self.accelerator.num_processes > 1
            else [rng_state()]
        )
        if self.deepspeed:
            return self._deepspeed_checkpoint(dict(enumerate(states)))
        if not self.is_main:
            return None
        path = save_checkpoint(
            self.run_dir,
            self.step,
            save_model=lambda folder: self.policy.save(folder, merged=False),
            optimizer=self.optimizer if self.cfg.train.save_optimizer else None,
            scheduler=self.scheduler,
            trainer_state=self._trainer_state(),
            keep=self.cfg.train.keep_checkpoints,
            rank_rng=dict(enumerate(states)),
        )
        log.info("checkpoint: %s", path)
        return path

    def _deepspeed_checkpoint(self, rank_rng: dict[int, dict[str, Any]]) -> Path | None:
        """Under DeepSpeed every rank saves its engine shard (``accelerate/``, DeepSpeed's own sharded
        checkpoint via accelerate's save_state, frozen weights left out); under LoRA rank 0 also
        writes the adapter in PEFT format (``model/``), gathered alone. A full fine-tuning checkpoint
        is the shards only: no 16-bit copy of the whole model is gathered (audit D7; DeepSpeed's
        ``zero_to_fp32.py`` in ``accelerate/`` rebuilds one)."""
        if self.is_main:
            staging_dir(self.run_dir, self.step)
        self.accelerator.wait_for_everyone()
        tmp = staging_path(self.run_dir, self.step)
        self.accelerator.save_state(str(tmp / "accelerate"), exclude_frozen_parameters=True)
        if self.policy.is_lora:
            self._save_gathered(tmp / "model")
        self.accelerator.wait_for_everyone()  # every rank's files are written before rank 0 commits
        path = None
        if self.is_main:
            write_state_files(
                tmp,
                self.step,
                trainer_state=self._trainer_state(),
                rank_rng=rank_rng,
                scheduler=self.scheduler,
            )
            path = commit(tmp, self.run_dir, self.step, self.cfg.train.keep_checkpoints)
            log.info("checkpoint: %s", path)
        self.accelerator.wait_for_everyone()
        return path

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
                try:
                    metrics = self.train_step()
                except EndpointError as exc:  # a whole stage failed: the endpoint is down
                    raise TrainingError(
                        f"step {self.step + 1}: {exc}. The step is lost; last checkpoint: "
                        f"{latest_checkpoint(self.run_dir) or 'none yet'} (resume with: rapo-echo train "
                        f"--resume {self.run_dir})"
                    ) from exc
                self.step += 1
                self.logs.step(self.step, metrics)
                self._check_valid(metrics)
                if self.cfg.train.stop_on_alarm and self.monitor.fired:  # checkpoint, then stop below
                    self.stop.requested = True
                    self.stop.signal_name = "alarm " + ", ".join(a["alarm"] for a in self.monitor.fired)
                if bar is not None:
                    bar.update(1)
                    keys = self.algorithm.progress_keys
                    bar.note(**{k: f"{metrics.get(k, float('nan')):.3f}" for k in keys})
                done = self.step >= self.cfg.train.max_steps
                if self.step % self.cfg.train.save_every == 0 or done or self.stop.requested:
                    self._checkpoint()
                    if done or not self.stop.requested:  # a stopped run validates when resumed
                        self._validate()
                if self.stop.requested and not done:
                    self.stopped_by = self.stop.signal_name
                    log.warning(
                        "stopped by %s after step %d; resume with: rapo-echo train --resume %s",
                        self.stop.signal_name,
                        self.step,
                        self.run_dir,
                    )
                    return self.run_dir
            self._save_final()
        finally:
            self.stop.restore()
            if bar is not None:
                bar.close()
            self.logs.close()
        return self.run_dir

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

    def _save_final(self) -> None:
        """The final model in Hugging Face format: merged under LoRA (plain transformers loads it);
        under DeepSpeed the gathered weights (an adapter folder under LoRA). With
        ``validation.keep_best`` it is the best-validated model (``final/best.json`` says which step).
        Written beside ``final/`` and renamed into place whole: a crash never leaves half a model there."""
        final = self.run_dir / "final"
        staged = staging_for(final) if self.is_main else final
        if self.deepspeed:
            self._save_gathered(staged)
        elif self.is_main:
            best = self.validator.restore_best(self.step) if self.validator is not None else None
            self.policy.save(staged, merged=True)
            if self.validator is not None and self.validator.keep_best:
                shutil.copy2(self.validator.best_dir / BEST_FILE, staged / BEST_FILE)
            if best is not None:
                self.best_step = best
        if self.is_main:
            replace_dir(staged, final)
            log.info("final model: %s", final)

    def _save_gathered(self, folder: Path) -> None:
        """Under DeepSpeed: gather the weights on every rank (ZeRO-3 partitions them) and save them in
        Hugging Face format on rank 0 (an adapter folder under LoRA, whose trainable weights alone are
        gathered, one at a time)."""
        if self.policy.is_lora:
            trainable = ((n, p) for n, p in self.policy.scorer.named_parameters() if p.requires_grad)
            full = {n: t.detach().cpu().clone() for n, t in gathered_one_at_a_time(trainable) if self.is_main}
        else:
            full = self.accelerator.get_state_dict(self.scorer)
        if self.is_main:
            lm_state = {k[len("lm.") :]: v for k, v in full.items() if k.startswith("lm.")}
            head = {k[len("value_head.") :]: v for k, v in full.items() if k.startswith("value_head.")}
            self.policy.save(folder, merged=False, state_dict=lm_state, value_state=head or None)

    def _batch(self) -> list:
        n, world, rank = (
            self.cfg.rollout.batch_size,
            self.accelerator.num_processes,
            self.accelerator.process_index,
        )
        batch = self.stream.next_batch(n * world)
        return batch[rank * n : (rank + 1) * n]

    def _judge_metrics(self, rollout: Rollout) -> dict[str, float]:
        """This step's position bias of the comparing judges (``judge/position_bias/*``): the rewards'
        judges and the algorithm's own (``Rollout.judge_metrics``), merged by decision count."""
        return merge_metrics([*self.rewards.step_metrics(), *rollout.judge_metrics])

    def _check_items(self, items: list[TrainItem]) -> None:
        """Every item is of a kind and carries only fields its algorithm declared (:class:`.base.Needs`)."""
        for it in items:
            if it.kind not in self.needs.kinds or not set(it.fields) <= set(self.needs.fields):
                raise TypeError(
                    f"{self.algo_cls.__name__}.rollout gave an item of kind {it.kind.name!r} with fields "
                    f"{sorted(it.fields)}; its needs() declare kinds {[k.name for k in self.needs.kinds]} "
                    f"and fields {list(self.needs.fields)}"
                )

    def train_step(self) -> dict[str, float]:
        """One step: rollout, scoring passes, updates. Returns the step's metrics."""
        t_step, cpu_step = time.perf_counter(), time.process_time()
        failed_before = failed_items(*self.remote_engines)
        scenarios = self._batch()
        with self.policy.generation_view():  # ZeRO-3: gathered once, no collectives inside (audit D1)
            persona_metrics: dict[str, float] = {}
            if self.persona is not None:  # inferred persona summaries into the scenarios' meta
                self.persona.annotate(scenarios)
                persona_metrics = self.persona.step_metrics()  # persona/inferred, persona/invalid
            rollout = self.algorithm.rollout(scenarios, self.step)
        if self.policy.rollout_engine is not None:
            self.policy.rollout_engine.sleep()  # vLLM's memory is free for training (where it can sleep)
        timings = dict(rollout.timings)
        items = rollout.items
        self._check_items(items)
        t0 = time.perf_counter()
        self._fill_reference(items)
        timings["ref_logprobs"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        gap = _LogprobGap()
        measured = self._fill_old(items, gap)
        timings["old_logprobs"] = time.perf_counter() - t0
        update_metrics, skipped = self._update(items, timings, None if measured else gap)
        t0 = time.perf_counter()
        self._sync_generator()
        timings["weight_sync"] = time.perf_counter() - t0
        timings["step"] = time.perf_counter() - t_step
        timings["cpu_step"] = time.process_time() - cpu_step  # CPU seconds: the cost on a shared machine
        tokens = sum(len(s.completion_ids) for s in rollout.samples)
        metrics = {**rollout.metrics, **persona_metrics, **self._judge_metrics(rollout), **update_metrics}
        metrics.update(gap.metrics())
        metrics.update({f"time/{k}": v for k, v in timings.items()})
        metrics["tokens_per_s"] = tokens / timings["step"] if timings["step"] > 0 else 0.0
        metrics["lr"] = self.scheduler.get_last_lr()[0]
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
        if self.heldout is not None:  # heldout/*: a judge the policy never trains on, on a sample
            metrics.update(self.heldout.step(self.step + 1, rollout.samples))
        self.logs.samples(self.step + 1, rollout)
        return self.monitor.update(self.step + 1, self._mean_over_processes(metrics), rollout.samples)

    def _mean_over_processes(self, metrics: dict[str, float]) -> dict[str, float]:
        """Average each metric over the processes (rollout metrics are per rank); adds ``world``."""
        world = self.accelerator.num_processes
        if world == 1:
            return {**metrics, "world": 1.0}
        from accelerate.utils import gather_object

        merged: dict[str, list[float]] = defaultdict(list)
        for part in gather_object([metrics]):
            for k, v in part.items():
                if isinstance(v, (int, float)) and math.isfinite(v):
                    merged[k].append(float(v))
        out = {k: sum(v) / len(v) for k, v in merged.items()}
        for k, v in merged.items():  # extremes stay extremes
            if k.endswith("/max"):
                out[k] = max(v)
            elif k.endswith("/min"):
                out[k] = min(v)
        for k in ("invalid", "items", "truncated", "valid", "prompt_truncated"):  # counts add up over ranks
            if k in merged:
                out[k] = sum(merged[k])
        out["world"] = float(world)
        return out

    def _check_replicas(self) -> None:
        """Under DDP every rank must hold the same weights; a mismatch means gradients were not synced."""
        if self.accelerator.num_processes == 1:
            return
        with torch.no_grad():
            total = sum(p.sum(dtype=torch.float64) for p in self.policy.trainable_parameters())
        sums = self.accelerator.gather(total.reshape(1).to(self.accelerator.device)).tolist()
        if max(sums) - min(sums) > 1e-6 * max(1.0, abs(sums[0])):
            raise TrainingError(
                f"model replicas diverged across processes (parameter sums {sums}); "
                "gradient synchronisation failed"
            )

    def _scoring_batches(self, items: list[TrainItem]) -> Iterator[tuple[list[TrainItem], Any]]:
        for mb in length_grouped(items, self.cfg.train.micro_batch_size):
            masks = [it.loss_mask for it in mb]
            yield mb, self.policy.batch([it.prompt_ids for it in mb], [it.completion_ids for it in mb], masks)

    def _no_grad_passes(self, items: list[TrainItem]) -> Iterator[tuple[list[TrainItem], Any]]:
        """Micro-batches for a no-grad scoring pass. Under ZeRO-3 each forward gathers the partitioned
        parameters (a collective), so every rank runs as many forwards as the busiest one (empty
        ``[]`` micro-batches of an idle batch on the others); every rank must call this."""
        micro = list(self._scoring_batches(items))
        n = len(micro)
        if zero_stage(self.accelerator) == 3:
            n = int(self._all_reduce([float(n)], "max")[0])
        for j in range(n):
            yield micro[j] if j < len(micro) else ([], self._idle_batch())

    def _fill_reference(self, items: list[TrainItem]) -> None:
        """Reference log-probs of the policy-gradient items (the KL term is taken on those only)."""
        if not self.needs.reference:
            return
        temp = self.cfg.rollout.temperature
        for mb, batch in self._no_grad_passes([it for it in items if it.kind.policy_gradient]):
            for it, values in zip(mb, batch.rows(self.policy.reference_logprobs(batch, temperature=temp))):
                it.ref_logprobs = values

    def _on_policy(self) -> bool:
        """One inner epoch and one mini-batch: every training forward runs on the weights that sampled,
        so its own detached log-probs are the old log-probs (ratio exactly 1, as TRL does) at any
        dtype and with any sampler, and no extra forward is needed."""
        t = self.cfg.train
        return t.inner_epochs == 1 and t.mini_batches == 1

    def _sampler_matches(self) -> bool:
        """Whether the sampler's log-probs may serve as old log-probs: the ``hf`` sampler (the training
        model itself) in float32 with one inner epoch. In bfloat16 the cached decode and the full
        training forward differ by up to ~0.2 in log-prob, and vLLM has numerics of its own."""
        return (
            self.cfg.train.inner_epochs == 1
            and self.cfg.rollout.engine == "hf"
            and self.policy.dtype == torch.float32
        )

    def _fill_old(self, items: list[TrainItem], gap: _LogprobGap) -> bool:
        """Old log-probs where the training forward cannot give them (several mini-batches or inner
        epochs): the sampler's where they match (:meth:`_sampler_matches`), else one no-grad pass of
        the current policy, which also measures the sampler gap. Returns whether it measured it."""
        if self._on_policy():
            return False  # taken from the training forward itself (see _accumulate)
        pg = [it for it in items if it.kind.policy_gradient]
        matches = self._sampler_matches()
        for it in pg:
            it.old_logprobs = it.sampler_logprobs if matches else None
        need = [it for it in pg if it.old_logprobs is None]
        temp = self.cfg.rollout.temperature
        with torch.no_grad():  # the unwrapped scorer: a DDP forward would broadcast buffers (a collective)
            for mb, batch in self._no_grad_passes(need):
                logp = self.policy.scorer(batch.to(self.accelerator.device), temp)[0]
                gap.add(mb, logp, batch.loss_mask)
                for it, values in zip(mb, batch.rows(logp)):
                    it.old_logprobs = values
        return bool(need) and len(need) == len(pg)

    def _micro(self, mb: list[TrainItem], batch: Any) -> MicroBatch:
        """What the loss sees of a micro-batch: masks, old and reference log-probs, advantages, weights
        and the declared per-token fields, padded to its width on this process's device."""
        dev = self.accelerator.device
        n = batch.n_targets
        old = pad_left_aligned([it.old_logprobs or [0.0] * len(it.completion_ids) for it in mb], n)
        ref = None
        if self.needs.reference:
            ref = pad_left_aligned([it.ref_logprobs or [0.0] * len(it.completion_ids) for it in mb], n).to(
                dev
            )
        fields = {
            name: pad_rows([it.fields.get(name) for it in mb], n).to(dev)
            for name in self.needs.fields
            if any(name in it.fields for it in mb)
        }
        return MicroBatch(
            items=mb,
            batch=batch,
            mask=batch.loss_mask.to(dev),
            old_logp=old.to(dev),
            ref_logp=ref,
            advantages=torch.tensor([it.advantage for it in mb], dtype=torch.float32, device=dev),
            weights=torch.tensor([it.weight for it in mb], dtype=torch.float32, device=dev),
            kinds=[it.kind for it in mb],
            fields=fields,
        )

    def _forward(self, mb: MicroBatch) -> TokenScores:
        """The training forward of a micro-batch through the wrapped scorer: each row at its kind's
        temperature, with the entropy (its gradient where the loss takes one), the value head's values
        and the log-probs at the gathered ids where the algorithm declared them."""
        t = self.cfg.rollout.temperature
        temps = [t if k.temperature is None else k.temperature for k in mb.kinds]
        temperature: float | torch.Tensor = temps[0]
        if any(x != temps[0] for x in temps):
            temperature = torch.tensor(temps, device=mb.mask.device)
        gather = mb.fields.get(self.needs.gather) if self.needs.gather else None
        return self.scorer(
            mb.batch.to(self.accelerator.device),
            temperature,
            True,
            self.needs.entropy_grad,
            gather_ids=None if gather is None else gather.long(),
            with_values=self.needs.value_head,
        )

    def _all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """``values`` reduced over the processes (``sum``, ``max`` or ``min``). A collective: every rank
        calls it the same number of times, whatever its own items are."""
        if self.accelerator.num_processes == 1:
            return values
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        t = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        dist.all_reduce(t, op=ops[op])
        return t.tolist()

    def _global_totals(self, items: list[TrainItem]) -> Totals:
        """Token and sequence counts of each declared kind in the mini-batch, summed over the processes
        (a collective): the normalisers of each kind's loss."""
        kinds = self.needs.kinds
        flat = self._all_reduce([totals_of(items, k)[f] for k in kinds for f in ("tokens", "seqs")])
        return {k: {"tokens": flat[2 * i], "seqs": flat[2 * i + 1]} for i, k in enumerate(kinds)}

    def _update(
        self, items: list[TrainItem], timings: dict[str, float], gap: _LogprobGap | None
    ) -> tuple[dict[str, float], int]:
        """Inner epochs x mini-batches of optimizer updates; returns averaged metrics and skips.
        ``gap`` (if given) is measured in the forwards of the first update, which run on the weights
        that sampled.

        Under several processes every rank joins every collective whatever its own items: the
        mini-batch totals are summed on every rank; a mini-batch empty on all ranks is skipped by
        all; ranks run the same number of micro-batch forwards (an empty or short rank runs
        zero-loss ones, so DDP's synced backward and ZeRO-3's parameter gathers line up); and
        whether the update is finite is agreed by all ranks before any of them steps."""
        t = self.cfg.train
        sums: dict[str, float] = defaultdict(float)
        updates = skipped = 0
        clock = {"policy_forward": 0.0, "backward": 0.0, "optimizer": 0.0}
        for _epoch in range(t.inner_epochs):
            order = items[:]
            if t.inner_epochs > 1 or t.mini_batches > 1:
                random.shuffle(order)
            for mini in (order[i :: t.mini_batches] for i in range(t.mini_batches)):
                micro = list(self._scoring_batches(mini))
                totals = self._global_totals(mini)
                if sum(t["tokens"] for t in totals.values()) == 0:
                    continue  # nothing to train on, on any rank
                n_micro = int(self._all_reduce([float(len(micro))], "max")[0])
                finite, step_metrics = self._accumulate(micro, totals, clock, gap, n_micro)
                gap = None
                finite = self._all_reduce([float(finite)], "min")[0] > 0
                t0 = time.perf_counter()
                grad_norm = self._clip() if finite else None
                finite = finite and (grad_norm is None or math.isfinite(grad_norm))
                if finite:
                    self.optimizer.step()
                    self.scheduler.step()
                    updates += 1
                    self.nonfinite_in_a_row = 0
                    for k, v in step_metrics.items():
                        sums[k] += v
                    if grad_norm is not None:
                        sums["grad_norm"] += grad_norm
                else:
                    skipped += 1
                    self.nonfinite_in_a_row += 1
                    log.warning(
                        "step %d: non-finite loss or gradient, update skipped (%d in a row)",
                        self.step + 1,
                        self.nonfinite_in_a_row,
                    )
                self.optimizer.zero_grad(set_to_none=True)
                clock["optimizer"] += time.perf_counter() - t0
                if self.nonfinite_in_a_row >= t.max_nonfinite:
                    ckpt = latest_checkpoint(self.run_dir)
                    raise TrainingError(
                        f"{self.nonfinite_in_a_row} non-finite losses/gradients in a row at step "
                        f"{self.step + 1}; stopping. Last checkpoint: {ckpt or 'none yet'}. "
                        "Lower train.lr or check the rewards."
                    )
        timings.update(clock)
        metrics = {k: v / max(1, updates) for k, v in sums.items()}
        metrics["updates"] = float(updates)
        return metrics, skipped

    def _accumulate(
        self,
        micro: list[tuple[list[TrainItem], Any]],
        totals: Totals,
        clock: dict[str, float],
        gap: _LogprobGap | None = None,
        n_micro: int | None = None,
    ) -> tuple[bool, dict[str, float]]:
        """Forward and backward ``n_micro`` micro-batches of one optimizer step (this rank's, then
        zero-loss ones; gradients sync on the last); returns whether every loss was finite, and the
        summed metric contributions. After a non-finite loss the remaining micro-batches are
        skipped except the last, whose backward runs with the loss times 0 so the synced backward
        still happens (the gradients are discarded: every rank skips the update).
        On-policy (see :meth:`_on_policy`) the forward's own detached log-probs are the old ones."""
        world = self.accelerator.num_processes
        on_policy = self._on_policy()
        n_micro = len(micro) if n_micro is None else n_micro
        step_metrics: dict[str, float] = defaultdict(float)
        finite = True
        for j in range(n_micro):
            last = j == n_micro - 1
            real = finite and j < len(micro)
            if not real and not last and not self.deepspeed:
                continue  # DDP needs only the last (synced) backward; ZeRO-3 needs every forward
            if self.deepspeed:
                mark_last_micro_batch(self.accelerator, last)
            sync = _nullcontext() if last or self.deepspeed else self.accelerator.no_sync(self.scorer)
            with sync, self.policy.training_mode():  # the one forward with dropout (see Policy)
                t0 = time.perf_counter()
                if not real:
                    self._idle_backward()
                    clock["policy_forward"] += time.perf_counter() - t0
                    continue
                mb = self._micro(*micro[j])
                out = self._forward(mb)
                if on_policy:
                    mb.old_logp = out.logp.detach()
                if gap is not None:
                    gap.add(mb.items, out.logp, mb.mask)
                loss, metrics = self.algorithm.loss(mb, out, totals)
                t1 = time.perf_counter()
                clock["policy_forward"] += t1 - t0
                if not torch.isfinite(loss):
                    if self.deepspeed:  # the engine keeps what earlier micro-batches accumulated
                        raise TrainingError(
                            f"step {self.step + 1}: non-finite loss under DeepSpeed; stopping"
                        )
                    finite = False
                    if last:  # the synced backward still has to happen (no second forward: under DDP
                        # a forward after a synced one broadcasts buffers, which the others would not)
                        self.accelerator.backward(loss * 0.0)
                    continue
                # Losses are normalised by global totals; DDP averages gradients over ranks, so scale back.
                self.accelerator.backward(loss * world)
                clock["backward"] += time.perf_counter() - t1
            step_metrics["loss/total"] += float(loss.detach())
            for k, v in metrics.items():
                step_metrics[k] += float(v)
        return finite, step_metrics

    def _idle_batch(self) -> Any:
        """A one-token batch for the forwards of a rank with nothing (left) to score or train on, so
        that it still joins the gradient all-reduce and parameter gathers of the others."""
        return self.policy.batch([[self.policy.pad_id]], [[self.policy.pad_id]])

    def _idle_backward(self) -> None:
        """A zero-loss forward and backward through the wrapped scorer (all gradients 0; a value head,
        if any, takes part too, so every parameter joins the gradient all-reduce)."""
        kw = {"with_values": True} if self.needs.value_head else {}
        out = self.scorer(self._idle_batch().to(self.accelerator.device), self.cfg.rollout.temperature, **kw)
        self.accelerator.backward(sum(o.sum() for o in out if o is not None) * 0.0)

    def _clip(self) -> float | None:
        """Clip gradients to ``train.max_grad_norm``; returns the norm before clipping (DeepSpeed clips
        inside its own step and reports the norm)."""
        if self.deepspeed:
            norm = getattr(self.scorer, "get_global_grad_norm", lambda: None)()
            return None if norm is None else float(norm)
        if not self.cfg.train.max_grad_norm:
            return None
        params = self.policy.trainable_parameters()
        return float(self.accelerator.clip_grad_norm_(params, self.cfg.train.max_grad_norm))


class _LogprobGap:
    """``|sampler log-prob - training-forward log-prob|`` over the policy-gradient tokens scored with
    the weights that sampled them: the signal that catches a sampler whose numerics or weights differ
    from the trained model (bf16 decode vs full forward, stale weights in a vLLM copy)."""

    def __init__(self) -> None:
        self.total = self.tokens = self.max = 0.0

    def add(self, items: list[TrainItem], logp: torch.Tensor, mask: torch.Tensor) -> None:
        rows = [
            i
            for i, it in enumerate(items)
            if it.kind.policy_gradient
            and it.sampler_logprobs is not None
            and len(it.sampler_logprobs) == len(it.completion_ids)
        ]
        if not rows:
            return
        sampler = pad_left_aligned([items[i].sampler_logprobs for i in rows], logp.shape[1])  # type: ignore[misc]
        m = mask[rows].float()
        diff = (logp.detach()[rows].float() - sampler.to(logp.device)).abs() * m
        self.total += float(diff.sum())
        self.tokens += float(m.sum())
        self.max = max(self.max, float(diff.max()))

    def metrics(self) -> dict[str, float]:
        if not self.tokens:
            return {}
        return {
            "train/sampler_logprob_gap/mean": self.total / self.tokens,
            "train/sampler_logprob_gap/max": self.max,
        }


class _nullcontext:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def check_heads(checkpoint: Path, needs: Needs) -> None:
    """Refuse, before anything loads, a checkpoint whose heads differ from this run's: its optimizer state
    holds a value head this run has none for, or the reverse (older checkpoints: the file tells)."""
    recorded = load_trainer_state(checkpoint).get("value_head")
    had = bool(recorded) if recorded is not None else (checkpoint / "model" / VALUE_HEAD_FILE).is_file()
    if had == needs.value_head:
        return
    held = "holds a value head" if had else "holds no value head"
    wants = "trains one" if needs.value_head else "trains none"
    raise ConfigError(
        f"--resume: the checkpoint {checkpoint} {held} and this run {wants}, so its optimizer state does not "
        "fit; resume with the settings it was written with, or start a new run in another --output"
    )


def run_training(cfg: RunConfig, *, resume: bool = False) -> Learner:
    """Build a :class:`Learner` and run it; returns it (``run_dir``; ``stopped_by`` a signal's name
    when one stopped the run early)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        learner = Learner(cfg, resume=resume)
        learner.train()
    finally:
        end_process_group()
    return learner

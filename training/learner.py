"""The Learner: the update engine every algorithm shares (docs/architecture.md, "One training step").

Given a step's training rows it fills reference and old log-probs, splits them into micro-batches
normalised exactly by their mini-batch's totals, runs the algorithm's loss on each and steps the
optimizer and schedule through ``accelerate`` (DDP or DeepSpeed), clipping the gradients; it saves and
restores the weights, optimizer and scheduler with a checkpoint. The run (:mod:`.run`) builds the
policy, the roles, the rewards and the algorithm, and holds the loop around it.

It knows no algorithm by name: what an algorithm needs from it is declared in
:class:`~rapo_echo.algorithms.base.Needs` (loss kinds and their normalisers, a reference, a value head,
per-token fields), and the loss comes in as a function of a micro-batch.
"""

from __future__ import annotations

import contextlib
import logging
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from rapo_echo.algorithms.base import MicroBatch, Needs, Totals, TrainItem, pad_rows, totals_of
from rapo_echo.auto_lr import resolve_lr
from rapo_echo.autosize import as_record, resolve_batch_sizes
from rapo_echo.checkpoint import (
    commit,
    latest_checkpoint,
    load_torch,
    load_trainer_state,
    rng_state,
    save_checkpoint,
    staging_dir,
    staging_path,
    write_state_files,
)
from rapo_echo.distributed import (
    accelerator_kwargs,
    configure_deepspeed,
    deepspeed_mixed_precision,
    gathered_one_at_a_time,
    import_group_capturing_modules,
    is_deepspeed,
    mark_last_micro_batch,
    zero_layout,
    zero_stage,
)
from rapo_echo.errors import ConfigError, RapoEchoError
from rapo_echo.master_weights import make_optimizer
from rapo_echo.policy import Policy, TokenScores, pad_left_aligned

if TYPE_CHECKING:
    from rapo_echo.algorithms.run_sections import RunConfig

log = logging.getLogger(__name__)

# what the algorithm computes on one micro-batch: its share of the loss and additive metrics
LossFn = Callable[[MicroBatch, TokenScores, Totals], tuple[torch.Tensor, dict[str, torch.Tensor]]]


class TrainingError(RapoEchoError):
    """The run cannot go on (e.g. repeated non-finite losses); the last checkpoint is kept."""


def start_processes(device: str) -> Any:
    """The run's ``accelerate.Accelerator`` (its process group, when launched with several)."""
    from accelerate import Accelerator

    import_group_capturing_modules()  # before Accelerator creates the process group
    return Accelerator(**accelerator_kwargs(device))


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def lr_lambda(kind: str, warmup: int, total: int) -> Callable[[int], float]:
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


class Learner:
    """Updates ``policy`` from training rows (see the module doc): the optimizer and schedule, the
    wrapped scorer, the update, clipping, checkpoints and the collectives between processes.
    ``roles``: the engines of the run's other roles (under ZeRO-3 a rollout gathers the weights they
    read)."""

    def __init__(
        self,
        cfg: RunConfig,
        policy: Policy,
        needs: Needs,
        accelerator: Any,
        run_dir: Path,
        roles: Sequence[Any] = (),
    ) -> None:
        self.cfg, self.policy, self.needs = cfg, policy, needs
        self.accelerator, self.run_dir = accelerator, run_dir
        self.is_main = accelerator.is_main_process
        # what the ``auto`` settings became (``resolved.json``)
        self.resolved = {"train.lr": resolve_lr(cfg.train, cfg.model.lora.enabled, policy.lm)}
        params = policy.trainable_parameters()
        if not params:
            raise ConfigError("model: nothing to train (no parameter requires gradients)")
        t = cfg.train
        optimizer = make_optimizer(  # float32 master weights for 16-bit weights (audit D6)
            params, t, deepspeed_mixed_precision=deepspeed_mixed_precision(accelerator)
        )
        updates_per_step = t.inner_epochs * t.mini_batches
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            optimizer, lr_lambda(t.scheduler, t.warmup_steps, t.max_steps * updates_per_step)
        )
        configure_deepspeed(accelerator, t.micro_batch_size, t.max_grad_norm)
        self.deepspeed = is_deepspeed(accelerator)
        # The scheduler is not handed to accelerate: its wrapper would step it once per process.
        self.scorer, self.optimizer = accelerator.prepare(policy.scorer, optimizer)
        if self.deepspeed:  # ZeRO-3 head gathers, the reference held by DeepSpeed (audit D2, D4)
            policy.attach_deepspeed(accelerator, self.scorer, roles=[r for r in roles if r is not None])
        self._resolve_batch_sizes()  # after prepare: measures the model as it trains (audit D5)
        self.nonfinite_in_a_row = 0

    # ------------------------------------------------------------------ setup
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
            reference_copy=self.needs.reference and not cfg.model.lora.enabled,
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

    @property
    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def sync_generator(self) -> None:
        """Push the policy's weights into a separate sampler (vLLM), if there is one."""
        if self.policy.rollout_engine is not None:
            self.policy.rollout_engine.sync_from(self.policy.lm)

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """The engine's part of a checkpoint's trainer state."""
        return {
            "nonfinite_in_a_row": self.nonfinite_in_a_row,
            "value_head": self.needs.value_head,
            "processes": self.accelerator.num_processes,  # a resume with another count keeps the global batch
        }

    def save_checkpoint(self, step: int, trainer_state: dict[str, Any]) -> Path | None:
        """Checkpoint step ``step`` atomically (every rank calls it): the weights, optimizer, scheduler,
        every rank's RNG state and ``trainer_state`` (the run's, with :meth:`state`); its path on the
        main process."""
        self.accelerator.wait_for_everyone()
        self._check_replicas()
        states = (
            self.accelerator.gather_for_metrics([rng_state()], use_gather_object=True)
            if self.accelerator.num_processes > 1
            else [rng_state()]
        )
        trainer_state = {**trainer_state, **self.state()}
        if self.deepspeed:
            return self._deepspeed_checkpoint(step, trainer_state, dict(enumerate(states)))
        if not self.is_main:
            return None
        path = save_checkpoint(
            self.run_dir,
            step,
            save_model=lambda folder: self.policy.save(folder, merged=False),
            optimizer=self.optimizer if self.cfg.train.save_optimizer else None,
            scheduler=self.scheduler,
            trainer_state=trainer_state,
            keep=self.cfg.train.keep_checkpoints,
            rank_rng=dict(enumerate(states)),
        )
        log.info("checkpoint: %s", path)
        return path

    def _deepspeed_checkpoint(
        self, step: int, trainer_state: dict[str, Any], rank_rng: dict[int, dict[str, Any]]
    ) -> Path | None:
        """Under DeepSpeed every rank saves its engine shard (``accelerate/``, DeepSpeed's own sharded
        checkpoint via accelerate's save_state, frozen weights left out); under LoRA rank 0 also
        writes the adapter in PEFT format (``model/``), gathered alone. A full fine-tuning checkpoint
        is the shards only: no 16-bit copy of the whole model is gathered (audit D7; DeepSpeed's
        ``zero_to_fp32.py`` in ``accelerate/`` rebuilds one)."""
        if self.is_main:
            staging_dir(self.run_dir, step)
        self.accelerator.wait_for_everyone()
        tmp = staging_path(self.run_dir, step)
        self.accelerator.save_state(str(tmp / "accelerate"), exclude_frozen_parameters=True)
        if self.policy.is_lora:
            self.save_gathered(tmp / "model")
        self.accelerator.wait_for_everyone()  # every rank's files are written before rank 0 commits
        path = None
        if self.is_main:
            write_state_files(
                tmp, step, trainer_state=trainer_state, rank_rng=rank_rng, scheduler=self.scheduler
            )
            path = commit(tmp, self.run_dir, step, self.cfg.train.keep_checkpoints)
            log.info("checkpoint: %s", path)
        self.accelerator.wait_for_everyone()
        return path

    def restore(self, ckpt: Path) -> dict[str, Any]:
        """Load the weights, optimizer and scheduler of ``ckpt``; returns its trainer state."""
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
        self.nonfinite_in_a_row = int(state.get("nonfinite_in_a_row", 0))
        return state

    def save_model(self, folder: Path) -> None:
        """The model in Hugging Face format into ``folder``: merged under LoRA (plain transformers loads
        it) by the main process; under DeepSpeed the gathered weights (every rank calls it)."""
        if self.deepspeed:
            self.save_gathered(folder)
        elif self.is_main:
            self.policy.save(folder, merged=True)

    def save_gathered(self, folder: Path) -> None:
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

    def _check_replicas(self) -> None:
        """Under DDP every rank must hold the same weights; a mismatch means gradients were not synced."""
        if self.accelerator.num_processes == 1:
            return
        with torch.no_grad():
            zero = torch.zeros((), dtype=torch.float64)
            total = sum((p.sum(dtype=torch.float64) for p in self.policy.trainable_parameters()), zero)
        sums = self.accelerator.gather(total.reshape(1).to(self.accelerator.device)).tolist()
        if max(sums) - min(sums) > 1e-6 * max(1.0, abs(sums[0])):
            raise TrainingError(
                f"model replicas diverged across processes (parameter sums {sums}); "
                "gradient synchronisation failed"
            )

    # ------------------------------------------------------------------ one step's update
    def update(
        self, items: list[TrainItem], step: int, loss: LossFn, timings: dict[str, float]
    ) -> tuple[dict[str, float], int]:
        """Learn from step ``step``'s rows: reference and old log-probs, then inner epochs x
        mini-batches of optimizer updates with ``loss``, then the weights pushed to a separate sampler.
        Returns the averaged metrics (the sampler gap's among them) and the updates skipped as
        non-finite; adds the stages' seconds to ``timings``."""
        t0 = time.perf_counter()
        self._fill_reference(items)
        timings["ref_logprobs"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        gap = LogprobGap()
        measured = self.fill_old(items, gap)
        timings["old_logprobs"] = time.perf_counter() - t0
        metrics, skipped = self._updates(items, step, loss, timings, None if measured else gap)
        metrics.update(gap.metrics())
        t0 = time.perf_counter()
        self.sync_generator()
        timings["weight_sync"] = time.perf_counter() - t0
        return metrics, skipped

    def scoring_batches(self, items: list[TrainItem]) -> Iterator[tuple[list[TrainItem], Any]]:
        for mb in length_grouped(items, self.cfg.train.micro_batch):
            masks = [it.loss_mask for it in mb]
            yield mb, self.policy.batch([it.prompt_ids for it in mb], [it.completion_ids for it in mb], masks)

    def _no_grad_passes(self, items: list[TrainItem]) -> Iterator[tuple[list[TrainItem], Any]]:
        """Micro-batches for a no-grad scoring pass. Under ZeRO-3 each forward gathers the partitioned
        parameters (a collective), so every rank runs as many forwards as the busiest one (empty
        ``[]`` micro-batches of an idle batch on the others); every rank must call this."""
        micro = list(self.scoring_batches(items))
        n = len(micro)
        if zero_stage(self.accelerator) == 3:
            n = int(self.all_reduce([float(n)], "max")[0])
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

    def fill_old(self, items: list[TrainItem], gap: LogprobGap) -> bool:
        """Old log-probs where the training forward cannot give them (several mini-batches or inner
        epochs): the sampler's where they match (:meth:`_sampler_matches`), else one no-grad pass of
        the current policy, which also measures the sampler gap. Returns whether it measured it."""
        if self._on_policy():
            return False  # taken from the training forward itself (see accumulate)
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

    def all_reduce(self, values: list[float], op: str = "sum") -> list[float]:
        """``values`` reduced over the processes (``sum``, ``max`` or ``min``). A collective: every rank
        calls it the same number of times, whatever its own items are."""
        if self.accelerator.num_processes == 1:
            return values
        import torch.distributed as dist

        ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}
        t = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        dist.all_reduce(t, op=ops[op])
        return t.tolist()

    def global_totals(self, items: list[TrainItem]) -> Totals:
        """Token and sequence counts of each declared kind in the mini-batch, summed over the processes
        (a collective): the normalisers of each kind's loss."""
        kinds = self.needs.kinds
        flat = self.all_reduce([totals_of(items, k)[f] for k in kinds for f in ("tokens", "seqs")])
        return {k: {"tokens": flat[2 * i], "seqs": flat[2 * i + 1]} for i, k in enumerate(kinds)}

    def _updates(
        self,
        items: list[TrainItem],
        step: int,
        loss: LossFn,
        timings: dict[str, float],
        gap: LogprobGap | None,
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
                micro = list(self.scoring_batches(mini))
                totals = self.global_totals(mini)
                if sum(t["tokens"] for t in totals.values()) == 0:
                    continue  # nothing to train on, on any rank
                n_micro = int(self.all_reduce([float(len(micro))], "max")[0])
                finite, step_metrics = self.accumulate(micro, totals, clock, loss, gap, n_micro, step)
                gap = None
                finite = self.all_reduce([float(finite)], "min")[0] > 0
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
                    self._skipped(step)
                self.optimizer.zero_grad(set_to_none=True)
                clock["optimizer"] += time.perf_counter() - t0
        timings.update(clock)
        metrics = {k: v / max(1, updates) for k, v in sums.items()}
        metrics["updates"] = float(updates)
        return metrics, skipped

    def _skipped(self, step: int) -> None:
        """Count a skipped non-finite update; stop after ``train.max_nonfinite`` in a row."""
        self.nonfinite_in_a_row += 1
        log.warning(
            "step %d: non-finite loss or gradient, update skipped (%d in a row)",
            step,
            self.nonfinite_in_a_row,
        )
        if self.nonfinite_in_a_row >= self.cfg.train.max_nonfinite:
            ckpt = latest_checkpoint(self.run_dir)
            raise TrainingError(
                f"{self.nonfinite_in_a_row} non-finite losses/gradients in a row at step {step}; stopping. "
                f"Last checkpoint: {ckpt or 'none yet'}. Lower train.lr or check the rewards."
            )

    def accumulate(
        self,
        micro: list[tuple[list[TrainItem], Any]],
        totals: Totals,
        clock: dict[str, float],
        loss: LossFn,
        gap: LogprobGap | None = None,
        n_micro: int | None = None,
        step: int = 0,
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
            sync = (
                contextlib.nullcontext() if last or self.deepspeed else self.accelerator.no_sync(self.scorer)
            )
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
                value, metrics = loss(mb, out, totals)
                t1 = time.perf_counter()
                clock["policy_forward"] += t1 - t0
                if not torch.isfinite(value):
                    if self.deepspeed:  # the engine keeps what earlier micro-batches accumulated
                        raise TrainingError(f"step {step}: non-finite loss under DeepSpeed; stopping")
                    finite = False
                    if last:  # the synced backward still has to happen (no second forward: under DDP
                        # a forward after a synced one broadcasts buffers, which the others would not)
                        self.accelerator.backward(value * 0.0)
                    continue
                # Losses are normalised by global totals; DDP averages gradients over ranks, so scale back.
                self.accelerator.backward(value * world)
                clock["backward"] += time.perf_counter() - t1
            step_metrics["loss/total"] += float(value.detach())
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


class LogprobGap:
    """``|sampler log-prob - training-forward log-prob|`` over the policy-gradient tokens scored with
    the weights that sampled them: the signal that catches a sampler whose numerics or weights differ
    from the trained model (bf16 decode vs full forward, stale weights in a vLLM copy)."""

    def __init__(self) -> None:
        self.total = self.tokens = self.max = 0.0

    def add(self, items: list[TrainItem], logp: torch.Tensor, mask: torch.Tensor) -> None:
        sampled = {
            i: it.sampler_logprobs
            for i, it in enumerate(items)
            if it.kind.policy_gradient
            and it.sampler_logprobs is not None
            and len(it.sampler_logprobs) == len(it.completion_ids)
        }
        if not sampled:
            return
        rows = list(sampled)
        sampler = pad_left_aligned(list(sampled.values()), logp.shape[1])
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

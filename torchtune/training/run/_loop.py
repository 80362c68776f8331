"""The pieces both finetune recipes' training loops are made of: step accounting (which epochs and steps
remain, where the data resumes), the weight of each micro-batch in its step, and what a logged step
records. Each recipe's ``train()`` composes them; what differs between the recipes is only sharding."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Dict, Iterator, List, Optional

import torch

from torchtune.training import memory
from torchtune.training.run._metrics import build_metric_logger, epoch_progress_bar
from torchtune.training.run._output_dir import drop_metrics_after
from torchtune.training.run._resume import RunSettings, TrainingProgress, recipe_state
from torchtune.training.run._step import num_label_tokens
from torchtune.training.setup._checks import positive_int
from torchtune.training.setup._data import TrainingData

log = logging.getLogger("torchtune")

__all__ = ["StepMetrics", "TrainingSteps", "label_token_shares"]

Batch = Dict[str, torch.Tensor]


class TrainingSteps:
    """Step accounting: the epochs and optimizer steps still to run, where each epoch's data starts
    (a resumed epoch skips the examples already trained on), the epoch's progress bar, and the position
    a checkpoint records.

    Raises:
        TuneError: the data holds less than one optimizer step.

    Args:
        data: the training data; its sampler is positioned at the start of each epoch.
        progress: epochs and steps run so far (a resumed run's); advanced in place.
        settings: the run's epochs, global batch size and gradient accumulation steps.
        seed: the run's seed (recorded in checkpoints).
        max_steps_per_epoch: the cap of an epoch's length (recorded, so a resume keeps it).
        show_progress: draw the progress bar (False on ranks other than 0).
        rounding: the run's stochastic rounding (its stream is part of the recipe state), if any.
    """

    def __init__(
        self,
        data: TrainingData,
        progress: TrainingProgress,
        settings: RunSettings,
        *,
        seed: int,
        max_steps_per_epoch: Optional[int],
        show_progress: bool = True,
        rounding: Any = None,
    ) -> None:
        self.data = data
        self.progress = progress
        self.settings = settings
        self.seed = seed
        self.max_steps_per_epoch = max_steps_per_epoch
        self.steps_per_epoch = data.steps_per_epoch(
            batch_size=settings.batch_size,
            gradient_accumulation_steps=settings.gradient_accumulation_steps,
            max_steps=max_steps_per_epoch,
        )
        self.show_progress = show_progress
        self.rounding = rounding
        self.bar: Any = None

    @property
    def global_step(self) -> int:
        return self.progress.global_step

    @property
    def total_steps(self) -> int:
        """Optimizer steps of the whole run (the LR schedule's length)."""
        return self.settings.epochs * self.steps_per_epoch

    @property
    def finished(self) -> bool:
        """Whether every epoch has run (the next save is the final one)."""
        return self.progress.epochs_run >= self.settings.epochs

    def epochs(self) -> Iterator[int]:
        """The epochs still to run, each with its data positioned and its progress bar drawn."""
        for epoch in range(self.progress.epochs_run, self.settings.epochs):
            # examples of the whole order (all ranks together) already trained on in this epoch
            start = (
                self.progress.steps_run_in_epoch * self.settings.gradient_accumulation_steps * self.settings.batch_size
            )
            self.data.sampler.set_epoch(epoch, start_index=start)
            self.bar = epoch_progress_bar(self.steps_per_epoch, self.progress.steps_run_in_epoch, self.show_progress)
            yield epoch

    def steps(self) -> Iterator[List[Batch]]:
        """The host micro-batches of each step left in this epoch, ``gradient_accumulation_steps`` at a time."""
        for micro_batches in self.data.steps(self.settings.gradient_accumulation_steps):
            if self.progress.steps_run_in_epoch >= self.steps_per_epoch:
                return
            yield micro_batches

    def finish_step(self) -> int:
        """Count an optimizer step as done; returns the new global step."""
        self.progress.global_step += 1
        self.progress.steps_run_in_epoch += 1
        self.bar.update(1)
        return self.progress.global_step

    def finish_epoch(self) -> None:
        """Count the epoch as done (its checkpoint is saved next)."""
        self.bar.close()
        self.progress.epochs_run += 1
        self.progress.steps_run_in_epoch = 0

    def recipe_state(self, optimizer: Any, lr_scheduler: Any, model: torch.nn.Module, **extra: Any) -> Dict[str, Any]:
        """:func:`~torchtune.training.recipe_state` at this position (``extra``: its other arguments)."""
        return recipe_state(
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            progress=self.progress,
            settings=self.settings,
            seed=self.seed,
            max_steps_per_epoch=self.max_steps_per_epoch,
            model=model,
            stochastic_rounding=self.rounding,
            **extra,
        )


def label_token_shares(micro_batches: List[Batch], info: Any = None) -> List[float]:
    """Each micro-batch's share of the label tokens of the whole step, counted on the host batches
    before the first forward (no device sync).

    Each micro-batch's mean loss times its share, summed (and, with ``info``, with the gradients summed
    over ranks), is the token mean of the whole step: the loss and gradient of one batch holding every
    micro-batch of every rank, however the tokens fall into them. With ``info`` (a world of several
    processes) the step's count is summed over ranks: one host all-reduce per step on the gloo group,
    none per micro-batch. It is left out only where this rank alone knows the total, in a world of
    one process: the other ranks' counts are known without asking only when every label-token count is
    fixed by shapes all ranks share, and no dataset here has that (packs and padded batches leave out
    each segment's first label and the padding, so their counts vary from batch to batch).
    """
    counts = [num_label_tokens(batch) for batch in micro_batches]
    total = sum(counts)
    if info is not None and info.world_size > 1:
        import torch.distributed as dist

        summed = torch.tensor([total], dtype=torch.int64)
        dist.all_reduce(summed, group=info.cpu_group)
        total = int(summed.item())
    return [count / max(total, 1) for count in counts]


class StepMetrics:
    """What the loop logs: on every ``log_every_n_steps``-th step the loss, LR, non-padding tokens and
    tokens/s since the last logged step, their padding share, the gradient norm, the share of weights
    changed (``weight_changes``) and memory (``log_peak_memory_stats``); the validation loss when due;
    each epoch's padding share; the run summary. Nothing is read from the device on steps that are not
    logged. Made in the recipe's constructor (the driver's memory peak is sampled from then on);
    ``open`` starts the metric loggers once the output folder is checked.

    With ``info`` (the distributed recipe) every rank calls every method: token counts and the
    gradient norm are summed over ranks, and only rank 0 writes (``logger`` is None elsewhere).

    Args:
        cfg: the recipe config (``log_every_n_steps``, ``log_peak_memory_stats``).
        device: the device whose memory is logged.
        grad_norm: the ``GradNormTracker`` the optimizer steps feed; armed on logged steps.
        weight_changes: the ``WeightChangeTracker`` (low-precision weights only), armed likewise.
        info: the ``DistributedInfo`` of a run of several processes.
    """

    def __init__(
        self, cfg: Any, *, device: torch.device, grad_norm: Any, weight_changes: Any = None, info: Any = None
    ) -> None:
        self.every_n_steps = positive_int(cfg, "log_every_n_steps")
        self.peak_memory = bool(cfg.log_peak_memory_stats)
        self.device = device
        self.grad_norm = grad_norm
        self.weight_changes = weight_changes
        self.info = info
        self.writes = info is None or info.is_rank_zero
        self.data: Optional[TrainingData] = None
        self.logger: Any = None  # the run's MetricLoggers, on the rank that writes
        # the driver's figure (managed memory, context) at its peak, not a snapshot between steps
        sample = self.peak_memory and self.writes and device.type == "cuda"
        self._device_peak = memory.DeviceMemoryPeak(device).start() if sample else None
        self._interval = [0, 0]  # non-padding tokens, token positions since the last logged step
        self._epoch = [0, 0]  # the same since the epoch began
        self._interval_start: Optional[float] = None  # None: the clock starts at the next step

    def open(self, cfg: Any, data: TrainingData, *, resumed_step: Optional[int] = None) -> Any:
        """Start the metric loggers of ``cfg`` (rank 0: ``metrics.jsonl`` and those listed in
        ``metric_logger``) for a run on ``data``; returns them (None on the other ranks).

        ``resumed_step``: the step of the checkpoint an accepted resume loaded (the recipe calls ``open``
        after every check and load of its setup): the lines of later steps in ``metrics.jsonl`` are dropped
        now, as the run logs them again; a resume refused before this point leaves them as they were."""
        self.data = data
        if self.writes:
            if resumed_step is not None:
                drop_metrics_after(cfg.output_dir, resumed_step)
            self.logger = build_metric_logger(cfg)
        return self.logger

    def start_step(self, step: int, micro_batches: List[Batch]) -> bool:
        """Count the step's tokens on the host batches; when ``step`` is logged, arm the gradient-norm
        and weight-change trackers (the step feeds them). Returns whether ``step`` is logged."""
        if self._interval_start is None:
            self._interval_start = time.perf_counter()
        for batch in micro_batches:
            tokens, positions = self.data.num_tokens(batch), batch["tokens"].numel()
            self._interval[0] += tokens
            self._interval[1] += positions
            self._epoch[0] += tokens
            self._epoch[1] += positions
        logged = step % self.every_n_steps == 0
        if logged:
            self.grad_norm.arm(self.device)
            if self.weight_changes is not None:
                self.weight_changes.arm(self.device)
        return logged

    def _over_ranks(self, *values: float) -> List[float]:
        if self.info is None or self.info.world_size == 1:
            return list(values)
        import torch.distributed as dist

        summed = torch.tensor(values, dtype=torch.float64)
        dist.all_reduce(summed, group=self.info.cpu_group)
        return summed.tolist()

    def log_step(
        self, *, epoch: int, step: int, loss: torch.Tensor, lr: float, bar: Any, nan_guard: Any = None
    ) -> None:
        """Log a step ``start_step`` armed. Its device values -- ``loss`` (over all ranks already), the gradient
        norm, the count of changed weights and ``nan_guard``'s bad step (a ``NonFiniteLossGuard``, told what
        was read: its ``check`` then reads nothing) -- are read in one device-to-host copy, the step's one
        host sync. A step after which the guard holds a NaN/inf loss is not logged."""
        norm_sq = self.grad_norm.total_square()  # a collective with sharded gradients
        values = [loss.detach().reshape(()), norm_sq]
        changed, counted = self.weight_changes.total() if self.weight_changes is not None else (None, 0)
        if changed is not None:
            values.append(changed)
        if nan_guard is not None:
            values.append(nan_guard.bad_step)
        host = torch.stack([v.to(torch.float64) for v in values]).tolist()  # the one sync
        loss_value, grad_norm = host[0], math.sqrt(max(host[1], 0.0))
        if nan_guard is not None:
            nan_guard.note(int(host[-1]))
            if int(host[-1]) >= 0:
                return  # a NaN/inf loss: nothing of this step is logged; the guard's check stops the run
        seconds = max(time.perf_counter() - (self._interval_start or 0.0), 1e-9)
        tokens, positions, rate = self._over_ranks(self._interval[0], self._interval[1], self._interval[0] / seconds)
        self._interval, self._interval_start = [0, 0], time.perf_counter()
        if not self.writes:
            return
        payload = {
            "epoch": epoch,
            "loss": loss_value,
            "lr": lr,
            "tokens": int(tokens),  # non-padding tokens (of all ranks) since the last logged step
            "tokens_per_second": rate,  # of all ranks together
            "padding_share": 1.0 - tokens / max(positions, 1),  # of the token positions since the last logged step
            "grad_norm": grad_norm,
        }
        if changed is not None:
            # share of weight elements whose stored value changed: near 0 means bf16 updates are lost
            payload["weights_changed"] = host[2] / counted if counted else float("nan")
        if self.peak_memory:
            # rank 0's device; the run's peaks so far (not reset)
            payload.update(memory.get_memory_stats(self.device, reset_stats=False, device_peak=self._device_peak))
        self.logger.log_dict(payload, step=step)
        bar.set_description(f"{epoch + 1}|{step}|Loss: {loss_value:.4f}")
        bar.set_postfix(lr=f"{lr:.2e}", tok_s=f"{rate:.0f}", refresh=False)

    def log_validation(
        self, validation: Any, model: Any, loss_fn: Any, step: int, *, end_of_epoch: bool = False
    ) -> None:
        """The validation loss, when ``validation`` (None: no validation set) is due at ``step``; its
        time is not training time, so it is left out of tokens/s."""
        if validation is None or not validation.due(step, end_of_epoch=end_of_epoch):
            return
        start = time.perf_counter()
        val_loss = validation.loss(model, loss_fn, device=self.device, global_step=step)
        if self.writes:
            self.logger.log_validation(val_loss, step=step)  # one line per logger
        if self._interval_start is not None:
            self._interval_start += time.perf_counter() - start

    def end_epoch(self, epoch: int) -> None:
        """Log the share of padding among the token positions the epoch trained on (of all ranks)."""
        tokens, positions = self._over_ranks(*self._epoch)
        self._epoch, self._interval, self._interval_start = [0, 0], [0, 0], None
        if positions:
            log.info(
                "Epoch %d: %.1f%% of the %d token positions trained on were padding%s",
                epoch + 1,
                100.0 * (1.0 - tokens / positions),
                positions,
                "" if self.data.packed else " (dataset.packed=True packs examples to avoid it)",
            )

    def log_memory(self, title: str) -> None:
        """One line of memory statistics (rank 0's device) when ``log_peak_memory_stats`` is on."""
        if self.peak_memory:
            stats = memory.get_memory_stats(self.device, reset_stats=False, device_peak=self._device_peak)
            log.info("Memory %s: %s", title, ", ".join(f"{k}={v:.2f} GB" for k, v in stats.items()))

    def report(self, checkpoint: Any) -> None:
        """Log the run summary (rank 0)."""
        if self.writes:
            log.info(self.logger.summary.report(checkpoint=checkpoint, device=self.device))

    def close(self) -> None:
        if self._device_peak is not None:
            self._device_peak.stop()
        if self.logger is not None:
            self.logger.close()

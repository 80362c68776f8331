"""Full finetune of a decoder model on several devices (or nodes) with FSDP2, launched by torchrun.

    tune run --nproc_per_node 8 full_finetune_distributed --config llama2/13B_full_distributed

``tune run`` hands ``--nproc_per_node``, ``--nnodes``, ``--rdzv-endpoint`` ... to torchrun
(``torch.distributed.run``), which starts one process per device; without them the recipe runs as a
world of one process (with ``fsdp_cpu_offload: True``, the way to train a model whose weights do not
fit one GPU). The training loop is that of ``full_finetune_single_device``, built from the same
``torchtune.training`` functions, with the model sharded by ``training.shard_model``.
Copy it with ``tune cp full_finetune_distributed my_recipe.py`` and edit it. docs/distributed.md
describes launching, the FSDP switches and resuming on another number of processes.
"""

from __future__ import annotations

import logging
import signal
import sys
import time
from pathlib import Path
from typing import Any, Optional

import torch
import torch.distributed as dist
from omegaconf import DictConfig
from torch.optim import Optimizer
from tqdm import tqdm

from torchtune import config, training, utils
from torchtune._errors import ConfigError, TuneError
from torchtune.training import memory

log = logging.getLogger("torchtune")

RECIPE_NAME = "full_finetune_distributed"
# `tune run --nproc_per_node N` starts only recipes that say they run on several processes.
DISTRIBUTED = True
# Every key this recipe reads; each one is in the shipped configs. An unknown key is a typo.
RECIPE_KEYS = (
    "output_dir",
    "tokenizer",
    "dataset",
    "seed",
    "shuffle",
    "model",
    "checkpointer",
    "resume_from_checkpoint",
    "overwrite",
    "batch_size",
    "epochs",
    "max_steps_per_epoch",
    "gradient_accumulation_steps",
    "optimizer",
    "optimizer_in_bwd",
    "optimizer_in_bwd_group",
    "lr_scheduler",
    "loss",
    "clip_grad_norm",
    "bf16_stochastic_rounding",
    "compile",
    "device",
    "dtype",
    "dist_backend",
    "fsdp_cpu_offload",
    "fsdp_reshard_after_forward",
    "fsdp_param_dtype",
    "fsdp_reduce_dtype",
    "enable_activation_checkpointing",
    "enable_activation_offloading",
    "save_every_n_steps",
    "keep_last_n_checkpoints",
    "async_checkpoint",
    "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats",
    "validation_dataset",
    "eval_every_n_steps",
)


def validate_config(cfg: DictConfig) -> None:
    """Every check of ``cfg`` that needs no model, data, device, file or process group: keys, value
    ranges, device/dtype/backend spellings, conflicting settings, optimizers that cannot take sharded
    parameters. ``__init__`` runs it first; ``tune validate`` and ``tune run --nproc_per_node`` (before
    starting any process) run it alone.

    Raises:
        ConfigError: naming the key to change.
    """
    config.check_recipe_keys(cfg, RECIPE_KEYS, RECIPE_NAME, "llama2/tiny_full_distributed")
    training.check_value_types(cfg)
    device = utils.parse_device(cfg.device)
    utils.dtype_name(cfg.dtype)
    training.check_optimizer_settings(cfg)
    training.check_stochastic_rounding(cfg, sharded=True)
    training.check_loop_keys(cfg)
    try:
        training.backend_for_device(device.type, cfg.dist_backend)
    except TuneError as exc:
        raise ConfigError(str(exc)) from exc
    if device.index is not None:
        raise ConfigError(
            f"device={cfg.device} names a GPU index; each process takes the GPU of its local rank. Set "
            f"device={device.type}."
        )
    if cfg.fsdp_cpu_offload and device.type != "cuda":
        raise ConfigError(
            f"fsdp_cpu_offload=True keeps parameters, gradients and optimizer state in host memory between their "
            f"uses on the GPU; with device={cfg.device} they are in host memory already. Set fsdp_cpu_offload=False."
        )
    if cfg.fsdp_param_dtype is not None:
        utils.dtype_name(cfg.fsdp_param_dtype)  # bf16 or fp32 in any spelling
    if cfg.fsdp_reduce_dtype is not None and cfg.fsdp_reduce_dtype != "fp32":
        raise ConfigError(
            f"fsdp_reduce_dtype={cfg.fsdp_reduce_dtype!r}: use null (reduce gradients in the parameters' dtype) or "
            "fp32 (sum the ranks' gradients in fp32: more exact with bf16, twice the communication)."
        )
    if not isinstance(cfg.async_checkpoint, bool):
        raise ConfigError(
            f"async_checkpoint={cfg.async_checkpoint!r}: use True (step checkpoints are written in the background "
            "while training goes on) or False (training waits for each save)."
        )
    reshard = cfg.fsdp_reshard_after_forward
    if not isinstance(reshard, bool):
        raise ConfigError(
            f"fsdp_reshard_after_forward={reshard!r}: use True (free each layer's gathered weights after its forward: "
            "least memory) or False (keep them until backward: one all-gather less per layer)."
        )
    component = str(cfg.optimizer.get(config.COMPONENT_KEY, ""))
    if component.startswith("bitsandbytes."):
        raise ConfigError(
            f"optimizer._component_={component}: bitsandbytes optimizers cannot step FSDP2's sharded (DTensor) "
            "parameters, and stepping each rank's shard alone would quantize other blocks than one process does, "
            "so the run would not be the same. Use torchao.optim.AdamW8bit (its 8-bit state is sharded with the "
            "parameters) or torch.optim.AdamW, e.g. optimizer._component_=torchao.optim.AdamW8bit."
        )
    if component.startswith("torchao.") and "4bit" in component:
        raise ConfigError(
            f"optimizer._component_={component}: torchao's 4-bit AdamW fails on FSDP2's sharded (DTensor) "
            "parameters with this PyTorch (its compiled 4-bit step does not take DTensor shards). Use "
            "torchao.optim.AdamW8bit (twice the state of 4-bit, a quarter of fp32 AdamW's), e.g. "
            "optimizer._component_=torchao.optim.AdamW8bit."
        )


class FullFinetuneRecipeDistributed:
    """Full finetuning of every parameter of a decoder model, sharded over processes with FSDP2.

    Features (each switched in the YAML config; details in docs/distributed.md and docs/recipe.md):
        - FSDP2 (``fully_shard``) on every decoder layer and the root: bf16 or fp32 parameters
          (``dtype``), ``fsdp_param_dtype: bf16`` to compute in bf16 on fp32 weights and optimizer
          state, ``fsdp_reduce_dtype: fp32`` to sum gradients in fp32, ``fsdp_reshard_after_forward``,
          ``fsdp_cpu_offload`` (parameters, gradients and optimizer state in pinned host memory);
        - weights loaded memory-mapped, each rank copying only its shards;
        - activation checkpointing and offloading, chunked loss and compile as on one device;
        - optimizer in backward on the sharded parameters (stepped after each reduce-scatter; one
          optimizer per parameter or, ``optimizer_in_bwd_group: layer``, per decoder layer), or a
          standard optimizer with gradient accumulation and clipping by the global norm;
        - ``batch_size`` is the global batch, split evenly over the processes; the loss is normalised
          by the token count of all ranks, so any number of processes computes the gradient one
          process would (same data order, too: the run can resume on another world size);
        - step checkpoints with torch.distributed.checkpoint (every rank writes its shards), atomic,
          optionally in the background (``async_checkpoint``);
          epoch and final checkpoints as a full Hugging Face folder written by rank 0, one gathered
          tensor at a time;
        - metrics, validation loss and checkpoints as in the single-device recipe, from rank 0,
          with losses over all ranks; SIGINT/SIGTERM save a resumable checkpoint on every rank.

    Raises (as ``TuneError``, printed once, by rank 0): everything the single-device recipe raises;
    a backend that does not fit the device; a ``batch_size`` that does not split over the processes;
    processes started with different configs; a bitsandbytes optimizer; a resume from a checkpoint
    this recipe did not write, or that is damaged or does not fit. Each message names what to change.
    """

    def __init__(self, cfg: DictConfig) -> None:
        validate_config(cfg)
        self._cfg = cfg
        if str(cfg.device).startswith("cuda"):
            memory.set_cuda_alloc_conf()  # before the first CUDA allocation
        self._dist = training.init_distributed(cfg.device, cfg.dist_backend)
        self._device = self._dist.device
        self._is_rank_zero = self._dist.is_rank_zero
        if not self._is_rank_zero:
            log.setLevel(logging.WARNING)  # one log, rank 0's; warnings and errors from every rank
        training.check_same_config(cfg, self._dist)
        # Rank 0 decides the seed (seed: null draws one) before any random number is drawn: with a seed
        # per rank each would shuffle differently and the ranks' slices of the data would overlap.
        self._seed = training.agree_on_seed(cfg.seed, self._dist)
        self._dtype = utils.get_dtype(cfg.dtype, self._device)
        world = self._dist.world_size
        batch_size = training.positive_int(cfg, "batch_size")
        if batch_size % world:
            raise training.RankErrors(
                f"batch_size={batch_size} (the global batch) does not split evenly over {world} processes. Set "
                f"batch_size to a multiple of {world} (e.g. {world * max(1, batch_size // world)}), or start a "
                "number of processes that divides it. A resumed run keeps the batch_size it was saved with.",
                quiet=not self._is_rank_zero,
            )
        self._local_batch_size = batch_size // world
        ga = training.positive_int(cfg, "gradient_accumulation_steps")
        log.info(
            "global batch %d = %d per rank x %d rank%s%s",
            batch_size,
            self._local_batch_size,
            world,
            "" if world == 1 else "s",
            f"; x {ga} accumulation steps = {batch_size * ga} examples per optimizer step" if ga > 1 else "",
        )
        self._settings = training.RunSettings.from_config(cfg)
        self._clip_grad_norm = cfg.clip_grad_norm
        self._log_every_n_steps = training.positive_int(cfg, "log_every_n_steps")
        self._log_peak_memory_stats = bool(cfg.log_peak_memory_stats)
        self._checkpoint_policy = training.CheckpointPolicy.from_config(cfg)
        self._output_dir = Path(str(cfg.checkpointer.output_dir)).expanduser()
        self._checkpoint_writer = training.ShardedCheckpointWriter(self._dist, async_save=cfg.async_checkpoint)
        self.progress = training.TrainingProgress()
        self.max_steps_per_epoch = self._settings.max_steps_per_epoch
        self._grad_norm = training.GradNormTracker()
        self._nan_guard = training.NonFiniteLossGuard(self._device)
        self._stop = training.StopSignals()
        self._resume: Optional[training.ResumePlan] = None
        self._metric_logger: Any = None
        self._last_checkpoint: Optional[Path] = None
        self._last_checkpoint_step: Optional[int] = None

    @property
    def global_step(self) -> int:
        return self.progress.global_step

    # ------------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Build everything, in order: resume plan, checkpointer, sharded model, tokenizer, optimizer,
        loss, data, LR schedule, metric logger. Each rank builds its part without communicating; then
        the ranks agree that all of them succeeded (one message, not a hang, when one failed) before
        a resume loads the sharded state."""
        cfg = self._cfg
        training.prepare_output_dir(cfg, self._dist)  # another run's checkpoints there: stop (or overwrite=True)
        error: Optional[BaseException] = None
        try:
            self._setup_locally(cfg)
        except Exception as exc:  # noqa: BLE001 - reported on every rank by raise_if_any_rank_failed
            error = exc
        training.raise_if_any_rank_failed(error, self._dist, "Setting up the run")
        if self._resume is not None:
            training.load_sharded_checkpoint(
                self._resume.checkpoint_dir, model=self._model, optimizer=self._optimizer, info=self._dist
            )
        self._lr_scheduler = training.build_lr_scheduler(
            cfg.lr_scheduler,
            self._optimizer,
            num_training_steps=self._settings.epochs * self._steps_per_epoch,
            state_dict=self._resume.lr_scheduler_state if self._resume else None,
        )
        if self._resume is not None:
            self._resume.drop_loaded_states()  # they live in the optimizer and scheduler now
        if self._is_rank_zero:
            self._metric_logger = training.build_metric_logger(cfg)  # metrics.jsonl + the loggers listed
        if self._log_peak_memory_stats:
            self._log_memory("after setup")

    def _setup_locally(self, cfg: DictConfig) -> None:
        self._resume = training.resolve_resume(cfg, self._settings)
        if self._resume is not None and self._resume.optimizer_state != training.SHARDED_STATE_MARKER:
            raise TuneError(
                f"{self._resume.recipe_state_path} was written by the single-device recipe, whose checkpoints hold "
                "the full optimizer state in one file; this recipe resumes from its own step_N / epoch_N folders "
                "(sharded state). Point checkpointer.recipe_checkpoint at the recipe_state.pt of a step_N or epoch_N "
                "folder of a full_finetune_distributed run, resume this one with full_finetune_single_device, or "
                f"start from its weights (checkpointer.checkpoint_dir={self._resume.checkpoint_dir}, "
                "resume_from_checkpoint=False)."
            )
        self.seed = utils.set_seed(self._resume.seed if self._resume else self._seed)
        if self._resume is not None:
            self.progress = self._resume.progress
            self.max_steps_per_epoch = self._resume.max_steps_per_epoch  # keeps the epoch length
            utils.set_rng_state(self._resume.rng_state)
        self._rounding = training.build_stochastic_rounding(  # one stream per rank, saved with every rank's
            cfg.bf16_stochastic_rounding,
            dtype=self._dtype,
            seed=self.seed,
            device=self._device,
            state=self._resume.stochastic_rounding_state if self._resume else None,
            rank=self._dist.rank,
            world_size=self._dist.world_size,
        )

        # The checkpointer always reads the base model folder: its config.json and file layout are
        # what the HF folders this run writes are made of. A resumed run takes its weights from the
        # sharded state instead.
        self._checkpointer = training.build_checkpointer(cfg.checkpointer, None)
        # config.json vs the builder, on a meta-device model: before any weight is read.
        training.check_model_matches_checkpoint(cfg.model, self._checkpointer)
        self._model = self._setup_model(cfg)
        self._activations = training.get_act_offloading_ctx_manager(self._model, cfg.enable_activation_offloading)
        if self._resume is not None:
            self._resume.check_model(self._model)
        self._tokenizer = config.instantiate(cfg.tokenizer)
        training.check_tokenizer_fits_model(self._tokenizer, self._model, cfg.tokenizer)

        self._optimizer = self._setup_optimizer(cfg.optimizer, optimizer_in_bwd=self._settings.optimizer_in_bwd)
        self._loss_fn = config.instantiate(cfg.loss)
        self._data = training.build_dataloader(
            cfg.dataset,
            self._tokenizer,
            batch_size=self._local_batch_size,
            shuffle=cfg.shuffle,
            seed=self.seed,
            num_replicas=self._dist.world_size,
            rank=self._dist.rank,
        )
        # Every rank evaluates the whole validation set (the same batches, so the FSDP collectives
        # match); only rank 0 logs the result.
        self._validation = training.build_validation(
            cfg.validation_dataset,
            self._tokenizer,
            batch_size=self._local_batch_size,
            every_n_steps=cfg.eval_every_n_steps,
        )
        self._steps_per_epoch = self._data.steps_per_epoch(
            batch_size=self._settings.batch_size,
            gradient_accumulation_steps=self._settings.gradient_accumulation_steps,
            max_steps=self.max_steps_per_epoch,
        )

    def _setup_model(self, cfg: DictConfig) -> torch.nn.Module:
        """Build on the meta device (no memory, no random init), checkpoint/compile the layers, shard,
        then give each rank its shards: from the base weights, or empty when a resume fills them."""
        model = training.build_model(
            cfg.model,
            device=torch.device("meta"),
            dtype=self._dtype,
            enable_activation_checkpointing=cfg.enable_activation_checkpointing,
            compile_model=cfg.compile,
        )
        cpu_offload = bool(cfg.fsdp_cpu_offload)
        param_dtype = cfg.fsdp_param_dtype
        training.shard_model(
            model,
            mesh=self._dist.mesh,
            param_dtype=None if param_dtype is None else utils.get_dtype(param_dtype, self._device),
            reduce_dtype=torch.float32 if cfg.fsdp_reduce_dtype == "fp32" else None,
            reshard_after_forward=bool(cfg.fsdp_reshard_after_forward),
            cpu_offload=cpu_offload,
            sum_gradients=True,  # each rank's loss is divided by the token count of all ranks
        )
        shard_device = torch.device("cpu") if cpu_offload else self._device
        if self._resume is None:  # each rank reads only its rows, one tensor at a time
            training.load_sharded_weights(model, self._checkpointer.open_weights(), device=shard_device)
        else:
            model.to_empty(device=shard_device)
        model.init_buffers(self._device)
        log.info(
            "Sharded over %d process(es)%s: %.1fM parameters, %s, %.1fM per rank",
            self._dist.world_size,
            " with CPU offload" if cpu_offload else "",
            sum(p.numel() for p in model.parameters()) / 1e6,
            self._dtype,
            sum(p.to_local().numel() for p in model.parameters()) / 1e6,
        )
        return model

    def _setup_optimizer(self, cfg_optimizer: DictConfig, optimizer_in_bwd: bool) -> Optimizer:
        """One optimizer over all sharded parameters, or, in backward, one per sharded parameter stepped
        from its post-accumulate-grad hook, which FSDP2 runs right after that parameter's
        reduce-scatter. A resumed state is loaded later, by ``load_sharded_checkpoint``."""
        return training.build_optimizer(
            cfg_optimizer,
            self._model,
            optimizer_in_bwd=optimizer_in_bwd,
            grad_norm=self._grad_norm,
            in_bwd_group=self._cfg.optimizer_in_bwd_group,
            rounding=self._rounding,
        )

    # ------------------------------------------------------------------------------------------
    # training
    # ------------------------------------------------------------------------------------------
    def _global_tokens(self, local: int) -> int:
        """The labelled tokens of this step over all ranks (host-side, on the gloo group: no GPU sync)."""
        if self._dist.world_size == 1:
            return local
        count = torch.tensor([local], dtype=torch.int64)
        dist.all_reduce(count, group=self._dist.cpu_group)
        return int(count.item())

    def train(self) -> None:
        """The training loop: epochs of steps, logging, checkpointing, graceful stop."""
        ga = self._settings.gradient_accumulation_steps
        progress = self.progress
        with self._stop:
            for epoch in range(progress.epochs_run, self._settings.epochs):
                start = progress.steps_run_in_epoch * ga * self._settings.batch_size  # examples, all ranks
                self._data.sampler.set_epoch(epoch, start_index=start)
                pbar = training.epoch_progress_bar(
                    self._steps_per_epoch, progress.steps_run_in_epoch, self._is_rank_zero
                )
                step_loss = torch.zeros((), device=self._device)
                interval_tokens, interval_start = 0, time.perf_counter()
                for micro_batches in self._data.steps(ga):
                    if progress.steps_run_in_epoch >= self._steps_per_epoch:
                        break
                    will_log = (progress.global_step + 1) % self._log_every_n_steps == 0
                    if will_log:
                        self._grad_norm.arm(self._device)  # the in-backward hooks add to it
                    lr = self._optimizer.param_groups[0]["lr"]  # the LR this step applies
                    # The label tokens of the whole step on all ranks, counted from the host batches
                    # before the first forward: one host all-reduce per step, none per micro-batch.
                    # Each micro-batch's mean loss weighted by its share of them, with FSDP summing
                    # the gradients, makes the ranks compute one process's gradient of the global batch.
                    label_tokens = [training.num_label_tokens(batch) for batch in micro_batches]
                    step_label_tokens = max(self._global_tokens(sum(label_tokens)), 1)
                    for i, batch in enumerate(micro_batches):
                        interval_tokens += self._data.num_tokens(batch)
                        if ga > 1:
                            # Gradients accumulate unsharded until the last micro-batch, then FSDP2
                            # reduce-scatters once per step (costs a full gradient per rank meanwhile).
                            self._model.set_requires_gradient_sync(i == ga - 1)
                        weight = label_tokens[i] / step_label_tokens
                        loss = training.forward_backward(
                            self._model,
                            self._loss_fn,
                            batch,
                            device=self._device,
                            activations_ctx=self._activations,
                            loss_scale=weight,
                        )
                        step_loss += loss * weight

                    # Standard mode: clip (by the global norm) and step. In backward: already stepped.
                    training.step_optimizer(
                        self._optimizer,
                        self._model.parameters(),
                        clip_grad_norm=self._clip_grad_norm,
                        grad_norm=self._grad_norm,
                        rounding=self._rounding,
                    )
                    if self._lr_scheduler is not None:
                        self._lr_scheduler.step()
                    progress.global_step += 1
                    progress.steps_run_in_epoch += 1
                    # The step's loss over all ranks (queued on the device: no host sync); every rank
                    # then holds the same value, so the NaN guard stops all of them at the same step.
                    if self._dist.world_size > 1:
                        dist.all_reduce(step_loss)
                    self._nan_guard.record(step_loss, progress.global_step)

                    if will_log:
                        tokens_per_second = interval_tokens / max(time.perf_counter() - interval_start, 1e-9)
                        self._log_step(epoch, step_loss, lr, interval_tokens, tokens_per_second, pbar)
                        interval_tokens, interval_start = 0, time.perf_counter()
                    pbar.update(1)
                    step_loss = torch.zeros((), device=self._device)
                    if self._validation is not None and self._validation.due(progress.global_step):
                        interval_start += self._log_validation_loss(pbar)  # not training time: not in tok/s

                    if self._checkpoint_policy.step_checkpoint_due(
                        progress.global_step, progress.steps_run_in_epoch, self._steps_per_epoch
                    ):
                        self.save_checkpoint(epoch=epoch, step_checkpoint=True)
                    if training.any_rank(self._stop.signum is not None, self._dist):
                        self._stop_and_exit(epoch)
                if self._validation is not None and self._validation.due(progress.global_step, end_of_epoch=True):
                    self._log_validation_loss(pbar)
                pbar.close()
                progress.epochs_run += 1
                progress.steps_run_in_epoch = 0
                self.save_checkpoint(epoch=epoch, step_checkpoint=False)
                if training.any_rank(self._stop.signum is not None, self._dist):
                    self._stop_and_exit(epoch)
        self._checkpoint_writer.finish()  # a step save still in flight (async_checkpoint)
        if self._log_peak_memory_stats:
            self._log_memory("end of training (peaks)")
        if self._is_rank_zero:
            log.info(self._metric_logger.summary.report(checkpoint=self._last_checkpoint, device=self._device))

    def _log_step(
        self, epoch: int, step_loss: torch.Tensor, lr: float, tokens: int, tokens_per_second: float, pbar: tqdm
    ) -> None:
        """Called on every rank (the gradient norm and token counts are summed over ranks); rank 0 writes."""
        loss_value = step_loss.item()  # the one sync per logged step; already summed over ranks
        self._nan_guard.check(epoch, self._last_checkpoint)
        self._check_loaded_checksums(wait=False)  # background checksums: no wait
        grad_norm = self._grad_norm.pop()
        if self._dist.world_size > 1:
            totals = torch.tensor([tokens, tokens_per_second], dtype=torch.float64)
            dist.all_reduce(totals, group=self._dist.cpu_group)
            tokens, tokens_per_second = int(totals[0]), float(totals[1])
        if not self._is_rank_zero:
            return
        payload = {
            "epoch": epoch,
            "loss": loss_value,
            "lr": lr,
            "tokens": tokens,  # non-padding tokens of all ranks since the last logged step
            "tokens_per_second": tokens_per_second,  # of all ranks together
            "grad_norm": grad_norm,
        }
        if self._log_peak_memory_stats:
            payload.update(memory.get_memory_stats(self._device))  # rank 0's device
        self._metric_logger.log_dict(payload, step=self.global_step)
        pbar.set_description(f"{epoch + 1}|{self.global_step}|Loss: {loss_value:.4f}")
        pbar.set_postfix(lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:.0f}", refresh=False)

    def _log_validation_loss(self, pbar: tqdm) -> float:
        """Every rank computes it (the same batches); rank 0 logs it. Returns the seconds it took."""
        start = time.perf_counter()
        val_loss = self._validation.loss(self._model, self._loss_fn, device=self._device, global_step=self.global_step)
        if self._is_rank_zero:
            self._metric_logger.log_validation(val_loss, step=self.global_step)  # one line per logger
        return time.perf_counter() - start

    # ------------------------------------------------------------------------------------------
    # checkpointing, stopping
    # ------------------------------------------------------------------------------------------
    def save_checkpoint(self, epoch: int, step_checkpoint: bool = False) -> Path:
        """Save on every rank (a collective); returns the folder.

        Step checkpoints (``output_dir/step_N``): the sharded model and optimizer state, written by
        every rank in parallel (torch.distributed.checkpoint), plus ``recipe_state.pt``. Epoch
        checkpoints (``output_dir/epoch_N``): the full weights streamed to rank 0 (one gathered tensor
        at a time) and written in the input format, as the single-device recipe writes them; with the
        sharded state too unless training is over. The NaN guard is checked first: weights after a
        NaN/inf loss are never written.
        """
        self._nan_guard.check(epoch, self._last_checkpoint)
        # Nothing trained from a damaged checkpoint is saved: wait for its background checksums.
        self._check_loaded_checksums(wait=True)
        final = not step_checkpoint and self.progress.epochs_run >= self._settings.epochs
        if final:
            self._checkpoint_writer.finish()  # publish a step save in flight first
            # rank 0 writes the HF folder one gathered tensor at a time (never the whole model in its RAM)
            folder = training.save_full_weights(
                self._model, self._checkpointer, self._dist, epoch=epoch, step=self.global_step
            )
        else:
            state = training.recipe_state(
                optimizer=self._optimizer,
                lr_scheduler=self._lr_scheduler,
                progress=self.progress,
                settings=self._settings,
                seed=self.seed,
                max_steps_per_epoch=self.max_steps_per_epoch,
                model=self._model,
                stochastic_rounding=self._rounding,  # every rank's stream (a collective)
                optimizer_state=training.SHARDED_STATE_MARKER,
            )
            folder = self._output_dir / (f"step_{self.global_step}" if step_checkpoint else f"epoch_{epoch}")
            self._checkpoint_writer.save(
                folder,
                model=self._model,
                optimizer=self._optimizer,
                recipe_state=state,
                step=self.global_step,
                epoch=epoch,
                intermediate=step_checkpoint,
                write_weights=None
                if step_checkpoint
                else training.full_weights_writer(self._model, self._checkpointer, self._dist),
                background=step_checkpoint,  # with async_checkpoint: published by the next save or the end
            )
        self._last_checkpoint, self._last_checkpoint_step = folder, self.global_step
        pending = self._checkpoint_writer.pending is not None
        log.info("%s checkpoint to %s%s", "Saving" if pending else "Saved", folder, "" if final else " (resumable)")
        if step_checkpoint and self._is_rank_zero:
            self._checkpoint_policy.prune(
                folder.parent, protected=self._resume.checkpoint_dir if self._resume else None
            )
        return folder

    def _check_loaded_checksums(self, wait: bool) -> None:
        """The background checksum checks of what set-up read (``checkpointer.verify_checksums``), agreed
        by all ranks: a damaged file stops every rank with one message."""
        error: Optional[BaseException] = None
        try:
            training.check_loaded_checksums(self._resume, self._checkpointer, wait=wait)
        except TuneError as exc:
            error = exc
        training.raise_if_any_rank_failed(error, self._dist, "Checking the loaded checkpoint files")

    def _stop_and_exit(self, epoch: int) -> None:
        # every rank is here (any_rank agreed); a rank that got no signal itself stops for the others'
        signum = self._stop.signum if self._stop.signum is not None else int(signal.SIGTERM)
        name = signal.Signals(signum).name
        if self._last_checkpoint is not None and self._last_checkpoint_step == self.global_step:
            folder = self._last_checkpoint  # just written (epoch end or a step checkpoint): no second save
        else:
            folder = self.save_checkpoint(epoch=epoch, step_checkpoint=True)
        self._checkpoint_writer.finish()  # the save must be complete before the resume command is printed
        if self._is_rank_zero:
            training.report_stop(name, self.global_step, folder, RECIPE_NAME)
        raise SystemExit(128 + int(signum))

    def _log_memory(self, title: str) -> None:
        stats = memory.get_memory_stats(self._device)
        log.info("Memory %s (rank 0): %s", title, ", ".join(f"{k}={v:.2f} GB" for k, v in stats.items()))

    def cleanup(self) -> None:
        if self._metric_logger is not None:
            self._metric_logger.close()
        training.destroy_distributed()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run [--nproc_per_node N ...] full_finetune_distributed --config ...``."""
    # Log lines go through tqdm.write: they appear above the progress bar instead of breaking it.
    logging.basicConfig(level=logging.INFO, handlers=[training.ProgressBarLogHandler(sys.stderr)])
    recipe = None
    try:
        recipe = FullFinetuneRecipeDistributed(cfg=cfg)
        recipe.setup()
        recipe.train()
    except training.RankErrors as exc:
        if exc.quiet:  # rank 0 prints the one message for all ranks
            raise SystemExit(exc.exit_code) from None
        raise
    finally:
        if recipe is not None:
            recipe.cleanup()
        else:
            training.destroy_distributed()


if __name__ == "__main__":
    sys.exit(recipe_main())

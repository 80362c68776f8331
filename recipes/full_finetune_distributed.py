"""Full finetune of a decoder model on several devices (or nodes) with FSDP2, launched by torchrun.

    tune run --nproc_per_node 8 full_finetune_distributed --config llama2/13B_full

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
import os
import signal
import sys
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist
from omegaconf import DictConfig

from torchtune import config, training, utils
from torchtune.training import memory

log = logging.getLogger("torchtune")

RECIPE_NAME = "full_finetune_distributed"
# Every key this recipe reads. Those a config may leave out get the default of training.FINETUNE_DEFAULTS
# (docs/recipe.md); the shipped configs spell each one out. An unknown key is a typo.
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
    "activation_offloading_use_streams",
    "save_every_n_steps",
    "keep_last_n_checkpoints",
    "async_checkpoint",
    "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats",
    "validation_dataset",
    "eval_every_n_steps",
    "eval_after_training",
    "global_batch_size",
    # torchtune's keys: honoured, or accepted with one log line saying what they do here (training.config_notes)
    "profiler",
    "log_level",
    "cudnn_deterministic_mode",
    "ac_mode",
    "ac_option",
    "collate_fn",
    "custom_sharded_layers",
    "tensor_parallel_dim",
    "tensor_parallel_plan",
    "data_parallel_shard_dim",
    "data_parallel_replicate_dim",
)
# `tune run --nproc_per_node N` starts only recipes that say they run on several processes.
DISTRIBUTED = True


def validate_config(cfg: DictConfig) -> None:
    """Every check of ``cfg`` that needs no model, data, device, file or process group: keys, value
    ranges, device/dtype/backend spellings, conflicting settings, optimizers that cannot take sharded
    parameters. ``__init__`` runs it first; ``tune validate`` and ``tune run --nproc_per_node`` (before
    starting any process) run it alone.

    Raises:
        ConfigError: naming the key to change.
    """
    training.check_finetune_config(cfg, RECIPE_KEYS, RECIPE_NAME, "llama2/tiny_full_distributed")
    training.check_distributed_settings(cfg)


class FullFinetuneRecipeDistributed:
    """Full finetuning of every parameter of a decoder model, sharded over processes with FSDP2.

    Features (each switched in the YAML config; details in docs/distributed.md and docs/recipe.md):
        - FSDP2 (``fully_shard``) on every decoder layer and the root: bf16 or fp32 parameters
          (``dtype``), ``fsdp_param_dtype: bf16`` to compute in bf16 on fp32 weights and optimizer
          state, ``fsdp_reduce_dtype: fp32`` to sum gradients in fp32, ``fsdp_reshard_after_forward``,
          ``fsdp_cpu_offload`` (parameters, gradients and optimizer state in pinned host memory, the
          in-backward steps on a CPU worker thread overlapped with backward);
        - weights loaded memory-mapped, each rank copying only its shards;
        - activation checkpointing and offloading, chunked loss and compile as on one device;
        - optimizer in backward on the sharded parameters (stepped after each reduce-scatter; one
          optimizer per parameter or, ``optimizer_in_bwd_group: layer``, per decoder layer), or a
          standard optimizer with gradient accumulation and clipping by the global norm;
        - ``batch_size`` is each process's batch, as in torchtune; or ``global_batch_size`` (with
          ``batch_size: null``) is split evenly over the processes, so that any number of them computes
          the gradient one process would (same data order, too: the run can resume on another world
          size). The loss is normalised by the token count of all ranks;
        - step checkpoints with torch.distributed.checkpoint (every rank writes its shards), atomic,
          optionally in the background (``async_checkpoint``);
          epoch and final checkpoints as a full Hugging Face folder written by rank 0;
        - metrics and checkpoints as in the single-device recipe, from rank 0, with losses over all
          ranks; the validation set split over the ranks; SIGINT/SIGTERM save a resumable checkpoint;
        - ``eval_after_training`` as on one device: every rank runs the requests, rank 0 reports.

    Raises (as ``TuneError``, printed once, by rank 0): everything the single-device recipe raises;
    a backend that does not fit the device; a ``global_batch_size`` that does not split over the processes;
    processes started with different configs; a bitsandbytes optimizer; a resume from a checkpoint
    this recipe did not write, or that is damaged or does not fit. Each message names what to change.
    """

    def __init__(self, cfg: DictConfig) -> None:
        validate_config(cfg)
        self._cfg = cfg
        training.apply_process_settings(cfg)  # log_level, cudnn_deterministic_mode
        if str(cfg.device).startswith("cuda"):
            memory.set_cuda_alloc_conf()  # before the first CUDA allocation
        self._dist = training.init_distributed(cfg.device, cfg.dist_backend)
        self._device = self._dist.device
        self._is_rank_zero = self._dist.is_rank_zero
        if not self._is_rank_zero:
            log.setLevel(logging.WARNING)  # one log, rank 0's; warnings and errors from every rank
        training.log_config_notes(cfg, distributed=True)  # torchtune keys that do nothing here, one line each
        training.check_same_config(cfg, self._dist)
        # Rank 0 decides the seed (seed: null draws one) before any random number is drawn: with a seed
        # per rank each would shuffle differently and the ranks' slices of the data would overlap.
        self._seed = training.agree_on_seed(cfg.seed, self._dist)
        self._dtype = utils.get_dtype(cfg.dtype, self._device)
        # on the CPU the shards are in host memory already: fsdp_cpu_offload does nothing (a config note says so)
        self._cpu_offload = bool(cfg.fsdp_cpu_offload) and self._device.type == "cuda"
        self._local_batch_size = training.local_batch_size(cfg, self._dist)  # batch_size: per process
        self._settings = training.RunSettings.from_config(cfg, world_size=self._dist.world_size)
        self._checkpoints = training.CheckpointPolicy.from_config(cfg)
        self._output_dir = Path(str(cfg.checkpointer.output_dir)).expanduser()
        self._checkpoint_writer = training.ShardedCheckpointWriter(self._dist, async_save=cfg.async_checkpoint)
        self._grad_norm = training.GradNormTracker()
        self._nan_guard = training.NonFiniteLossGuard(self._device)
        # one process says what a signal does: rank 0, or the `tune run --nproc_per_node` launcher when it started us
        self._stop = training.StopSignals(announce=self._is_rank_zero and not training.launcher_reports())
        self._eval = training.EvalAfterTraining(cfg)
        self._metrics = training.StepMetrics(cfg, device=self._device, grad_norm=self._grad_norm, info=self._dist)
        self.progress = training.TrainingProgress()

    @property
    def global_step(self) -> int:
        return self.progress.global_step

    # ------------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Build everything in the single-device recipe's order, cheapest check first: resume plan,
        tokenizer, data, checkpointer and the model's shapes against it; then the sharded model, its
        weights, the optimizer and loss. Each rank works without communicating, and the ranks agree after
        the checks and again after the weights that every rank succeeded (one message, not a hang, when
        one failed): a missing data column stops every rank before any weight is read."""
        cfg = self._cfg
        training.prepare_output_dir(cfg, self._dist)  # another run's checkpoints there: stop (or overwrite=True)
        self._on_every_rank("Checking the config, tokenizer, data and checkpoint", self._check_cheap_things_first, cfg)
        self._on_every_rank("Building the sharded model and optimizer", self._setup_model_and_optimizer, cfg)
        if self._resume is not None:
            training.load_sharded_checkpoint(
                self._resume.checkpoint_dir, model=self._model, optimizer=self._optimizer, info=self._dist
            )
        self._lr_scheduler = training.build_lr_scheduler(
            cfg.lr_scheduler,
            self._optimizer,
            num_training_steps=self._steps.total_steps,
            state_dict=self._resume.lr_scheduler_state if self._resume else None,
        )
        if self._resume is not None:
            self._resume.drop_loaded_states()  # they live in the optimizer and scheduler now
        # the resume is accepted now: rank 0's metrics.jsonl drops the lines of the steps it runs again
        self._metrics.open(cfg, self._data, resumed_step=self.global_step if self._resume is not None else None)
        self._profiler = training.build_profiler(cfg.profiler)  # nothing unless profiler.enabled
        self._metrics.log_memory("after setup (rank 0)")

    def _on_every_rank(self, what: str, build: Callable[..., Any], *args: Any) -> Any:
        """``build(*args)`` on every rank, then agreed: if it failed on any rank, every rank raises one
        ``RankErrors`` (printed once, by rank 0) instead of going on into a collective."""
        error, result = None, None
        try:
            result = build(*args)
        except Exception as exc:  # noqa: BLE001 - reported on every rank by raise_if_any_rank_failed
            error = exc
        training.raise_if_any_rank_failed(error, self._dist, what)
        return result

    def _check_cheap_things_first(self, cfg: DictConfig) -> None:
        self._resume = training.resolve_resume(cfg, self._settings)
        training.check_resume_is_sharded(self._resume)
        self.seed, self.progress, max_steps = training.seed_or_restore(
            self._resume, seed=self._seed, settings=self._settings
        )
        shards_on = torch.device("cpu") if self._cpu_offload else self._device  # where they are stepped
        self._rounding = training.rounding_for_run(  # each rank rounds its shards with its own stream
            cfg, self._resume, seed=self.seed, dtype=self._dtype, device=shards_on, info=self._dist
        )
        self._eval.resolve_tasks()  # a missing lm-eval or a typo in a task name, before training
        self._tokenizer = config.instantiate(cfg.tokenizer)
        batch_size = self._local_batch_size
        self._data = training.build_dataloader(
            cfg.dataset,
            self._tokenizer,
            batch_size=batch_size,
            shuffle=cfg.shuffle,
            seed=self.seed,
            info=self._dist,
            device=self._device,
        )
        # Each rank evaluates its share of the validation set; the loss sums are added over ranks.
        self._validation = training.build_validation(
            cfg.validation_dataset,
            self._tokenizer,
            batch_size=batch_size,
            every_n_steps=cfg.eval_every_n_steps,
            info=self._dist,
        )
        self._steps = training.TrainingSteps(
            self._data,
            self.progress,
            self._settings,
            seed=self.seed,
            max_steps_per_epoch=max_steps,
            show_progress=self._is_rank_zero,
            rounding=self._rounding,  # every rank's stream, gathered when a checkpoint is saved
        )
        # The checkpointer always reads the base model folder: its config.json and file layout are
        # what the HF folders this run writes are made of. A resumed run takes its weights from the
        # sharded state instead.
        self._checkpointer = training.build_checkpointer(cfg.checkpointer, None)
        training.check_model_fits(cfg, self._checkpointer, self._tokenizer, dtype=self._dtype, resume=self._resume)

    def _setup_model_and_optimizer(self, cfg: DictConfig) -> None:
        self._model = self._setup_model(cfg)
        self._activations = training.get_act_offloading_ctx_manager(
            self._model, cfg.enable_activation_offloading, use_streams=cfg.activation_offloading_use_streams
        )
        # One optimizer over all sharded parameters, or, in backward, one per sharded parameter stepped from
        # its post-accumulate-grad hook, which FSDP2 runs right after that parameter's reduce-scatter. A
        # resumed state is loaded by load_sharded_checkpoint once every rank got here.
        self._optimizer = training.build_optimizer(
            cfg.optimizer,
            self._model,
            optimizer_in_bwd=self._settings.optimizer_in_bwd,
            grad_norm=self._grad_norm,
            in_bwd_group=cfg.optimizer_in_bwd_group,
            rounding=self._rounding,
            cpu_worker=self._cpu_offload,  # host shards: CPU steps overlap backward
        )
        # Standard mode: clip (by the norm of the whole gradient over all ranks) and step after backward.
        self._step_optimizer = partial(
            training.step_optimizer,
            self._optimizer,
            clip_grad_norm=cfg.clip_grad_norm,
            grad_norm=self._grad_norm,
            rounding=self._rounding,
        )
        self._loss_fn = config.instantiate(cfg.loss)

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
        cpu_offload = self._cpu_offload
        # host RAM and the locked-memory limit against the machine's, before any weight loads
        pin = training.check_offload_for_run(model, cfg, self._dist.world_size, self._dtype) if cpu_offload else None
        param_dtype = cfg.fsdp_param_dtype
        training.shard_model(
            model,
            mesh=self._dist.mesh,
            param_dtype=None if param_dtype is None else utils.get_dtype(param_dtype, self._device),
            reduce_dtype=torch.float32 if cfg.fsdp_reduce_dtype == "fp32" else None,
            reshard_after_forward=bool(cfg.fsdp_reshard_after_forward),
            cpu_offload=cpu_offload,
            pin_memory=pin,
            sum_gradients=True,  # each rank's loss is divided by the token count of all ranks
        )
        shard_device = torch.device("cpu") if cpu_offload else self._device
        if self._resume is None:  # each rank reads only its rows, one tensor at a time
            training.load_sharded_weights(model, self._checkpointer.open_weights(), device=shard_device)
        else:
            model.to_empty(device=shard_device)
        model.init_buffers(self._device)
        training.log_sharded_model(model, self._dist.world_size, cpu_offload)
        return model

    # ------------------------------------------------------------------------------------------
    # training
    # ------------------------------------------------------------------------------------------
    def train(self) -> None:
        """The training loop, on every rank: epochs of steps, logging, validation, checkpointing, graceful stop."""
        with self._stop, self._profiler:
            for epoch in self._steps.epochs():
                for micro_batches in self._steps.steps():
                    # Each micro-batch's mean loss weighted by its share of the label tokens of the step on all
                    # ranks (one host all-reduce per step), with FSDP summing the gradients: the ranks compute
                    # one process's gradient of the global batch.
                    shares = training.label_token_shares(micro_batches, self._dist)
                    lr = self._optimizer.param_groups[0]["lr"]  # the LR this step applies
                    logged = self._metrics.start_step(self.global_step + 1, micro_batches)
                    step_loss = torch.zeros((), device=self._device)
                    for i, batch in enumerate(micro_batches):
                        if len(micro_batches) > 1:
                            # Gradients accumulate unsharded until the last micro-batch, then FSDP2
                            # reduce-scatters once per step (costs a full gradient per rank meanwhile).
                            self._model.set_requires_gradient_sync(i == len(micro_batches) - 1)
                        loss = training.forward_backward(
                            self._model,
                            self._loss_fn,
                            batch,
                            device=self._device,
                            activations_ctx=self._activations,
                            loss_scale=shares[i],
                        )
                        step_loss += loss * shares[i]
                    self._step_optimizer(self._model.parameters())  # in backward: already stepped
                    if self._lr_scheduler is not None:
                        self._lr_scheduler.step()
                    step = self._steps.finish_step()
                    self._profiler.step()
                    # The step's loss over all ranks (queued on the device: no host sync); every rank
                    # then holds the same value, so the NaN guard stops all of them at the same step.
                    if self._dist.world_size > 1:
                        dist.all_reduce(step_loss)
                    self._nan_guard.record(step_loss, step)
                    if logged:  # every rank: the token counts and the gradient norm are summed over ranks
                        self._metrics.log_step(  # the loss, norm and NaN guard in one read
                            epoch=epoch,
                            step=step,
                            loss=step_loss,
                            lr=lr,
                            bar=self._steps.bar,
                            nan_guard=self._nan_guard,
                        )
                        self._nan_guard.check(epoch, self._checkpoints.last_folder)
                        self._check_loaded_checksums(wait=False)  # background checksums: no wait
                    self._metrics.log_validation(self._validation, self._model, self._loss_fn, step)
                    if self._checkpoints.step_checkpoint_due(self.progress, self._steps.steps_per_epoch):
                        self.save_checkpoint(epoch=epoch, step_checkpoint=True)
                    self._stop_if_requested(epoch)
                self._metrics.log_validation(
                    self._validation, self._model, self._loss_fn, self.global_step, end_of_epoch=True
                )
                self._steps.finish_epoch()
                self._metrics.end_epoch(epoch)  # a collective: the padding share of all ranks
                self.save_checkpoint(epoch=epoch, step_checkpoint=False)
                self._stop_if_requested(epoch)
        self._checkpoint_writer.finish()  # a step save still in flight (async_checkpoint)
        self._metrics.log_memory("end of training (peaks, rank 0)")
        self._metrics.report(checkpoint=self._checkpoints.last_folder)

    # ------------------------------------------------------------------------------------------
    # checkpointing, stopping, evaluation
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
        self._nan_guard.check(epoch, self._checkpoints.last_folder)
        # Nothing trained from a damaged checkpoint is saved: wait for its background checksums.
        self._check_loaded_checksums(wait=True)
        final = not step_checkpoint and self._steps.finished
        if final:
            self._checkpoint_writer.finish()  # publish a step save in flight first
            # rank 0 writes the HF folder one gathered tensor at a time (never the whole model in its RAM)
            folder = training.save_full_weights(
                self._model, self._checkpointer, self._dist, epoch=epoch, step=self.global_step
            )
        else:
            folder = self._output_dir / (f"step_{self.global_step}" if step_checkpoint else f"epoch_{epoch}")
            write_weights = training.full_weights_writer(self._model, self._checkpointer, self._dist)
            self._checkpoint_writer.save(
                folder,
                model=self._model,
                optimizer=self._optimizer,
                recipe_state=self._steps.recipe_state(
                    self._optimizer, self._lr_scheduler, self._model, optimizer_state=training.SHARDED_STATE_MARKER
                ),
                step=self.global_step,
                epoch=epoch,
                intermediate=step_checkpoint,
                write_weights=None
                if step_checkpoint
                else write_weights,  # every rank: the HF folder of an epoch checkpoint, streamed to rank 0
                background=step_checkpoint,  # with async_checkpoint: published by the next save or the end
            )
        pending = self._checkpoint_writer.pending is not None
        log.info("%s checkpoint to %s%s", "Saving" if pending else "Saved", folder, "" if final else " (resumable)")
        resumed_from = self._resume.checkpoint_dir if self._resume else None
        self._checkpoints.saved(
            folder, self.global_step, step_checkpoint=step_checkpoint, protected=resumed_from, prune=self._is_rank_zero
        )
        return folder

    def _check_loaded_checksums(self, wait: bool) -> None:
        """The background checksum checks of what set-up read (``checkpointer.verify_checksums``), agreed
        by all ranks: a damaged file stops every rank with one message."""
        check = partial(training.check_loaded_checksums, wait=wait)
        self._on_every_rank("Checking the loaded checkpoint files", check, self._resume, self._checkpointer)

    def _stop_if_requested(self, epoch: int) -> None:
        """After a signal to any rank (agreed by all), every rank saves a step checkpoint and exits."""
        if not self._stop.requested(self._dist):
            return
        folder = self._checkpoints.saved_at(self.global_step)  # just written (epoch end or a step checkpoint)
        if folder is None:
            folder = self.save_checkpoint(epoch=epoch, step_checkpoint=True)
        self._checkpoint_writer.finish()  # the save must be complete before the resume command is printed
        if self._is_rank_zero:
            training.report_stop(self._stop.name, self.global_step, folder, RECIPE_NAME)
        raise SystemExit(self._stop.exit_code)

    def evaluate(self) -> Optional[Dict[str, Any]]:
        """``eval_after_training`` on the final (sharded) model, after its gathered save: every rank runs
        the same lm-eval requests, since each forward needs every rank's shards; rank 0 prints the
        table, logs the scores and writes ``eval_results.json`` into the final folder."""
        score = partial(self._eval.score, step=self.global_step, checkpoint=self._checkpoints.last_folder)
        return self._on_every_rank("Scoring the final model", score, self._model, self._tokenizer, self._metrics)

    def cleanup(self, every_rank_done: bool = False) -> None:
        self._metrics.close()
        training.destroy_distributed(self._dist if every_rank_done else None)


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
        recipe.evaluate()  # eval_after_training: null does nothing
        recipe.cleanup(every_rank_done=True)  # a barrier first: no rank leaves while another is in a collective
        recipe = None
    except training.RankErrors as exc:
        if exc.quiet:  # rank 0 prints the one message for all ranks
            raise SystemExit(exc.exit_code) from None
        if not training.is_lost_peer_error(exc):
            raise
        _lost_peer(exc)
    except KeyboardInterrupt:  # a second SIGINT/SIGTERM: stop at once, without saving
        if training.is_rank_zero() and not training.launcher_reports():
            print("Stopped at once (a second signal): the step in progress was not saved.", file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None
    except Exception as exc:
        if not training.is_lost_peer_error(exc):
            raise
        _lost_peer(exc)
    finally:
        if recipe is not None:
            recipe.cleanup()
        else:
            training.destroy_distributed()


def _lost_peer(exc: BaseException) -> None:
    """Another process of the run is gone (killed, or crashed): its own exit says why, not this process's
    traceback. Tell the launcher (which names that process), or, started by torchrun itself, say it in one line."""
    rank = training.get_world_size_and_rank()[1] if dist.is_initialized() else int(os.environ.get("RANK", 0))
    cause = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
    if not training.report_to_launcher("lost_peer", rank, cause=cause):
        print(
            f"Rank {rank}: another process of this run ended in the middle of a collective ({cause}); see that "
            "process's messages (and torchrun's exit codes) for why. No checkpoint was harmed: resume from the last "
            "complete one in the output_dir.",
            file=sys.stderr,
        )
    raise SystemExit(1) from None


if __name__ == "__main__":
    training.exit_process(recipe_main)  # no interpreter finalization under torchrun: see its docstring

"""Full finetune of a decoder model on one device, with optimizer in backward.

Copy it with ``tune cp full_finetune_single_device my_recipe.py`` and edit it: the training loop is
all in this file, built from the functions of ``torchtune.training``. docs/recipe.md describes every
config key and behaviour.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from omegaconf import DictConfig
from torch.optim import Optimizer

from torchtune import config, training, utils
from torchtune._errors import TuneError
from torchtune.training import memory

log = logging.getLogger("torchtune")

RECIPE_NAME = "full_finetune_single_device"
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
    "optimizer_on_cpu",
    "lr_scheduler",
    "loss",
    "clip_grad_norm",
    "compile",
    "liger_kernels",
    "device",
    "dtype",
    "bf16_stochastic_rounding",
    "enable_activation_checkpointing",
    "enable_activation_offloading",
    "activation_offloading_use_streams",
    "save_every_n_steps",
    "keep_last_n_checkpoints",
    "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats",
    "validation_dataset",
    "eval_every_n_steps",
    "eval_after_training",
    # torchtune's keys: honoured, or accepted with one log line saying what they do here (training.config_notes)
    "profiler",
    "log_level",
    "cudnn_deterministic_mode",
    "ac_mode",
    "ac_option",
    "collate_fn",
)


def validate_config(cfg: DictConfig) -> None:
    """Every check of ``cfg`` that needs no model, data, device or file: keys, value ranges, device and
    dtype spellings, conflicting settings. ``__init__`` runs it first; ``tune validate`` runs it alone.

    Raises:
        ConfigError: naming the key to change.
    """
    training.check_finetune_config(cfg, RECIPE_KEYS, RECIPE_NAME, "llama2/7B_full_low_memory")
    training.check_stochastic_rounding(cfg)


class FullFinetuneRecipeSingleDevice:
    """Full finetuning of every parameter of a decoder model on a single device.

    Features (each switched in the YAML config; details in docs/recipe.md):
        - bf16 or fp32 weights built in place on the device, loaded memory-mapped (HF or Meta format);
          bf16 weight updates rounded stochastically, so updates below half a bf16 step are not lost;
        - activation checkpointing and offloading; liger-kernel's Triton RMSNorm, RoPE, SwiGLU and fused
          linear cross-entropy on CUDA (``liger_kernels``, ``loss._component_``);
        - optimizer in backward: one optimizer per parameter (or per decoder layer) stepped from the
          post-accumulate-grad hooks, which free the gradients (torch, bitsandbytes or torchao
          optimizers); or a standard
          optimizer with gradient accumulation and clipping;
        - ``optimizer_on_cpu``: the weights on the device, the optimizer (state included) on the host: each
          gradient copied out on its own stream as backward produces it, stepped on the other cores
          (``torchtune.training.CPUAdamW``), the weight copied back before the next forward;
        - an LR schedule; a loss over the final hidden states (chunked: no full fp32 logits), computed
          only at the positions that have a label (prompt and padding tokens skip the output
          projection);
        - packed datasets (best-fit packs, built once and cached next to the dataset); the share of
          padding is logged per step and per epoch;
        - step and epoch checkpoints written atomically, tensor by tensor (no device memory beyond
          the weights), with checksums computed while writing; exact resume, also mid-epoch, with
          the optimizer state memory-mapped and restored one parameter at a time;
        - checkpoint sizes checked on load, sums before it or in the background
          (``checkpointer.verify_checksums``); a damaged file stops the run before anything is saved;
        - SIGINT/SIGTERM save a resumable checkpoint and print the resume command; a NaN loss stops
          the run without saving those weights.
        - metrics to output_dir/logs/metrics.jsonl and the loggers of ``metric_logger`` at once; a
          validation loss every ``eval_every_n_steps`` and at each epoch end; a run summary at the end.
        - ``eval_after_training``: the final model scored on lm-eval tasks (as ``eleuther_eval`` does),
          lm-eval's table printed and the scores written to the final checkpoint's
          ``eval_results.json`` and logged as ``eval/<task>/<metric>``.

    Raises (as ``TuneError``, printed as one paragraph by ``tune``): unknown or missing keys and
    values out of range; a device or dtype this machine cannot run; liger-kernel asked for off CUDA or not
    installed; conflicting optimizer settings;
    a missing optional package (lm-eval for ``eval_after_training``, checked with its tasks before
    training starts); an output_dir that holds another run's checkpoints or metrics (resume it, pick
    another output_dir, or set overwrite=True); a resume that cannot continue (missing or damaged state, another
    model, other optimizer/batch settings); weights or a tokenizer that do not fit the model; an
    empty dataset; a NaN or infinite loss; on a GPU, a compiled kernel that cannot be built (the fused
    rounded optimizer step at set-up, FlexAttention for packed batches at the first step) rather than a
    silent, slower fallback. Each message names the key to change.
    """

    def __init__(self, cfg: DictConfig) -> None:
        validate_config(cfg)
        self._cfg = cfg
        training.apply_process_settings(cfg)  # log_level, cudnn_deterministic_mode
        training.log_config_notes(cfg, distributed=False)  # torchtune keys that do nothing here, one line each
        if str(cfg.device).startswith("cuda"):
            memory.set_cuda_alloc_conf()  # before the first CUDA allocation
        self._device = utils.get_device(cfg.device)
        if self._device.type == "cpu":
            memory.reuse_freed_host_memory_if_asked()  # TUNE_KEEP_FREED_HOST_MEMORY=1: no page faults per step
        self._dtype = utils.get_dtype(cfg.dtype, self._device)
        self._settings = training.RunSettings.from_config(cfg)
        self._checkpoints = training.CheckpointPolicy.from_config(cfg)
        self._grad_norm = training.GradNormTracker()
        # weights_changed tells whether low-precision updates are lost; fp32 updates never are, and
        # counting copies every weight on each logged step (a fifth of a small step on the CPU)
        self._weight_changes = training.WeightChangeTracker() if self._dtype != torch.float32 else None
        self._nan_guard = training.NonFiniteLossGuard(self._device)
        self._stop = training.StopSignals()
        self._eval = training.EvalAfterTraining(cfg)
        self._metrics = training.StepMetrics(
            cfg, device=self._device, grad_norm=self._grad_norm, weight_changes=self._weight_changes
        )
        self.progress = training.TrainingProgress()

    @property
    def global_step(self) -> int:
        return self.progress.global_step

    # ------------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Build everything, cheapest check first: resume plan, tokenizer, data, checkpointer and the
        model's shapes against it, the tokenizer and the resume state; only then the weights, optimizer,
        loss, LR schedule."""
        cfg = self._cfg
        training.prepare_output_dir(cfg)  # another run's checkpoints there: stop (or overwrite=True), load nothing
        self._eval.resolve_tasks()  # before training: a missing lm-eval or a typo in a task name
        self._resume = training.resolve_resume(cfg, self._settings)
        self.seed, self.progress, max_steps = training.seed_or_restore(
            self._resume, seed=cfg.seed, settings=self._settings
        )
        self._rounding = training.rounding_for_run(
            cfg, self._resume, seed=self.seed, dtype=self._dtype, device=self._device
        )

        # Cheapest first: a missing tokenizer file, a missing data column or a template that does not fit the
        # rows fails here, in seconds, before minutes of reading weights.
        self._tokenizer = config.instantiate(cfg.tokenizer)
        batch_size = self._settings.batch_size
        self._data = training.build_dataloader(
            cfg.dataset,
            self._tokenizer,
            batch_size=batch_size,
            shuffle=cfg.shuffle,
            seed=self.seed,
            device=self._device,
        )
        self._validation = training.build_validation(
            cfg.validation_dataset, self._tokenizer, batch_size=batch_size, every_n_steps=cfg.eval_every_n_steps
        )
        steps = dict(
            seed=self.seed, max_steps_per_epoch=max_steps, rounding=self._rounding
        )  # what its checkpoints record
        self._steps = training.TrainingSteps(self._data, self.progress, self._settings, **steps)
        self._checkpointer = training.build_checkpointer(cfg.checkpointer, self._resume)
        training.check_model_fits(cfg, self._checkpointer, self._tokenizer, dtype=self._dtype, resume=self._resume)
        self._model = training.build_model(
            cfg.model,
            device=self._device,
            dtype=self._dtype,
            state_dict=self._checkpointer.load_checkpoint()["model"],
            enable_activation_checkpointing=cfg.enable_activation_checkpointing,
            compile_model=cfg.compile,
            liger_kernels=cfg.liger_kernels,
        )
        self._activations = training.get_act_offloading_ctx_manager(
            self._model, cfg.enable_activation_offloading, use_streams=cfg.activation_offloading_use_streams
        )
        self._optimizer = self._setup_optimizer(
            cfg.optimizer,
            optimizer_in_bwd=self._settings.optimizer_in_bwd,
            opt_state_dict=self._resume.optimizer_state if self._resume else None,
        )
        self._loss_fn = config.instantiate(cfg.loss)
        lr_state = self._resume.lr_scheduler_state if self._resume else None
        self._lr_scheduler = training.build_lr_scheduler(
            cfg.lr_scheduler, self._optimizer, num_training_steps=self._steps.total_steps, state_dict=lr_state
        )
        if self._resume is not None:
            self._resume.drop_loaded_states()  # they live in the optimizer and scheduler now
        # the resume is accepted now: metrics.jsonl drops the lines of the steps it runs again
        resumed_step = self.global_step if self._resume is not None else None
        self._metric_logger = self._metrics.open(cfg, self._data, resumed_step=resumed_step)
        self._profiler = training.build_profiler(cfg.profiler)  # nothing unless profiler.enabled
        self._metrics.log_memory("after setup")

    def _setup_optimizer(
        self, cfg_optimizer: DictConfig, optimizer_in_bwd: bool, opt_state_dict: Optional[Dict[str, Any]] = None
    ) -> Optimizer:
        """One optimizer over all parameters, or, in backward, one per parameter: ``build_optimizer``
        registers each one's step on its parameter with ``register_post_accumulate_grad_hook`` and
        returns them as an ``OptimInBackwardWrapper``. The recipe holds that one object either way."""
        optimizer = training.build_optimizer(
            cfg_optimizer,
            self._model,
            optimizer_in_bwd=optimizer_in_bwd,
            grad_norm=self._grad_norm,
            in_bwd_group=self._cfg.optimizer_in_bwd_group,
            rounding=self._rounding,
            weight_changes=self._weight_changes,
            host_step=bool(self._cfg.optimizer_on_cpu),
        )
        if opt_state_dict is not None:
            training.load_optimizer_state(optimizer, opt_state_dict)
        return optimizer

    # ------------------------------------------------------------------------------------------
    # training
    # ------------------------------------------------------------------------------------------
    def train(self) -> None:
        """The training loop: epochs of steps, logging, validation, checkpointing, graceful stop."""
        steps, metrics = self._steps, self._metrics
        with self._stop, self._profiler:
            for epoch in steps.epochs():
                for micro_batches in steps.steps():
                    logged = metrics.start_step(self.global_step + 1, micro_batches)
                    lr = self._optimizer.param_groups[0]["lr"]  # the LR this step applies
                    # Each micro-batch's mean loss weighted by its share of the step's label tokens: the
                    # step of one batch of all of them. In backward the optimizers step inside backward().
                    step_loss = torch.zeros((), device=self._device)
                    for batch, share in zip(micro_batches, training.label_token_shares(micro_batches)):
                        step_loss += share * training.forward_backward(
                            self._model,
                            self._loss_fn,
                            batch,
                            device=self._device,
                            activations_ctx=self._activations,
                            loss_scale=share,
                        )
                    # Standard mode: clip and step. In backward: already stepped, nothing left to do.
                    training.step_optimizer(
                        self._optimizer,
                        self._model.parameters(),
                        clip_grad_norm=self._cfg.clip_grad_norm,
                        grad_norm=self._grad_norm,
                        rounding=self._rounding,
                        weight_changes=self._weight_changes,
                    )
                    if self._lr_scheduler is not None:
                        self._lr_scheduler.step()
                    step = steps.finish_step()
                    self._profiler.step()
                    self._nan_guard.record(step_loss, step)  # on the device: no sync
                    if logged:  # the loss, norm, weight-change count and NaN guard in one read: one sync
                        metrics.log_step(
                            epoch=epoch, step=step, loss=step_loss, lr=lr, bar=steps.bar, nan_guard=self._nan_guard
                        )
                        self._check_loss_and_loaded_checkpoint(epoch, before_save=False)
                    metrics.log_validation(self._validation, self._model, self._loss_fn, step)
                    if self._checkpoints.step_checkpoint_due(self.progress, steps.steps_per_epoch):
                        self.save_checkpoint(epoch=epoch, step_checkpoint=True)
                    if self._stop.requested():
                        self._stop_and_exit(epoch)
                metrics.log_validation(
                    self._validation, self._model, self._loss_fn, self.global_step, end_of_epoch=True
                )
                metrics.end_epoch(epoch)
                steps.finish_epoch()
                self.save_checkpoint(epoch=epoch, step_checkpoint=False)
                if self._stop.requested():
                    self._stop_and_exit(epoch)
        metrics.log_memory("end of training (peaks)")
        metrics.report(checkpoint=self._checkpoints.last_folder)

    # ------------------------------------------------------------------------------------------
    # checkpointing, stopping
    # ------------------------------------------------------------------------------------------
    def save_checkpoint(self, epoch: int, step_checkpoint: bool = False) -> Path:
        """Save the weights (input format) and, unless this is the final save, the recipe state.

        ``step_checkpoint`` saves into ``output_dir/step_N``; otherwise ``output_dir/epoch_N``. The NaN
        guard is checked first: weights after a NaN/inf loss are never written.
        """
        self._check_loss_and_loaded_checkpoint(epoch, before_save=True)
        # state_dict() holds references, not copies; the checkpointer moves one tensor at a time to
        # the host and converts it there, so a save needs no device memory beyond the weights.
        state: Dict[str, Any] = {"model": self._model.state_dict()}
        final = not step_checkpoint and self._steps.finished
        if not final:
            state.update(self._steps.recipe_state(self._optimizer, self._lr_scheduler, self._model))
        folder = Path(
            self._checkpointer.save_checkpoint(state, epoch=epoch, step=self.global_step, intermediate=step_checkpoint)
        )
        log.info("Saved checkpoint to %s%s", folder, "" if final else " (resumable)")
        resumed_from = self._resume.checkpoint_dir if self._resume else None
        self._checkpoints.saved(folder, self.global_step, step_checkpoint=step_checkpoint, protected=resumed_from)
        return folder

    def _check_loss_and_loaded_checkpoint(self, epoch: int, *, before_save: bool) -> None:
        """Stop on a non-finite loss, or on a damaged checkpoint found by the background checksums
        (``checkpointer.verify_checksums: background``). Before a save the checksums are waited for,
        so nothing trained from a damaged file is saved; a non-finite loss waits for them too, since
        a damaged checkpoint is then the likelier cause and the one to report."""
        try:
            self._nan_guard.check(epoch, self._checkpoints.last_folder)
        except TuneError:
            training.check_loaded_checksums(self._resume, self._checkpointer, wait=True)
            raise
        training.check_loaded_checksums(self._resume, self._checkpointer, wait=before_save)

    def _stop_and_exit(self, epoch: int) -> None:
        # a checkpoint of this step just written (epoch end or a step checkpoint): no second save
        folder = self._checkpoints.saved_at(self.global_step) or self.save_checkpoint(epoch=epoch, step_checkpoint=True)
        training.report_stop(self._stop.name, self.global_step, folder, RECIPE_NAME)
        raise SystemExit(self._stop.exit_code)

    def evaluate(self) -> Optional[Dict[str, Any]]:
        """Score the final model on ``eval_after_training``'s tasks (nothing when it is null): print
        lm-eval's table, write ``eval_results.json`` into the final checkpoint folder, log the scores."""
        folder = self._checkpoints.last_folder
        return self._eval.score(self._model, self._tokenizer, self._metrics, step=self.global_step, checkpoint=folder)

    def cleanup(self) -> None:
        self._metrics.close()


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run full_finetune_single_device --config ...``."""
    # Log lines go through tqdm.write: they appear above the progress bar instead of breaking it.
    logging.basicConfig(level=logging.INFO, handlers=[training.ProgressBarLogHandler(sys.stderr)])
    recipe = FullFinetuneRecipeSingleDevice(cfg=cfg)
    recipe.setup()
    try:
        recipe.train()
        recipe.evaluate()  # eval_after_training: null does nothing
    finally:
        recipe.cleanup()


if __name__ == "__main__":
    sys.exit(recipe_main())

"""Full finetune of a decoder model on one device, with optimizer in backward.

Copy it with ``tune cp full_finetune_single_device my_recipe.py`` and edit it: the training loop is
all in this file, built from the functions of ``torchtune.training``. docs/recipe.md describes every
config key and behaviour.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch
from omegaconf import DictConfig
from torch.optim import Optimizer
from tqdm import tqdm

from torchtune import config, evaluation, training, utils
from torchtune._errors import TuneError
from torchtune.training import memory

log = logging.getLogger("torchtune")

RECIPE_NAME = "full_finetune_single_device"
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
    "compile",
    "device",
    "dtype",
    "bf16_stochastic_rounding",
    "enable_activation_checkpointing",
    "enable_activation_offloading",
    "save_every_n_steps",
    "keep_last_n_checkpoints",
    "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats",
    "validation_dataset",
    "eval_every_n_steps",
    "eval_after_training",
)
# The keys of eval_after_training (those of the eleuther_eval recipe that say what to evaluate).
EVAL_AFTER_TRAINING_KEYS = ("tasks", "limit", "num_fewshot", "batch_size", "max_seq_length")


def validate_config(cfg: DictConfig) -> None:
    """Every check of ``cfg`` that needs no model, data, device or file: keys, value ranges, device and
    dtype spellings, conflicting settings. ``__init__`` runs it first; ``tune validate`` runs it alone.

    Raises:
        ConfigError: naming the key to change.
    """
    config.check_recipe_keys(cfg, RECIPE_KEYS, RECIPE_NAME, "llama2/7B_full_low_memory")
    training.check_value_types(cfg)
    utils.parse_device(cfg.device)
    utils.dtype_name(cfg.dtype)
    training.check_optimizer_settings(cfg)
    training.check_stochastic_rounding(cfg)
    training.check_loop_keys(cfg)
    eval_after_training_settings(cfg)


def eval_after_training_settings(cfg: DictConfig) -> Optional[evaluation.EvalSettings]:
    """The checked ``eval_after_training`` node, or None when it is null (no eval).

    Raises:
        ConfigError: a node that is not a mapping of exactly ``EVAL_AFTER_TRAINING_KEYS``, or a bad value.
    """
    node = cfg.eval_after_training
    if node is None:
        return None
    if not isinstance(node, DictConfig) or set(node.keys()) != set(EVAL_AFTER_TRAINING_KEYS):
        raise config.ConfigError(
            "eval_after_training must be null (no eval) or a mapping of exactly "
            f"{', '.join(EVAL_AFTER_TRAINING_KEYS)}, e.g. eval_after_training={{tasks: [truthfulqa_mc2], limit: null, "
            f"num_fewshot: null, batch_size: 8, max_seq_length: null}}; got {node!r}."
        )
    return evaluation.eval_settings(
        node, prefix="eval_after_training.", seed=cfg.seed if cfg.seed is not None else 1234
    )


class FullFinetuneRecipeSingleDevice:
    """Full finetuning of every parameter of a decoder model on a single device.

    Features (each switched in the YAML config; details in docs/recipe.md):
        - bf16 or fp32 weights built in place on the device, loaded memory-mapped (HF or Meta format);
          bf16 weight updates rounded stochastically, so updates below half a bf16 step are not lost;
        - activation checkpointing and offloading;
        - optimizer in backward: one optimizer per parameter (or per decoder layer) stepped from the
          post-accumulate-grad hooks, which free the gradients (torch, bitsandbytes or torchao
          optimizers); or a standard
          optimizer with gradient accumulation and clipping;
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
    values out of range; a device or dtype this machine cannot run; conflicting optimizer settings;
    a missing optional package (lm-eval for ``eval_after_training``, checked with its tasks before
    training starts); an output_dir that holds another run's checkpoints or metrics (resume it, pick
    another output_dir, or set overwrite=True); a resume that cannot continue (missing or damaged state, another
    model, other optimizer/batch settings); weights or a tokenizer that do not fit the model; an
    empty dataset; a NaN or infinite loss. Each message names the key to change.
    """

    def __init__(self, cfg: DictConfig) -> None:
        validate_config(cfg)
        self._cfg = cfg
        if str(cfg.device).startswith("cuda"):
            memory.set_cuda_alloc_conf()  # before the first CUDA allocation
        self._device = utils.get_device(cfg.device)
        if self._device.type == "cpu":
            memory.reuse_freed_host_memory()  # no page faults for each step's large gradients
        self._dtype = utils.get_dtype(cfg.dtype, self._device)
        self._settings = training.RunSettings.from_config(cfg)
        self._clip_grad_norm = cfg.clip_grad_norm
        self._log_every_n_steps = training.positive_int(cfg, "log_every_n_steps")
        self._log_peak_memory_stats = bool(cfg.log_peak_memory_stats)
        # the driver's figure (managed memory, context) at its peak, not a snapshot between steps
        self._device_peak: Optional[memory.DeviceMemoryPeak] = None
        if self._log_peak_memory_stats and self._device.type == "cuda":
            self._device_peak = memory.DeviceMemoryPeak(self._device).start()
        self._checkpoint_policy = training.CheckpointPolicy.from_config(cfg)
        self.progress = training.TrainingProgress()
        self.max_steps_per_epoch = self._settings.max_steps_per_epoch
        self._grad_norm = training.GradNormTracker()
        # weights_changed tells whether low-precision updates are lost; fp32 updates never are, and
        # counting copies every weight on each logged step (a fifth of a small step on the CPU)
        self._weight_changes = training.WeightChangeTracker() if self._dtype != torch.float32 else None
        self._nan_guard = training.NonFiniteLossGuard(self._device)
        self._stop = training.StopSignals()
        self._eval_settings = eval_after_training_settings(cfg)
        self._eval_tasks: Optional[evaluation.ResolvedTasks] = None
        self._resume: Optional[training.ResumePlan] = None
        self._last_checkpoint: Optional[Path] = None
        self._last_checkpoint_step: Optional[int] = None

    @property
    def global_step(self) -> int:
        return self.progress.global_step

    # ------------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Build everything, cheapest check first: resume plan, metric logger, tokenizer, data, checkpointer
        and the model's shapes against it and the tokenizer; only then the weights, optimizer, loss, LR schedule."""
        cfg = self._cfg
        training.prepare_output_dir(cfg)  # another run's checkpoints there: stop (or overwrite=True), load nothing
        if self._eval_settings is not None:  # before training: a missing lm-eval or a typo in a task name
            evaluation.import_lm_eval()
            self._eval_tasks = evaluation.resolve_tasks(self._eval_settings.tasks)
        self._resume = training.resolve_resume(cfg, self._settings)
        self.seed = utils.set_seed(self._resume.seed if self._resume else cfg.seed)
        if self._resume is not None:
            self.progress = self._resume.progress
            self.max_steps_per_epoch = self._resume.max_steps_per_epoch  # keeps the epoch length
            utils.set_rng_state(self._resume.rng_state)
        self._rounding = training.build_stochastic_rounding(
            cfg.bf16_stochastic_rounding,
            dtype=self._dtype,
            seed=self.seed,
            device=self._device,
            state=self._resume.stochastic_rounding_state if self._resume else None,
        )
        if self._rounding is not None and self._resume is not None and self._resume.stochastic_rounding_state is None:
            log.info("The checkpoint was saved without bf16_stochastic_rounding: its rounding stream starts now.")
        self._metric_logger = training.build_metric_logger(cfg)  # metrics.jsonl + the loggers listed in the config

        # Cheapest first: a missing tokenizer file, a missing data column or a template that does not fit the
        # rows fails here, in seconds, before minutes of reading weights.
        self._tokenizer = config.instantiate(cfg.tokenizer)
        self._data = training.build_dataloader(
            cfg.dataset, self._tokenizer, batch_size=self._settings.batch_size, shuffle=cfg.shuffle, seed=self.seed
        )
        self._validation = training.build_validation(
            cfg.validation_dataset,
            self._tokenizer,
            batch_size=self._settings.batch_size,
            every_n_steps=cfg.eval_every_n_steps,
        )
        self._steps_per_epoch = self._data.steps_per_epoch(
            batch_size=self._settings.batch_size,
            gradient_accumulation_steps=self._settings.gradient_accumulation_steps,
            max_steps=self.max_steps_per_epoch,
        )
        self._checkpointer = training.build_checkpointer(cfg.checkpointer, self._resume)
        # the model's shapes without its weights (meta device): checked against the checkpoint's config and
        # the tokenizer before any weight is read
        skeleton = training.model_skeleton(cfg.model, dtype=self._dtype)
        training.check_model_matches_checkpoint(skeleton, self._checkpointer)
        training.check_tokenizer_fits_model(self._tokenizer, skeleton, cfg.tokenizer)
        del skeleton
        self._model = training.build_model(
            cfg.model,
            device=self._device,
            dtype=self._dtype,
            state_dict=self._checkpointer.load_checkpoint()["model"],
            enable_activation_checkpointing=cfg.enable_activation_checkpointing,
            compile_model=cfg.compile,
        )
        self._activations = training.get_act_offloading_ctx_manager(self._model, cfg.enable_activation_offloading)
        if self._resume is not None:
            self._resume.check_model(self._model)

        self._optimizer = self._setup_optimizer(
            cfg.optimizer,
            optimizer_in_bwd=self._settings.optimizer_in_bwd,
            opt_state_dict=self._resume.optimizer_state if self._resume else None,
        )
        self._loss_fn = config.instantiate(cfg.loss)
        self._lr_scheduler = training.build_lr_scheduler(
            cfg.lr_scheduler,
            self._optimizer,
            num_training_steps=self._settings.epochs * self._steps_per_epoch,
            state_dict=self._resume.lr_scheduler_state if self._resume else None,
        )
        if self._resume is not None:
            self._resume.drop_loaded_states()  # they live in the optimizer and scheduler now
        if self._log_peak_memory_stats:
            self._log_memory("after setup")

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
        )
        if opt_state_dict is not None:
            training.load_optimizer_state(optimizer, opt_state_dict)
        return optimizer

    # ------------------------------------------------------------------------------------------
    # training
    # ------------------------------------------------------------------------------------------
    def train(self) -> None:
        """The training loop: epochs of steps, logging, checkpointing, graceful stop."""
        ga = self._settings.gradient_accumulation_steps
        progress = self.progress
        with self._stop:
            for epoch in range(progress.epochs_run, self._settings.epochs):
                start = progress.steps_run_in_epoch * ga * self._settings.batch_size
                self._data.sampler.set_epoch(epoch, start_index=start)
                pbar = training.epoch_progress_bar(self._steps_per_epoch, progress.steps_run_in_epoch)
                step_loss, step_label_tokens = torch.zeros((), device=self._device), 0
                interval_tokens, interval_start = 0, time.perf_counter()
                interval_positions = 0
                epoch_tokens, epoch_positions = 0, 0  # counted on the host batches: no sync
                for idx, batch in enumerate(self._data.dataloader):
                    if progress.steps_run_in_epoch >= self._steps_per_epoch:
                        break
                    last_micro_batch = (idx + 1) % ga == 0
                    will_log = last_micro_batch and (progress.global_step + 1) % self._log_every_n_steps == 0
                    if will_log:
                        self._grad_norm.arm(self._device)  # the in-backward hooks add to it
                        if self._weight_changes is not None:
                            self._weight_changes.arm(self._device)
                    lr = self._optimizer.param_groups[0]["lr"]  # the LR this step applies
                    batch_tokens, batch_positions = self._data.num_tokens(batch), batch["tokens"].numel()
                    interval_tokens += batch_tokens
                    interval_positions += batch_positions
                    epoch_tokens += batch_tokens
                    epoch_positions += batch_positions
                    # Accumulating, each micro-batch's mean loss counts by its label tokens (the gradients
                    # are divided by the step's total in step_optimizer): the step of one batch of all of them.
                    label_tokens = training.num_label_tokens(batch) if ga > 1 else 1
                    step_label_tokens += label_tokens
                    loss = training.forward_backward(
                        self._model,
                        self._loss_fn,
                        batch,
                        device=self._device,
                        activations_ctx=self._activations,
                        loss_scale=float(label_tokens),
                    )
                    step_loss += loss * label_tokens
                    if not last_micro_batch:
                        continue
                    grad_scale = 1.0 / max(step_label_tokens, 1) if ga > 1 else None
                    if grad_scale is not None:
                        step_loss *= grad_scale

                    # Standard mode: clip and step. In backward: already stepped, nothing left to do.
                    training.step_optimizer(
                        self._optimizer,
                        self._model.parameters(),
                        clip_grad_norm=self._clip_grad_norm,
                        grad_norm=self._grad_norm,
                        rounding=self._rounding,
                        weight_changes=self._weight_changes,
                        grad_scale=grad_scale,
                    )
                    if self._lr_scheduler is not None:
                        self._lr_scheduler.step()
                    progress.global_step += 1
                    progress.steps_run_in_epoch += 1
                    self._nan_guard.record(step_loss, progress.global_step)  # on the device: no sync

                    if will_log:
                        tokens_per_second = interval_tokens / max(time.perf_counter() - interval_start, 1e-9)
                        padding_share = 1.0 - interval_tokens / max(interval_positions, 1)
                        self._log_step(epoch, step_loss, lr, interval_tokens, tokens_per_second, padding_share, pbar)
                        interval_tokens, interval_start, interval_positions = 0, time.perf_counter(), 0
                    pbar.update(1)
                    step_loss, step_label_tokens = torch.zeros((), device=self._device), 0
                    if self._validation is not None and self._validation.due(progress.global_step):
                        interval_start += self._log_validation_loss(pbar)  # not training time: not in tok/s

                    if self._checkpoint_policy.step_checkpoint_due(
                        progress.global_step, progress.steps_run_in_epoch, self._steps_per_epoch
                    ):
                        self.save_checkpoint(epoch=epoch, step_checkpoint=True)
                    if self._stop.signum is not None:
                        self._stop_and_exit(epoch)
                if self._validation is not None and self._validation.due(progress.global_step, end_of_epoch=True):
                    self._log_validation_loss(pbar)
                pbar.close()
                if epoch_positions:
                    log.info(
                        "Epoch %d: %.1f%% of the %d token positions trained on were padding%s",
                        epoch + 1,
                        100.0 * (1.0 - epoch_tokens / epoch_positions),
                        epoch_positions,
                        "" if self._data.packed else " (dataset.packed=True packs examples to avoid it)",
                    )
                progress.epochs_run += 1
                progress.steps_run_in_epoch = 0
                self.save_checkpoint(epoch=epoch, step_checkpoint=False)
                if self._stop.signum is not None:
                    self._stop_and_exit(epoch)
        if self._log_peak_memory_stats:
            self._log_memory("end of training (peaks)")
        log.info(self._metric_logger.summary.report(checkpoint=self._last_checkpoint, device=self._device))

    def _log_step(
        self,
        epoch: int,
        step_loss: torch.Tensor,
        lr: float,
        tokens: int,
        tokens_per_second: float,
        padding_share: float,
        pbar: tqdm,
    ) -> None:
        loss_value = step_loss.item()  # the one sync per logged step
        self._check_loss_and_loaded_checkpoint(epoch, before_save=False)
        payload = {
            "epoch": epoch,
            "loss": loss_value,
            "lr": lr,
            "tokens": tokens,  # non-padding tokens since the last logged step
            "tokens_per_second": tokens_per_second,
            "padding_share": padding_share,  # of the token positions since the last logged step
            "grad_norm": self._grad_norm.pop(),
        }
        if self._weight_changes is not None:
            # share of weight elements whose stored value changed: near 0 means bf16 updates are lost
            payload["weights_changed"] = self._weight_changes.pop()
        if self._log_peak_memory_stats:
            payload.update(memory.get_memory_stats(self._device, self._device_peak))
        self._metric_logger.log_dict(payload, step=self.global_step)
        pbar.set_description(f"{epoch + 1}|{self.global_step}|Loss: {loss_value:.4f}")
        pbar.set_postfix(lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:.0f}", refresh=False)

    def _log_validation_loss(self, pbar: tqdm) -> float:
        """Log the validation loss; returns the seconds it took."""
        start = time.perf_counter()
        val_loss = self._validation.loss(self._model, self._loss_fn, device=self._device, global_step=self.global_step)
        self._metric_logger.log_validation(val_loss, step=self.global_step)  # one line per logger
        return time.perf_counter() - start

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
        final = not step_checkpoint and self.progress.epochs_run >= self._settings.epochs
        if not final:
            state.update(
                training.recipe_state(
                    optimizer=self._optimizer,
                    lr_scheduler=self._lr_scheduler,
                    progress=self.progress,
                    settings=self._settings,
                    seed=self.seed,
                    max_steps_per_epoch=self.max_steps_per_epoch,
                    model=self._model,
                    stochastic_rounding=self._rounding,
                )
            )
        folder = Path(
            self._checkpointer.save_checkpoint(state, epoch=epoch, step=self.global_step, intermediate=step_checkpoint)
        )
        self._last_checkpoint, self._last_checkpoint_step = folder, self.global_step
        log.info("Saved checkpoint to %s%s", folder, "" if final else " (resumable)")
        if step_checkpoint:
            self._checkpoint_policy.prune(
                folder.parent, protected=self._resume.checkpoint_dir if self._resume else None
            )
        return folder

    def _check_loss_and_loaded_checkpoint(self, epoch: int, *, before_save: bool) -> None:
        """Stop on a non-finite loss, or on a damaged checkpoint found by the background checksums
        (``checkpointer.verify_checksums: background``). Before a save the checksums are waited for,
        so nothing trained from a damaged file is saved; a non-finite loss waits for them too, since
        a damaged checkpoint is then the likelier cause and the one to report."""
        try:
            self._nan_guard.check(epoch, self._last_checkpoint)
        except TuneError:
            training.check_loaded_checksums(self._resume, self._checkpointer, wait=True)
            raise
        training.check_loaded_checksums(self._resume, self._checkpointer, wait=before_save)

    def _stop_and_exit(self, epoch: int) -> None:
        if self._last_checkpoint is not None and self._last_checkpoint_step == self.global_step:
            folder = self._last_checkpoint  # just written (epoch end or a step checkpoint): no second save
        else:
            folder = self.save_checkpoint(epoch=epoch, step_checkpoint=True)
        training.report_stop(self._stop.name, self.global_step, folder, RECIPE_NAME)
        raise SystemExit(128 + int(self._stop.signum))

    def evaluate(self) -> Optional[Dict[str, Any]]:
        """Score the final model on ``eval_after_training``'s tasks (nothing when it is null): print
        lm-eval's table, write ``eval_results.json`` into the final checkpoint folder, log the scores."""
        if self._eval_settings is None or self._eval_tasks is None:
            return None
        start = time.perf_counter()
        lm = evaluation.build_lm(self._model, self._tokenizer, self._eval_settings)
        results = evaluation.run_tasks(lm, self._eval_tasks, self._eval_settings)
        self._model.train()  # build_lm put it in eval mode
        print(evaluation.results_table(results))
        scores = evaluation.primary_scores(results)
        self._metric_logger.log_dict(
            {f"eval/{task}/{metric}": value for task, metrics in scores.items() for metric, value in metrics.items()},
            step=self.global_step,
        )
        if self._last_checkpoint is not None:
            path = evaluation.write_results(
                results,
                self._last_checkpoint / "eval_results.json",
                extra={"checkpoint_dir": str(self._last_checkpoint), "settings": self._eval_settings.as_dict()},
            )
            log.info("Scores of the final model written to %s (%.0f s)", path, time.perf_counter() - start)
        return results

    def _log_memory(self, title: str) -> None:
        stats = memory.get_memory_stats(self._device, self._device_peak)
        log.info("Memory %s: %s", title, ", ".join(f"{k}={v:.2f} GB" for k, v in stats.items()))

    def cleanup(self) -> None:
        if self._device_peak is not None:
            self._device_peak.stop()
        self._metric_logger.close()


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

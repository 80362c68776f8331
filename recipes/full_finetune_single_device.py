"""Full finetune of a Llama2 model on one device, with optimizer in backward.

Copy it with ``tune cp full_finetune_single_device my_recipe.py`` and edit it: everything the run
does is in this one file.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import shlex
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn
from torch.utils.data import DataLoader
from tqdm import tqdm

from torchtune import config, utils
from torchtune._errors import ConfigError, TuneError
from torchtune.datasets import collate_for
from torchtune.utils import memory
from torchtune.utils._activations import OffloadActivations, set_activation_checkpointing
from torchtune.utils._checkpointing._checkpoint_utils import is_standard_optimizer_state
from torchtune.utils._checkpointing._checkpointer import validate_state_dict

log = logging.getLogger("torchtune")

IGNORE_INDEX = -100
RECIPE_STATE_VERSION = 1

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
    "batch_size",
    "epochs",
    "max_steps_per_epoch",
    "gradient_accumulation_steps",
    "optimizer",
    "optimizer_in_bwd",
    "lr_scheduler",
    "loss",
    "clip_grad_norm",
    "compile",
    "device",
    "dtype",
    "enable_activation_checkpointing",
    "enable_activation_offloading",
    "save_every_n_steps",
    "keep_last_n_checkpoints",
    "metric_logger",
    "log_every_n_steps",
    "log_peak_memory_stats",
)


class FullFinetuneRecipeSingleDevice:
    """Full finetuning of every parameter of a decoder model on a single device.

    Features:
        - bf16 or fp32 weights, built directly in that dtype on the device; weights loaded
          memory-mapped from Hugging Face or Meta checkpoints.
        - Activation checkpointing per decoder layer (``enable_activation_checkpointing``) and
          activation offloading to host memory (``enable_activation_offloading``).
        - Optimizer in backward (``optimizer_in_bwd: True``): one optimizer per parameter, stepped
          from the parameter's post-accumulate-grad hook, which then frees the gradient, so the
          model never holds a full set of gradients. Any ``torch.optim`` optimizer, or
          bitsandbytes ``PagedAdamW`` / ``PagedAdamW8bit`` / ``AdamW8bit``, or torchao
          ``AdamW8bit`` / ``AdamW4bit``, chosen in YAML.
        - Standard mode (``optimizer_in_bwd: False``) with gradient accumulation and gradient
          clipping.
        - Cosine LR schedule with linear warm-up, applied to every per-parameter optimizer.
        - Mean cross-entropy over the non-ignored tokens of each batch (already normalised, as
          in-backward gradients cannot be rescaled later); ``ChunkedCrossEntropyLoss`` never
          materialises the full fp32 logits.
        - Seeded, deterministic shuffling, re-seeded per epoch; checkpoints at the end of each
          epoch and every ``save_every_n_steps``; exact resume, also mid-epoch, from
          ``recipe_state.pt`` (``resume_from_checkpoint=True checkpointer.recipe_checkpoint=PATH``).
        - SIGINT/SIGTERM finish the current step, save a resumable checkpoint and print the
          command that resumes; a NaN/inf loss stops the run without saving those weights.
        - Metrics (loss, lr, tokens/s, grad norm, memory) to ``metric_logger`` (JSON lines on
          disk by default) and a tqdm bar ``epoch|step|loss|lr|tok/s``.

    Resuming with settings that differ from the checkpoint's:
        - ``optimizer_in_bwd``, ``batch_size``, ``gradient_accumulation_steps``: error (the saved
          optimizer state or data position would not mean the same thing).
        - ``seed``, ``max_steps_per_epoch``: warning; the checkpoint's value is used, so the data
          order and epoch length stay those of the interrupted run.
        - ``epochs``: warning; the config's value is used (a run can be extended), and the LR
          schedule continues with the new total.

    Raises (as ``TuneError``, printed as one paragraph by ``tune``):
        - unknown or missing top-level config keys, values out of range;
        - a device that does not exist (cuda on a machine without one suggests ``device=cpu``);
        - ``dtype`` other than bf16/fp32 (fp16 needs a gradient scaler, which cannot work with
          optimizer in backward);
        - ``optimizer_in_bwd: True`` together with ``gradient_accumulation_steps > 1`` or
          ``clip_grad_norm`` (no gradients are left to accumulate or clip);
        - bitsandbytes or torchao asked for but not installed;
        - a resume without ``checkpointer.recipe_checkpoint``, or with a checkpoint written for
          another model or another ``optimizer_in_bwd`` setting;
        - a tokenizer whose vocabulary does not match the model's (more tokens, or far fewer);
          config.json heads or RoPE that differ from the model's; an empty dataset;
        - a NaN or infinite loss (names the step).
    """

    def __init__(self, cfg: DictConfig) -> None:
        config.check_recipe_keys(cfg, RECIPE_KEYS, "full_finetune_single_device", "llama2/7B_full_low_memory")
        self._cfg = cfg
        if str(cfg.device).startswith("cuda"):
            # Must happen before the first CUDA allocation; see torchtune.utils.memory.
            memory.set_cuda_alloc_conf()
        self._device = utils.get_device(cfg.device)
        self._dtype = utils.get_dtype(cfg.dtype, self._device)

        self._optimizer_in_bwd = bool(cfg.optimizer_in_bwd)
        self._gradient_accumulation_steps = _positive_int(cfg, "gradient_accumulation_steps")
        self._clip_grad_norm = cfg.clip_grad_norm
        if self._optimizer_in_bwd and self._gradient_accumulation_steps > 1:
            raise ConfigError(
                f"gradient_accumulation_steps={self._gradient_accumulation_steps} cannot be used with "
                "optimizer_in_bwd=True: each gradient is consumed by its optimizer and freed during "
                "backward, so there is nothing left to accumulate. Set gradient_accumulation_steps=1 "
                "(raise batch_size instead), or set optimizer_in_bwd=False."
            )
        if self._clip_grad_norm is not None:
            if self._optimizer_in_bwd:
                raise ConfigError(
                    f"clip_grad_norm={self._clip_grad_norm} cannot be used with optimizer_in_bwd=True: "
                    "each parameter is updated as soon as its gradient exists, before the global norm "
                    "is known. Set clip_grad_norm=null, or set optimizer_in_bwd=False."
                )
            if not isinstance(self._clip_grad_norm, (int, float)) or self._clip_grad_norm <= 0:
                raise ConfigError(f"clip_grad_norm must be a positive number or null, got {self._clip_grad_norm!r}.")

        self._batch_size = _positive_int(cfg, "batch_size")
        self.total_epochs = _positive_int(cfg, "epochs")
        self.max_steps_per_epoch = _positive_int(cfg, "max_steps_per_epoch", allow_none=True)
        self._save_every_n_steps = _positive_int(cfg, "save_every_n_steps", allow_none=True)
        self._keep_last_n = _positive_int(cfg, "keep_last_n_checkpoints", allow_none=True)
        self._log_every_n_steps = _positive_int(cfg, "log_every_n_steps")
        self._log_peak_memory_stats = bool(cfg.log_peak_memory_stats)
        lr = cfg.optimizer.get("lr") if isinstance(cfg.optimizer, DictConfig) else None
        if lr is not None and (not isinstance(lr, (int, float)) or lr < 0):
            raise ConfigError(f"optimizer.lr must be a non-negative number, got {lr!r}. Set e.g. optimizer.lr=2e-5.")
        self._resume_from_checkpoint = bool(cfg.resume_from_checkpoint)

        self.seed = utils.set_seed(cfg.seed)
        self.epochs_run = 0
        self.global_step = 0
        self._steps_run_in_epoch = 0
        self._stop_signal: Optional[int] = None
        self._grad_norm_sq: Optional[torch.Tensor] = None
        self._resumed_from: Optional[Path] = None
        self._last_checkpoint: Optional[Path] = None
        self._last_checkpoint_step: Optional[int] = None
        self._activations_ctx: Any = None

    # ------------------------------------------------------------------------------------------
    # setup
    # ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        """Build everything, in order: checkpointer, model, tokenizer, optimizer, LR schedule,
        loss, data, metric logger."""
        cfg = self._cfg
        self._metric_logger = config.instantiate(cfg.metric_logger)
        self._checkpointer = self._setup_checkpointer(cfg.checkpointer)
        ckpt = self._checkpointer.load_checkpoint()
        if self._resume_from_checkpoint:
            self._load_recipe_state(ckpt)

        self._model = self._setup_model(
            cfg.model,
            enable_activation_checkpointing=cfg.enable_activation_checkpointing,
            enable_activation_offloading=cfg.enable_activation_offloading,
            compile_model=cfg.compile,
            model_state_dict=ckpt["model"],
        )
        if self._resume_from_checkpoint:
            self._check_model_fingerprint(ckpt)
        self._check_attention_heads()
        self._tokenizer = config.instantiate(cfg.tokenizer)
        vocab_size = self._model.tok_embeddings.num_embeddings
        # An embedding table may be padded up to a multiple of 256 rows; a larger gap means another
        # model's tokenizer (Llama 2's 32000 tokens against Llama 3's 128256), a smaller table crashes.
        padded = -(-self._tokenizer.vocab_size // 256) * 256
        if not self._tokenizer.vocab_size <= vocab_size <= padded:
            raise TuneError(
                f"The tokenizer ({cfg.tokenizer.get('path', cfg.tokenizer._component_)}) has "
                f"{self._tokenizer.vocab_size} tokens but the model's vocabulary has {vocab_size}: "
                "the tokenizer does not belong to this model (token ids past the embedding table would "
                "crash training; a much larger table means the ids mean other tokens). Use the tokenizer "
                "that belongs to the checkpoint (tokenizer.path and tokenizer._component_), or a model "
                "builder whose vocab_size matches."
            )

        self._optimizer = self._setup_optimizer(
            cfg.optimizer,
            optimizer_in_bwd=self._optimizer_in_bwd,
            opt_state_dict=ckpt.get("optimizer") if self._resume_from_checkpoint else None,
        )
        self._loss_fn = self._setup_loss(cfg.loss)
        self._sampler, self._dataloader = self._setup_data(cfg.dataset, cfg.shuffle, self._batch_size)

        batches_per_epoch = len(self._dataloader)
        self._steps_per_epoch = batches_per_epoch // self._gradient_accumulation_steps
        if self.max_steps_per_epoch is not None:
            self._steps_per_epoch = min(self._steps_per_epoch, self.max_steps_per_epoch)
        if self._steps_per_epoch < 1:
            raise TuneError(
                f"The dataset has {len(self._dataloader.dataset)} examples, fewer than one optimizer "
                f"step needs (batch_size={self._batch_size} x gradient_accumulation_steps="
                f"{self._gradient_accumulation_steps}). Lower batch_size or use a larger dataset."
            )
        self._lr_scheduler = self._setup_lr_scheduler(
            cfg.lr_scheduler,
            num_training_steps=self.total_epochs * self._steps_per_epoch,
            state_dict=ckpt.get("lr_scheduler") if self._resume_from_checkpoint else None,
        )
        del ckpt  # drop the memory-mapped weights and the loaded optimizer state
        if self._log_peak_memory_stats:
            self._log_memory("after setup")

    def _setup_checkpointer(self, cfg_checkpointer: DictConfig) -> Any:
        cfg_checkpointer = cfg_checkpointer.copy()
        if self._resume_from_checkpoint:
            recipe_ckpt = cfg_checkpointer.get("recipe_checkpoint")
            if not recipe_ckpt:
                raise ConfigError(
                    "resume_from_checkpoint=True needs checkpointer.recipe_checkpoint: the path of "
                    "the recipe_state.pt saved by the run to resume (e.g. "
                    "checkpointer.recipe_checkpoint=OUTPUT_DIR/step_100/recipe_state.pt)."
                )
            path = Path(str(recipe_ckpt)).expanduser()
            if not path.is_absolute() and not path.exists():
                path = Path(str(cfg_checkpointer.checkpoint_dir)) / path
            if not path.is_file():
                raise TuneError(
                    f"checkpointer.recipe_checkpoint={recipe_ckpt} does not exist (looked for {path}). "
                    "Point it at the recipe_state.pt inside a checkpoint folder of the run to resume."
                )
            # The weights to resume from are the ones saved next to recipe_state.pt, not the
            # original base model: a checkpoint folder holds both, in the input format.
            path = path.resolve()
            self._resumed_from = path.parent
            cfg_checkpointer.checkpoint_dir = str(path.parent)
            cfg_checkpointer.recipe_checkpoint = str(path)
        return config.instantiate(cfg_checkpointer, resume_from_checkpoint=self._resume_from_checkpoint)

    def _check_attention_heads(self) -> None:
        """Heads and RoPE in the checkpoint's config vs the model: a mismatch converts q/k weights
        wrongly, or turns positions differently, without any shape error, so it is caught here."""
        check_model = getattr(self._checkpointer, "check_model", None)
        if check_model is not None:
            check_model(self._model)

    def _setup_model(
        self,
        cfg_model: DictConfig,
        enable_activation_checkpointing: bool,
        enable_activation_offloading: bool,
        compile_model: bool,
        model_state_dict: Optional[Dict[str, torch.Tensor]],
    ) -> nn.Module:
        """Build the model in the training dtype on the device; ``None`` weights = random init."""
        if model_state_dict is None:
            with utils.set_default_dtype(self._dtype), self._device:
                model = config.instantiate(cfg_model)
        else:
            # Building on the meta device skips a random initialisation that the weights would
            # overwrite anyway; to_empty then allocates the weights once, in the final dtype.
            with utils.set_default_dtype(self._dtype), torch.device("meta"):
                model = config.instantiate(cfg_model)
            model.to_empty(device=self._device)
            validate_state_dict(model, model_state_dict)
            model.load_state_dict(model_state_dict)
            model.init_buffers(self._device)
        if enable_activation_checkpointing:
            from torchtune.modules import TransformerDecoderLayer

            set_activation_checkpointing(model, {TransformerDecoderLayer})
        self._activations_ctx = OffloadActivations if enable_activation_offloading else None
        if compile_model:
            # Per layer, in place: parameter names (and so checkpoints and optimizer keys) stay
            # the same, and the in-backward hooks sit on the same parameters.
            for layer in model.layers:
                layer.compile()
        log.info(
            "Model %s: %.1fM parameters, %s on %s",
            cfg_model._component_,
            sum(p.numel() for p in model.parameters()) / 1e6,
            self._dtype,
            self._device,
        )
        return model

    def _setup_optimizer(
        self,
        cfg_optimizer: DictConfig,
        optimizer_in_bwd: bool,
        opt_state_dict: Optional[Dict[str, Any]] = None,
    ) -> Optional[torch.optim.Optimizer]:
        """One optimizer over all parameters, or (in backward) one per parameter stepped by hooks.

        Returns the optimizer in standard mode and ``None`` in backward, where the
        ``OptimInBackwardWrapper`` (``self._optim_wrapper``) holds the per-parameter optimizers.
        """
        params = {n: p for n, p in self._model.named_parameters() if p.requires_grad}
        self._optim_wrapper = None
        if not optimizer_in_bwd:
            optimizer = config.instantiate(cfg_optimizer, list(params.values()))
            if opt_state_dict is not None:
                if not is_standard_optimizer_state(opt_state_dict):
                    raise TuneError(
                        "The optimizer state in the recipe checkpoint was written by a run with "
                        "optimizer_in_bwd=True (one optimizer per parameter), but this run has "
                        "optimizer_in_bwd=False. Resume with optimizer_in_bwd=True, or start a new "
                        "run without resume_from_checkpoint."
                    )
                optimizer.load_state_dict(opt_state_dict)
                utils.keep_optimizer_state_paged(optimizer)
            return optimizer

        optim_map = {name: config.instantiate(cfg_optimizer, [p]) for name, p in params.items()}
        for name, param in params.items():
            param.register_post_accumulate_grad_hook(self._make_step_hook(optim_map[name]))
        self._optim_wrapper = utils.OptimInBackwardWrapper(optim_map)
        if opt_state_dict is not None:
            self._optim_wrapper.load_state_dict(opt_state_dict)
        return None

    def _make_step_hook(self, optimizer: torch.optim.Optimizer):
        def step_and_free(param: torch.Tensor) -> None:
            if self._grad_norm_sq is not None:  # only on steps whose metrics are logged
                self._grad_norm_sq += torch.linalg.vector_norm(param.grad, dtype=torch.float32).square()
            optimizer.step()
            # The optimizer holds only this parameter: dropping its grad is all zero_grad would
            # do, without zero_grad's ~25 us of Python per parameter per step.
            param.grad = None

        return step_and_free

    def _setup_lr_scheduler(
        self,
        cfg_lr_scheduler: Optional[DictConfig],
        num_training_steps: int,
        state_dict: Optional[Dict[str, Any]] = None,
    ) -> Optional[torch.optim.lr_scheduler.LRScheduler]:
        if cfg_lr_scheduler is None:
            return None
        target = self._optim_wrapper.scheduler_optimizer if self._optim_wrapper else self._optimizer
        scheduler = config.instantiate(cfg_lr_scheduler, target, num_training_steps=num_training_steps)
        if state_dict is not None:
            scheduler.load_state_dict(state_dict)
            # A freshly built scheduler has already written its step-0 LR into the optimizer;
            # put back the LR the interrupted run was at.
            for group, lr in zip(target.param_groups, scheduler.get_last_lr()):
                group["lr"] = lr
        if self._optim_wrapper is not None:
            self._optim_wrapper.set_lr_scheduler(scheduler)
        return scheduler

    def _setup_loss(self, cfg_loss: DictConfig) -> nn.Module:
        return config.instantiate(cfg_loss)

    def _setup_data(self, cfg_dataset: DictConfig, shuffle: bool, batch_size: int):
        dataset = config.instantiate(cfg_dataset, self._tokenizer)
        if len(dataset) == 0:
            raise TuneError(
                f"The dataset ({cfg_dataset._component_}, source {cfg_dataset.get('source')}) has no "
                "examples. Check dataset.source / dataset.data_files and dataset.split."
            )
        self._pad_id = self._tokenizer.pad_id if self._tokenizer.pad_id >= 0 else 0
        sampler = utils.ResumableSampler(len(dataset), shuffle=bool(shuffle), seed=self.seed)
        dataloader = DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            collate_fn=collate_for(dataset, padding_idx=self._pad_id, ignore_idx=IGNORE_INDEX),
        )
        log.info("Dataset: %d examples, %d batches per epoch", len(dataset), len(dataloader))
        return sampler, dataloader

    # ------------------------------------------------------------------------------------------
    # recipe state
    # ------------------------------------------------------------------------------------------
    def _model_fingerprint(self) -> str:
        shapes = sorted((n, tuple(p.shape)) for n, p in self._model.named_parameters())
        return hashlib.sha256(repr(shapes).encode()).hexdigest()[:16]

    def _check_model_fingerprint(self, ckpt: Dict[str, Any]) -> None:
        saved = ckpt.get("model_fingerprint")
        if saved is not None and saved != self._model_fingerprint():
            raise TuneError(
                f"The recipe checkpoint {self._resumed_from} was written for a different model "
                "(its parameter names or shapes differ from this config's model). Resume with the "
                "model config it was trained with."
            )

    def _load_recipe_state(self, ckpt: Dict[str, Any]) -> None:
        required = (
            "optimizer",
            "optimizer_in_bwd",
            "seed",
            "epochs_run",
            "total_epochs",
            "max_steps_per_epoch",
            "global_step",
            "steps_run_in_epoch",
            "batch_size",
            "gradient_accumulation_steps",
            "rng_state",
        )
        missing = [k for k in required if k not in ckpt]
        if missing:
            raise TuneError(
                f"The recipe checkpoint in {self._resumed_from} lacks {', '.join(missing)}; it was "
                "not written by this recipe (or by a final, non-resumable save). Point "
                "checkpointer.recipe_checkpoint at a recipe_state.pt from a step or epoch folder."
            )
        if bool(ckpt["optimizer_in_bwd"]) != self._optimizer_in_bwd:
            raise TuneError(
                f"The recipe checkpoint was made with optimizer_in_bwd={bool(ckpt['optimizer_in_bwd'])} "
                f"but this run has optimizer_in_bwd={self._optimizer_in_bwd}; the optimizer state "
                f"cannot be carried across. Resume with optimizer_in_bwd={bool(ckpt['optimizer_in_bwd'])}."
            )
        for key, ours in (
            ("batch_size", self._batch_size),
            ("gradient_accumulation_steps", self._gradient_accumulation_steps),
        ):
            if ckpt[key] != ours:
                raise TuneError(
                    f"The recipe checkpoint was made with {key}={ckpt[key]}, this run has {key}={ours}: "
                    f"the saved position inside the epoch would point at other data. Resume with {key}={ckpt[key]}."
                )
        if self._cfg.seed is not None and ckpt["seed"] != self.seed:
            log.warning(
                "seed=%s differs from the checkpoint's seed=%s; using the checkpoint's so the data order continues.",
                self.seed,
                ckpt["seed"],
            )
        if ckpt["max_steps_per_epoch"] != self.max_steps_per_epoch:
            log.warning(
                "max_steps_per_epoch=%s differs from the checkpoint's %s; using the checkpoint's.",
                self.max_steps_per_epoch,
                ckpt["max_steps_per_epoch"],
            )
        if ckpt["total_epochs"] != self.total_epochs:
            log.warning(
                "epochs=%s differs from the checkpoint's %s; training to %s epochs, and the LR "
                "schedule continues with the new total.",
                self.total_epochs,
                ckpt["total_epochs"],
                self.total_epochs,
            )
        self.seed = int(ckpt["seed"])
        self.max_steps_per_epoch = ckpt["max_steps_per_epoch"]
        self.epochs_run = int(ckpt["epochs_run"])
        self.global_step = int(ckpt["global_step"])
        self._steps_run_in_epoch = int(ckpt["steps_run_in_epoch"])
        utils.set_rng_state(ckpt["rng_state"])

    def _recipe_state(self) -> Dict[str, Any]:
        optimizer_state = (
            self._optim_wrapper.state_dict() if self._optim_wrapper is not None else self._optimizer.state_dict()
        )
        return {
            "recipe_state_version": RECIPE_STATE_VERSION,
            "optimizer": optimizer_state,
            "optimizer_in_bwd": self._optimizer_in_bwd,
            "lr_scheduler": self._lr_scheduler.state_dict() if self._lr_scheduler is not None else None,
            "seed": self.seed,
            "epochs_run": self.epochs_run,
            "total_epochs": self.total_epochs,
            "max_steps_per_epoch": self.max_steps_per_epoch,
            "global_step": self.global_step,
            "steps_run_in_epoch": self._steps_run_in_epoch,
            "batch_size": self._batch_size,
            "gradient_accumulation_steps": self._gradient_accumulation_steps,
            "rng_state": utils.get_rng_state(),
            "model_fingerprint": self._model_fingerprint(),
        }

    # ------------------------------------------------------------------------------------------
    # training
    # ------------------------------------------------------------------------------------------
    def train_step(self, batch: Dict[str, torch.Tensor], step_optimizer: bool = True) -> torch.Tensor:
        """Forward, loss and backward for one (micro-)batch; returns the detached loss.

        With optimizer in backward the parameters are updated inside ``backward()``. In standard
        mode the optimizer steps when ``step_optimizer`` is true (the last micro-batch of a step).
        """
        tokens = batch["tokens"].to(self._device, non_blocking=True)
        # Shift so that labels[:, t] is the target of position t; the last position has none.
        labels = F.pad(batch["labels"][:, 1:], (0, 1), value=IGNORE_INDEX).to(self._device, non_blocking=True)
        mask = batch.get("mask")
        input_pos = batch.get("input_pos")
        if mask is not None:
            mask = mask.to(self._device, non_blocking=True)
        if input_pos is not None:
            input_pos = input_pos.to(self._device, non_blocking=True)

        ctx = self._activations_ctx() if self._activations_ctx is not None else contextlib.nullcontext()
        with ctx:
            hidden = self._model(tokens, mask=mask, input_pos=input_pos, output_hidden_states=True)
            loss = self._loss_fn(self._model.output, hidden, labels)
            del hidden
            (loss / self._gradient_accumulation_steps).backward()

        if not self._optimizer_in_bwd and step_optimizer:
            params = [p for p in self._model.parameters() if p.grad is not None]
            if self._clip_grad_norm is not None:
                norm = torch.nn.utils.clip_grad_norm_(params, max_norm=float(self._clip_grad_norm))
                self._grad_norm_sq = norm.detach().float().square()
            elif self._grad_norm_sq is not None:
                self._grad_norm_sq = torch.nn.utils.get_total_norm([p.grad for p in params]).float().square()
            self._optimizer.step()
            self._optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    def _current_lr(self) -> float:
        if self._optim_wrapper is not None:
            return float(self._optim_wrapper.get_optim_key("lr"))
        return float(self._optimizer.param_groups[0]["lr"])

    def _num_tokens(self, batch: Dict[str, torch.Tensor]) -> int:
        """Non-padding tokens of a batch, counted on the host (no device sync)."""
        return int(batch["tokens"].ne(self._pad_id).sum())

    def train(self) -> None:
        """The training loop: epochs of steps, logging, checkpointing, graceful stop."""
        ga = self._gradient_accumulation_steps
        self._install_signal_handlers()
        bad_step = torch.full((), -1, dtype=torch.long, device=self._device)
        try:
            for epoch in range(self.epochs_run, self.total_epochs):
                start = self._steps_run_in_epoch * ga * self._batch_size
                self._sampler.set_epoch(epoch, start_index=start)
                if not self._optimizer_in_bwd:
                    self._optimizer.zero_grad(set_to_none=True)
                pbar = tqdm(
                    total=self._steps_per_epoch,
                    initial=self._steps_run_in_epoch,
                    dynamic_ncols=True,
                    file=sys.stderr,
                    mininterval=0.5,
                )
                step_loss = torch.zeros((), device=self._device)
                interval_tokens, interval_start = 0, time.perf_counter()
                for idx, batch in enumerate(self._dataloader):
                    if self._steps_run_in_epoch >= self._steps_per_epoch:
                        break
                    last_micro_batch = (idx + 1) % ga == 0
                    will_log = last_micro_batch and (self.global_step + 1) % self._log_every_n_steps == 0
                    if will_log and self._grad_norm_sq is None:
                        self._grad_norm_sq = torch.zeros((), device=self._device)
                    lr = self._current_lr()
                    interval_tokens += self._num_tokens(batch)
                    step_loss += self.train_step(batch, step_optimizer=last_micro_batch) / ga
                    if not last_micro_batch:
                        continue

                    self.global_step += 1
                    self._steps_run_in_epoch += 1
                    # Recorded on the device: no sync on steps that are not logged.
                    bad_step = torch.where((bad_step < 0) & ~torch.isfinite(step_loss), self.global_step, bad_step)
                    if self._optim_wrapper is not None:
                        self._optim_wrapper.step_lr_scheduler()
                    elif self._lr_scheduler is not None:
                        self._lr_scheduler.step()

                    if will_log:
                        loss_value = step_loss.item()  # the one sync per logged step
                        self._check_finite(bad_step, epoch)
                        elapsed = time.perf_counter() - interval_start
                        tokens_per_second = interval_tokens / max(elapsed, 1e-9)
                        payload = {
                            "epoch": epoch,
                            "loss": loss_value,
                            "lr": lr,
                            "tokens_per_second": tokens_per_second,
                            "grad_norm": math.sqrt(max(self._grad_norm_sq.item(), 0.0)),
                        }
                        self._grad_norm_sq = None
                        if self._log_peak_memory_stats:
                            payload.update(memory.get_memory_stats(self._device))
                        self._metric_logger.log_dict(payload, step=self.global_step)
                        pbar.set_description(f"{epoch + 1}|{self.global_step}|Loss: {loss_value:.4f}")
                        pbar.set_postfix(lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:.0f}", refresh=False)
                        interval_tokens, interval_start = 0, time.perf_counter()
                    pbar.update(1)
                    step_loss = torch.zeros((), device=self._device)

                    if (
                        self._save_every_n_steps
                        and self.global_step % self._save_every_n_steps == 0
                        and self._steps_run_in_epoch < self._steps_per_epoch
                    ):
                        self._check_finite(bad_step, epoch)
                        self.save_checkpoint(epoch=epoch, step_checkpoint=True)
                    if self._stop_signal is not None:
                        self._check_finite(bad_step, epoch)
                        self._stop_and_exit(epoch)
                pbar.close()
                self._check_finite(bad_step, epoch)
                self.epochs_run += 1
                self._steps_run_in_epoch = 0
                self.save_checkpoint(epoch=epoch, step_checkpoint=False)
                if self._stop_signal is not None:
                    self._stop_and_exit(epoch)
        finally:
            self._restore_signal_handlers()
        if self._log_peak_memory_stats:
            self._log_memory("end of training (peaks)")

    def _check_finite(self, bad_step: torch.Tensor, epoch: int) -> None:
        step = int(bad_step.item())
        if step >= 0:
            last = f" The last good checkpoint is {self._last_checkpoint}." if self._last_checkpoint else ""
            raise TuneError(
                f"The loss became NaN or infinite at step {step} (epoch {epoch}); training stopped and "
                f"the weights after that step were not saved.{last} Lower optimizer.lr, raise the LR "
                "warm-up (lr_scheduler.num_warmup_steps), use dtype=bf16 rather than a lower "
                "precision, and check the dataset for empty or broken examples."
            )

    # ------------------------------------------------------------------------------------------
    # checkpointing, stopping
    # ------------------------------------------------------------------------------------------
    def save_checkpoint(self, epoch: int, step_checkpoint: bool = False) -> Path:
        """Save the weights (input format) and, unless this is the final save, ``recipe_state.pt``.

        ``step_checkpoint`` saves into ``output_dir/step_N``; otherwise ``output_dir/epoch_N``.
        """
        state: Dict[str, Any] = {"model": self._model.state_dict()}
        final = not step_checkpoint and self.epochs_run >= self.total_epochs
        if not final:
            state.update(self._recipe_state())
        folder = Path(
            self._checkpointer.save_checkpoint(state, epoch=epoch, step=self.global_step, intermediate=step_checkpoint)
        )
        self._last_checkpoint, self._last_checkpoint_step = folder, self.global_step
        log.info("Saved checkpoint to %s%s", folder, "" if final else " (resumable)")
        if step_checkpoint and self._keep_last_n is not None:
            self._prune_step_checkpoints(folder.parent)
        return folder

    def _prune_step_checkpoints(self, output_dir: Path) -> None:
        """Keep the newest ``keep_last_n_checkpoints`` step folders; never the resumed-from one."""
        folders = sorted(
            (p for p in output_dir.glob("step_*") if p.is_dir() and p.name[5:].isdigit()), key=lambda p: int(p.name[5:])
        )
        protected = {self._resumed_from.resolve()} if self._resumed_from else set()
        for old in folders[: max(0, len(folders) - self._keep_last_n)]:
            if old.resolve() in protected:
                continue
            shutil.rmtree(old, ignore_errors=True)

    def resume_command(self, recipe_checkpoint: Path) -> str:
        """The command line that resumes this run from ``recipe_checkpoint``."""
        argv = list(sys.argv[1:])
        config_path = None
        if "--config" in argv[:-1]:
            i = argv.index("--config")
            config_path = argv[i + 1]
            del argv[i : i + 2]
        elif any(a.startswith("--config=") for a in argv):
            config_path = next(a for a in argv if a.startswith("--config=")).split("=", 1)[1]
            argv = [a for a in argv if not a.startswith("--config=")]
        overrides = [
            a for a in argv if not a.startswith(("resume_from_checkpoint=", "checkpointer.recipe_checkpoint="))
        ]
        # A copy of this recipe (`tune cp`) resumes with the copy, not with the built-in recipe.
        from torchtune import _recipe_registry

        builtin = _recipe_registry.get_recipe("full_finetune_single_device")
        script = sys.argv[0] if sys.argv and sys.argv[0].endswith(".py") else ""
        recipe = (
            script
            if script and builtin is not None and Path(script).resolve() != builtin.path.resolve()
            else "full_finetune_single_device"
        )
        parts = [
            "tune",
            "run",
            recipe,
            "--config",
            config_path or "CONFIG",
            *overrides,
            "resume_from_checkpoint=True",
            f"checkpointer.recipe_checkpoint={recipe_checkpoint}",
        ]
        return " ".join(shlex.quote(p) for p in parts)

    def _stop_and_exit(self, epoch: int) -> None:
        name = signal.Signals(self._stop_signal).name
        if self._last_checkpoint is not None and self._last_checkpoint_step == self.global_step:
            folder = self._last_checkpoint  # just written (epoch end or save_every_n_steps): no second save
        else:
            folder = self.save_checkpoint(epoch=epoch, step_checkpoint=True)
        recipe_ckpt = folder / "recipe_state.pt"
        if recipe_ckpt.exists():
            print(
                f"\nStopped by {name} after step {self.global_step}; checkpoint saved to {folder}.\n"
                f"Resume with:\n  {self.resume_command(recipe_ckpt)}",
                file=sys.stderr,
                flush=True,
            )
        else:
            print(f"\nStopped by {name}; training had finished. Final weights in {folder}.", file=sys.stderr)
        raise SystemExit(128 + int(self._stop_signal))

    def _install_signal_handlers(self) -> None:
        self._previous_handlers = {}

        def request_stop(signum, frame):  # noqa: ARG001
            if self._stop_signal is not None:  # a second signal: stop now, as the user insists
                raise KeyboardInterrupt
            self._stop_signal = signum
            print(
                f"\nReceived {signal.Signals(signum).name}: finishing this step, then saving a "
                "checkpoint (send it again to stop at once, without saving).",
                file=sys.stderr,
                flush=True,
            )

        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous_handlers[sig] = signal.signal(sig, request_stop)
            except ValueError:  # not the main thread (e.g. run from a notebook worker)
                pass

    def _restore_signal_handlers(self) -> None:
        for sig, handler in getattr(self, "_previous_handlers", {}).items():
            signal.signal(sig, handler)

    def _log_memory(self, title: str) -> None:
        stats = memory.get_memory_stats(self._device)
        log.info("Memory %s: %s", title, ", ".join(f"{k}={v:.2f} GB" for k, v in stats.items()))

    def cleanup(self) -> None:
        self._metric_logger.close()


def _positive_int(cfg: DictConfig, key: str, allow_none: bool = False) -> Optional[int]:
    value = cfg[key]
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        extra = " or null" if allow_none else ""
        raise ConfigError(f"{key} must be a whole number of at least 1{extra}, got {value!r}. Set {key}=1 or more.")
    return value


@config.parse
def recipe_main(cfg: DictConfig) -> None:
    """Entry point: ``tune run full_finetune_single_device --config ...``."""
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    recipe = FullFinetuneRecipeSingleDevice(cfg=cfg)
    recipe.setup()
    try:
        recipe.train()
    finally:
        recipe.cleanup()


if __name__ == "__main__":
    sys.exit(recipe_main())

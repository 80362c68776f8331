"""What a recipe composes: plain functions that take config values and return objects.

A recipe calls them in order (see ``recipes/full_finetune_single_device.py``)::

    training.prepare_output_dir(cfg)                             # stop before overwriting another run
    resume = training.resolve_resume(cfg, settings)             # what to load, from where
    checkpointer = training.build_checkpointer(cfg.checkpointer, resume)
    model = training.build_model(cfg.model, device=..., dtype=..., state_dict=..., ...)
    optimizer = training.build_optimizer(cfg.optimizer, model, optimizer_in_bwd=...)
    scheduler = training.build_lr_scheduler(cfg.lr_scheduler, optimizer, num_training_steps=...)
    data = training.build_dataloader(cfg.dataset, tokenizer, batch_size=..., shuffle=..., seed=...)
    steps = training.TrainingSteps(data, progress, settings, seed=..., max_steps_per_epoch=...)
    for epoch in steps.epochs():
        for micro_batches in steps.steps():
            for batch, share in zip(micro_batches, training.label_token_shares(micro_batches)):
                training.forward_backward(model, loss_fn, batch, device=..., loss_scale=share)
            training.step_optimizer(optimizer, model.parameters())
            scheduler.step()
            steps.finish_step()
        steps.finish_epoch()

The memory estimator (``tune estimate-memory``) and the benchmarks build their steps from the same
functions, so what they measure is what a recipe runs.
"""

import importlib
from typing import Any

from torchtune.training import memory
from torchtune.training._activations import (
    OffloadActivations,
    get_act_offloading_ctx_manager,
    set_activation_checkpointing,
)
from torchtune.training._checks import (
    RECIPE_VALUE_TYPES,
    check_liger,
    check_optimizer_settings,
    check_value_types,
    positive_int,
)
from torchtune.training._data import TrainingData, build_dataloader, check_data_head, num_tokens, padding_id
from torchtune.training._distributed_settings import (
    check_distributed_settings,
    check_resume_is_sharded,
    local_batch_size,
)
from torchtune.training._eval_after_training import EVAL_AFTER_TRAINING_KEYS, EvalAfterTraining
from torchtune.training._launch_report import is_lost_peer_error, launcher_reports, report_to_launcher
from torchtune.training._loop import StepMetrics, TrainingSteps, label_token_shares
from torchtune.training._loop_checks import check_finetune_config, check_loop_keys
from torchtune.training._low_rank import check_low_rank_optimizer, is_low_rank
from torchtune.training._metrics import (
    MetricLoggers,
    ProgressBarLogHandler,
    RunSummary,
    build_metric_logger,
    check_metric_logger,
    epoch_progress_bar,
    metrics_path,
)
from torchtune.training._model import (
    build_model,
    check_model_fits,
    check_model_matches_checkpoint,
    check_tokenizer_fits_model,
    model_fingerprint,
    model_skeleton,
)
from torchtune.training._optimizer import (
    GradNormTracker,
    build_optimizer,
    in_bwd_groups,
    load_optimizer_state,
    register_optim_in_bwd_hooks,
    step_optimizer,
    trainable_parameters,
)
from torchtune.training._output_dir import check_output_dir, check_overwrite, prepare_output_dir
from torchtune.training._preflight import check_inputs
from torchtune.training._resume import (
    RECIPE_STATE_NAME,
    ResumePlan,
    RunSettings,
    TrainingProgress,
    build_checkpointer,
    check_loaded_checksums,
    check_resume_keys,
    recipe_state,
    resolve_resume,
    resume_command,
    seed_or_restore,
)
from torchtune.training._run_control import CheckpointPolicy, NonFiniteLossGuard, StopSignals, report_stop
from torchtune.training._sampler import ResumableSampler
from torchtune.training._step import (
    TrainStep,
    forward_backward,
    forward_loss,
    label_positions,
    num_label_tokens,
    shift_labels,
)
from torchtune.training._stochastic_rounding import (
    StochasticRounding,
    WeightChangeTracker,
    build_stochastic_rounding,
    check_stochastic_rounding,
    rounding_for_run,
    step_parameter,
)
from torchtune.training._validation import Validation, build_validation, check_validation_settings
from torchtune.training.lr_schedulers import build_lr_scheduler

# The distributed pieces import FSDP, DTensor and distributed checkpointing (about a second of CPU before any
# work): they are loaded on first use, so `tune validate` and single-device runs never pay for them.
_LAZY = {
    "DistributedInfo": "torchtune.training._distributed",
    "RankErrors": "torchtune.training._distributed",
    "agree_on_seed": "torchtune.training._distributed",
    "any_rank": "torchtune.training._distributed",
    "backend_for_device": "torchtune.training._distributed",
    "check_same_config": "torchtune.training._distributed",
    "destroy_distributed": "torchtune.training._distributed",
    "exit_process": "torchtune.training._distributed",
    "get_world_size_and_rank": "torchtune.training._distributed",
    "init_distributed": "torchtune.training._distributed",
    "is_rank_zero": "torchtune.training._distributed",
    "launched_by_torchrun": "torchtune.training._distributed",
    "load_full_state_dict": "torchtune.training._distributed",
    "load_sharded_weights": "torchtune.training._distributed",
    "full_weights_writer": "torchtune.training._full_weights",
    "save_full_weights": "torchtune.training._full_weights",
    "raise_if_any_rank_failed": "torchtune.training._distributed",
    "shard_model": "torchtune.training._distributed",
    "log_sharded_model": "torchtune.training._distributed",
    "SHARDED_STATE_DIR": "torchtune.training._distributed_checkpoint",
    "SHARDED_STATE_MARKER": "torchtune.training._distributed_checkpoint",
    "ShardedCheckpointWriter": "torchtune.training._distributed_checkpoint",
    "load_sharded_checkpoint": "torchtune.training._distributed_checkpoint",
    "save_sharded_checkpoint": "torchtune.training._distributed_checkpoint",
    "check_offload_host_memory": "torchtune.training._offload_memory",
    "check_offload_for_run": "torchtune.training._offload_memory",
    "offload_plan": "torchtune.training._offload_memory",
    "ShardedModelReader": "torchtune.training._sharded_read",
    "holds_only_sharded_weights": "torchtune.training._sharded_read",
    "load_sharded_model": "torchtune.training._sharded_read",
    "export_hf_folder": "torchtune.training._hf_export",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchtune.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


__all__ = [
    "EVAL_AFTER_TRAINING_KEYS",
    "EvalAfterTraining",
    "StepMetrics",
    "TrainingSteps",
    "check_distributed_settings",
    "check_finetune_config",
    "check_resume_is_sharded",
    "check_model_fits",
    "local_batch_size",
    "label_token_shares",
    "seed_or_restore",
    "CheckpointPolicy",
    "DistributedInfo",
    "GradNormTracker",
    "MetricLoggers",
    "NonFiniteLossGuard",
    "OffloadActivations",
    "ProgressBarLogHandler",
    "epoch_progress_bar",
    "report_stop",
    "RECIPE_STATE_NAME",
    "RECIPE_VALUE_TYPES",
    "RankErrors",
    "ResumableSampler",
    "ResumePlan",
    "RunSettings",
    "RunSummary",
    "StochasticRounding",
    "SHARDED_STATE_DIR",
    "SHARDED_STATE_MARKER",
    "ShardedCheckpointWriter",
    "ShardedModelReader",
    "StopSignals",
    "TrainStep",
    "TrainingData",
    "TrainingProgress",
    "Validation",
    "WeightChangeTracker",
    "agree_on_seed",
    "any_rank",
    "is_lost_peer_error",
    "launcher_reports",
    "report_to_launcher",
    "export_hf_folder",
    "holds_only_sharded_weights",
    "load_sharded_model",
    "backend_for_device",
    "build_checkpointer",
    "build_dataloader",
    "check_data_head",
    "check_inputs",
    "check_output_dir",
    "build_lr_scheduler",
    "build_metric_logger",
    "build_model",
    "build_optimizer",
    "build_stochastic_rounding",
    "rounding_for_run",
    "build_validation",
    "check_loaded_checksums",
    "check_metric_logger",
    "check_model_matches_checkpoint",
    "check_loop_keys",
    "check_low_rank_optimizer",
    "is_low_rank",
    "check_optimizer_settings",
    "check_liger",
    "check_offload_host_memory",
    "check_offload_for_run",
    "check_overwrite",
    "check_value_types",
    "check_resume_keys",
    "check_stochastic_rounding",
    "check_same_config",
    "check_tokenizer_fits_model",
    "check_validation_settings",
    "destroy_distributed",
    "exit_process",
    "forward_backward",
    "forward_loss",
    "in_bwd_groups",
    "get_act_offloading_ctx_manager",
    "get_world_size_and_rank",
    "init_distributed",
    "is_rank_zero",
    "label_positions",
    "launched_by_torchrun",
    "load_full_state_dict",
    "load_sharded_weights",
    "full_weights_writer",
    "save_full_weights",
    "load_optimizer_state",
    "load_sharded_checkpoint",
    "memory",
    "metrics_path",
    "model_fingerprint",
    "model_skeleton",
    "num_label_tokens",
    "num_tokens",
    "offload_plan",
    "padding_id",
    "positive_int",
    "raise_if_any_rank_failed",
    "recipe_state",
    "register_optim_in_bwd_hooks",
    "prepare_output_dir",
    "resolve_resume",
    "resume_command",
    "save_sharded_checkpoint",
    "set_activation_checkpointing",
    "shard_model",
    "log_sharded_model",
    "shift_labels",
    "step_optimizer",
    "step_parameter",
    "trainable_parameters",
]

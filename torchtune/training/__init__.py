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

torchtune 0.6.1's names of ``torchtune.training`` are here too, with its signatures, each a front of the same
implementation (``docs/training.md`` lists them and where they differ).
"""

import importlib
from typing import Any

from torchtune.training import checkpointing, lr_schedulers, memory, metric_logging, pooling, precision, seed
from torchtune.training.activations import (
    NoOpManager,
    OffloadActivations,
    apply_selective_activation_checkpointing,
    get_act_offloading_ctx_manager,
    set_activation_checkpointing,
)
from torchtune.training.checkpointing import (
    ADAPTER_CONFIG,
    ADAPTER_KEY,
    DATALOADER_KEY,
    EPOCHS_KEY,
    MAX_STEPS_KEY,
    MODEL_KEY,
    OPT_KEY,
    RNG_KEY,
    SEED_KEY,
    STEPS_KEY,
    TOTAL_EPOCHS_KEY,
    Checkpointer,
    FormattedCheckpointFiles,
    FullModelHFCheckpointer,
    FullModelMetaCheckpointer,
    FullModelTorchTuneCheckpointer,
    ModelType,
    update_state_dict_for_classifier,
)
from torchtune.training.distributed._launch_report import is_lost_peer_error, launcher_reports, report_to_launcher
from torchtune.training.distributed._settings import (
    check_distributed_settings,
    check_resume_is_sharded,
    local_batch_size,
)
from torchtune.training.lr_schedulers import build_lr_scheduler, get_cosine_schedule_with_warmup, get_lr
from torchtune.training.memory import (
    OptimizerInBackwardWrapper,
    cleanup_before_training,
    get_memory_stats,
    log_memory_stats,
)
from torchtune.training.optim._cpu_optimizers import CPUSGD, CPUAdamW
from torchtune.training.optim._low_rank import check_low_rank_optimizer, is_low_rank
from torchtune.training.optim._optimizer import (
    GradNormTracker,
    build_optimizer,
    create_optim_in_bwd_wrapper,
    in_bwd_groups,
    load_optimizer_state,
    register_optim_in_bwd_hooks,
    scale_grads,
    step_optimizer,
    trainable_parameters,
)
from torchtune.training.optim._parameter_step import step_parameter
from torchtune.training.optim._stochastic_rounding import (
    StochasticRounding,
    WeightChangeTracker,
    build_stochastic_rounding,
    check_stochastic_rounding,
    rounding_for_run,
)
from torchtune.training.pooling import get_unmasked_sequence_lengths
from torchtune.training.precision import get_dtype, set_default_dtype, validate_expected_param_dtype
from torchtune.training.run._eval_after_training import EVAL_AFTER_TRAINING_KEYS, EvalAfterTraining
from torchtune.training.run._loop import StepMetrics, TrainingSteps, label_token_shares
from torchtune.training.run._metrics import (
    MetricLoggers,
    ProgressBarLogHandler,
    RunSummary,
    build_metric_logger,
    check_metric_logger,
    epoch_progress_bar,
    metrics_path,
)
from torchtune.training.run._output_dir import check_output_dir, check_overwrite, prepare_output_dir
from torchtune.training.run._profiler import (
    DEFAULT_PROFILE_DIR,
    DEFAULT_PROFILER_ACTIVITIES,
    DEFAULT_SCHEDULE,
    DEFAULT_TRACE_OPTS,
    PROFILER_KEY,
    DummyProfiler,
    build_profiler,
    setup_torch_profiler,
)
from torchtune.training.run._resume import (
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
from torchtune.training.run._run_control import CheckpointPolicy, NonFiniteLossGuard, StopSignals, report_stop
from torchtune.training.run._step import (
    TrainStep,
    forward_backward,
    forward_loss,
    label_positions,
    num_label_tokens,
    shift_labels,
)
from torchtune.training.run._validation import Validation, build_validation, check_validation_settings
from torchtune.training.seed import set_seed
from torchtune.training.setup._checks import (
    RECIPE_VALUE_TYPES,
    check_liger,
    check_optimizer_settings,
    check_value_types,
    positive_int,
)
from torchtune.training.setup._compile import compile_loss, compile_model
from torchtune.training.setup._data import TrainingData, build_dataloader, check_data_head, num_tokens, padding_id
from torchtune.training.setup._loop_checks import check_finetune_config, check_loop_keys
from torchtune.training.setup._model import (
    build_model,
    check_model_fits,
    check_model_matches_checkpoint,
    check_tokenizer_fits_model,
    disable_dropout,
    model_fingerprint,
    model_skeleton,
)
from torchtune.training.setup._preflight import check_inputs
from torchtune.training.setup._recipe_keys import (
    FINETUNE_DEFAULTS,
    apply_process_settings,
    config_notes,
    log_config_notes,
)
from torchtune.training.setup._sampler import ResumableSampler

# The distributed pieces import FSDP, DTensor and distributed checkpointing (about a second of CPU before any
# work): they are loaded on first use, so `tune validate` and single-device runs never pay for them.
_LAZY = {
    "DistributedInfo": "torchtune.training.distributed._fsdp",
    "RankErrors": "torchtune.training.distributed._fsdp",
    "agree_on_seed": "torchtune.training.distributed._fsdp",
    "any_rank": "torchtune.training.distributed._fsdp",
    "backend_for_device": "torchtune.training.distributed._fsdp",
    "check_same_config": "torchtune.training.distributed._fsdp",
    "destroy_distributed": "torchtune.training.distributed._fsdp",
    "gather_cpu_state_dict": "torchtune.training.distributed._state_dicts",
    "get_distributed_backend": "torchtune.training.distributed._fsdp",
    "get_full_optimizer_state_dict": "torchtune.training.distributed._state_dicts",
    "get_shard_conditions": "torchtune.training.distributed._fsdp",
    "get_world_size_and_rank": "torchtune.training.distributed._fsdp",
    "init_distributed": "torchtune.training.distributed._fsdp",
    "is_distributed": "torchtune.training.distributed._fsdp",
    "load_from_full_model_state_dict": "torchtune.training.distributed._state_dicts",
    "load_from_full_optimizer_state_dict": "torchtune.training.distributed._state_dicts",
    "set_torch_num_threads": "torchtune.training.distributed._fsdp",
    "validate_no_params_on_meta_device": "torchtune.training.distributed._fsdp",
    "is_rank_zero": "torchtune.training.distributed._fsdp",
    "launched_by_torchrun": "torchtune.training.distributed._fsdp",
    "load_full_state_dict": "torchtune.training.distributed._fsdp",
    "load_sharded_weights": "torchtune.training.distributed._fsdp",
    "full_weights_writer": "torchtune.training.distributed._full_weights",
    "save_full_weights": "torchtune.training.distributed._full_weights",
    "raise_if_any_rank_failed": "torchtune.training.distributed._fsdp",
    "shard_model": "torchtune.training.distributed._fsdp",
    "log_sharded_model": "torchtune.training.distributed._fsdp",
    "SHARDED_STATE_DIR": "torchtune.training.distributed._checkpoint",
    "SHARDED_STATE_MARKER": "torchtune.training.distributed._checkpoint",
    "ShardedCheckpointWriter": "torchtune.training.distributed._checkpoint",
    "load_sharded_checkpoint": "torchtune.training.distributed._checkpoint",
    "save_sharded_checkpoint": "torchtune.training.distributed._checkpoint",
    "check_offload_host_memory": "torchtune.training.estimate._offload_memory",
    "check_offload_for_run": "torchtune.training.estimate._offload_memory",
    "offload_plan": "torchtune.training.estimate._offload_memory",
    "ShardedModelReader": "torchtune.training.distributed._sharded_read",
    "holds_only_sharded_weights": "torchtune.training.distributed._sharded_read",
    "load_sharded_model": "torchtune.training.distributed._sharded_read",
    "export_hf_folder": "torchtune.training.checkpointing._hf_export",
    "exit_process": "torchtune.training.distributed._fsdp",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'torchtune.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


__all__ = [
    "CPUAdamW",
    "CPUSGD",
    # torchtune 0.6.1's public names of torchtune.training: all but get_quantizer_mode, prepare_mha_for_tp
    # and DistributedCheckpointer (quantization-aware training, tensor parallelism and its checkpointer are
    # outside this library's scope)
    "get_act_offloading_ctx_manager",
    "apply_selective_activation_checkpointing",
    "get_dtype",
    "set_default_dtype",
    "validate_expected_param_dtype",
    "FullModelHFCheckpointer",
    "FullModelMetaCheckpointer",
    "FullModelTorchTuneCheckpointer",
    "ModelType",
    "Checkpointer",
    "update_state_dict_for_classifier",
    "ADAPTER_CONFIG",
    "ADAPTER_KEY",
    "EPOCHS_KEY",
    "MAX_STEPS_KEY",
    "MODEL_KEY",
    "OPT_KEY",
    "RNG_KEY",
    "SEED_KEY",
    "STEPS_KEY",
    "TOTAL_EPOCHS_KEY",
    "get_cosine_schedule_with_warmup",
    "get_distributed_backend",
    "get_lr",
    "cleanup_before_training",
    "create_optim_in_bwd_wrapper",
    "get_memory_stats",
    "log_memory_stats",
    "OptimizerInBackwardWrapper",
    "register_optim_in_bwd_hooks",
    "set_activation_checkpointing",
    "init_distributed",
    "is_distributed",
    "get_world_size_and_rank",
    "set_torch_num_threads",
    "shard_model",
    "get_shard_conditions",
    "validate_no_params_on_meta_device",
    "gather_cpu_state_dict",
    "get_full_optimizer_state_dict",
    "load_from_full_model_state_dict",
    "load_from_full_optimizer_state_dict",
    "set_seed",
    "get_unmasked_sequence_lengths",
    "DEFAULT_PROFILE_DIR",
    "DEFAULT_PROFILER_ACTIVITIES",
    "DEFAULT_SCHEDULE",
    "DEFAULT_TRACE_OPTS",
    "DummyProfiler",
    "PROFILER_KEY",
    "setup_torch_profiler",
    "compile_loss",
    "compile_model",
    "NoOpManager",
    "OffloadActivations",
    "FormattedCheckpointFiles",
    "scale_grads",
    "disable_dropout",
    "DATALOADER_KEY",
    # this library's
    "checkpointing",
    "lr_schedulers",
    "memory",
    "metric_logging",
    "pooling",
    "precision",
    "seed",
    "EVAL_AFTER_TRAINING_KEYS",
    "EvalAfterTraining",
    "StepMetrics",
    "TrainingSteps",
    "check_distributed_settings",
    "check_finetune_config",
    "FINETUNE_DEFAULTS",
    "apply_process_settings",
    "build_profiler",
    "config_notes",
    "log_config_notes",
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
    "CPUAdamW",
    "CPUSGD",
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
    "is_rank_zero",
    "label_positions",
    "launched_by_torchrun",
    "load_full_state_dict",
    "load_sharded_weights",
    "full_weights_writer",
    "save_full_weights",
    "load_optimizer_state",
    "load_sharded_checkpoint",
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
    "prepare_output_dir",
    "resolve_resume",
    "resume_command",
    "save_sharded_checkpoint",
    "log_sharded_model",
    "shift_labels",
    "step_optimizer",
    "step_parameter",
    "trainable_parameters",
]

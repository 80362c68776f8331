"""The top-level keys of the finetune recipes beyond those every config has: the defaults of the keys a
config may leave out, torchtune 0.6.1's keys (and later torchtune spellings) and what each does here.

A torchtune config has none of this library's own keys (``overwrite``, ``bf16_stochastic_rounding``,
``validation_dataset`` ...) and leaves out some of torchtune's optional ones: each gets the default of
``FINETUNE_DEFAULTS`` (docs/recipe.md lists them). torchtune's keys are honoured where they mean something
here; where they do not, ``config_notes`` says in one line what they do here, and a value this library
cannot run (tensor parallelism, say) is an error naming the key.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Sequence

from omegaconf import DictConfig, ListConfig, OmegaConf

from torchtune._errors import ConfigError

log = logging.getLogger("torchtune")

__all__ = [
    "FINETUNE_DEFAULTS",
    "apply_process_settings",
    "REQUIRED_FINETUNE_KEYS",
    "TORCHTUNE_ALIASES",
    "apply_key_defaults",
    "check_torchtune_keys",
    "config_notes",
    "log_config_notes",
]

# The keys a finetune config must have (torchtune's recipes require each of them too).
REQUIRED_FINETUNE_KEYS = (
    "output_dir",
    "tokenizer",
    "dataset",
    "model",
    "checkpointer",
    "optimizer",
    "loss",
    "batch_size",
    "epochs",
    "device",
    "dtype",
)

# The value each other key takes when the config leaves it out (a recipe fills in only the keys it reads).
FINETUNE_DEFAULTS: Dict[str, Any] = {
    # torchtune's keys, with torchtune's defaults
    "seed": None,
    "shuffle": True,
    "resume_from_checkpoint": False,
    "max_steps_per_epoch": None,
    "gradient_accumulation_steps": 1,
    "optimizer_in_bwd": False,
    "lr_scheduler": None,
    "clip_grad_norm": None,
    "compile": False,
    "enable_activation_checkpointing": False,
    "enable_activation_offloading": False,
    "activation_offloading_use_streams": True,
    "metric_logger": [],
    "log_every_n_steps": 1,
    "log_peak_memory_stats": False,
    "log_level": None,
    "profiler": None,
    "cudnn_deterministic_mode": None,
    "ac_mode": None,
    "ac_option": None,
    "collate_fn": "torchtune.data.padded_collate_sft",
    "fsdp_cpu_offload": False,
    "fsdp_reshard_after_forward": True,
    "custom_sharded_layers": None,
    "tensor_parallel_dim": 1,
    "tensor_parallel_plan": None,
    "data_parallel_shard_dim": -1,
    "data_parallel_replicate_dim": 1,
    # this library's keys
    "overwrite": False,
    "optimizer_in_bwd_group": "param",
    "optimizer_on_cpu": False,
    "liger_kernels": False,
    "bf16_stochastic_rounding": False,
    "save_every_n_steps": None,
    "keep_last_n_checkpoints": None,
    "validation_dataset": None,
    "eval_every_n_steps": None,
    "eval_after_training": None,
    "global_batch_size": None,
    "dist_backend": None,
    "fsdp_param_dtype": None,
    "fsdp_reduce_dtype": None,
    "async_checkpoint": False,
}

# Later torchtune releases' spellings of keys this library has: the config's value moves to this library's key.
TORCHTUNE_ALIASES = {
    "dataset_val": "validation_dataset",
    "run_val_every_n_steps": "eval_every_n_steps",
    "enable_async_checkpointing": "async_checkpoint",
}

_PADDED_COLLATE = "torchtune.data.padded_collate_sft"
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def apply_key_defaults(cfg: DictConfig, recipe_keys: Sequence[str]) -> None:
    """Move torchtune's later spellings to this library's keys, then give every key of ``recipe_keys`` that
    ``cfg`` lacks its ``FINETUNE_DEFAULTS`` value (in place: the recipe then reads ``cfg.key`` as usual).

    Raises:
        ConfigError: a key given in both spellings.
    """
    for theirs, ours in TORCHTUNE_ALIASES.items():
        if theirs not in cfg or ours not in recipe_keys:
            continue
        if ours in cfg:
            raise ConfigError(
                f"{theirs} and {ours} are the same key (torchtune's spelling and this library's) and the config "
                f"sets both. Keep one: ~{theirs} or ~{ours}."
            )
        cfg[ours] = OmegaConf.to_container(cfg, resolve=False)[theirs]  # as written: ${...} stays one
        del cfg[theirs]
    for key in recipe_keys:
        if key not in cfg and key in FINETUNE_DEFAULTS:
            default = FINETUNE_DEFAULTS[key]
            cfg[key] = list(default) if isinstance(default, list) else default


def check_torchtune_keys(cfg: Any) -> None:
    """The values of torchtune's keys that this library runs only one way: each must ask for that way.

    Raises:
        ConfigError: naming the key and the value that runs here.
    """
    tp = cfg.get("tensor_parallel_dim", 1)
    if tp != 1:
        raise ConfigError(
            f"tensor_parallel_dim={tp}: tensor parallelism is not in this library, which shards every weight "
            "over all processes with FSDP2 (full_finetune_distributed). Set tensor_parallel_dim=1; FSDP2 over the "
            "same GPUs holds the same model."
        )
    shard, replicate = cfg.get("data_parallel_shard_dim", -1), cfg.get("data_parallel_replicate_dim", 1)
    if shard != -1 or replicate != 1:
        raise ConfigError(
            f"data_parallel_shard_dim={shard}, data_parallel_replicate_dim={replicate}: this library shards over "
            "every process (FSDP2, no replication groups: HSDP is not here). Set data_parallel_shard_dim=-1 and "
            "data_parallel_replicate_dim=1."
        )
    collate = cfg.get("collate_fn", _PADDED_COLLATE)
    if collate != _PADDED_COLLATE:
        raise ConfigError(
            f"collate_fn={collate}: batches are made by this library's collate, which pads each batch to its "
            f"longest sequence as {_PADDED_COLLATE} does (and packs the examples of a packed dataset). Remove "
            f"collate_fn or set collate_fn={_PADDED_COLLATE}."
        )
    level = cfg.get("log_level")
    if level is not None and str(level).upper() not in _LOG_LEVELS:
        raise ConfigError(f"log_level={level!r}: use one of {', '.join(_LOG_LEVELS)} (or null: INFO).")
    mode = cfg.get("cudnn_deterministic_mode")
    if mode not in (None, False, True, "default", "warn", "error", 0, 1, 2):
        raise ConfigError(
            f"cudnn_deterministic_mode={mode!r}: use null (off), warn (deterministic kernels where they exist, "
            "a warning where not) or error (an error where not)."
        )
    layers = cfg.get("custom_sharded_layers")
    if layers is not None and not (
        isinstance(layers, (ListConfig, list)) and all(isinstance(name, str) for name in layers)
    ):
        raise ConfigError(
            f"custom_sharded_layers={layers!r}: use a list of module names, e.g. ['tok_embeddings', 'output'], or null."
        )


def config_notes(cfg: Any, *, distributed: bool) -> List[str]:
    """One line for each torchtune key ``cfg`` sets that does nothing here, saying what runs instead."""
    notes = []
    if cfg.get("tensor_parallel_plan") is not None:
        notes.append(
            "tensor_parallel_plan: not used, there is no tensor parallelism here (tensor_parallel_dim=1); FSDP2 "
            "shards every weight over all processes."
        )
    if cfg.get("ac_mode") is not None or cfg.get("ac_option") is not None:
        notes.append(
            "ac_mode / ac_option: selective activation checkpointing is not here; enable_activation_checkpointing "
            "checkpoints every decoder layer."
        )
    if cfg.get("custom_sharded_layers"):
        notes.append(
            f"custom_sharded_layers {list(cfg.custom_sharded_layers)}: not used; the weights outside the decoder "
            "layers (embedding, output, final norm) are sharded with the model's root unit here"
            + ("" if distributed else ", and on one device nothing is sharded")
            + "."
        )
    if str(cfg.get("device", "")).startswith("cpu") and cfg.get("fsdp_cpu_offload"):
        notes.append("fsdp_cpu_offload: on the CPU the shards are in host memory already (nothing to offload).")
    if str(cfg.get("device", "")).startswith("cpu") and cfg.get("enable_activation_offloading"):
        notes.append("enable_activation_offloading: on the CPU the activations are in host memory already (no copy).")
    return notes


def log_config_notes(cfg: Any, *, distributed: bool) -> None:
    """Log ``config_notes`` (once per process: the distributed recipe calls it on rank 0)."""
    for note in config_notes(cfg, distributed=distributed):
        log.info("%s", note)


def apply_process_settings(cfg: Any) -> None:
    """This process's ``log_level`` (the ``torchtune`` logger's level; null keeps INFO) and torchtune's
    ``cudnn_deterministic_mode`` (``utils.set_deterministic_mode``)."""
    from torchtune import utils

    level = cfg.get("log_level")
    if level is not None:
        log.setLevel(str(level).upper())
    utils.set_deterministic_mode(cfg.get("cudnn_deterministic_mode"))

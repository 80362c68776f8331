"""The checks of the keys both recipes' training loops read, in one call, and every check of a config
both finetune recipes make before building anything.

Apart from ``_checks`` because it gathers checks from the modules that own those keys (resume, output
folder, validation, metric loggers), several of which import ``_checks`` themselves.
"""

from __future__ import annotations

from typing import Any, Sequence

from torchtune import config, utils
from torchtune._errors import ConfigError
from torchtune.training.run._eval_after_training import EvalAfterTraining
from torchtune.training.run._metrics import check_metric_logger
from torchtune.training.run._output_dir import check_overwrite
from torchtune.training.run._resume import check_resume_keys
from torchtune.training.run._validation import check_validation_settings
from torchtune.training.setup._checks import check_liger, check_optimizer_settings, check_value_types, positive_int
from torchtune.training.setup._recipe_keys import apply_key_defaults, check_torchtune_keys

__all__ = ["check_finetune_config", "check_loop_keys"]


def check_finetune_config(cfg: Any, recipe_keys: Sequence[str], recipe_name: str, shipped_config: str) -> None:
    """What both finetune recipes check of ``cfg`` before building anything: its keys (those of
    ``recipe_keys``, no others; ``shipped_config`` is named as an example), value types and ranges,
    device and dtype spellings, optimizer settings, liger-kernel's device and package, the loop's keys
    and ``eval_after_training``.

    First the keys a config may leave out get their defaults (``FINETUNE_DEFAULTS``), in ``cfg`` itself, and
    torchtune's later spellings become this library's keys: a torchtune config runs as written.

    Raises:
        ConfigError: naming the key to change.
    """
    apply_key_defaults(cfg, recipe_keys)
    config.check_recipe_keys(cfg, recipe_keys, recipe_name, shipped_config)
    check_torchtune_keys(cfg)
    check_value_types(cfg)
    utils.parse_device(cfg.device)
    utils.dtype_name(cfg.dtype)
    check_optimizer_settings(cfg)
    check_liger(cfg)
    check_loop_keys(cfg)
    EvalAfterTraining(cfg)


def check_loop_keys(cfg: Any) -> None:
    """The checks of the keys the training loop of both recipes reads: step counts and intervals, resume,
    output folder, validation and metric loggers.

    Raises:
        ConfigError: naming the key to change.
    """
    for key in ("epochs", "log_every_n_steps"):
        positive_int(cfg, key)
    if cfg.get("global_batch_size") is None:
        positive_int(cfg, "batch_size")
    else:
        positive_int(cfg, "global_batch_size")
        if cfg.batch_size is not None:
            raise ConfigError(
                f"global_batch_size={cfg.global_batch_size} and batch_size={cfg.batch_size} are both set: batch_size "
                "is the batch of each process, global_batch_size the batch of all of them split over the processes. "
                "Set batch_size=null to split the global batch, or remove global_batch_size."
            )
    for key in ("max_steps_per_epoch", "save_every_n_steps", "keep_last_n_checkpoints"):
        positive_int(cfg, key, allow_none=True)
    check_resume_keys(cfg)
    check_overwrite(cfg)
    check_validation_settings(cfg)
    check_metric_logger(cfg)

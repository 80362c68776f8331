"""The checks of the keys both recipes' training loops read, in one call.

Apart from ``_checks`` because it gathers checks from the modules that own those keys (resume, output
folder, validation, metric loggers), several of which import ``_checks`` themselves.
"""

from __future__ import annotations

from typing import Any

from torchtune.training._checks import positive_int
from torchtune.training._metrics import check_metric_logger
from torchtune.training._output_dir import check_overwrite
from torchtune.training._resume import check_resume_keys
from torchtune.training._validation import check_validation_settings

__all__ = ["check_loop_keys"]


def check_loop_keys(cfg: Any) -> None:
    """The checks of the keys the training loop of both recipes reads: step counts and intervals, resume,
    output folder, validation and metric loggers.

    Raises:
        ConfigError: naming the key to change.
    """
    for key in ("batch_size", "epochs", "log_every_n_steps"):
        positive_int(cfg, key)
    for key in ("max_steps_per_epoch", "save_every_n_steps", "keep_last_n_checkpoints"):
        positive_int(cfg, key, allow_none=True)
    check_resume_keys(cfg)
    check_overwrite(cfg)
    check_validation_settings(cfg)
    check_metric_logger(cfg)

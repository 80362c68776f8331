"""torchtune's logging helpers at their path: a logger with a handler, messages from rank 0 only."""

from __future__ import annotations

import logging
import warnings
from functools import lru_cache, wraps
from typing import Any, Callable, Optional, TypeVar

from torch import distributed as dist

T = TypeVar("T")


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def get_logger(level: Optional[str] = None) -> logging.Logger:
    """This module's logger, with a stream handler if none is set up; ``level`` ("INFO", "DEBUG") sets its level."""
    logger = logging.getLogger(__name__)
    if not logger.hasHandlers():
        logger.addHandler(logging.StreamHandler())
    if level is not None:
        logger.setLevel(getattr(logging, level.upper()))
    return logger


def log_rank_zero(logger: logging.Logger, msg: str, level: int = logging.INFO) -> None:
    """Log ``msg`` on rank 0 only (every process is rank 0 outside a process group)."""
    if _rank() == 0:
        logger.log(level, msg, stacklevel=2)


@lru_cache(None)
def log_once(logger: logging.Logger, msg: str, level: int = logging.INFO) -> None:
    """Log ``msg`` once per process (later calls with the same arguments do nothing), on rank 0."""
    log_rank_zero(logger=logger, msg=msg, level=level)


def deprecated(msg: str = "") -> Callable[[T], T]:
    """Mark a function or class deprecated: its first use warns (FutureWarning, rank 0) with ``msg`` added."""

    @lru_cache(maxsize=1)
    def warn(obj: Any) -> None:
        if _rank() == 0:
            warnings.warn(
                f"{obj.__name__} is deprecated and will be removed in future versions. {msg}",
                category=FutureWarning,
                stacklevel=3,
            )

    def decorator(obj: Any) -> Any:
        @wraps(obj)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            warn(obj)
            return obj(*args, **kwargs)

        return wrapper

    return decorator

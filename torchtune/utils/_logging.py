"""torchtune's logging helpers: a logger that prints without any set-up, messages from rank 0 only, and a
deprecation decorator."""

from __future__ import annotations

import logging
import warnings
from functools import lru_cache, wraps
from typing import Callable, Optional, TypeVar

from torch import distributed as dist

T = TypeVar("T")


def get_logger(level: Optional[str] = None) -> logging.Logger:
    """A logger under this library's ``torchtune`` logger that prints to stderr even when nothing configured
    logging (a ``StreamHandler`` is added when neither it nor its parents have a handler).

    Args:
        level: a level name (``"INFO"``, ``"DEBUG"`` ...) to set on it; None leaves it as it is.
    """
    logger = logging.getLogger(__name__)
    if not logger.hasHandlers():
        logger.addHandler(logging.StreamHandler())
    if level is not None:
        logger.setLevel(getattr(logging, level.upper()))
    return logger


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def log_rank_zero(logger: logging.Logger, msg: str, level: int = logging.INFO) -> None:
    """Log ``msg`` at ``level`` on rank 0 (or the only process); other ranks log nothing."""
    if _rank() != 0:
        return
    logger.log(level, msg, stacklevel=2)


@lru_cache(None)
def log_once(logger: logging.Logger, msg: str, level: int = logging.INFO) -> None:
    """:func:`log_rank_zero`, once per distinct ``(logger, msg, level)`` in the process."""
    log_rank_zero(logger=logger, msg=msg, level=level)


def deprecated(msg: str = "") -> Callable[[T], T]:
    """Mark a function or class as deprecated: its first use (on rank 0) warns with a ``FutureWarning`` naming
    it, followed by ``msg``."""

    def decorator(obj: T) -> T:
        warned = []

        @wraps(obj)
        def wrapper(*args, **kwargs):
            if not warned and _rank() == 0:
                warned.append(True)
                warnings.warn(
                    f"{obj.__name__} is deprecated and will be removed in future versions. {msg}",
                    category=FutureWarning,
                    stacklevel=2,
                )
            return obj(*args, **kwargs)

        return wrapper

    return decorator

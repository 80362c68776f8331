"""Seeding (torchtune's ``set_seed``) and RNG state capture for exact resume."""

from __future__ import annotations

import logging
import os
import random
from typing import Any, Dict, Optional, Union

import numpy as np
import torch

from torchtune._errors import TuneValueError
from torchtune.utils._device import get_world_size_and_rank

log = logging.getLogger("torchtune")

_MAX_SEED = np.iinfo(np.uint32).max


def draw_seed() -> int:
    """A fresh seed from the operating system's entropy (not from the seeded generators)."""
    return random.SystemRandom().randint(0, 2**31 - 1)


def set_seed(
    seed: Optional[int] = None, debug_mode: Optional[Union[str, int]] = None, *, offset_by_rank: bool = True
) -> int:
    """Seed Python's ``random``, NumPy and torch (every device) and return the seed.

    ``None`` draws a seed from the operating system's entropy (in a process group, rank 0's, sent to all).
    Each process seeds ``seed + rank`` (torchtune's rule; ``offset_by_rank=False`` seeds every rank alike, as
    the distributed recipe does so that its ranks draw what one process would).

    Args:
        seed: in ``[0, 2**32 - world_size]``, or None.
        debug_mode: PyTorch's determinism mode (``torch.set_deterministic_debug_mode``): None leaves the global
            settings alone; ``"default"`` / 0 allows nondeterministic ops and turns the cuDNN benchmark on;
            ``"warn"`` / 1 and ``"error"`` / 2 warn on / refuse them, turn cuDNN's deterministic mode on and its
            benchmark off, and set ``CUBLAS_WORKSPACE_CONFIG`` for deterministic cuBLAS.
        offset_by_rank: add the process's rank to the seed.

    Raises:
        ValueError: a seed outside the range.
    """
    world_size, rank = get_world_size_and_rank()
    top = _MAX_SEED - world_size + 1
    if seed is None:
        seed = draw_seed()
        if world_size > 1:
            shared = [seed]
            torch.distributed.broadcast_object_list(shared, src=0)
            seed = int(shared[0])
    if not 0 <= seed <= top:
        raise TuneValueError(
            f"Invalid seed value provided: {seed}. Value must be in the range [0, {top}]: set seed to a whole "
            "number in it (or null to draw one)."
        )
    local_seed = seed + rank if offset_by_rank else seed
    torch.manual_seed(local_seed)  # also seeds every CUDA device
    np.random.seed(local_seed)
    random.seed(local_seed)
    if debug_mode is not None:
        torch.set_deterministic_debug_mode(debug_mode)
        deterministic = torch.get_deterministic_debug_mode() != 0
        torch.backends.cudnn.deterministic = deterministic
        torch.backends.cudnn.benchmark = not deterministic
        if deterministic:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = ":4096:8"
    return seed


def get_rng_state() -> Dict[str, Any]:
    """RNG states in a form ``torch.load(weights_only=True)`` accepts."""
    state: Dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    """Restore what :func:`get_rng_state` captured."""
    torch.set_rng_state(state["torch"])
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def set_deterministic_mode(mode: Any) -> None:
    """torchtune's ``cudnn_deterministic_mode``: ``None``/``False``/``"default"``/0 leave PyTorch as it is;
    ``"warn"``/1 makes it pick deterministic kernels and warn where an op has none; ``"error"``/2/``True``
    raise there instead. cuDNN's autotuner is switched off too (it picks kernels by timing)."""
    if mode in (None, False, "default", 0):
        return
    import os

    # cuBLAS is deterministic only with a fixed workspace, set before its first call
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=mode in ("warn", 1))
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False

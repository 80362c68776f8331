"""Seeding and RNG state capture for exact resume."""

from __future__ import annotations

import random
from typing import Any, Dict, Optional

import torch


def draw_seed() -> int:
    """A fresh seed from the operating system's entropy (not from the seeded generators)."""
    return random.SystemRandom().randint(0, 2**31 - 1)


def set_seed(seed: Optional[int] = None) -> int:
    """Seed python and torch (all devices); a ``None`` seed draws one and returns it."""
    if seed is None:
        seed = draw_seed()
    random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device
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

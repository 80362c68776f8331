"""Device and dtype selection with errors that say which key to change."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch

from torchtune._errors import ConfigError, TuneError

_DTYPES = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp32": torch.float32, "float32": torch.float32}


def get_device(device: Optional[str] = None) -> torch.device:
    """Resolve ``device`` (``cuda``, ``cuda:1``, ``cpu``, ``mps``; ``None`` picks cuda if present).

    Raises:
        TuneError: the device does not exist on this machine.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except RuntimeError as exc:
        raise ConfigError(
            f"device={device!r} is not a device name PyTorch knows. Use device=cuda, device=cuda:N, "
            "device=cpu or device=mps."
        ) from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise TuneError(
                f"device={device} was asked for, but PyTorch sees no CUDA GPU on this machine "
                f"(torch {torch.__version__}). Run with device=cpu, or install a CUDA build of "
                "PyTorch on a machine with an NVIDIA GPU."
            )
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        if index >= torch.cuda.device_count():
            raise TuneError(
                f"device={device} was asked for, but this machine has {torch.cuda.device_count()} "
                f"CUDA device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1}). Pick one of those."
            )
        dev = torch.device("cuda", index)
    elif dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise TuneError(f"device={device} was asked for, but MPS is not available here. Use device=cpu.")
    elif dev.type != "cpu":
        raise ConfigError(f"device={device} is not supported by this recipe. Use cuda, cpu or mps.")
    return dev


def get_dtype(dtype: str, device: torch.device) -> torch.dtype:
    """Resolve the ``dtype`` key: bf16 or fp32.

    fp16 is refused: it needs loss scaling, and with optimizer in backward each gradient is
    consumed by its optimizer the moment it exists, so there is no point at which gradients could
    be unscaled or skipped on overflow.
    """
    key = str(dtype).lower()
    if key in {"fp16", "float16", "half"}:
        raise ConfigError(
            "dtype=fp16 is not supported: fp16 training needs a gradient scaler, and with "
            "optimizer in backward gradients are used the moment they are computed, so overflowing "
            "steps cannot be unscaled or skipped. Use dtype=bf16 (or dtype=fp32)."
        )
    if key not in _DTYPES:
        raise ConfigError(f"dtype={dtype!r} is not one of bf16, fp32. Set dtype=bf16 or dtype=fp32.")
    result = _DTYPES[key]
    if result == torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise TuneError("dtype=bf16 was asked for, but this GPU does not support bfloat16. Use dtype=fp32.")
    return result


@contextlib.contextmanager
def set_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules directly in ``dtype`` (no fp32 copy first), restoring the default after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)

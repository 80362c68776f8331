"""Device and dtype selection with errors that say which key to change."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch

from torchtune._errors import ConfigError, TuneError

# Every spelling of the ``dtype`` key, in one table. A value is matched after lower-casing and dropping
# "torch.", "-", "_" and spaces, so bf16, BF16, bfloat16, torch.bfloat16 and bf-16 are one dtype, and
# fp-16 is refused for the same reason as fp16.
_DTYPE_SPELLINGS = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
}
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def get_device(device: Optional[str] = None) -> torch.device:
    """Resolve ``device`` (``cuda``, ``cuda:1``, ``cpu``, ``mps``; ``None`` picks cuda if present).

    Raises:
        TuneError: the device does not exist on this machine.
    """
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = parse_device(device)
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
    return dev


def parse_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` of a supported type, without asking whether this machine has it.

    Raises:
        ConfigError: a name PyTorch does not know, or a device type other than cuda, cpu and mps.
    """
    try:
        dev = torch.device(str(device))
    except RuntimeError as exc:
        raise ConfigError(
            f"device={device!r} is not a device name PyTorch knows. Use device=cuda, device=cuda:N, "
            "device=cpu or device=mps."
        ) from exc
    if dev.type not in ("cuda", "cpu", "mps"):
        raise ConfigError(f"device={device} is not supported by this recipe. Use cuda, cpu or mps.")
    return dev


def dtype_name(dtype: Any) -> str:
    """The canonical name (``bf16`` or ``fp32``) of a ``dtype`` config value, whatever its spelling.

    Raises:
        ConfigError: fp16 in any spelling (see ``get_dtype``), or a value that is no known dtype.
    """
    key = str(dtype).strip().lower().removeprefix("torch.")
    key = key.replace("-", "").replace("_", "").replace(" ", "")
    name = _DTYPE_SPELLINGS.get(key)
    if name == "fp16":
        raise ConfigError(
            f"dtype={dtype}{'' if key == 'fp16' else ' (fp16)'} is not supported: fp16 training needs a "
            "gradient scaler, and with optimizer in backward gradients are used the moment they are computed, "
            "so overflowing steps cannot be unscaled or skipped. Use dtype=bf16 (or dtype=fp32)."
        )
    if name is None:
        raise ConfigError(
            f"dtype={dtype!r} is not a dtype this recipe trains in. Set dtype=bf16 (also spelled bfloat16) "
            "or dtype=fp32 (float32)."
        )
    return name


def get_dtype(dtype: Any, device: torch.device) -> torch.dtype:
    """Resolve the ``dtype`` key (any spelling ``dtype_name`` accepts) to bf16 or fp32 on ``device``.

    fp16 is refused: it needs loss scaling, and with optimizer in backward each gradient is
    consumed by its optimizer the moment it exists, so there is no point at which gradients could
    be unscaled or skipped on overflow. bf16 on a CUDA device needs native support on that device
    (``check_native_bf16``).

    Raises:
        ConfigError: as ``dtype_name``.
        TuneError: bf16 on a GPU without native bfloat16 (before Ampere).
    """
    result = _DTYPES[dtype_name(dtype)]
    if result == torch.bfloat16 and device.type == "cuda":
        check_native_bf16(device)
    return result


# Compute capability 8.0 (Ampere) brought bf16 tensor-core matmuls and the flash / memory-efficient
# SDPA kernels for bf16; older cards emulate bf16 matmuls through fp32 and run attention on the math
# kernel, whose memory grows with the square of the sequence length.
_NATIVE_BF16_CAPABILITY = (8, 0)


def check_native_bf16(device: torch.device) -> None:
    """Refuse bf16 on a CUDA device that would only emulate it.

    ``torch.cuda.is_bf16_supported()`` also says yes where bf16 is emulated (T4, V100, P100: common
    16 GB cards) and asks the current device, not the configured one; this asks ``device`` itself
    for its compute capability. ROCm GPUs that PyTorch supports all have bf16.

    Raises:
        TuneError: no CUDA here, or ``device`` is older than compute capability 8.0; the message
            names the card and what to use instead.
    """
    if torch.version.hip:
        return
    if not torch.cuda.is_available():
        raise TuneError(
            f"dtype=bf16 on device={device} was asked for, but PyTorch sees no CUDA GPU on this machine. "
            "Run with device=cpu, or on a machine with an NVIDIA GPU."
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) >= _NATIVE_BF16_CAPABILITY:
        return
    name = torch.cuda.get_device_name(index)
    raise TuneError(
        f"dtype=bf16 was asked for, but cuda:{index} is a {name} (compute capability {major}.{minor}), which has "
        "no native bfloat16: PyTorch would emulate bf16 matmuls (several times slower) and run attention on the "
        "math kernel, whose memory grows with the square of the sequence length, so the memory figures of the bf16 "
        "configs do not hold. Use dtype=fp32 on this card (weights, gradients and optimizer state take twice the "
        "memory; fp16 is not supported by this recipe), or a GPU of compute capability 8.0 or newer (Ampere or "
        "later: A100, A10, L4, RTX 30xx/40xx, H100)."
    )


@contextlib.contextmanager
def set_default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Build modules directly in ``dtype`` (no fp32 copy first), restoring the default after."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)

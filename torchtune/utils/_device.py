"""Devices and dtypes: torchtune's device helpers (``get_device``, ``DeviceSupport``, ``batch_to_device`` ...) and
this library's checks of the ``device`` / ``dtype`` config keys, with errors that say which key to change."""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
from enum import Enum
from typing import Any, Iterator, Optional, Tuple

import torch

from torchtune._errors import ConfigError, TuneError, TuneRuntimeError, TuneValueError

log = logging.getLogger("torchtune")

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
    "fp64": "fp64",
    "float64": "fp64",
    "double": "fp64",
}
# torchtune's precisions (training.get_dtype resolves all four); the recipes train in bf16 or fp32.
_PRECISIONS = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32, "fp64": torch.float64}
_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}

# Ascend NPUs come with the torch_npu package; looked up, not imported (importing torchtune has no side effects).
is_npu_available = importlib.util.find_spec("torch_npu") is not None


def get_world_size_and_rank() -> Tuple[int, int]:
    """``(world_size, rank)`` of the default process group, ``(1, 0)`` outside one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_world_size(), torch.distributed.get_rank()
    return 1, 0


class DeviceSupport(Enum):
    """The accelerator kinds torchtune knows: ``device_type`` (torch's name), ``device_name`` (for messages) and
    the ``communication_backend`` of torch.distributed on it."""

    CPU = ("cpu", "CPU", "gloo")
    CUDA = ("cuda", "GPU", "nccl")
    NPU = ("npu", "NPU", "hccl")
    XPU = ("xpu", "XPU", "ccl")

    def __init__(self, device_type: str, device_name: str, communication_backend: str) -> None:
        self.device_type = device_type
        self.device_name = device_name
        self.communication_backend = communication_backend

    @staticmethod
    def from_type(device_type: str) -> "DeviceSupport":
        """The member of ``device_type`` (``"cuda"``).

        Raises:
            ValueError: no member has that type.
        """
        for member in DeviceSupport:
            if member.device_type == device_type:
                return member
        raise TuneValueError(f"Unknown device type: {device_type}; known: cpu, cuda, npu, xpu.")


def _get_device_type_from_env() -> str:
    """The best accelerator this machine has: ``cuda``, ``npu``, ``xpu``, else ``cpu``."""
    if torch.cuda.is_available():
        return "cuda"
    if is_npu_available and getattr(torch, "npu", None) is not None and torch.npu.is_available():
        return "npu"
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return "xpu"
    return "cpu"


def get_device_support() -> DeviceSupport:
    """The ``DeviceSupport`` of this machine's best accelerator (``CPU`` without one)."""
    return DeviceSupport.from_type(_get_device_type_from_env())


def get_torch_device_namespace() -> Any:
    """torch's module for this machine's best accelerator (``torch.cuda``, ``torch.xpu`` ...; ``torch.cpu``
    without one), for ``empty_cache`` / ``memory_stats`` / ``set_device`` calls that read the same everywhere."""
    device_type = get_device_support().device_type
    namespace = getattr(torch, device_type, None)
    if namespace is None:
        log.warning("torch has no %r namespace; using torch.cuda.", device_type)
        return torch.cuda
    return namespace


def _get_local_rank() -> Optional[int]:
    """``LOCAL_RANK`` of a torchrun launch, or None."""
    local_rank = os.environ.get("LOCAL_RANK")
    return int(local_rank) if local_rank is not None else None


def _setup_device(device: torch.device) -> torch.device:
    """Give an accelerator ``device`` its index (``LOCAL_RANK``, else 0, when it has none) and make it the
    current device of its kind.

    Raises:
        RuntimeError: the index is past the devices this machine has.
    """
    support = get_device_support()
    namespace = get_torch_device_namespace()
    if device.index is None:
        device = torch.device(support.device_type, _get_local_rank() or 0)
    if device.index >= namespace.device_count():
        raise TuneRuntimeError(
            f"The local rank is larger than the number of available {support.device_name}s: {device} was asked "
            f"for and this machine has {namespace.device_count()}. Launch at most that many processes per node "
            "(--nproc_per_node), or pick an existing device index."
        )
    namespace.set_device(device)
    return device


def _validate_device_from_env(device: torch.device) -> None:
    """Refuse a device this machine does not have, and, under torchrun, an accelerator index other than the
    process's ``LOCAL_RANK``.

    Raises:
        RuntimeError: naming the device and what to use instead.
    """
    local_rank = _get_local_rank()
    if device.type != "cpu" and device.type != "meta" and local_rank is not None and device.index != local_rank:
        raise TuneRuntimeError(
            f"You can't specify a device index when using distributed training. Device specified is {device} but "
            f"local rank is:{local_rank}. Set device={device.type} (each process takes the device of its rank)."
        )
    try:
        torch.empty(0, device=device)
    except RuntimeError as exc:
        raise TuneRuntimeError(
            f"The device {device} is not available on this machine ({exc}). Use device=cpu or an accelerator "
            "this machine has."
        ) from exc


def get_device(device: Optional[str] = None) -> torch.device:
    """The ``torch.device`` of ``device`` (``cuda``, ``cuda:1``, ``cpu``, ``mps``, ``meta`` ...; ``None``: the best
    accelerator this machine has, else the CPU), checked to exist here. An accelerator without an index gets
    ``LOCAL_RANK`` (0 outside torchrun) and becomes the current device, as torchtune does.

    Raises:
        ConfigError: a name PyTorch does not know.
        TuneError: the device does not exist on this machine (for CUDA: no GPU, or no GPU of that index);
            under torchrun, an index other than the process's local rank.
    """
    if device is None:
        device = _get_device_type_from_env()
    dev = _torch_device(device)
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise TuneError(
                f"device={device} was asked for, but PyTorch sees no CUDA GPU on this machine "
                f"(torch {torch.__version__}). Run with device=cpu, or install a CUDA build of "
                "PyTorch on a machine with an NVIDIA GPU."
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise TuneError(
                f"device={device} was asked for, but this machine has {torch.cuda.device_count()} "
                f"CUDA device(s) (cuda:0 to cuda:{torch.cuda.device_count() - 1}). Pick one of those."
            )
    elif dev.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise TuneError(f"device={device} was asked for, but MPS is not available here. Use device=cpu.")
    if dev.type in ("cuda", "npu", "xpu"):
        dev = _setup_device(dev)
    _validate_device_from_env(dev)
    return dev


def _torch_device(device: Any) -> torch.device:
    try:
        return torch.device(str(device))
    except RuntimeError as exc:
        raise ConfigError(
            f"device={device!r} is not a device name PyTorch knows. Use device=cuda, device=cuda:N, "
            "device=cpu or device=mps."
        ) from exc


def batch_to_device(batch: dict, device: torch.device) -> None:
    """Move every tensor of ``batch`` (nested dicts too) to ``device``, in place.

    Raises:
        ValueError: a value is neither a tensor, a dict nor a flex-attention ``BlockMask``.
    """
    for key, value in batch.items():
        if isinstance(value, dict):
            batch_to_device(value, device)
        elif isinstance(value, torch.Tensor) or _is_block_mask(value):
            batch[key] = value.to(device)
        else:
            raise TuneValueError(
                f"To use batch_to_device, all elements in the batch must be a dict or Tensor. Got key {key!r} with "
                f"value of type {type(value)}."
            )


def _is_block_mask(value: Any) -> bool:
    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:  # torch without flex attention
        return False
    return isinstance(value, BlockMask)


def parse_device(device: Any) -> torch.device:
    """``device`` as a ``torch.device`` of a supported type, without asking whether this machine has it.

    Raises:
        ConfigError: a name PyTorch does not know, or a device type other than cuda, cpu and mps.
    """
    dev = _torch_device(device)
    if dev.type not in ("cuda", "cpu", "mps"):
        raise ConfigError(f"device={device} is not supported by this recipe. Use cuda, cpu or mps.")
    return dev


def _spelling(dtype: Any) -> tuple[str, Optional[str]]:
    key = str(dtype).strip().lower().removeprefix("torch.")
    key = key.replace("-", "").replace("_", "").replace(" ", "")
    return key, _DTYPE_SPELLINGS.get(key)


def precision_dtype(dtype: Any) -> torch.dtype:
    """``dtype`` (a ``torch.dtype``, or any spelling of fp16, bf16, fp32, fp64) as a ``torch.dtype``.

    Raises:
        ValueError: anything else.
    """
    if isinstance(dtype, torch.dtype):
        if dtype in _PRECISIONS.values():
            return dtype
    else:
        name = _spelling(dtype)[1]
        if name is not None:
            return _PRECISIONS[name]
    raise TuneValueError(
        f"Dtype {dtype} must be one of {', '.join(_PRECISIONS)} for finetuning (also spelled float16, bfloat16, "
        "float32, float64)."
    )


def dtype_name(dtype: Any) -> str:
    """The canonical name (``bf16`` or ``fp32``) of a ``dtype`` config value, whatever its spelling.

    Raises:
        ConfigError: fp16 in any spelling (see ``get_dtype``), or a value that is no dtype the recipes train in.
    """
    key, name = _spelling(dtype)
    if name == "fp16":
        raise ConfigError(
            f"dtype={dtype}{'' if key == 'fp16' else ' (fp16)'} is not supported: fp16 training needs a "
            "gradient scaler, and with optimizer in backward gradients are used the moment they are computed, "
            "so overflowing steps cannot be unscaled or skipped. Use dtype=bf16 (or dtype=fp32)."
        )
    if name not in _DTYPES:
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


def has_native_bf16(index: Optional[int] = None) -> bool:
    """True when CUDA device ``index`` (the current one by default) computes bf16 natively (compute capability
    8.0 or newer; every ROCm GPU PyTorch supports). False without CUDA."""
    if not torch.cuda.is_available():
        return False
    if torch.version.hip:
        return True
    index = torch.cuda.current_device() if index is None else index
    return torch.cuda.get_device_capability(index) >= _NATIVE_BF16_CAPABILITY


def check_native_bf16(device: torch.device) -> None:
    """Refuse bf16 on a CUDA device that would only emulate it.

    ``torch.cuda.is_bf16_supported()`` also says yes where bf16 is emulated (T4, V100, P100: common
    16 GB cards) and asks the current device, not the configured one; this asks ``device`` itself
    for its compute capability. ROCm GPUs that PyTorch supports all have bf16.

    Raises:
        TuneError: no CUDA here, or ``device`` is older than compute capability 8.0; the message
            names the card and what to use instead.
    """
    if not torch.cuda.is_available():
        raise TuneRuntimeError(
            f"dtype=bf16 on device={device} was asked for, but PyTorch sees no CUDA GPU on this machine. "
            "Run with device=cpu, or on a machine with an NVIDIA GPU."
        )
    if torch.version.hip:
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    if (major, minor) >= _NATIVE_BF16_CAPABILITY:
        return
    name = torch.cuda.get_device_name(index)
    raise TuneRuntimeError(
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

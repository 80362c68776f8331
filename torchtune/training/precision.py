"""torchtune's precision helpers: a precision name to a ``torch.dtype``, whether this machine computes bf16, the
default dtype modules are built in, and a check that parameters have the dtype they should.

The recipes resolve their ``dtype`` key with ``torchtune.utils.get_dtype`` (bf16 or fp32 only: fp16 needs a
gradient scaler that optimizer in backward cannot have); ``get_dtype`` here is torchtune's, which resolves any
of fp16, bf16, fp32 and fp64.
"""

from __future__ import annotations

from typing import Iterable, List, Optional, Tuple

import torch

from torchtune._errors import TuneRuntimeError, TuneValueError
from torchtune.utils._device import _PRECISIONS, has_native_bf16, is_npu_available, precision_dtype, set_default_dtype

__all__ = [
    "PRECISION_STR_TO_DTYPE",
    "get_dtype",
    "set_default_dtype",
    "validate_expected_param_dtype",
    "verify_bf16_support",
]

PRECISION_STR_TO_DTYPE = dict(_PRECISIONS)


def _set_float32_precision(precision: str = "high") -> None:
    """Let fp32 matmuls and convolutions use TF32 (``"high"``) or not (``"highest"``) on CUDA / NPU; a no-op
    elsewhere."""
    if not (torch.cuda.is_available() or is_npu_available):
        return
    torch.set_float32_matmul_precision(precision)
    torch.backends.cudnn.allow_tf32 = precision != "highest"


def verify_bf16_support() -> bool:
    """True when this machine computes bf16 natively: a CUDA GPU of compute capability 8.0 or newer (ROCm:
    any), Apple MPS, an Ascend NPU or an Intel XPU that supports it."""
    mps = torch.backends.mps.is_available() and torch.backends.mps.is_built()
    npu = is_npu_available and getattr(torch, "npu", None) is not None and torch.npu.is_bf16_supported()
    xpu = hasattr(torch, "xpu") and torch.xpu.is_available() and torch.xpu.is_bf16_supported()
    return has_native_bf16() or mps or npu or xpu


def get_dtype(dtype: Optional[str] = None, device: Optional[torch.device] = None) -> torch.dtype:
    """The ``torch.dtype`` of a precision: ``None`` is fp32; ``"fp16"``, ``"bf16"``, ``"fp32"``, ``"fp64"`` (or
    float16, bfloat16 ... or a ``torch.dtype``). bf16 on any device but the CPU (``None``: an accelerator is
    assumed) needs ``verify_bf16_support()``.

    Raises:
        ValueError: not one of those precisions.
        RuntimeError: bf16 asked for where this machine would only emulate it.
    """
    if dtype is None:
        return torch.float32
    result = precision_dtype(dtype)
    on_cpu = device is not None and torch.device(device).type in ("cpu", "meta")
    if result == torch.bfloat16 and not on_cpu and not verify_bf16_support():
        raise TuneRuntimeError(
            "bf16 precision was requested but not available on this hardware (bf16 needs a GPU of compute "
            "capability 8.0 or newer, Apple MPS, an Ascend NPU or an Intel XPU). Please use fp32 precision instead."
        )
    return result


def validate_expected_param_dtype(
    named_params: Iterable[Tuple[str, torch.nn.Parameter]],
    dtype: torch.dtype,
    exclude_param_names: Optional[List[str]] = None,
) -> None:
    """Check that every parameter has ``dtype``, except those whose name contains one of ``exclude_param_names``.

    Raises:
        ValueError: naming the first parameter of another dtype.
    """
    for name, param in named_params:
        if exclude_param_names is not None and any(n in name for n in exclude_param_names):
            continue
        if param.dtype != dtype:
            raise TuneValueError(
                f"Parameter {name} has dtype {param.dtype}, but expected {dtype}: build the model under "
                f"set_default_dtype({dtype}) or cast it with model.to({dtype})."
            )

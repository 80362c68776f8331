"""liger-kernel's real Triton kernels on CPU tensors, through Triton's interpreter (``TRITON_INTERPRET=1``).

The interpreter runs a kernel's Python body with NumPy; ``@triton.jit`` picks it when a kernel is
defined, Triton's own helpers included, so the variable must be set before Triton is imported
(tests/conftest.py does, where PyTorch sees no GPU), and stays set while the kernels run (Triton reads it
again inside interpreted calls). Two gaps of Triton 3.9's interpreter that compiled Triton
does not have are closed here, without touching liger-kernel's kernels:

- a Python float argument stays a Python float (compiled Triton passes it as an fp32 scalar), so
  liger-kernel's ``eps.to(tl.float32)`` fails: floats become fp32 scalars, as compiled Triton makes them;
- ``libdevice`` functions have no interpreter implementation: liger-kernel's RMSNorm imports
  ``libdevice.rsqrt``, which is bound to ``tl.math.rsqrt`` (the same function, which the interpreter has).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Iterator

import pytest

LIGER_OPS = ("rms_norm", "rope", "swiglu", "fused_linear_cross_entropy")


def interpreted_liger() -> Iterator[None]:
    """A fixture body: liger-kernel's ops imported under Triton's interpreter for the tests that use it;
    skips with the reason when liger-kernel is not installed or its ops were already compiled for a GPU."""
    if importlib.util.find_spec("liger_kernel") is None:
        pytest.skip("liger-kernel is not installed (pip install 'plaintune[liger]'): its CPU parity tests skip")
    before = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        import numpy as np
        import triton.language as tl
        from triton.runtime import interpreter

        if not isinstance(tl.standard.sigmoid, interpreter.InterpretedFunction):
            pytest.skip(
                "Triton was imported without TRITON_INTERPRET=1 in this process (tests/conftest.py sets it where "
                "PyTorch sees no GPU): its kernels are compiled for a GPU here (tests/gpu/test_gpu_liger.py)"
            )

        if not getattr(interpreter._implicit_cvt, "floats_as_fp32", False):
            plain = interpreter._implicit_cvt

            def implicit_cvt(arg):
                if isinstance(arg, float):
                    handle = interpreter.TensorHandle(np.array([arg], dtype=np.float32), tl.float32)
                    return tl.tensor(handle, tl.float32)
                return plain(arg)

            implicit_cvt.floats_as_fp32 = True
            interpreter._implicit_cvt = implicit_cvt
        rms_norm = importlib.import_module("liger_kernel.ops.rms_norm")
        rms_norm.rsqrt = lambda x: tl.math.rsqrt(x)  # looked up when called: the interpreter's tl.math then
        for op in LIGER_OPS:
            importlib.import_module(f"liger_kernel.ops.{op}")
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = before

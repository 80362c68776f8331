"""Comparing two computations of the same tensors when only the order of their floating-point reductions differs.

Two correct implementations (a fused kernel and the plain ops, FSDP and one process, chunked and whole) round
differently: their sums run in another order, and which order depends on the CPU too (ATen's AVX2 and AVX512
kernels split a reduction differently, and so do MKL and oneDNN). A rounding in a different order moves a value
by about the dtype's epsilon times the magnitude of the numbers summed, not times the value itself: a gradient
element that is a near-cancelling sum of large terms can be off by far more than ``rtol * |element|`` while the
computation is exact to the last bit that matters. So the tolerance here is scaled by the tensor's largest
magnitude (``max |expected|``), in units of the dtype's epsilon, and the caller says how many such units the
operation can lose (``ulps``: about one per chained reduction or rounding, with room for the reductions' length).

To see what another CPU does on this one, run a test with ``ATEN_CPU_CAPABILITY=avx2`` (or ``default``):
ATen then takes the kernels an AVX2-only machine (CI's) takes.

A failing comparison names the worst element: its index, both values, the difference and the tolerance.
"""

from __future__ import annotations

from typing import Mapping, Optional

import torch


def tolerance(expected: torch.Tensor, ulps: float, dtype: Optional[torch.dtype] = None) -> float:
    """``ulps`` units of ``dtype``'s epsilon (the expected tensor's, by default) at ``max |expected|``."""
    dtype = dtype or expected.dtype
    scale = expected.detach().abs().max().item() if expected.numel() else 0.0
    return ulps * torch.finfo(dtype).eps * scale


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    ulps: float,
    dtype: Optional[torch.dtype] = None,
    name: str = "tensor",
) -> None:
    """Assert ``|actual - expected| <= tolerance(expected, ulps, dtype)`` everywhere (same shape, no NaN).

    ``dtype`` is the precision the computation ran in, when it is not the expected tensor's (a bf16 forward
    compared in fp32, say). The failure message gives the worst element, its index, both values and the tolerance.
    """
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    a, e = actual.detach().double(), expected.detach().double()
    assert not (a.isnan() ^ e.isnan()).any(), f"{name}: NaN in one of the two tensors and not the other"
    diff = (a - e).abs().nan_to_num(0.0)
    tol = tolerance(expected, ulps, dtype)
    if diff.numel() == 0 or diff.max().item() <= tol:
        return
    flat = int(diff.argmax())
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape))
    worst = diff.max().item()
    over = int((diff > tol).sum())
    eps = torch.finfo(dtype or expected.dtype).eps
    scale = expected.detach().abs().max().item()
    raise AssertionError(
        f"{name}: {over} of {diff.numel()} elements differ by more than the tolerance {tol:.3g} "
        f"({ulps:g} x eps {eps:.3g} x max|expected| {scale:.4g}); the worst, at index {index}: "
        f"actual {a.flatten()[flat].item():.8g}, expected {e.flatten()[flat].item():.8g}, "
        f"difference {worst:.3g} ({worst / (eps * scale) if scale else float('inf'):.1f} ulps of max|expected|)"
    )


def assert_all_close(
    actual: Mapping[str, torch.Tensor],
    expected: Mapping[str, torch.Tensor],
    *,
    ulps: float,
    dtype: Optional[torch.dtype] = None,
) -> None:
    """``assert_close`` for each named tensor (gradients or weights by parameter name), same names on both sides."""
    assert actual.keys() == expected.keys(), f"names differ: {sorted(actual.keys() ^ expected.keys())}"
    for name, want in expected.items():
        assert_close(actual[name], want, ulps=ulps, dtype=dtype, name=name)

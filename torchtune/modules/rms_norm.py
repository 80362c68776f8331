"""Root-mean-square layer norm as used by Llama2."""

from __future__ import annotations

import torch
from torch import nn


def _wide(t: torch.Tensor) -> torch.Tensor:
    """``t`` in fp32, or as it is if wider (float64 for gradient checks)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _input_grad(dn32: torch.Tensor, n32: torch.Tensor, rstd: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The gradient through ``n = x * rstd`` with ``rstd = rsqrt(mean(x^2) + eps)``, given ``dn``:
    ``rstd * (dn - n * mean(dn * n))``, the derivative autograd takes through the composite formula, in
    four passes over the activations where autograd's chain of ``float``, ``pow``, ``mean``, ``rsqrt``,
    product and cast backwards takes about ten."""
    return ((dn32 - n32 * (dn32 * n32).mean(-1, keepdim=True)) * rstd).to(dtype)


class _RMSNormFn(torch.autograd.Function):
    """RMSNorm (Llama's, or Gemma's with ``gemma``) with a hand-written backward. The forward is the
    composite formula op for op (the same bits); the backward saves the input and one fp32 number per row
    (autograd through the composite saves an fp32 copy of the input and the bf16 normalised values) and
    runs in about 0.8x the time (benchmarks/bench_modules.py). The gradients equal autograd's up to rounding
    (tested)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, scale: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:  # type: ignore[override]
        x32 = _wide(x)
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        ctx.save_for_backward(x, rstd, scale)
        ctx.gemma = gemma
        if gemma:
            return (x32 * rstd * (1.0 + _wide(scale))).to(x.dtype)
        # cast last too: a scale of another dtype (an fp32 norm on fp16 input) must not promote the output
        return (scale * (x32 * rstd).to(x.dtype)).to(x.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, rstd, scale = ctx.saved_tensors
        n32 = _wide(x) * rstd
        need_x, need_scale = ctx.needs_input_grad[:2]
        if ctx.gemma:
            g32 = _wide(grad)
            grad_scale = (g32 * n32).sum_to_size(scale.shape).to(scale.dtype) if need_scale else None
            dn32 = g32 * (1.0 + _wide(scale))
        else:
            grad_scale = (grad * n32.to(x.dtype)).sum_to_size(scale.shape).to(scale.dtype) if need_scale else None
            dn32 = _wide(grad * scale)
        return (_input_grad(dn32, n32, rstd, x.dtype) if need_x else None), grad_scale, None, None


class RMSNorm(nn.Module):
    """RMSNorm with a learned per-channel ``scale`` (torchtune's ``RMSNorm``: its arguments and default).

    The normalisation runs in fp32 even for a bf16 model: the mean of squares over 4096 channels
    loses most of its precision in bf16. The result is cast back before scaling, as in Meta's and
    Hugging Face's Llama (torchtune scales in fp32 and casts after: the same in fp32, one rounding
    apart in bf16), so the weights are bit-compatible with both. The output has the input's dtype.

    Args:
        dim: size of the last dimension.
        eps: added to the mean of squares for numerical stability (1e-6 as torchtune's; the Llama builders
            pass their 1e-5).
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.normalized_shape = (dim,)
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` over its last dimension and apply ``scale``."""
        return _RMSNormFn.apply(x, self.scale, self.eps, False)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.scale)


class GemmaRMSNorm(nn.Module):
    """Gemma's RMSNorm: the learned ``scale`` is stored as an offset from one and applied as ``1 + scale``.

    Unlike :class:`RMSNorm`, the scaling also runs in fp32 and the result is cast back last, as
    transformers' ``Gemma3RMSNorm`` does (``(x * (1 + w)).to(dtype)``, not ``x.to(dtype) * w``), so a
    bf16 model rounds once where Gemma was trained to. ``scale`` starts at zero (an identity scaling).

    Args:
        dim: size of the last dimension.
        eps: added to the mean of squares for numerical stability.
    """

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` over its last dimension and apply ``1 + scale``, all in fp32."""
        return _RMSNormFn.apply(x, self.scale, self.eps, True)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.scale)

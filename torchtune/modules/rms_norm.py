"""Root-mean-square layer norm as used by Llama2."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """RMSNorm with a learned per-channel ``scale``.

    The normalisation runs in fp32 even for a bf16 model: the mean of squares over 4096 channels
    loses most of its precision in bf16. The result is cast back before scaling, as in Meta's and
    Hugging Face's Llama, so the weights are bit-compatible with both.

    Args:
        dim: size of the last dimension.
        eps: added to the mean of squares for numerical stability.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` over its last dimension and apply ``scale``."""
        x_fp32 = x.float()
        normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.scale * normed.type_as(x)

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
        x_fp32 = x.float()
        normed = x_fp32 * torch.rsqrt(x_fp32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (normed * (1.0 + self.scale.float())).type_as(x)

    def reset_parameters(self) -> None:
        nn.init.zeros_(self.scale)

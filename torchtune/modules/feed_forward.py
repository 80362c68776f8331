"""Gated feed-forward block (torchtune's ``FeedForward``): SwiGLU (Llama) or, with a GELU activation, GeGLU
(Gemma)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

# torchtune's default activation: one stateless module, shared (a default argument is built once anyway)
_SILU = nn.SiLU()


class FeedForward(nn.Module):
    """``down_proj(activation(gate_proj(x)) * up_proj(x))``, or ``down_proj(activation(gate_proj(x)))``
    without ``up_proj``. The projections are stored as ``w1`` (gate), ``w2`` (down) and ``w3`` (up), the
    names of torchtune's and Meta's checkpoints.

    Args:
        gate_proj: ``dim -> hidden_dim``, through the activation.
        down_proj: ``hidden_dim -> dim``.
        up_proj: ``dim -> hidden_dim``, multiplied by the activated gate; ``None`` for an ungated block.
        activation: applied to the gate; SiLU for Llama, ``nn.GELU(approximate="tanh")`` for Gemma
            (transformers' ``gelu_pytorch_tanh``).
    """

    def __init__(
        self,
        *,
        gate_proj: nn.Module,
        down_proj: nn.Module,
        up_proj: Optional[nn.Module] = None,
        activation: nn.Module = _SILU,
    ) -> None:
        super().__init__()
        self.w1 = gate_proj
        self.w2 = down_proj
        self.w3 = up_proj
        self.activation = activation

    @property
    def is_swiglu(self) -> bool:
        """Whether this is a SiLU-gated block with an up projection (what fused SwiGLU kernels compute)."""
        return self.w3 is not None and type(self.activation) is nn.SiLU

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = self.w1(x)
        # F.silu directly: the same op as nn.SiLU, without the module call
        h = F.silu(gate) if type(self.activation) is nn.SiLU else self.activation(gate)
        if self.w3 is not None:
            h = h * self.w3(x)
        return self.w2(h)

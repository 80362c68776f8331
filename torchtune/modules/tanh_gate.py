"""A learned gate on a layer's output (torchtune's ``TanhGate``, used by cross-attention layers)."""

from __future__ import annotations

import torch
from torch import nn


class TanhGate(nn.Module):
    """``x * tanh(scale)`` with one learned ``scale``, starting at 0 (the gated branch starts switched off)."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale.tanh()

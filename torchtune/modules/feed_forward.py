"""SwiGLU feed-forward block of Llama2."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    """``w2(silu(w1(x)) * w3(x))``: w1 is the gate, w3 the up and w2 the down projection.

    Args:
        w1: gate projection, ``dim -> hidden_dim``.
        w2: down projection, ``hidden_dim -> dim``.
        w3: up projection, ``dim -> hidden_dim``.
    """

    def __init__(self, w1: nn.Module, w2: nn.Module, w3: nn.Module) -> None:
        super().__init__()
        self.w1 = w1
        self.w2 = w2
        self.w3 = w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))

"""Gated feed-forward block: SwiGLU (Llama2) or, with a GELU activation, GeGLU (Gemma)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


class FeedForward(nn.Module):
    """``w2(activation(w1(x)) * w3(x))``: w1 is the gate, w3 the up and w2 the down projection.

    Args:
        w1: gate projection, ``dim -> hidden_dim``.
        w2: down projection, ``hidden_dim -> dim``.
        w3: up projection, ``dim -> hidden_dim``.
        activation: applied to the gate; ``None`` is SiLU (Llama). Gemma uses
            ``nn.GELU(approximate="tanh")`` (transformers' ``gelu_pytorch_tanh``).
    """

    def __init__(self, w1: nn.Module, w2: nn.Module, w3: nn.Module, activation: Optional[nn.Module] = None) -> None:
        super().__init__()
        self.w1 = w1
        self.w2 = w2
        self.w3 = w3
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.silu(self.w1(x)) if self.activation is None else self.activation(self.w1(x))
        return self.w2(gate * self.w3(x))

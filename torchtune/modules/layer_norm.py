"""LayerNorm computed in fp32 whatever the input's dtype (torchtune's ``Fp32LayerNorm``)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Fp32LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same arguments and parameters) that normalises in fp32 and returns the input's
    dtype: the mean and variance of a bf16/fp16 row lose most of their precision otherwise."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.layer_norm(
            x.float(),
            self.normalized_shape,
            None if self.weight is None else self.weight.float(),
            None if self.bias is None else self.bias.float(),
            self.eps,
        )
        return out.type_as(x)

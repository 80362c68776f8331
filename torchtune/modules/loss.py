"""Losses that take the output projection and the final hidden states (not logits).

Taking ``hidden`` and ``output_proj`` rather than logits lets a loss bound the size of the fp32
logits it materialises (``ChunkedCrossEntropyLoss`` does this chunk by chunk).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from torchtune.modules._chunked_loss import ChunkedCrossEntropyLoss

__all__ = ["ChunkedCrossEntropyLoss", "CrossEntropyLoss"]


class CrossEntropyLoss(nn.Module):
    """Mean token cross-entropy over labels that are not ``ignore_index``, in fp32.

    ``labels`` are already shifted by the recipe: ``labels[:, t]`` is the target of position ``t``.
    A batch whose labels are all ignored gives 0 (not NaN) and a zero gradient, with the graph still
    attached so ``backward()`` (and the optimizer-in-backward hooks) run as usual.

    Args:
        ignore_index: label value that is left out of the loss.
    """

    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def forward(self, output_proj: nn.Linear, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of ``output_proj(hidden)`` (``[b, s, dim]``) against ``labels`` (``[b, s]``)."""
        logits = output_proj(hidden).float()
        loss_sum = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=self.ignore_index, reduction="sum"
        )
        # clamp instead of branching on the count: no host sync, and 0/1 = 0 when all are ignored
        num_tokens = (labels != self.ignore_index).sum().clamp(min=1)
        return loss_sum / num_tokens

"""torchtune's ``CEWithChunkedOutputLoss``: cross-entropy over logits the model returns in chunks."""

from __future__ import annotations

from typing import List, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn

from torchtune.modules._chunked_loss import chunked_linear_cross_entropy
from torchtune.modules.loss._ignore_index import CROSS_ENTROPY_IGNORE_IDX


class CEWithChunkedOutputLoss(nn.Module):
    """Mean token cross-entropy in fp32 over logits given as chunks along the sequence, each cast to fp32 only
    while its loss is computed (torchtune's loss; the model returns the chunks after
    ``model.set_num_output_chunks(loss.num_output_chunks)``).

    Two ways to call it:

    - torchtune's: ``loss(logits_chunks, labels)`` with the ``num_output_chunks`` chunks
      ``[b, s / num_output_chunks, vocab]`` and ``labels`` ``[b, s]`` (already shifted);
    - our recipes': ``loss(output_proj, hidden, labels)`` with the final hidden states, as the other losses
      here take them: the logits are then computed ``num_output_chunks`` chunks of rows at a time by
      :class:`~torchtune.modules.loss.ChunkedCrossEntropyLoss` (same value; not even the bf16 logits exist
      whole), or, for a projection that soft-caps its logits (Gemma 2), by calling it on each chunk.

    Args:
        num_output_chunks: chunks of the sequence.
        ignore_index: label value that is left out of the loss.
    """

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = CROSS_ENTROPY_IGNORE_IDX) -> None:
        super().__init__()
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index

    def compute_cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Summed cross-entropy of one chunk (``[n, vocab]`` logits, ``[n]`` labels), in fp32."""
        return F.cross_entropy(logits.float(), labels, ignore_index=self.ignore_index, reduction="sum")

    def forward(
        self,
        logits: Union[Sequence[torch.Tensor], nn.Module],
        labels: torch.Tensor,
        *rest: torch.Tensor,
    ) -> torch.Tensor:
        """``(logits_chunks, labels)`` or ``(output_proj, hidden, labels)``; see the class docstring."""
        if isinstance(logits, nn.Module):
            output_proj, hidden, (targets,) = logits, labels, rest
            if getattr(output_proj, "softcap", None) is None:
                # ChunkedCrossEntropyLoss's computation (min_chunk_rows=1: exactly num_output_chunks chunks)
                return chunked_linear_cross_entropy(
                    hidden, output_proj.weight, output_proj.bias, targets, self.num_output_chunks, self.ignore_index, 1
                )
            # logits the projection caps itself (Gemma 2): through the module, a chunk of rows at a time
            flat_h, flat_y = hidden.reshape(-1, hidden.size(-1)), targets.reshape(-1)
            total = sum(
                self.compute_cross_entropy(output_proj(h), y)
                for h, y in zip(flat_h.chunk(self.num_output_chunks), flat_y.chunk(self.num_output_chunks))
            )
            return total / (flat_y != self.ignore_index).sum().clamp(min=1)
        total_elements = (labels != self.ignore_index).sum()
        label_chunks: List[torch.Tensor] = [c.reshape(-1) for c in labels.chunk(self.num_output_chunks, dim=1)]
        total = 0.0
        for logit_chunk, label_chunk in zip(logits, label_chunks):
            total = total + self.compute_cross_entropy(logit_chunk.reshape(-1, logit_chunk.size(-1)), label_chunk)
        return total / total_elements

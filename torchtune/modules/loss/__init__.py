"""Losses that take the output projection and the final hidden states (not logits), and torchtune's
``CEWithChunkedOutputLoss`` (``torchtune.modules.loss.ce_chunked_output_loss``).

Taking ``hidden`` and ``output_proj`` rather than logits lets a loss bound the size of the fp32
logits it materialises (``ChunkedCrossEntropyLoss`` does this chunk by chunk).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from torchtune._errors import ConfigError
from torchtune.config._types import whole_number
from torchtune.modules._chunked_loss import DEFAULT_MIN_CHUNK_ROWS, chunked_linear_cross_entropy
from torchtune.modules._vocab_chunked_loss import vocab_chunked_linear_cross_entropy
from torchtune.modules.loss._ignore_index import CROSS_ENTROPY_IGNORE_IDX
from torchtune.modules.loss.ce_chunked_output_loss import CEWithChunkedOutputLoss

__all__ = [
    "CEWithChunkedOutputLoss",
    "CROSS_ENTROPY_IGNORE_IDX",
    "ChunkedCrossEntropyLoss",
    "CrossEntropyLoss",
    "LigerLinearCrossEntropyLoss",
    "VocabChunkedCrossEntropyLoss",
]


def _refuse_softcap(output_proj: nn.Module, loss: str) -> None:
    """Gemma 2 soft-caps its logits inside ``model.output``; a loss that computes the logits from
    ``output_proj.weight`` itself would leave the cap out."""
    if getattr(output_proj, "softcap", None) is not None:
        raise ConfigError(
            f"{loss} computes the logits from the output weight itself, so it would leave out this model's final "
            f"logit soft-cap ({output_proj.softcap:g}, Gemma 2). Set loss._component_ to "
            "torchtune.modules.loss.CrossEntropyLoss or torchtune.modules.loss.CEWithChunkedOutputLoss."
        )


class CrossEntropyLoss(nn.Module):
    """Mean token cross-entropy over labels that are not ``ignore_index``, in fp32.

    ``labels`` are already shifted by the recipe: ``labels[:, t]`` is the target of position ``t``. The
    recipe passes only the positions that have a label (``[n, dim]`` hidden states, ``[n]`` labels;
    see ``torchtune.training.forward_loss``); any leading shape works.
    A batch whose labels are all ignored gives 0 (not NaN) and a zero gradient, with the graph still
    attached so ``backward()`` (and the optimizer-in-backward hooks) run as usual.

    Args:
        ignore_index: label value that is left out of the loss.
    """

    def __init__(self, ignore_index: int = CROSS_ENTROPY_IGNORE_IDX) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def forward(self, output_proj: nn.Linear, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of ``output_proj(hidden)`` (``[b, s, dim]``, or ``[n, dim]`` for selected positions) against
        ``labels`` (``[b, s]``, or ``[n]``)."""
        logits = output_proj(hidden).float()
        loss_sum = F.cross_entropy(
            logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=self.ignore_index, reduction="sum"
        )
        # clamp instead of branching on the count: no host sync, and 0/1 = 0 when all are ignored
        num_tokens = (labels != self.ignore_index).sum().clamp(min=1)
        return loss_sum / num_tokens


class ChunkedCrossEntropyLoss(nn.Module):
    """Mean token cross-entropy in fp32, computed ``num_output_chunks`` token chunks at a time.

    Same inputs, value and gradients as ``CrossEntropyLoss``: called with the output projection, the
    final hidden states ``[b, s, dim]`` (or ``[n, dim]``) and already-shifted labels ``[b, s]`` (or
    ``[n]``); labels equal to ``ignore_index`` are left out; a batch with no label gives 0 and zero
    gradients. The full fp32 logits never exist at once (see ``torchtune.modules._chunked_loss``).

    Args:
        num_output_chunks: how many token chunks the logits are computed in. More chunks: a smaller
            fp32 peak (``rows*vocab*4 / num_output_chunks`` bytes), but each chunk streams the whole
            output weight and its gradient once more, whatever its size.
        ignore_index: label value that is left out of the loss.
        min_chunk_rows: fewer chunks are taken where a chunk would have fewer rows (positions) than
            this (a chunk of few rows costs nearly what a full one does; see
            ``torchtune.modules._chunked_loss``). The fp32 peak is then at most
            ``max(rows / num_output_chunks, min_chunk_rows) * vocab * 4`` bytes. 1 always takes
            ``num_output_chunks`` chunks.
    """

    def __init__(
        self,
        num_output_chunks: int = 8,
        ignore_index: int = CROSS_ENTROPY_IGNORE_IDX,
        min_chunk_rows: int = DEFAULT_MIN_CHUNK_ROWS,
    ) -> None:
        super().__init__()
        self.check_config_args("loss", {"num_output_chunks": num_output_chunks, "min_chunk_rows": min_chunk_rows})
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index
        self.min_chunk_rows = min_chunk_rows

    def forward(self, output_proj: nn.Linear, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of ``output_proj(hidden)`` against ``labels``, never materialising all logits."""
        _refuse_softcap(output_proj, type(self).__name__)
        return chunked_linear_cross_entropy(
            hidden,
            output_proj.weight,
            output_proj.bias,
            labels,
            self.num_output_chunks,
            self.ignore_index,
            self.min_chunk_rows,
        )

    @staticmethod
    def check_config_args(key: str, fields: Mapping[str, Any]) -> None:
        """Raise ConfigError naming ``key.num_output_chunks`` / ``key.min_chunk_rows`` below 1."""
        for name in ("num_output_chunks", "min_chunk_rows"):
            if name in fields:
                whole_number(f"{key}.{name}", fields[name])


class VocabChunkedCrossEntropyLoss(nn.Module):
    """Mean token cross-entropy in fp32, computed ``num_output_chunks`` slices of the vocabulary at a time.

    Same inputs, value and gradients as ``CrossEntropyLoss`` and ``ChunkedCrossEntropyLoss``; the fp32
    logits of one vocabulary slice exist at a time (``rows x vocab / num_output_chunks x 4`` bytes, the
    row-chunked loss's bound). Where ``ChunkedCrossEntropyLoss`` streams the whole output weight and
    its gradient once per chunk, this one streams the weight a fixed three times and writes each slice
    of its gradient once, whatever the chunk count: it pays off where the vocabulary is large and the
    step short (Llama 3, Qwen), see ``torchtune.modules._vocab_chunked_loss``.

    Args:
        num_output_chunks: how many slices the vocabulary is cut into.
        ignore_index: label value that is left out of the loss.
    """

    def __init__(self, num_output_chunks: int = 8, ignore_index: int = CROSS_ENTROPY_IGNORE_IDX) -> None:
        super().__init__()
        self.check_config_args("loss", {"num_output_chunks": num_output_chunks})
        self.num_output_chunks = num_output_chunks
        self.ignore_index = ignore_index

    # the same arguments, the same checks
    check_config_args = staticmethod(ChunkedCrossEntropyLoss.check_config_args)

    def forward(self, output_proj: nn.Linear, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of ``output_proj(hidden)`` against ``labels``, one vocabulary slice at a time."""
        _refuse_softcap(output_proj, type(self).__name__)
        return vocab_chunked_linear_cross_entropy(
            hidden, output_proj.weight, output_proj.bias, labels, self.num_output_chunks, self.ignore_index
        )


class LigerLinearCrossEntropyLoss(nn.Module):
    """Mean token cross-entropy by liger-kernel's fused linear cross-entropy (Triton, CUDA only).

    Same inputs, value and gradients as ``CrossEntropyLoss`` and ``ChunkedCrossEntropyLoss`` (the recipe
    passes only the positions that have a label; a batch with no label gives 0 and zero gradients). The
    kernel computes the logits a chunk of rows at a time (``vocab / dim`` chunks) and the gradients of the
    hidden states and of the output weight already in forward, so no logits outlive a chunk; the
    softmax and the loss run in fp32 whatever the model's dtype. It reads the label count back to the
    host once per call (liger-kernel's ``.item()``). Needs ``pip install 'plaintune[liger]'``; the
    memory estimator counts its allocations without it.

    Args:
        ignore_index: label value that is left out of the loss.
        fp32_accumulation: accumulate the output weight's gradient over the chunks in fp32 (liger-kernel's
            ``accum_dtype``) rather than in the weight's dtype: one fp32 copy of that gradient
            (``vocab x dim x 4`` bytes) exists while the loss runs. No effect on fp32 models.
    """

    def __init__(self, ignore_index: int = CROSS_ENTROPY_IGNORE_IDX, fp32_accumulation: bool = True) -> None:
        super().__init__()
        if not isinstance(fp32_accumulation, bool):
            raise ConfigError(f"loss.fp32_accumulation must be True or False, got {fp32_accumulation!r}.")
        self.ignore_index = ignore_index
        self.fp32_accumulation = fp32_accumulation

    def forward(self, output_proj: nn.Linear, hidden: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """Loss of ``output_proj(hidden)`` against ``labels``, fused with the projection."""
        from torchtune.modules._liger import fused_linear_cross_entropy

        _refuse_softcap(output_proj, type(self).__name__)
        flat_h = hidden.reshape(-1, hidden.size(-1))
        flat_y = labels.reshape(-1)
        weight, bias = output_proj.weight, output_proj.bias
        if flat_h.size(0) == 0:
            # no labelled position (a shape, known on the host): 0 with the graph attached, zero gradients
            return F.linear(flat_h, weight, bias).float().sum()
        accum = torch.float32 if self.fp32_accumulation and weight.dtype != torch.float32 else None
        return fused_linear_cross_entropy(flat_h, weight, bias, flat_y, self.ignore_index, accum)

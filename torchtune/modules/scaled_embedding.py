"""A token embedding multiplied by a constant (Gemma's ``sqrt(embed_dim)``)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ScaledEmbedding(nn.Embedding):
    """``nn.Embedding`` whose output is multiplied by ``embed_scale``.

    The factor is rounded to the weight's dtype before the multiplication, as transformers'
    ``Gemma3TextScaledWordEmbedding`` does (in bf16, ``sqrt(3072) = 55.43`` becomes 55.5): Gemma was
    trained with the rounded factor. Being an ``nn.Embedding``, it has the same ``weight`` (and state
    dict key) and can be tied to the output projection with ``TiedLinear``, which uses the weight
    unscaled.

    Args:
        num_embeddings: vocabulary size.
        embedding_dim: model width.
        embed_scale: the factor (``embedding_dim ** 0.5`` for Gemma).
        *args, **kwargs: ``nn.Embedding``'s other arguments.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, embed_scale: float, *args: Any, **kwargs: Any) -> None:
        super().__init__(num_embeddings, embedding_dim, *args, **kwargs)
        self.embed_scale = float(embed_scale)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = super().forward(tokens)
        # an fp32 scalar rounded to the weight's dtype, exactly as transformers rounds it
        scale = torch.tensor(self.embed_scale, dtype=torch.float32, device=h.device).to(self.weight.dtype)
        return h * scale

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, embed_scale={self.embed_scale:g}"

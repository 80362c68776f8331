"""Gemma's token embedding at torchtune's path (``GemmaNormEmbeddings``): an embedding multiplied by
``sqrt(embedding_dim)``."""

from __future__ import annotations

from typing import Any

from torchtune.modules.scaled_embedding import ScaledEmbedding


class GemmaNormEmbeddings(ScaledEmbedding):
    """:class:`~torchtune.modules.ScaledEmbedding` with Gemma's factor ``sqrt(embedding_dim)`` (rounded to the
    weight's dtype, as torchtune and transformers round it); torchtune's arguments.

    Args:
        num_embeddings: vocabulary size.
        embedding_dim: model width.
        *args, **kwargs: ``nn.Embedding``'s other arguments.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *args: Any, **kwargs: Any) -> None:
        super().__init__(num_embeddings, embedding_dim, embedding_dim**0.5, *args, **kwargs)

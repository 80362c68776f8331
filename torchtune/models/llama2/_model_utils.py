"""Llama2's feed-forward width rule (torchtune's ``torchtune.models.llama2._model_utils``)."""

from __future__ import annotations


def scale_hidden_dim_for_mlp(dim: int, multiple_of: int = 256) -> int:
    """The SwiGLU width that keeps a 4x feed-forward's parameter count: ``4 * int(2 * dim / 3)`` rounded up
    to a multiple of ``multiple_of``, as torchtune computes it (Meta's ``int(8 * dim / 3)`` is up to 2
    larger before the rounding, which can cross a multiple: width 97 gives 256 here, 512 there)."""
    hidden_dim = 4 * int(2 * dim / 3)
    return multiple_of * ((hidden_dim + multiple_of - 1) // multiple_of)

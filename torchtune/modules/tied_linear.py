"""An output projection that reuses the token embedding's weight (tied input/output embeddings)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn


class TiedLinear(nn.Module):
    """``x @ embedding.weight.T``: the output projection of a model whose embeddings are tied.

    It owns no parameter: ``weight`` is looked up on the embedding at every call, so there is one
    tensor in memory, one entry in ``named_parameters()`` (``tok_embeddings.weight``), one
    optimizer and one post-accumulate-grad hook for it, and no ``output.weight`` in the state dict
    (Hugging Face's tied checkpoints have no ``lm_head.weight`` either). Because the lookup is lazy,
    the tie survives everything that replaces the embedding's parameter: ``to_empty()`` after
    building on the meta device, ``load_state_dict(assign=True)``, dtype and device moves.

    The embedding is kept out of the module tree on purpose: as a submodule it would appear a second
    time in ``state_dict()`` as ``output.embedding.weight``.

    Unlike torchtune's ``TiedLinear`` (a plain object) it is an ``nn.Module``, so hooks, ``apply`` and
    activation offloading see it like any other layer.

    Args:
        tied_module: the token embedding whose ``[vocab_size, dim]`` weight is shared.
        softcap: Gemma 2's final logit soft-cap: the logits become ``softcap * tanh(logits / softcap)``
            (in the weight's dtype, as transformers computes them); ``None`` for none. The losses that
            compute logits from ``weight`` themselves refuse a capped projection.
    """

    bias = None  # what losses that read ``output_proj.bias`` expect of a bias-free projection

    def __init__(self, tied_module: nn.Module, *, softcap: Optional[float] = None) -> None:
        super().__init__()
        if not hasattr(tied_module, "weight"):
            raise AttributeError("TiedLinear shares the weight of a module that has one (the token embedding).")
        object.__setattr__(self, "_embedding", tied_module)
        self.softcap = softcap

    @property
    def tied_module(self) -> nn.Module:
        """The module whose weight is shared (torchtune's attribute name)."""
        return self._embedding

    @property
    def weight(self) -> nn.Parameter:
        """The embedding's weight, ``[vocab_size, dim]``."""
        return self._embedding.weight

    @property
    def in_features(self) -> int:
        return self._embedding.embedding_dim

    @property
    def out_features(self) -> int:
        return self._embedding.num_embeddings

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x, self.weight)
        if self.softcap is None:
            return logits
        return torch.tanh(logits / self.softcap) * self.softcap

    def extra_repr(self) -> str:
        cap = "" if self.softcap is None else f", softcap={self.softcap:g}"
        return f"in_features={self.in_features}, out_features={self.out_features}, tied to the token embedding{cap}"

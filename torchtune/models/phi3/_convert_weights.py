"""torchtune's Phi-3 weight conversion functions (``phi3_hf_to_tune`` / ``phi3_tune_to_hf``), on our converter: the
fused ``qkv_proj`` and ``gate_up_proj`` split and stacked again, q/k rows as Hugging Face stores them."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from torchtune.models._hf_convert import hf_to_tune, tune_to_hf_plan, tune_to_hf_tensor
from torchtune.models._hf_family import ModelShape

__all__ = ["phi3_hf_to_tune", "phi3_tune_to_hf"]


def _shape(num_heads: int, num_kv_heads: Optional[int], dim: int) -> ModelShape:
    return ModelShape(
        vocab_size=None,
        num_layers=None,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads or num_heads,
        embed_dim=dim,
        head_dim=dim // num_heads,
        intermediate_dim=None,
        norm_eps=None,
        rope_base=0.0,
        tie_word_embeddings=False,
        rope_interleaved=False,
    )


def phi3_hf_to_tune(
    state_dict: Dict[str, torch.Tensor], num_heads: int, num_kv_heads: Optional[int], dim: int
) -> Dict[str, torch.Tensor]:
    """A Hugging Face Phi-3 state dict in torchtune's names, the fused projections split."""
    return hf_to_tune(state_dict, _shape(num_heads, num_kv_heads, dim), fused=True, family="Phi-3")


def phi3_tune_to_hf(state_dict: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
    """A torchtune Phi-3 state dict in Hugging Face's names, q/k/v and gate/up stacked (host tensors)."""
    shape = _shape(1, 1, 1)  # rows are stacked and copied as they are: no size is needed
    plan = tune_to_hf_plan(state_dict, fused=True, family="Phi-3")
    return {hf: tune_to_hf_tensor(hf, {k: state_dict[k] for k in parts}, shape) for hf, parts in plan.items()}

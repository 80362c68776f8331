"""torchtune's Qwen2 weight conversion functions (``qwen2_hf_to_tune`` / ``qwen2_tune_to_hf``), on our converter:
names only, the q/k rows as Hugging Face stores them (Qwen2's RoPE rotates halves), no ``lm_head`` when tied."""

from __future__ import annotations

from typing import Dict, Optional

import torch

from torchtune.models._hf_convert import hf_to_tune, tune_to_hf_plan, tune_to_hf_tensor
from torchtune.models._hf_family import ModelShape

__all__ = ["qwen2_hf_to_tune", "qwen2_tune_to_hf"]


def _shape(num_heads: int, num_kv_heads: int, dim: int, head_dim: Optional[int], tied: bool) -> ModelShape:
    return ModelShape(
        vocab_size=None,
        num_layers=None,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        embed_dim=dim,
        head_dim=head_dim or dim // num_heads,
        intermediate_dim=None,
        norm_eps=None,
        rope_base=0.0,
        tie_word_embeddings=tied,
        qkv_bias=True,
        rope_interleaved=False,
    )


def qwen2_hf_to_tune(
    state_dict: Dict[str, torch.Tensor],
    num_heads: int = 32,
    num_kv_heads: int = 32,
    dim: int = 4096,
    head_dim: Optional[int] = None,
    tie_word_embeddings: bool = False,
) -> Dict[str, torch.Tensor]:
    """A Hugging Face Qwen2 / Qwen2.5 state dict in torchtune's names (``lm_head.weight`` left out when tied)."""
    if tie_word_embeddings:
        state_dict = {k: v for k, v in state_dict.items() if k != "lm_head.weight"}
    shape = _shape(num_heads, num_kv_heads, dim, head_dim, tie_word_embeddings)
    return hf_to_tune(state_dict, shape, family="Qwen2")


def qwen2_tune_to_hf(
    state_dict: Dict[str, torch.Tensor],
    num_heads: int = 32,
    num_kv_heads: int = 32,
    dim: int = 4096,
    head_dim: Optional[int] = None,
    tie_word_embeddings: bool = False,
) -> Dict[str, torch.Tensor]:
    """A torchtune Qwen2 state dict in Hugging Face's names (host tensors)."""
    shape = _shape(num_heads, num_kv_heads, dim, head_dim, tie_word_embeddings)
    plan = tune_to_hf_plan(state_dict, family="Qwen2")
    return {hf: tune_to_hf_tensor(hf, {k: state_dict[k] for k in parts}, shape) for hf, parts in plan.items()}

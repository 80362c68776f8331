"""The generic Gemma 2 builder (torchtune's ``gemma2`` arguments; transformers' ``Gemma2ForCausalLM``)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
from torch import nn

from torchtune._errors import TuneError
from torchtune.models.gemma._component_builders import gemma_decoder
from torchtune.modules import GemmaRMSNorm, RotaryPositionalEmbeddings, TransformerDecoder

__all__ = ["Gemma2FinalNorm", "TanhSoftCapping", "gemma2"]


class TanhSoftCapping(nn.Module):
    """``capping_value * tanh(x / capping_value)`` (torchtune's module of that name)."""

    def __init__(self, capping_value: float) -> None:
        super().__init__()
        self.capping_value = capping_value

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x / self.capping_value) * self.capping_value


class Gemma2FinalNorm(nn.Module):
    """torchtune 0.6.1's final norm of Gemma 2: RMSNorm, then the soft cap applied to the normed hidden
    states (its state-dict key is ``norm.rms_norm.scale``). Built only with ``soft_cap_hidden_states=True``:
    Gemma 2 itself caps the logits."""

    def __init__(self, capping_value: float, embed_dim: int, eps: float) -> None:
        super().__init__()
        self.capping_value = capping_value
        self.rms_norm = GemmaRMSNorm(embed_dim, eps=eps)
        self.logit_capping = TanhSoftCapping(capping_value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.logit_capping(self.rms_norm(x))


def gemma2(
    vocab_size: int,
    num_layers: int,
    num_heads: int,
    head_dim: int,
    num_kv_heads: int,
    embed_dim: int,
    intermediate_dim: int,
    max_seq_len: int,
    attn_dropout: float = 0.0,
    norm_eps: float = 1e-6,
    rope_base: float = 10_000,
    hidden_capping_value: float = 50.0,
    final_capping_value: float = 30.0,
    sliding_window_size: int = 4096,
    query_pre_attn_scalar: Optional[int] = None,
    *,
    soft_cap_hidden_states: bool = False,
) -> TransformerDecoder:
    """Build a Gemma 2 decoder (torchtune's ``gemma2`` arguments, order and defaults): Gemma's decoder with
    norms after attention and after the feed-forward, the attention logits scaled by
    ``query_pre_attn_scalar ** -0.5`` and soft-capped at ``hidden_capping_value`` (``attn_logit_softcapping``),
    local layers (the even ones: 0, 2, ...) attending within ``sliding_window_size`` tokens, the others
    globally, and the output logits soft-capped at ``final_capping_value`` (``final_logit_softcapping``).

    torchtune 0.6.1 differs on the final cap: it caps the final normed hidden states, not the logits (and
    its model builders swap the two capping values). ``soft_cap_hidden_states=True`` computes that, with
    torchtune's ``norm.rms_norm.scale`` key, for its checkpoints; a torchtune state dict given to a model
    built without it is refused with that advice.

    Args:
        vocab_size: tokens in the vocabulary.
        num_layers: decoder layers.
        num_heads: query heads.
        head_dim: channels per head.
        num_kv_heads: key/value heads.
        embed_dim: model width (``hidden_size``).
        intermediate_dim: feed-forward width.
        max_seq_len: longest sequence (RoPE and KV cache size).
        attn_dropout: attention dropout during training.
        norm_eps: RMSNorm epsilon.
        rope_base: RoPE base (``rope_theta``).
        hidden_capping_value: the attention-logit soft cap.
        final_capping_value: the output-logit soft cap.
        sliding_window_size: the local layers' window.
        query_pre_attn_scalar: attention logits are scaled by its inverse square root; default ``head_dim``.
        soft_cap_hidden_states: torchtune 0.6.1's final cap (on the normed hidden states) instead of Gemma 2's.
    """
    rope = RotaryPositionalEmbeddings(dim=head_dim, max_seq_len=max_seq_len, base=rope_base)
    model = gemma_decoder(
        vocab_size=vocab_size,
        embed_dim=embed_dim,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        intermediate_dim=intermediate_dim,
        max_seq_len=max_seq_len,
        norm_eps=norm_eps,
        attn_dropout=attn_dropout,
        ropes=[rope] * num_layers,
        sliding_windows=[sliding_window_size if i % 2 == 0 else None for i in range(num_layers)],
        scale=float(query_pre_attn_scalar if query_pre_attn_scalar is not None else head_dim) ** -0.5,
        hidden_capping_value=hidden_capping_value,
        final_capping_value=None if soft_cap_hidden_states else final_capping_value,
        post_norms=True,
    )
    if soft_cap_hidden_states:
        model.norm = Gemma2FinalNorm(final_capping_value, embed_dim, eps=norm_eps)
    else:
        model._register_load_state_dict_pre_hook(_refuse_torchtune_final_norm)
    return model


def _refuse_torchtune_final_norm(state_dict: Dict[str, Any], prefix: str, *args: Any) -> None:
    if f"{prefix}norm.rms_norm.scale" in state_dict:
        raise TuneError(
            "This is a torchtune 0.6.1 Gemma 2 state dict (it has norm.rms_norm.scale): torchtune soft-caps the "
            "final normed hidden states, where Gemma 2 (and transformers) caps the output logits, so this model "
            "computes other numbers from those weights. For torchtune's numbers build the model with "
            "soft_cap_hidden_states=True (and, as torchtune's gemma2_2b/9b/27b, hidden_capping_value=30.0, "
            "final_capping_value=50.0); to run the weights as Gemma 2, rename norm.rms_norm.scale to norm.scale."
        )

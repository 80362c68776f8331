"""Multi-head attention with grouped-query heads, rotary embeddings and PyTorch's fused SDPA, and the
variants other families need: q/k norms (Qwen3, Gemma 3), q/k/v biases (Qwen2.5, in the projections
given), a logit scale and soft cap (Gemma 3) and a sliding attention window (Mistral v0.1, Gemma 3's
local layers)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from torchtune.modules.attention_flex import BlockMask, flex_attention
from torchtune.modules.kv_cache import KVCache
from torchtune.modules.sliding_window import attention, sliding_window_attention


class MultiHeadAttention(nn.Module):
    """Causal self-attention; ``num_kv_heads < num_heads`` gives grouped-query attention (Llama2-70B).

    Without a mask it calls ``scaled_dot_product_attention(is_causal=True)``, which lets PyTorch pick
    a fused (flash / memory-efficient) kernel and never materialises an ``s x s`` mask. A given mask
    is boolean, ``mask[b, q, k] = True`` where query ``q`` may attend to key ``k`` (block-diagonal for
    packed sequences; ``[b, s, max_seq_len]`` over the cache when a KV cache is set up).

    Args:
        embed_dim: model width.
        num_heads: query heads.
        num_kv_heads: key/value heads; must divide ``num_heads``.
        head_dim: channels per head.
        q_proj, k_proj, v_proj, output_proj: the projections (``nn.Linear`` without bias for Llama2).
        pos_embeddings: rotary embeddings applied to q and k (may be shared between layers); one with a
            ``rotate_qk(q, k, input_pos=...)`` method rotates both in one call.
        max_seq_len: longest sequence; size of the KV cache.
        attn_dropout: dropout on attention weights, training only.
        q_norm, k_norm: norms over ``head_dim`` applied to each query / key head before RoPE (Qwen3's
            and Gemma 3's per-head RMSNorm); ``None`` for none.
        scale: multiplies the attention logits; default ``head_dim ** -0.5`` (Gemma 3:
            ``query_pre_attn_scalar ** -0.5``).
        softcap: soft cap of the attention logits (``softcap * tanh(logits / softcap)``), or ``None``.
            It needs the logits, which fused SDPA kernels never form: a capped layer computes them.
        sliding_window: a query at position ``p`` sees keys at ``p - sliding_window < k <= p`` only, as
            transformers' ``sliding_window_overlay``; ``None`` for full causal attention. See
            ``torchtune.modules.sliding_window`` for the kernels (no ``s x s`` mask on CUDA).
    """

    def __init__(
        self,
        *,
        embed_dim: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        q_proj: nn.Module,
        k_proj: nn.Module,
        v_proj: nn.Module,
        output_proj: nn.Module,
        pos_embeddings: nn.Module,
        max_seq_len: int = 4096,
        attn_dropout: float = 0.0,
        q_norm: Optional[nn.Module] = None,
        k_norm: Optional[nn.Module] = None,
        scale: Optional[float] = None,
        softcap: Optional[float] = None,
        sliding_window: Optional[int] = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        if not 0.0 <= attn_dropout <= 1.0:
            raise ValueError(f"attn_dropout must be in [0, 1], got {attn_dropout}")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive number of tokens or None, got {sliding_window}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.attn_dropout = attn_dropout
        self.q_proj = q_proj
        self.k_proj = k_proj
        self.v_proj = v_proj
        self.output_proj = output_proj
        self.pos_embeddings = pos_embeddings
        self.q_norm = q_norm
        self.k_norm = k_norm
        self.scale = scale
        self.softcap = softcap
        self.sliding_window = sliding_window
        self.kv_cache: Optional[KVCache] = None

    def setup_cache(self, batch_size: int, dtype: torch.dtype, device: Optional[torch.device] = None) -> None:
        """Allocate a KV cache for ``batch_size`` sequences of up to ``max_seq_len`` tokens."""
        if device is None:
            device = self.q_proj.weight.device
        self.kv_cache = KVCache(batch_size, self.max_seq_len, self.num_kv_heads, self.head_dim, dtype, device)

    def reset_cache(self) -> None:
        if self.kv_cache is not None:
            self.kv_cache.reset()

    def forward(
        self, x: torch.Tensor, *, mask: Optional[torch.Tensor] = None, input_pos: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        """Attend over ``x`` (``[b, s, embed_dim]``); returns ``[b, s, embed_dim]``.

        Args:
            x: input activations.
            mask: boolean ``[b, s, s_kv]`` "may attend" mask, or ``None`` for causal.
            input_pos: rotary positions (``[b, s]``) and, with a KV cache, where to write k/v.
        """
        bsz, seq_len, _ = x.shape
        q = self.q_proj(x).view(bsz, seq_len, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(bsz, seq_len, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(bsz, seq_len, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        if self.k_norm is not None:
            k = self.k_norm(k)
        rotate_qk = getattr(self.pos_embeddings, "rotate_qk", None)
        if rotate_qk is not None:  # one kernel for both (torchtune.modules._liger.LigerRoPE)
            q, k = rotate_qk(q, k, input_pos=input_pos)
        else:
            q = self.pos_embeddings(q, input_pos=input_pos)
            k = self.pos_embeddings(k, input_pos=input_pos)

        if self.kv_cache is not None:
            if input_pos is None or mask is None:
                raise ValueError(
                    "with a KV cache, attention needs input_pos and a mask over the cache "
                    "(TransformerDecoder.forward builds the mask from input_pos)"
                )
            k, v = self.kv_cache.update(input_pos, k, v)

        # [b, s, h, d] -> [b, h, s, d], the layout SDPA expects
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if self.num_kv_heads != self.num_heads:
            # kv head j serves query heads j*rep .. (j+1)*rep-1, as in Meta's and HF's repeat_kv
            rep = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)

        dropout_p = self.attn_dropout if self.training else 0.0
        if isinstance(mask, BlockMask):  # a packed batch on a GPU (torchtune.modules.attention_flex)
            out = flex_attention(q, k, v, mask, scale=self.scale)
            return self.output_proj(out.transpose(1, 2).reshape(bsz, seq_len, self.num_heads * self.head_dim))
        mask = None if mask is None else mask[:, None, :, :]
        if self.sliding_window is not None:
            out = sliding_window_attention(
                q,
                k,
                v,
                window=self.sliding_window,
                mask=mask,
                q_positions=None if self.kv_cache is None else input_pos.reshape(-1, seq_len),
                scale=self.scale,
                softcap=self.softcap,
                dropout_p=dropout_p,
            )
        else:
            out = attention(
                q, k, v, mask=mask, is_causal=mask is None, scale=self.scale, softcap=self.softcap, dropout_p=dropout_p
            )
        out = out.transpose(1, 2).reshape(bsz, seq_len, self.num_heads * self.head_dim)
        return self.output_proj(out)

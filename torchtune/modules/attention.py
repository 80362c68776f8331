"""Multi-head attention with grouped-query heads, rotary embeddings and PyTorch's fused SDPA (torchtune's
``MultiHeadAttention``: its arguments, defaults and forward), and the variants other families need: q/k
norms (Qwen3, Gemma 3), q/k/v biases (Qwen2, in the projections given), a logit scale and soft cap (Gemma 2
and 3) and a sliding attention window (Mistral v0.1, Gemma 2 and 3's local layers)."""

from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from torchtune._errors import TuneError
from torchtune.modules.attention_utils import _MaskType, flex_attention_call, is_block_mask
from torchtune.modules.kv_cache import KVCache
from torchtune.modules.sliding_window import attention, sliding_window_attention

_log = logging.getLogger(__name__)


class MultiHeadAttention(nn.Module):
    """Attention of ``x`` over ``y`` (self-attention: ``y = x``); ``num_kv_heads < num_heads`` gives
    grouped-query attention (Llama2-70B), ``num_kv_heads == 1`` multi-query attention.

    Without a mask it calls ``scaled_dot_product_attention(is_causal=is_causal)``, which lets PyTorch pick
    a fused (flash / memory-efficient) kernel and never materialises an ``s x s`` mask. A given mask is
    ``[b, s_x, s_y]``: boolean, ``True`` where query ``q`` may attend to key ``k`` (block-diagonal for
    packed sequences; ``[b, s, max_seq_len]`` over the cache when a KV cache is enabled), or additive
    floats, as SDPA takes them; or a flex-attention ``BlockMask`` (packed batches on CUDA, see
    ``torchtune.modules.attention_utils.packed_block_causal_mask``).

    Args:
        embed_dim: model width.
        num_heads: query heads.
        num_kv_heads: key/value heads; must divide ``num_heads``.
        head_dim: channels per head.
        q_proj, k_proj, v_proj, output_proj: the projections (``nn.Linear`` without bias for Llama2).
        pos_embeddings: rotary embeddings applied to q and k (may be shared between layers); one with a
            ``rotate_qk(q, k, input_pos=...)`` method rotates both in one call; ``None`` for none.
        q_norm, k_norm: norms over ``head_dim`` applied to each query / key head before RoPE (Qwen3's
            and Gemma 3's per-head RMSNorm, as transformers orders them); both or neither.
        kv_cache: a :class:`KVCache` to decode with; usually left ``None`` and set up by
            ``TransformerDecoder.setup_caches``.
        max_seq_len: longest sequence; default size of the KV cache.
        is_causal: without a mask, each query sees the keys up to its own position (``False``: all keys).
        attn_dropout: dropout on attention weights, training only.
        scale: multiplies the attention logits; default ``head_dim ** -0.5`` (Gemma 2 and 3:
            ``query_pre_attn_scalar ** -0.5``).
        softcap: soft cap of the attention logits (``softcap * tanh(logits / softcap)``), or ``None``.
            It needs the logits, which fused SDPA kernels never form: a capped layer computes them.
        sliding_window: a query at position ``p`` sees keys at ``p - sliding_window < k <= p`` only, as
            transformers' ``sliding_window_overlay``; ``None`` for full causal attention. See
            ``torchtune.modules.sliding_window`` for the kernels (no ``s x s`` mask on CUDA).

    Raises:
        ValueError: ``num_heads`` not a multiple of ``num_kv_heads``, ``embed_dim`` not of ``num_heads``,
            ``attn_dropout`` outside [0, 1], only one of ``q_norm`` / ``k_norm``, a window below 1.
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
        pos_embeddings: Optional[nn.Module] = None,
        q_norm: Optional[nn.Module] = None,
        k_norm: Optional[nn.Module] = None,
        kv_cache: Optional[KVCache] = None,
        max_seq_len: int = 4096,
        is_causal: bool = True,
        attn_dropout: float = 0.0,
        scale: Optional[float] = None,
        softcap: Optional[float] = None,
        sliding_window: Optional[int] = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be divisible by num_kv_heads ({num_kv_heads})")
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")
        if not 0.0 <= attn_dropout <= 1.0:
            raise ValueError(f"attn_dropout must be in [0, 1], got {attn_dropout}")
        if (q_norm is None) != (k_norm is None):
            raise ValueError("q_norm and k_norm must be set together")
        if sliding_window is not None and sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive number of tokens or None, got {sliding_window}")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.max_seq_len = max_seq_len
        self.is_causal = is_causal
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
        self.kv_cache = kv_cache
        # Whether forward writes to the cache: disable_kv_cache() turns it off without freeing the cache.
        self.cache_enabled = False

    def setup_cache(
        self,
        batch_size: int,
        dtype: torch.dtype,
        max_seq_len: Optional[int] = None,
        *,
        device: Optional[torch.device] = None,
    ) -> None:
        """Allocate a KV cache for ``batch_size`` sequences of ``max_seq_len`` tokens (default: the module's),
        on ``device`` (default: the q projection's). A cache that is already there is kept (torchtune
        warns and skips likewise)."""
        if self.kv_cache is not None:
            _log.warning("The key/value cache is already set up; setup_cache() is skipped.")
            return
        if device is None:
            weight = getattr(self.q_proj, "weight", None)
            device = weight.device if weight is not None else None
        self.kv_cache = KVCache(
            batch_size=batch_size,
            max_seq_len=self.max_seq_len if max_seq_len is None else max_seq_len,
            num_kv_heads=self.num_kv_heads,
            head_dim=self.head_dim,
            dtype=dtype,
            device=device,
        )
        self.cache_enabled = True

    def reset_cache(self) -> None:
        """Empty the KV cache (the next forward writes at slot 0).

        Raises:
            RuntimeError: no cache is set up.
        """
        if self.kv_cache is None:
            raise RuntimeError("Key value caches are not setup. Call ``setup_caches()`` first.")
        self.kv_cache.reset()

    def forward(
        self,
        x: torch.Tensor,
        y: Optional[torch.Tensor] = None,
        *,
        mask: Optional[_MaskType] = None,
        input_pos: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Attend from ``x`` (``[b, s_x, embed_dim]``) over ``y`` (``[b, s_y, embed_dim]``); returns
        ``[b, s_x, embed_dim]``.

        Args:
            x: the queries' input.
            y: the keys' and values' input (``x`` for self-attention); ``None`` attends over what the
                enabled KV cache holds.
            mask: ``[b, s_x, s_y]`` (``[b, s_x, cache size]`` with a KV cache) boolean "may attend" mask,
                additive float mask or ``BlockMask``; ``None`` for causal (``is_causal``).
            input_pos: rotary positions (``[b, s]`` or ``[s]``); ``None`` means ``0..s-1``.

        Raises:
            ValueError: ``y`` is ``None`` and no KV cache is enabled.
        """
        bsz, s_x, _ = x.shape
        q = self.q_proj(x).view(bsz, s_x, self.num_heads, self.head_dim)
        if self.q_norm is not None:
            q = self.q_norm(q)
        cached = self.kv_cache is not None and self.cache_enabled
        if y is None:
            if not cached:
                raise ValueError("Must provide y input or use kv_cache to enable streaming decoding")
            k = v = None
        else:
            s_y = y.shape[1]
            k = self.k_proj(y).view(bsz, s_y, -1, self.head_dim)
            v = self.v_proj(y).view(bsz, s_y, -1, self.head_dim)
            if self.k_norm is not None:
                k = self.k_norm(k)
        if self.pos_embeddings is not None:
            rotate_qk = getattr(self.pos_embeddings, "rotate_qk", None)
            if rotate_qk is not None and k is not None:  # one kernel for both (torchtune.modules._liger.LigerRoPE)
                q, k = rotate_qk(q, k, input_pos=input_pos)
            else:
                q = self.pos_embeddings(q, input_pos=input_pos)
                if k is not None:
                    k = self.pos_embeddings(k, input_pos=input_pos)

        # [b, s, h, d] -> [b, h, s, d], the layout SDPA (and the KV cache) expects
        q = q.transpose(1, 2)
        if k is None:
            k, v = self.kv_cache.k_cache[:bsz], self.kv_cache.v_cache[:bsz]
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            if cached:
                k, v = self.kv_cache.update(k, v)
        if self.num_kv_heads != self.num_heads:
            # kv head j serves query heads j*rep .. (j+1)*rep-1, as in Meta's and HF's repeat_kv
            rep = self.num_heads // self.num_kv_heads
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)

        dropout_p = self.attn_dropout if self.training else 0.0
        if is_block_mask(mask):
            if self.sliding_window is not None or self.softcap is not None:
                raise TuneError(
                    "A packed batch on CUDA comes with a flex-attention BlockMask, which this model's sliding "
                    "window / logit soft-cap does not take. Set dataset.packed=False for this model."
                )
            out = flex_attention_call(q, k, v, mask, scale=self.scale, dropout_p=dropout_p)
        else:
            mask = None if mask is None else mask[:, None, :, :]
            is_causal = mask is None and self.is_causal and not cached
            if self.sliding_window is not None:
                out = sliding_window_attention(
                    q,
                    k,
                    v,
                    window=self.sliding_window,
                    mask=mask,
                    q_positions=_query_positions(input_pos, bsz, s_x, q.device) if cached else None,
                    scale=self.scale,
                    softcap=self.softcap,
                    dropout_p=dropout_p,
                )
            else:
                out = attention(
                    q, k, v, mask=mask, is_causal=is_causal, scale=self.scale, softcap=self.softcap, dropout_p=dropout_p
                )
        out = out.transpose(1, 2).reshape(bsz, s_x, self.num_heads * self.head_dim)
        return self.output_proj(out)


def _query_positions(input_pos: Optional[torch.Tensor], bsz: int, seq_len: int, device: torch.device) -> torch.Tensor:
    """``[b, s]`` positions of the queries, which with a KV cache are also their cache slots."""
    if input_pos is None:
        return torch.arange(seq_len, device=device).expand(bsz, seq_len)
    return input_pos.reshape(-1, seq_len).expand(bsz, seq_len)

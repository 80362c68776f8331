"""Key/value cache for incremental decoding."""

from __future__ import annotations

import torch
from torch import nn


class KVCache(nn.Module):
    """Keys and values of the positions seen so far, ``[batch, max_seq_len, num_kv_heads, head_dim]``.

    Positions are written at ``input_pos`` (any order; a position written twice is overwritten),
    so the caller's attention mask decides what is visible. Buffers are not persistent: a cache is
    never part of a checkpoint.
    """

    def __init__(
        self,
        batch_size: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | None = None,
    ) -> None:
        super().__init__()
        shape = (batch_size, max_seq_len, num_kv_heads, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len

    def reset(self) -> None:
        """Forget every cached position."""
        self.k_cache.zero_()
        self.v_cache.zero_()

    def update(self, input_pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k``/``v`` (``[b, s, n_kv, d]``) at ``input_pos`` (``[b, s]`` or ``[s]``); return the whole cache."""
        bsz, seq_len = k.shape[:2]
        if bsz > self.batch_size:
            raise ValueError(
                f"batch of {bsz} is larger than the KV cache's batch size {self.batch_size}; "
                "call setup_caches() with a larger batch_size"
            )
        input_pos = input_pos.expand(bsz, seq_len)
        rows = torch.arange(bsz, device=k.device).unsqueeze(1).expand(bsz, seq_len)
        k_out, v_out = self.k_cache[:bsz], self.v_cache[:bsz]
        k_out[rows, input_pos] = k.to(k_out.dtype)
        v_out[rows, input_pos] = v.to(v_out.dtype)
        return k_out, v_out

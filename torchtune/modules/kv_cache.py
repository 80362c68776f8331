"""Key/value cache for incremental decoding, as torchtune's ``KVCache``: positions are appended in order."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn


class KVCache(nn.Module):
    """Keys and values of the positions seen so far, ``[batch_size, num_kv_heads, max_seq_len, head_dim]``.

    Each :meth:`update` writes its ``s`` new positions after those already there (``cache_pos`` counts
    them on the device, so decoding never reads a number back) and returns the whole cache; the caller's
    attention mask decides which slots a query sees. :meth:`reset` starts over at slot 0. Buffers are not
    persistent: a cache is never part of a checkpoint.

    Args:
        batch_size: most sequences decoded together (a smaller batch uses the first rows).
        max_seq_len: slots per sequence.
        num_kv_heads: key/value heads.
        head_dim: channels per head.
        dtype: dtype of the cached keys and values.
        device: where the cache lives; default the default device.
    """

    def __init__(
        self,
        batch_size: int,
        max_seq_len: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: Optional[torch.device] = None,
    ) -> None:
        super().__init__()
        shape = (batch_size, num_kv_heads, max_seq_len, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("cache_pos", torch.arange(max_seq_len, device=device), persistent=False)
        self.batch_size = batch_size
        self.max_seq_len = max_seq_len

    def reset(self) -> None:
        """Forget every cached position; the next update writes at slot 0."""
        self.k_cache.zero_()
        self.v_cache.zero_()
        self.cache_pos -= self.cache_pos[0].clone()

    @property
    def size(self) -> int:
        """Slots filled so far (reads the count back from the device)."""
        return int(self.cache_pos[0].item())

    def update(self, k_val: torch.Tensor, v_val: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``k_val``/``v_val`` (``[b, num_kv_heads, s, head_dim]``) at the next ``s`` slots; return the
        keys and values of the whole cache (its first ``b`` rows).

        Raises:
            ValueError: ``b`` is larger than the cache's ``batch_size``.
            AssertionError: the ``s`` new positions do not fit in the slots left.
        """
        bsz, _, seq_len, _ = k_val.shape
        if bsz > self.batch_size:
            raise ValueError(
                f"The KV cache holds {self.batch_size} sequences, but the keys have a batch of {bsz}; "
                "set the caches up with a larger batch_size."
            )
        assert (self.cache_pos[0] + seq_len) <= self.k_cache.shape[2], "the KV cache is full"
        slots = self.cache_pos[:seq_len]
        k_out, v_out = self.k_cache[:bsz], self.v_cache[:bsz]
        k_out[:, :, slots] = k_val.to(k_out.dtype)
        v_out[:, :, slots] = v_val.to(v_out.dtype)
        self.cache_pos.add_(seq_len)
        return k_out, v_out

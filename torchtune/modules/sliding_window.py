"""Attention kernels for local (sliding-window) layers, and for attention with soft-capped logits.

A sliding window of ``w`` tokens lets the query at index ``q`` see the keys at ``q - w < k <= q``
(transformers' ``sliding_window_overlay`` on top of the causal mask). Two ways to compute it:

- plain: one boolean ``s x s`` mask for SDPA. Exact and simple; the CPU path, and the path of
  calls that already carry an ``s x s`` mask of their own (a KV cache during generation).
- chunked: the queries are cut into chunks of ``w``; the chunk starting at ``i`` attends to keys
  ``i - w + 1 .. i + w - 1`` with a mask of ``w x (2w - 1)``. No ``s x s`` tensor ever exists, so
  memory grows as ``s * w``, not ``s^2`` (Gemma 3 4B at 8192 tokens: each of the 34 layers' windows
  is 1024). The CUDA path; packed batches slice their block-diagonal mask per chunk.

Which path a call takes depends on the device of the tensors, or on :func:`window_kernel_device`,
through which the memory estimator (fake CPU tensors standing for CUDA) counts the CUDA path.
"""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

import torch
import torch.nn.functional as F

__all__ = ["attention", "sliding_window_attention", "target_device_type", "window_kernel_device"]

_TARGET_DEVICE: Optional[str] = None


@contextlib.contextmanager
def window_kernel_device(device_type: Optional[str]) -> Iterator[None]:
    """Inside, sliding-window attention picks its path as on ``device_type`` (``None``: the tensors' own)."""
    global _TARGET_DEVICE
    previous, _TARGET_DEVICE = _TARGET_DEVICE, device_type
    try:
        yield
    finally:
        _TARGET_DEVICE = previous


def target_device_type(device: torch.device) -> str:
    """The device type kernels are picked for: ``window_kernel_device``'s inside it, else ``device``'s."""
    return _TARGET_DEVICE or torch.device(device).type


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: Optional[torch.Tensor] = None,
    is_causal: bool = False,
    scale: Optional[float] = None,
    softcap: Optional[float] = None,
    dropout_p: float = 0.0,
) -> torch.Tensor:
    """``softmax(q k^T * scale [soft-capped] + mask) v`` over ``[b, h, s, d]`` tensors.

    Without ``softcap`` this is SDPA (fused kernels). With it, the logits are ``softcap *
    tanh(logits / softcap)`` before the mask, which SDPA cannot do: computed as transformers' eager
    attention does (softmax in fp32, cast back to the query's dtype), materialising the scores.

    Args:
        mask: boolean "may attend", broadcastable to ``[b, h, s_q, s_k]``.
        is_causal: causal attention (only without ``mask``).
        scale: multiplies the logits; default ``head_dim ** -0.5``.
        softcap: the soft cap of the logits, or ``None``.
        dropout_p: dropout on the attention weights.
    """
    if softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal and mask is None, scale=scale
        )
    scale = q.size(-1) ** -0.5 if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if mask is None and is_causal:
        s_q, s_k = q.size(-2), k.size(-2)
        mask = torch.ones(s_q, s_k, dtype=torch.bool, device=q.device).tril(diagonal=s_k - s_q)
    if mask is not None:
        scores = scores.masked_fill(mask.logical_not(), float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    if dropout_p:
        weights = F.dropout(weights, p=dropout_p)
    return torch.matmul(weights, v)


def _window(q_idx: torch.Tensor, k_idx: torch.Tensor, window: int) -> torch.Tensor:
    return (k_idx <= q_idx) & (k_idx > q_idx - window)


def sliding_window_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    window: int,
    mask: Optional[torch.Tensor] = None,
    q_positions: Optional[torch.Tensor] = None,
    scale: Optional[float] = None,
    softcap: Optional[float] = None,
    dropout_p: float = 0.0,
    chunked: Optional[bool] = None,
) -> torch.Tensor:
    """Causal attention of ``q`` (``[b, h, s, d]``) over ``k``/``v`` within a window of ``window`` tokens.

    Args:
        window: keys at most ``window - 1`` positions before the query are seen (and the query's own).
        mask: an extra boolean "may attend" mask ``[b, 1, s, s_k]`` (a packed batch's block diagonal,
            or a KV cache's occupancy); the window is applied on top of it.
        q_positions: ``[b, s]`` positions of the queries when the keys are a KV cache indexed by
            position (generation); ``None`` when query ``i`` and key ``i`` are the same token.
        scale, softcap, dropout_p: as for :func:`attention`.
        chunked: force a path (tests); ``None`` picks chunked on CUDA (or under
            ``window_kernel_device("cuda")``) for sequences longer than the window, plain otherwise.
    """
    s_q, s_k = q.size(-2), k.size(-2)
    if q_positions is not None:  # keys are cache slots = positions; queries sit at q_positions
        window_mask = _window(q_positions[:, None, :, None], torch.arange(s_k, device=q.device), window)
        mask = window_mask if mask is None else mask & window_mask
        return attention(q, k, v, mask=mask, scale=scale, softcap=softcap, dropout_p=dropout_p)
    if s_q != s_k:
        raise ValueError(f"sliding-window attention without q_positions needs as many keys as queries, {s_q} != {s_k}")
    if s_q <= window:  # the window covers everything causal attention sees
        return attention(q, k, v, mask=mask, is_causal=True, scale=scale, softcap=softcap, dropout_p=dropout_p)
    if chunked is None:
        chunked = target_device_type(q.device) == "cuda"
    idx = torch.arange(s_q, device=q.device)
    if not chunked:
        window_mask = _window(idx[:, None], idx[None, :], window)
        mask = window_mask if mask is None else mask & window_mask
        return attention(q, k, v, mask=mask, scale=scale, softcap=softcap, dropout_p=dropout_p)
    outputs = []
    for start in range(0, s_q, window):
        end = min(start + window, s_q)
        lo = max(0, start - window + 1)
        chunk_mask = _window(idx[start:end, None], idx[None, lo:end], window)
        if mask is not None:
            chunk_mask = mask[..., start:end, lo:end] & chunk_mask
        outputs.append(
            attention(
                q[..., start:end, :],
                k[..., lo:end, :],
                v[..., lo:end, :],
                mask=chunk_mask,
                scale=scale,
                softcap=softcap,
                dropout_p=dropout_p,
            )
        )
    return torch.cat(outputs, dim=-2)

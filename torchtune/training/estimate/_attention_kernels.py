"""Attention as the target device runs it, for the memory estimator.

The estimator runs on fake CPU tensors, where ``F.scaled_dot_product_attention`` picks the CPU's own
kernel. On CUDA, PyTorch picks (in its priority order flash, memory-efficient, math) the FlashAttention-2
kernel for fp16/bf16 without a mask and the memory-efficient kernel otherwise; each saves different
tensors for backward and allocates different workspaces. ``target_attention("cuda")`` replaces the call
by the CUDA kernel's own ATen op, whose fake (meta) implementation gives exactly the tensors the kernel
returns and saves, and adds the flash backward's fp32 workspaces (``dq_accum`` and ``softmax_d`` of
PyTorch's FlashAttention-2 ``mha_bwd``) for the duration of the backward kernel. A packed batch on CUDA
goes through FlexAttention (``torchtune.modules.attention_flex``): inside ``target_attention("cuda")`` its
compiled kernel is the stand-in below, which allocates and saves what that kernel does.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

import torch
import torch.nn.functional as F

__all__ = ["describe_attention", "target_attention"]

_FLASH = "flash"
_EFFICIENT = "memory-efficient"
_MATH = "math"
_FLEX = "flex"

DESCRIPTIONS = {
    _FLASH: "CUDA flash SDPA kernel (aten._scaled_dot_product_flash_attention, PyTorch's first choice for "
    "bf16/fp16 without a mask on sm80+): saves the output and an fp32 log-sum-exp, no s x s matrix; "
    "its backward's fp32 workspaces are counted",
    _EFFICIENT: "CUDA memory-efficient SDPA kernel (aten._scaled_dot_product_efficient_attention; a boolean mask "
    "becomes a materialised additive bias of b x s x s): saves the output and an fp32 log-sum-exp",
    _MATH: "the math SDPA path (materialises the s x s attention weights)",
    _FLEX: "compiled FlexAttention with a block-causal document mask (packed batches on CUDA): saves the output "
    "and an fp32 log-sum-exp, no s x s matrix; the block mask's per-block tensors and its backward's fp32 "
    "row sums are counted",
}


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def cuda_kernel(q: torch.Tensor, attn_mask: Optional[torch.Tensor], dropout_p: float) -> str:
    """The SDPA kernel PyTorch's CUDA dispatch picks for these inputs (on sm80+ GPUs)."""
    head_dim = q.shape[-1]
    if q.dtype in (torch.bfloat16, torch.float16) and attn_mask is None and head_dim <= 256 and head_dim % 8 == 0:
        return _FLASH
    if (
        q.dtype in (torch.bfloat16, torch.float16, torch.float32)
        and head_dim % (4 if q.dtype == torch.float32 else 8) == 0
    ):
        return _EFFICIENT
    return _MATH


class _FlashAttention(torch.autograd.Function):
    """The CUDA flash kernel's forward and backward ops, with the backward's workspaces allocated."""

    @staticmethod
    def forward(
        ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, scale: Any
    ) -> torch.Tensor:
        out, lse, _, _, max_q, max_k, seed, offset, _ = torch.ops.aten._scaled_dot_product_flash_attention(
            q, k, v, 0.0, is_causal, False, scale=scale
        )
        ctx.save_for_backward(q, k, v, out, lse, seed, offset)
        ctx.args = (max_q, max_k, is_causal, scale)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> Any:
        q, k, v, out, lse, seed, offset = ctx.saved_tensors
        max_q, max_k, is_causal, scale = ctx.args
        b, h, s, d = q.shape
        s_rounded = _round_up(s, 128)
        d_rounded = _round_up(d, 32) if d <= 192 else 256
        # mha_bwd allocates these fp32 buffers next to dq/dk/dv for the kernel's duration
        softmax_d = torch.empty((b, h, s_rounded), dtype=torch.float32, device=q.device)
        dq_accum = torch.empty((b, s_rounded, h, d_rounded), dtype=torch.float32, device=q.device)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad_out, q, k, v, out, lse, None, None, max_q, max_k, 0.0, is_causal, seed, offset, scale=scale
        )
        del softmax_d, dq_accum
        return dq, dk, dv, None, None


def _efficient(q, k, v, attn_mask, dropout_p, is_causal, scale) -> torch.Tensor:
    bias = None
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            # PyTorch turns a boolean mask into an additive bias in q's dtype before the kernel
            bias = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
                attn_mask.logical_not(), float("-inf")
            )
        else:
            bias = attn_mask
        bias = bias.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])
    out = torch.ops.aten._scaled_dot_product_efficient_attention(
        q, k, v, bias, True, dropout_p, is_causal and attn_mask is None, scale=scale
    )
    return out[0]


class _TargetAttention:
    """Called in place of ``F.scaled_dot_product_attention``; counts the kernels it stood in for."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.kernels: dict[str, int] = {}

    def __call__(self, *args: Any, **kwargs: Any) -> torch.Tensor:
        names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
        bound = dict(zip(names, args))
        bound.update(kwargs)
        q, k, v = bound["query"], bound["key"], bound["value"]
        mask, dropout_p = bound.get("attn_mask"), float(bound.get("dropout_p", 0.0))
        is_causal, scale = bool(bound.get("is_causal", False)), bound.get("scale")
        kernel = cuda_kernel(q, mask, dropout_p)
        if kernel == _FLASH and dropout_p != 0.0:
            kernel = _EFFICIENT  # the flash op's dropout needs a CUDA generator; counted as memory-efficient
        self.kernels[kernel] = self.kernels.get(kernel, 0) + 1
        if kernel == _FLASH:
            return _FlashAttention.apply(q, k, v, is_causal, scale)
        if kernel == _EFFICIENT:
            return _efficient(q, k, v, mask, dropout_p, is_causal, scale)
        return self.original(*args, **kwargs)


@contextlib.contextmanager
def target_attention(device_type: str) -> Iterator[dict[str, int]]:
    """Inside, SDPA runs the kernel ``device_type`` would run (CUDA: flash / memory-efficient ops).

    Yields ``{kernel name: calls}`` filled as attention runs. For other device types it does nothing
    (the kernel of the device the tensors are on runs, as in a real run). It replaces the function
    ``torch.nn.functional.scaled_dot_product_attention`` while inside, rather than using a
    ``TorchFunctionMode``, because activation checkpointing recomputes the layer inside the autograd
    engine, where function modes are not active: the recomputation must save what the forward saved.
    """
    from torchtune.modules import attention_flex
    from torchtune.modules.sliding_window import window_kernel_device

    if device_type != "cuda":
        yield {}
        return
    original = F.scaled_dot_product_attention
    stand_in = _TargetAttention(original)

    def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any) -> torch.Tensor:
        stand_in.kernels[_FLEX] = stand_in.kernels.get(_FLEX, 0) + 1
        return flex_attention_as_compiled(q, k, v, block_mask)

    F.scaled_dot_product_attention, attention_flex.STAND_IN = stand_in, flex
    try:
        with window_kernel_device(device_type):
            yield stand_in.kernels
    finally:
        F.scaled_dot_product_attention, attention_flex.STAND_IN = original, None


def describe_attention(kernels: dict[str, int], device_type: str) -> str:
    """One sentence for the estimate's output: which attention kernel was counted."""
    if not kernels:
        return f"attention counted as the kernel the {device_type} device itself picks"
    return "attention counted as the " + "; and ".join(DESCRIPTIONS[k] for k in sorted(kernels))


# --- FlexAttention, compiled, as a stand-in on fake and meta tensors --------------------------------------
# A compiled ``flex_attention`` is one Triton kernel forward and two backward (the ``delta = sum(dO * O)``
# preprocessing and the dq/dk/dv kernel). Forward it returns the output and the fp32 log-sum-exp of each
# query row and saves them with q, k, v and the block mask; backward allocates delta (fp32, per query row)
# besides dq, dk and dv. These custom ops allocate exactly that and compute nothing: the memory estimator
# counts their tensors, the launch counter counts them as those kernels (by their names, which it knows).
# The block mask's own tensors are made by the code that builds it (``torchtune.modules.attention_flex``).


@torch.library.custom_op("tune_kernels::flex_attention", mutates_args=())
def flex_attention_stand_in(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, log-sum-exp) shapes of a compiled FlexAttention call; fake and meta tensors only."""
    raise NotImplementedError("the FlexAttention stand-in runs on fake and meta tensors only")


@flex_attention_stand_in.register_fake
def _(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out = torch.empty((*q.shape[:-1], v.shape[-1]), dtype=q.dtype, device=q.device)
    return out, torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)


@torch.library.custom_op("tune_kernels::flex_attention_backward", mutates_args=())
def flex_attention_backward_stand_in(
    grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of a compiled FlexAttention backward; fake and meta tensors only."""
    raise NotImplementedError("the FlexAttention stand-in runs on fake and meta tensors only")


@flex_attention_backward_stand_in.register_fake
def _(grad_out, q, k, v, out, lse):
    delta = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)  # noqa: F841 - held by the kernel
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _flex_setup(ctx: Any, inputs: tuple, output: tuple) -> None:
    q, k, v = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)


def _flex_backward(ctx: Any, grad_out: torch.Tensor, grad_lse: Any) -> tuple:
    q, k, v, out, lse = ctx.saved_tensors
    return flex_attention_backward_stand_in(grad_out.contiguous(), q, k, v, out, lse)


flex_attention_stand_in.register_autograd(_flex_backward, setup_context=_flex_setup)


def flex_attention_as_compiled(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_mask: Any = None
) -> torch.Tensor:
    """What a compiled ``flex_attention(q, k, v, block_mask=...)`` returns and saves, on fake or meta tensors.
    The block mask's tensors stay alive with the graph, as they do for the real kernel."""
    out, _ = flex_attention_stand_in(q, k, v)
    return out

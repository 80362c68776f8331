"""liger-kernel's Triton kernels in place of the model's RMSNorm, RoPE and SwiGLU (``liger_kernels: True``).

Each module here takes over the parameters of the module it replaces (same names, so checkpoints,
optimizer state and in-backward hooks are unchanged) and calls liger-kernel's autograd Function
(``liger_kernel.ops.*``). The math is the plain module's: RMSNorm in Llama's casting (fp32 inverse RMS,
cast back before the scale) or Gemma's (all fp32, ``1 + scale``), as liger-kernel's own model patches
set it per family; SiLU-gated feed-forward blocks only (Gemma's GELU-gated one stays plain).

RoPE: the Llama, Mistral and Gemma models rotate Meta's interleaved channel pairs ``(2i, 2i+1)``,
liger-kernel rotates Hugging Face's halves ``(i, i + dim/2)`` (as the Qwen2 and Phi-3 models here do, which
it takes as they are). For the interleaved ones ``LigerRoPE`` moves each head's rotated channels into halves
(evens first, then odds) and rotates those: the rotation is then exactly ours, on permuted channels.
Queries and keys are permuted alike and attention only takes dot products of their heads, so the
attention is unchanged; values and the output keep their order.

The kernels run on CUDA tensors only. The memory estimator runs the model on fake tensors, which no
Triton kernel takes: there each op runs a stand-in (``_Fake*``) that allocates and saves for backward
exactly what liger-kernel's op does (same shapes and dtypes), with no values. liger-kernel is imported
only when a kernel runs, so estimating needs no package.
"""

from __future__ import annotations

from typing import Optional, Tuple, Union

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake

from torchtune.modules.feed_forward import FeedForward
from torchtune.modules.position_embeddings import PartialRotaryEmbeddings, RotaryPositionalEmbeddings
from torchtune.modules.rms_norm import GemmaRMSNorm, RMSNorm

__all__ = ["LigerRMSNorm", "LigerRoPE", "LigerSwiGLU", "apply_liger_kernels"]

# The streaming multiprocessors of an H100/H200: liger's RMSNorm backward keeps one fp32 row of weight
# gradient partial sums per SM. Only used where the device is simulated (the estimator).
_SIMULATED_SM_COUNT = 132


def _next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


# --- stand-ins on fake tensors: liger-kernel's allocations and saved tensors, no values --------------------


class _FakeRMSNorm(torch.autograd.Function):
    """``liger_kernel.ops.rms_norm``: Y and an fp32 inverse RMS per row; saves X, W, RSTD. Backward (not in
    place): dX, and an fp32 ``[SMs, dim]`` buffer of weight-gradient partial sums reduced to dW."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        rows = x.contiguous().view(-1, x.size(-1))
        y = torch.empty_like(rows)
        rstd = torch.empty(rows.size(0), dtype=torch.float32, device=x.device)
        ctx.save_for_backward(rows, weight, rstd)
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        _, weight, _ = ctx.saved_tensors
        dx = torch.zeros_like(dy.contiguous())
        partial = torch.empty(_SIMULATED_SM_COUNT, dy.size(-1), dtype=torch.float32, device=dy.device)
        return dx, partial.sum(0).to(weight.dtype)


class _FakeSiLUMul(torch.autograd.Function):
    """``liger_kernel.ops.swiglu``: a new output; saves the gate and up inputs and writes their gradients
    into them in backward (no new memory there)."""

    @staticmethod
    def forward(ctx, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        shape = gate.shape
        gate, up = gate.contiguous().view(-1, shape[-1]), up.contiguous().view(-1, shape[-1])
        ctx.save_for_backward(gate, up)
        return torch.empty_like(gate).view(shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        gate, up = ctx.saved_tensors
        grad.contiguous()
        return gate.view(grad.shape), up.view(grad.shape)


class _FakeRope(torch.autograd.Function):
    """``liger_kernel.ops.rope``: rotates q and k in place; saves contiguous cos and sin."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        ctx.save_for_backward(cos.contiguous(), sin.contiguous())
        q, k = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
        return q.transpose(1, 2), k.transpose(1, 2)

    @staticmethod
    def backward(ctx, dq: torch.Tensor, dk: torch.Tensor):
        dq, dk = dq.transpose(1, 2).contiguous(), dk.transpose(1, 2).contiguous()
        return dq.transpose(1, 2), dk.transpose(1, 2), None, None


class _FakeFusedLinearCrossEntropy(torch.autograd.Function):
    """``liger_kernel.ops.fused_linear_cross_entropy``: the gradients are computed in forward, chunk by chunk
    of rows (``next_power_of_2(rows / ceil(vocab / dim))`` rows of logits at a time), into an input gradient
    and a weight gradient accumulated in ``accum_dtype``, cast to the weight's dtype at the end; both are
    saved and returned (scaled in place) by backward."""

    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: Optional[torch.Tensor],
        accum_dtype: Optional[torch.dtype],
    ) -> torch.Tensor:
        rows, dim = hidden.shape
        vocab = weight.size(0)
        chunk = min(_next_power_of_2(-(-rows // -(-vocab // dim))), rows)
        grad_input = torch.zeros_like(hidden)
        grad_weight = torch.zeros_like(weight, dtype=accum_dtype or weight.dtype)
        grad_bias = None if bias is None else torch.zeros_like(bias, dtype=accum_dtype or bias.dtype)
        loss_rows = torch.zeros(rows, dtype=torch.float32, device=hidden.device)
        logits = torch.empty(chunk, vocab, dtype=hidden.dtype, device=hidden.device)
        del logits
        grad_weight = grad_weight.to(weight.dtype)
        grad_bias = None if grad_bias is None else grad_bias.to(bias.dtype)
        ctx.save_for_backward(grad_input, grad_weight, grad_bias)
        return loss_rows.sum()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad_input, grad_weight, grad_bias = ctx.saved_tensors
        return grad_input, grad_weight, grad_bias, None


# --- the ops: liger-kernel's kernel on a real tensor, the stand-in on a fake one ---------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, gemma: bool) -> torch.Tensor:
    """liger-kernel's RMSNorm: Llama's casting, or Gemma's (``gemma``: fp32 throughout, ``1 + weight``)."""
    if is_fake(x):
        return _FakeRMSNorm.apply(x, weight)
    from liger_kernel.ops.rms_norm import LigerRMSNormFunction

    # not in place: Gemma's post-norms feed the residual, whose gradient dY also flows elsewhere
    offset, casting = (1.0, "gemma") if gemma else (0.0, "llama")
    return LigerRMSNormFunction.apply(x, weight, eps, offset, casting, False)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` by liger-kernel's SwiGLU kernel (its backward overwrites ``gate`` and ``up``)."""
    if is_fake(gate):
        return _FakeSiLUMul.apply(gate, up)
    from liger_kernel.ops.swiglu import LigerSiLUMulFunction

    return LigerSiLUMulFunction.apply(gate, up)


def rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int
) -> Tuple[torch.Tensor, torch.Tensor]:
    """liger-kernel's RoPE (halves layout) of q ``[b, h, s, d]`` and k ``[b, h_kv, s, d]`` in place, over the
    first ``rotary_dim`` channels; ``cos``/``sin`` are ``[s, rotary_dim / 2]`` or ``[b, s, rotary_dim / 2]``."""
    if is_fake(q):
        return _FakeRope.apply(q, k, cos, sin)
    from liger_kernel.ops.rope import LigerRopeFunction

    return LigerRopeFunction.apply(q, k, cos, sin, None, 1, rotary_dim)


def fused_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    labels: torch.Tensor,
    ignore_index: int,
    accum_dtype: Optional[torch.dtype],
) -> torch.Tensor:
    """Mean cross-entropy of ``F.linear(hidden, weight, bias)`` (``hidden`` ``[n, dim]``) against ``labels``
    (``[n]``) by liger-kernel's fused kernel, over the labels that are not ``ignore_index``."""
    if is_fake(hidden):
        return _FakeFusedLinearCrossEntropy.apply(hidden, weight, bias, accum_dtype)
    from liger_kernel.ops.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyFunction

    # arguments by position: (input, weight, target, bias, ce_weight, ignore_index, lse_square_scale,
    # label_smoothing, reduction, softcap, return_z_loss, accum_dtype)
    loss, *_ = LigerFusedLinearCrossEntropyFunction.apply(
        hidden, weight, labels, bias, None, ignore_index, 0.0, 0.0, "mean", None, False, accum_dtype
    )
    return loss


# --- the modules --------------------------------------------------------------------------------------------


class LigerRMSNorm(nn.Module):
    """An ``RMSNorm`` or ``GemmaRMSNorm`` computed by liger-kernel, with the same ``scale`` parameter."""

    def __init__(self, norm: Union[RMSNorm, GemmaRMSNorm]) -> None:
        super().__init__()
        self.scale = norm.scale
        self.eps = norm.eps
        self.gemma = isinstance(norm, GemmaRMSNorm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.scale, self.eps, self.gemma)


class LigerSwiGLU(nn.Module):
    """A SiLU-gated ``FeedForward`` (``w2(silu(w1(x)) * w3(x))``) whose gating is liger-kernel's SwiGLU
    kernel, with the same ``w1``/``w2``/``w3`` projections."""

    def __init__(self, mlp: FeedForward) -> None:
        super().__init__()
        if not mlp.is_swiglu:
            raise ValueError("LigerSwiGLU replaces SiLU-gated feed-forward blocks only (SiLU, with an up projection)")
        self.w1, self.w2, self.w3 = mlp.w1, mlp.w2, mlp.w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(silu_mul(self.w1(x), self.w3(x)))


def _halves(x: torch.Tensor, rotary_dim: int) -> torch.Tensor:
    """``x`` (``[b, s, h, d]``) with each head's first ``rotary_dim`` channels reordered from interleaved pairs
    to halves (``0, 2, 4, ..., 1, 3, 5, ...``), the other channels after them; a new contiguous tensor."""
    rotated = x[..., :rotary_dim].unflatten(-1, (rotary_dim // 2, 2)).transpose(-1, -2).flatten(-2)
    if rotary_dim == x.size(-1):
        return rotated.contiguous()
    return torch.cat([rotated, x[..., rotary_dim:]], dim=-1)


class LigerRoPE(nn.Module):
    """Rotary embeddings computed by liger-kernel, from the cos/sin tables of the module it wraps.

    ``MultiHeadAttention`` calls :meth:`rotate_qk` (queries and keys in one kernel) when its position
    embedding has one. The results have each head's rotated channels in halves order (see the module
    docstring): only dot products between queries and keys rotated here are meaningful.

    Args:
        rope: a ``RotaryPositionalEmbeddings`` (any of its scalings) or ``PartialRotaryEmbeddings``.
    """

    def __init__(self, rope: Union[RotaryPositionalEmbeddings, PartialRotaryEmbeddings]) -> None:
        super().__init__()
        self.rope = rope

    @property
    def tables(self) -> RotaryPositionalEmbeddings:
        """The module holding the cos/sin tables (a partial rotation's inner one)."""
        return self.rope.rope if isinstance(self.rope, PartialRotaryEmbeddings) else self.rope

    @property
    def dim(self) -> int:
        return self.tables.dim

    def forward(self, x: torch.Tensor, *, input_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        raise RuntimeError("LigerRoPE rotates queries and keys together: call rotate_qk(q, k, input_pos=...)")

    def rotate_qk(
        self, q: torch.Tensor, k: torch.Tensor, *, input_pos: Optional[torch.Tensor] = None
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        """Rotate q ``[b, s, h, d]`` and k ``[b, s, h_kv, d]`` at ``input_pos`` (``None``: ``0..s-1``)."""
        table = self.tables._table(q.size(1), input_pos)  # [s or b, s, dim / 2, 2] fp32
        rd = self.dim
        if self.tables.interleaved:
            q, k = _halves(q, rd), _halves(k, rd)
        else:  # already in liger-kernel's layout
            q, k = q.contiguous(), k.contiguous()
        q, k = rope(q.transpose(1, 2), k.transpose(1, 2), table[..., 0], table[..., 1], rd)
        return q.transpose(1, 2), k.transpose(1, 2)


def apply_liger_kernels(model: nn.Module) -> dict[str, int]:
    """Replace, in place, the RMSNorms (``RMSNorm``, ``GemmaRMSNorm``), rotary embeddings and SiLU-gated
    feed-forward blocks of ``model`` by their liger-kernel modules, sharing their parameters; a rotary
    module shared between layers stays shared. Call it after the weights are loaded and before activation
    checkpointing or compile wrap the layers. Returns how many modules of each kind were replaced."""
    counts = {"rms_norm": 0, "rope": 0, "swiglu": 0}
    ropes: dict[int, LigerRoPE] = {}
    # rotary modules are replaced whole: what is inside one (a partial rotation's tables) is not visited
    skip = (RotaryPositionalEmbeddings, PartialRotaryEmbeddings, LigerRoPE)
    for parent in [m for m in model.modules() if not isinstance(m, skip)]:
        for name, child in list(parent.named_children()):
            if isinstance(child, (RMSNorm, GemmaRMSNorm)):
                setattr(parent, name, LigerRMSNorm(child))
                counts["rms_norm"] += 1
            elif isinstance(child, FeedForward) and child.is_swiglu:
                setattr(parent, name, LigerSwiGLU(child))
                counts["swiglu"] += 1
            elif isinstance(child, (RotaryPositionalEmbeddings, PartialRotaryEmbeddings)):
                if id(child) not in ropes:
                    ropes[id(child)] = LigerRoPE(child)
                    counts["rope"] += 1
                setattr(parent, name, ropes[id(child)])
    return counts

"""Cross-entropy that applies the output projection chunk by chunk, so the fp32 logits never exist whole.

For Llama2-7B at batch 2 x 2048 tokens the full fp32 logits are 2*2048*32000*4 bytes = 524 MB, and
the plain loss keeps the bf16 logits (262 MB) and the fp32 log-probabilities (524 MB) for backward.
Here forward keeps nothing but the (already alive) hidden states and the weight; backward recomputes
one chunk of logits at a time and accumulates the output projection's gradient into ONE buffer in
place, so the weight gradient is never held twice (autograd would hold a per-chunk gradient next to
the running sum).

Every chunk streams the whole weight through the multiply three times (forward, the recomputation
and the input gradient) and reads and writes the whole weight gradient once, whatever its row
count, so a chunk of a few rows is bound by memory traffic, not arithmetic: in the step of a 168M
model (32000 x 1024 fp32 output weight, ~110 labelled rows, 2-core CPU) eight chunks of ~14 rows
made the step 1.5x slower than one chunk (docs/speed.md). Chunks are therefore never cut below
``min_chunk_rows`` rows: a step with few labelled rows (a small batch, or one whose prompts carry no
label) takes fewer, fuller chunks, and the fp32 peak stays at most
``max(rows / num_chunks, min_chunk_rows) * vocab * 4`` bytes.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["DEFAULT_MIN_CHUNK_ROWS", "chunk_count", "chunked_linear_cross_entropy"]

# 128 rows: the loss's time per row levels off from there on a CPU (docs/speed.md), and it is the
# chunk size of the 16 GB Llama2-7B config (batch 2 x 512 tokens in 8 chunks), whose peak it keeps.
DEFAULT_MIN_CHUNK_ROWS = 128


def chunk_count(rows: int, num_chunks: int, min_chunk_rows: int = DEFAULT_MIN_CHUNK_ROWS) -> int:
    """How many chunks ``rows`` rows are cut into: ``num_chunks``, fewer when chunks would have fewer
    than ``min_chunk_rows`` rows (never fewer than one). A chunk then has at most
    ``max(ceil(rows / num_chunks), min_chunk_rows)`` rows."""
    return max(1, min(num_chunks, -(-rows // max(min_chunk_rows, 1))))


def _chunk_nll_sum(
    hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], labels: torch.Tensor, ignore_index: int
) -> torch.Tensor:
    logits = F.linear(hidden, weight, bias)
    # log_softmax straight into fp32: no separate fp32 copy of the logits
    logp = torch.log_softmax(logits, dim=-1, dtype=torch.float32)
    del logits
    valid = labels != ignore_index
    target = torch.where(valid, labels, torch.zeros_like(labels))
    nll = -logp.gather(1, target.unsqueeze(1)).squeeze(1)
    return torch.where(valid, nll, torch.zeros_like(nll)).sum()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: Optional[torch.Tensor],
        labels: torch.Tensor,
        num_chunks: int,
        ignore_index: int,
        min_chunk_rows: int,
    ) -> torch.Tensor:
        dim = hidden.size(-1)
        flat_h = hidden.reshape(-1, dim)
        flat_y = labels.reshape(-1)
        num_chunks = chunk_count(flat_h.size(0), num_chunks, min_chunk_rows)  # a shape: no host sync
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for h_c, y_c in zip(flat_h.chunk(num_chunks), flat_y.chunk(num_chunks)):
            total = total + _chunk_nll_sum(h_c, weight, bias, y_c, ignore_index)
        # clamp instead of branching on the count: no host sync, 0 when every label is ignored
        num_tokens = (flat_y != ignore_index).sum().clamp(min=1)
        ctx.save_for_backward(hidden, weight, bias, labels, num_tokens)
        ctx.num_chunks = num_chunks
        ctx.ignore_index = ignore_index
        return total / num_tokens

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, bias, labels, num_tokens = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        dim = hidden.size(-1)
        flat_h = hidden.reshape(-1, dim)
        flat_y = labels.reshape(-1)
        scale = grad_out.float() / num_tokens
        grad_h = torch.empty_like(flat_h) if need_h else None
        grad_w = torch.zeros_like(weight) if need_w else None
        grad_b = torch.zeros_like(bias) if (need_b and bias is not None) else None
        grad_h_chunks = grad_h.chunk(ctx.num_chunks) if need_h else [None] * ctx.num_chunks
        for h_c, y_c, gh_c in zip(flat_h.chunk(ctx.num_chunks), flat_y.chunk(ctx.num_chunks), grad_h_chunks):
            logits = F.linear(h_c, weight, bias)
            g = torch.softmax(logits, dim=-1, dtype=torch.float32)
            del logits
            valid = y_c != ctx.ignore_index
            target = torch.where(valid, y_c, torch.zeros_like(y_c))
            # d(-log softmax[target]) / d logits = softmax - onehot(target)
            g.scatter_add_(1, target.unsqueeze(1), torch.full_like(g[:, :1], -1.0))
            g.mul_((valid.to(g.dtype) * scale).unsqueeze(1))
            g = g.to(weight.dtype)
            if need_h:
                torch.mm(g, weight, out=gh_c)
            if need_w:
                grad_w.addmm_(g.t(), h_c)
            if grad_b is not None:
                grad_b.add_(g.sum(0))
            del g
        if need_h:
            grad_h = grad_h.view_as(hidden)
        return grad_h, grad_w, grad_b, None, None, None, None


def chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    labels: torch.Tensor,
    num_chunks: int,
    ignore_index: int,
    min_chunk_rows: int = DEFAULT_MIN_CHUNK_ROWS,
) -> torch.Tensor:
    """Mean fp32 cross-entropy of ``F.linear(hidden, weight, bias)`` against ``labels``, over the labels
    that are not ``ignore_index``, computed chunk by chunk in forward and backward: ``num_chunks``
    token chunks, fewer where a chunk would have fewer than ``min_chunk_rows`` rows (``chunk_count``)."""
    return _ChunkedLinearCrossEntropy.apply(hidden, weight, bias, labels, num_chunks, ignore_index, min_chunk_rows)

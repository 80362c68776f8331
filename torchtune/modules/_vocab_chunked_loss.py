"""Cross-entropy that applies the output projection one slice of the vocabulary at a time.

``ChunkedCrossEntropyLoss`` cuts the *rows* (positions): every chunk multiplies by the whole output
weight and adds into the whole weight gradient, so with ``C`` chunks the weight is streamed ``3C`` times
and its gradient read and written ``C`` times. With the 128k-152k vocabularies of Llama 3 and Qwen
(a 128256 x 4096 bf16 weight is 1.05 GB) that traffic is the largest single cost of a short step on a
GPU. Here the *vocabulary* is cut instead: each slice ``W[a:b]`` meets all rows at once, so the weight
is streamed three times in all (forward, the recomputation, the two gradient products) and each slice
of the weight gradient is written exactly once (``torch.mm(..., out=grad_w[a:b])``), never accumulated.

Forward keeps a running log-sum-exp per row (combined slice by slice with ``logaddexp``) and the
target's logit, so the loss needs no second pass; backward recomputes one slice of logits at a time,
turns it into ``softmax - onehot`` with the saved log-sum-exp, and writes that slice's weight and bias
gradients. The input gradient is the sum of every slice's contribution: it is accumulated in fp32
(one ``rows x dim`` buffer) when the weights are in a lower precision, so a bf16 run does not round
it once per slice.

Memory: the fp32 logits of one slice, ``rows x ceil(vocab / num_output_chunks) x 4`` bytes, the same
bound as ``num_output_chunks`` row chunks, plus (bf16/fp16 weights) the fp32 input-gradient
accumulator ``rows x dim x 4`` bytes during backward. ``tune estimate-memory`` counts both, since it runs
this code on fake tensors.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F

__all__ = ["vocab_chunked_linear_cross_entropy"]


def _slices(vocab: int, num_chunks: int) -> list[tuple[int, int]]:
    size = -(-vocab // max(1, min(num_chunks, vocab)))
    return [(start, min(start + size, vocab)) for start in range(0, vocab, size)]


class _VocabChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: Optional[torch.Tensor],
        labels: torch.Tensor,
        num_chunks: int,
        ignore_index: int,
    ) -> torch.Tensor:
        flat_h = hidden.reshape(-1, hidden.size(-1))
        flat_y = labels.reshape(-1)
        valid = flat_y != ignore_index
        rows = flat_h.size(0)
        lse = torch.full((rows,), float("-inf"), dtype=torch.float32, device=hidden.device)
        target_logit = torch.zeros(rows, dtype=torch.float32, device=hidden.device)
        slices = _slices(weight.size(0), num_chunks)
        for start, end in slices:
            logits = F.linear(flat_h, weight[start:end], None if bias is None else bias[start:end]).float()
            lse = torch.logaddexp(lse, torch.logsumexp(logits, dim=-1))
            in_slice = valid & (flat_y >= start) & (flat_y < end)
            # Out-of-slice targets gather column 0 and are masked out: no host sync, no data-dependent shape.
            local = torch.where(in_slice, flat_y - start, torch.zeros_like(flat_y))
            picked = logits.gather(1, local.unsqueeze(1)).squeeze(1)
            target_logit = target_logit + torch.where(in_slice, picked, torch.zeros_like(picked))
            del logits
        nll = torch.where(valid, lse - target_logit, torch.zeros_like(lse))
        # clamp instead of branching on the count: no host sync, 0 when every label is ignored
        num_tokens = valid.sum().clamp(min=1)
        ctx.save_for_backward(hidden, weight, bias, labels, lse, num_tokens)
        ctx.slices = slices
        ctx.ignore_index = ignore_index
        return nll.sum() / num_tokens

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, bias, labels, lse, num_tokens = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        flat_h = hidden.reshape(-1, hidden.size(-1))
        flat_y = labels.reshape(-1)
        valid = flat_y != ctx.ignore_index
        row_scale = (valid.to(torch.float32) * (grad_out.float() / num_tokens)).unsqueeze(1)
        # the input gradient sums every slice's share: fp32 unless the weights are fp32 already
        acc_dtype = torch.float32 if weight.dtype in (torch.bfloat16, torch.float16) else weight.dtype
        grad_h = torch.zeros(flat_h.shape, dtype=acc_dtype, device=flat_h.device) if need_h else None
        grad_w = torch.empty_like(weight) if need_w else None
        grad_b = torch.empty_like(bias) if (need_b and bias is not None) else None
        for start, end in ctx.slices:
            w = weight[start:end]
            logits = F.linear(flat_h, w, None if bias is None else bias[start:end]).float()
            # d(lse - logit[target]) / d logits = softmax - onehot(target), softmax from the saved lse
            g = torch.exp(logits.sub_(lse.unsqueeze(1)))
            in_slice = valid & (flat_y >= start) & (flat_y < end)
            local = torch.where(in_slice, flat_y - start, torch.zeros_like(flat_y))
            g.scatter_add_(1, local.unsqueeze(1), -in_slice.to(g.dtype).unsqueeze(1))
            g.mul_(row_scale)
            g = g.to(weight.dtype)
            if need_h:
                if acc_dtype == weight.dtype:
                    grad_h.addmm_(g, w)
                else:  # the product in the weights' dtype (tensor cores), the running sum in fp32
                    grad_h.add_(torch.mm(g, w))
            if need_w:
                torch.mm(g.t(), flat_h, out=grad_w[start:end])  # this slice's gradient, written once
            if grad_b is not None:
                torch.sum(g, dim=0, out=grad_b[start:end])
            del g, logits
        if need_h:
            grad_h = grad_h.to(hidden.dtype).view_as(hidden)
        return grad_h, grad_w, grad_b, None, None, None


def vocab_chunked_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: Optional[torch.Tensor],
    labels: torch.Tensor,
    num_chunks: int,
    ignore_index: int,
) -> torch.Tensor:
    """Mean fp32 cross-entropy of ``F.linear(hidden, weight, bias)`` against ``labels`` (those that are
    not ``ignore_index``), computed over ``num_chunks`` slices of the vocabulary in forward and backward."""
    return _VocabChunkedLinearCrossEntropy.apply(hidden, weight, bias, labels, num_chunks, ignore_index)

"""VocabChunkedCrossEntropyLoss gives the plain loss's value and gradients one vocabulary slice at a time."""

import pytest
import torch
from torch import nn

from torchtune._errors import ConfigError
from torchtune.modules import _vocab_chunked_loss
from torchtune.modules.loss import ChunkedCrossEntropyLoss, CrossEntropyLoss, VocabChunkedCrossEntropyLoss


def _example(bias: bool, ignore_all: bool = False, dtype=torch.float32):
    torch.manual_seed(0)
    proj = nn.Linear(16, 40, bias=bias).to(dtype)
    hidden = torch.randn(2, 7, 16, dtype=dtype, requires_grad=True)
    labels = torch.randint(0, 40, (2, 7))
    labels[0, :3] = -100
    labels[1, -1] = -100
    labels[1, 0] = 39  # the last vocabulary row: the last, shorter slice holds a target
    if ignore_all:
        labels[:] = -100
    return proj, hidden, labels


def _loss_and_grads(loss_fn, proj, hidden, labels):
    proj.zero_grad(set_to_none=True)
    hidden.grad = None
    loss = loss_fn(proj, hidden, labels)
    loss.backward()
    grads = [hidden.grad.clone(), proj.weight.grad.clone()]
    if proj.bias is not None:
        grads.append(proj.bias.grad.clone())
    return loss.detach(), grads


@pytest.mark.parametrize("num_chunks", [1, 3, 7, 40, 64])  # 40 slices of one row; 64 > vocab
@pytest.mark.parametrize("bias", [False, True])
def test_matches_plain_and_row_chunked_loss(num_chunks, bias):
    proj, hidden, labels = _example(bias)
    plain, plain_grads = _loss_and_grads(CrossEntropyLoss(), proj, hidden, labels)
    rows, rows_grads = _loss_and_grads(ChunkedCrossEntropyLoss(4, min_chunk_rows=1), proj, hidden, labels)
    vocab, vocab_grads = _loss_and_grads(VocabChunkedCrossEntropyLoss(num_chunks), proj, hidden, labels)
    torch.testing.assert_close(vocab, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vocab, rows, rtol=1e-5, atol=1e-5)
    for got, want, other in zip(vocab_grads, plain_grads, rows_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(got, other, rtol=1e-5, atol=1e-5)


def test_all_ignored_gives_zero_loss_and_zero_grads():
    proj, hidden, labels = _example(bias=True, ignore_all=True)
    loss, grads = _loss_and_grads(VocabChunkedCrossEntropyLoss(3), proj, hidden, labels)
    assert loss.item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads)


def test_bf16_close_to_plain_with_an_fp32_input_gradient_sum():
    proj, hidden, labels = _example(bias=False, dtype=torch.bfloat16)
    plain, plain_grads = _loss_and_grads(CrossEntropyLoss(), proj, hidden, labels)
    vocab, vocab_grads = _loss_and_grads(VocabChunkedCrossEntropyLoss(5), proj, hidden, labels)
    assert vocab.dtype == torch.float32
    assert all(g.dtype == torch.bfloat16 for g in vocab_grads)
    torch.testing.assert_close(vocab, plain, rtol=1e-3, atol=1e-3)
    for got, want in zip(vocab_grads, plain_grads):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-3)


def test_each_weight_gradient_slice_is_written_once(monkeypatch):
    """The weight gradient's slices are written by one mm each (no read-modify-write per chunk), and the
    widest fp32 temporary is one slice of the vocabulary."""
    proj, hidden, labels = _example(bias=False)
    writes, widths = [], []
    real_mm, real_linear = torch.mm, _vocab_chunked_loss.F.linear

    def recording_mm(a, b, *, out=None):
        if out is not None:
            writes.append((out.data_ptr(), out.shape[0]))
        return real_mm(a, b, out=out) if out is not None else real_mm(a, b)

    def recording_linear(x, w, b=None):
        widths.append(w.shape[0])
        return real_linear(x, w, b)

    monkeypatch.setattr(_vocab_chunked_loss.torch, "mm", recording_mm)
    monkeypatch.setattr(_vocab_chunked_loss.F, "linear", recording_linear)
    _loss_and_grads(VocabChunkedCrossEntropyLoss(3), proj, hidden, labels)
    assert [rows for _, rows in writes] == [14, 14, 12]  # 40 rows in slices of ceil(40/3)
    assert len({ptr for ptr, _ in writes}) == 3  # three distinct places, each written once
    assert widths == [14, 14, 12] * 2  # forward, then backward's recomputation


def test_rejects_zero_chunks():
    with pytest.raises(ConfigError, match="loss.num_output_chunks"):
        VocabChunkedCrossEntropyLoss(0)

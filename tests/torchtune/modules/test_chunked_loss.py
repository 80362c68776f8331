"""ChunkedCrossEntropyLoss gives the plain loss's value and gradients without the full logits."""

import pytest
import torch
from torch import nn

from torchtune._errors import ConfigError
from torchtune.modules import _chunked_loss
from torchtune.modules._chunked_loss import chunk_count
from torchtune.modules.loss import ChunkedCrossEntropyLoss, CrossEntropyLoss

EXPECTED = {False: 3.8436, True: 4.1269}


def _example(bias: bool, ignore_all: bool = False):
    torch.manual_seed(0)
    proj = nn.Linear(16, 40, bias=bias)
    hidden = torch.randn(2, 7, 16, requires_grad=True)
    labels = torch.randint(0, 40, (2, 7))
    labels[0, :3] = -100
    labels[1, -1] = -100
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


@pytest.mark.parametrize("num_chunks", [1, 3, 8, 20])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_plain_loss(num_chunks, bias):
    proj, hidden, labels = _example(bias)
    plain, plain_grads = _loss_and_grads(CrossEntropyLoss(), proj, hidden, labels)
    chunked_loss = ChunkedCrossEntropyLoss(num_chunks, min_chunk_rows=1)
    chunked, chunked_grads = _loss_and_grads(chunked_loss, proj, hidden, labels)
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
    assert plain.item() == pytest.approx(EXPECTED[bias], abs=1e-4)  # fixed seed: a known value
    for got, want in zip(chunked_grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_all_ignored_gives_zero_loss_and_zero_grads():
    proj, hidden, labels = _example(bias=False, ignore_all=True)
    loss, grads = _loss_and_grads(ChunkedCrossEntropyLoss(4, min_chunk_rows=1), proj, hidden, labels)
    assert loss.item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads)


def test_bf16_close_to_plain():
    proj, hidden, labels = _example(bias=False)
    proj = proj.to(torch.bfloat16)
    hidden = hidden.detach().to(torch.bfloat16).requires_grad_()
    plain, plain_grads = _loss_and_grads(CrossEntropyLoss(), proj, hidden, labels)
    chunked, chunked_grads = _loss_and_grads(ChunkedCrossEntropyLoss(4, min_chunk_rows=1), proj, hidden, labels)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=1e-3, atol=1e-3)
    for got, want in zip(chunked_grads, plain_grads):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-3)


def test_rejects_zero_chunks():
    with pytest.raises(ConfigError, match="loss.num_output_chunks"):
        ChunkedCrossEntropyLoss(0)
    with pytest.raises(ConfigError, match="loss.min_chunk_rows"):
        ChunkedCrossEntropyLoss(8, min_chunk_rows=0)


@pytest.mark.parametrize(
    "rows, chunks, min_rows, expected",
    [
        (1024, 8, 128, 8),  # llama2/7B_full_low_memory: batch 2 x 512 in chunks of 128 rows, as before
        (4096, 8, 128, 8),  # longer batches keep the configured count: bigger chunks
        (213, 8, 128, 2),  # a packed 512-token row with 213 labelled positions: two chunks of <= 107 rows
        (128, 8, 128, 1),
        (129, 8, 128, 2),
        (0, 8, 128, 1),
        (14, 8, 1, 8),  # min_chunk_rows=1: always the configured count (up to one row each)
    ],
)
def test_chunk_count_keeps_chunks_at_least_min_rows(rows, chunks, min_rows, expected):
    count = chunk_count(rows, chunks, min_rows)
    assert count == expected
    if rows:  # what torch.chunk then makes: no chunk exceeds the documented bound
        largest = max(c.numel() for c in torch.arange(rows).chunk(count))
        assert largest <= max(-(-rows // chunks), min_rows)


def test_few_rows_take_fewer_chunks_with_the_same_loss_and_gradients(monkeypatch):
    """14 rows with the default min_chunk_rows run as one chunk: every fp32 softmax the loss makes
    covers all 14 rows, and the result equals eight one-or-two-row chunks."""
    proj, hidden, labels = _example(bias=False)
    widths = []
    real_softmax = torch.softmax

    def counting_softmax(x, *args, **kwargs):
        widths.append(x.shape[0])
        return real_softmax(x, *args, **kwargs)

    monkeypatch.setattr(_chunked_loss.torch, "softmax", counting_softmax)
    full, full_grads = _loss_and_grads(ChunkedCrossEntropyLoss(8), proj, hidden, labels)
    assert widths == [14]  # backward's one recomputed chunk
    widths.clear()
    split, split_grads = _loss_and_grads(ChunkedCrossEntropyLoss(8, min_chunk_rows=1), proj, hidden, labels)
    assert widths == [2] * 7
    torch.testing.assert_close(full, split, rtol=1e-6, atol=1e-6)
    for got, want in zip(full_grads, split_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)

"""ChunkedCrossEntropyLoss gives the plain loss's value and gradients without the full logits."""

import pytest
import torch
from torch import nn

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
    chunked, chunked_grads = _loss_and_grads(ChunkedCrossEntropyLoss(num_chunks), proj, hidden, labels)
    torch.testing.assert_close(chunked, plain, rtol=1e-6, atol=1e-6)
    assert plain.item() == pytest.approx(EXPECTED[bias], abs=1e-4)  # fixed seed: a known value
    for got, want in zip(chunked_grads, plain_grads):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_all_ignored_gives_zero_loss_and_zero_grads():
    proj, hidden, labels = _example(bias=False, ignore_all=True)
    loss, grads = _loss_and_grads(ChunkedCrossEntropyLoss(4), proj, hidden, labels)
    assert loss.item() == 0.0
    assert all(torch.count_nonzero(g) == 0 for g in grads)


def test_bf16_close_to_plain():
    proj, hidden, labels = _example(bias=False)
    proj = proj.to(torch.bfloat16)
    hidden = hidden.detach().to(torch.bfloat16).requires_grad_()
    plain, plain_grads = _loss_and_grads(CrossEntropyLoss(), proj, hidden, labels)
    chunked, chunked_grads = _loss_and_grads(ChunkedCrossEntropyLoss(4), proj, hidden, labels)
    assert chunked.dtype == torch.float32
    torch.testing.assert_close(chunked, plain, rtol=1e-3, atol=1e-3)
    for got, want in zip(chunked_grads, plain_grads):
        torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-3)


def test_rejects_zero_chunks():
    with pytest.raises(ValueError, match="num_output_chunks"):
        ChunkedCrossEntropyLoss(0)

"""Activation checkpointing keeps names and gradients; offloading moves saved tensors (or counts them on CPU)."""

import torch
from torch import nn

from torchtune.models.llama2 import llama2
from torchtune.modules import TransformerDecoderLayer
from torchtune.training._activations import (
    NoOpManager,
    OffloadActivations,
    get_act_offloading_ctx_manager,
    is_activation_checkpointed,
    set_activation_checkpointing,
    simulate_offloading,
)


def _model():
    torch.manual_seed(0)
    return llama2(vocab_size=64, num_layers=2, num_heads=2, num_kv_heads=2, embed_dim=16, max_seq_len=32)


def _grads(model, ctx=None):
    torch.manual_seed(1)
    tokens = torch.randint(0, 64, (2, 12))
    with ctx if ctx is not None else NoOpManager():
        loss = model(tokens).logsumexp(-1).mean()
        loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_checkpointing_keeps_names_and_gradients():
    plain, ckpt = _model(), _model()
    keys = list(plain.state_dict())
    assert set_activation_checkpointing(ckpt, TransformerDecoderLayer) == 2
    assert set_activation_checkpointing(ckpt, {TransformerDecoderLayer}) == 0  # not twice
    assert list(ckpt.state_dict()) == keys
    assert all(is_activation_checkpointed(layer) for layer in ckpt.layers)
    loss_a, grads_a = _grads(plain)
    loss_b, grads_b = _grads(ckpt)
    torch.testing.assert_close(loss_a, loss_b)
    for name in grads_a:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-6)


def test_checkpointing_is_skipped_without_grad():
    model = _model()
    set_activation_checkpointing(model, TransformerDecoderLayer)
    with torch.no_grad():
        out = model(torch.zeros(1, 4, dtype=torch.long))
    assert out.shape == (1, 4, 64)


def test_offloading_on_cpu_counts_and_keeps_gradients():
    model = _model()
    set_activation_checkpointing(model, TransformerDecoderLayer)
    _, want = _grads(model)
    model.zero_grad(set_to_none=True)
    ctx = OffloadActivations(min_offload_bytes=1024, model=model)
    _, got = _grads(model, ctx)
    for name in want:
        torch.testing.assert_close(got[name], want[name])
    # with checkpointing, the saved tensors are the layer inputs (2 x 12 x 16 fp32 = 1536 bytes each)
    # and the final hidden states; parameters and small tensors are not counted
    assert ctx.offloaded_tensors >= 2
    assert ctx.offloaded_bytes % 1536 == 0 and ctx.offloaded_bytes >= 2 * 1536


def test_parameters_are_never_offloaded():
    weight = nn.Parameter(torch.randn(64, 64))
    x = torch.randn(8, 64, requires_grad=True) * 2  # an activation (not a trainable leaf)
    ctx = OffloadActivations(min_offload_bytes=1)
    with ctx:
        (x @ weight.t()).sum().backward()  # saves x and a view of the weight
    assert ctx.offloaded_tensors == 1 and ctx.offloaded_bytes == 8 * 64 * 4


def test_simulated_offloading_copies_to_host_and_back():
    made_on_host, seen = [], []

    class HostCtx:
        def __enter__(self):
            made_on_host.append(True)

        def __exit__(self, *exc):
            return False

    x = torch.randn(32, 32, requires_grad=True)
    with simulate_offloading(HostCtx, on_saved=seen.append):
        with OffloadActivations(min_offload_bytes=1024) as ctx:
            y = (x.exp() * 2).sum()
        y.backward()
    torch.testing.assert_close(x.grad, 2 * x.detach().exp())
    assert ctx.offloaded_tensors == 1 and len(made_on_host) == 1  # exp's output, copied once
    assert len(seen) == 1 and seen[0].shape == (32, 32)  # the copy brought back for backward


def test_ctx_manager_factory():
    model = _model()
    assert isinstance(get_act_offloading_ctx_manager(model, True), OffloadActivations)
    assert isinstance(get_act_offloading_ctx_manager(model, False), NoOpManager)

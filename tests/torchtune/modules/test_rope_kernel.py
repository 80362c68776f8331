"""RoPE's C kernel on a CPU (``_RotateOnCPU``) gives the PyTorch ops' bits, forward and backward."""

import pytest
import torch

from torchtune.modules import _native_kernels
from torchtune.modules.position_embeddings import (
    LongRoPE,
    PartialRotaryEmbeddings,
    RotaryPositionalEmbeddings,
    _RotateOnCPU,
)

pytestmark = pytest.mark.skipif(_native_kernels.library() is None, reason="no C compiler: the PyTorch ops run")


def _rope_and_grad(rope, x, input_pos, grad, native):
    x = x.clone().requires_grad_()
    calls = []
    real = _RotateOnCPU.apply

    def counting(*args):
        calls.append(1)
        return real(*args)

    _RotateOnCPU.apply = counting
    try:
        if native:
            out = rope(x, input_pos=input_pos)
        else:
            with _native_kernels.disabled():
                out = rope(x, input_pos=input_pos)
        out.backward(grad)
    finally:
        _RotateOnCPU.apply = real
    return out.detach(), x.grad, bool(calls)


def _long_rope(dim, max_seq_len):
    factors = [1.0 + i / dim for i in range(dim // 2)]
    return LongRoPE(dim, max_seq_len, 10_000.0, factors, [2 * f for f in factors], 16, 4.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("positions", ["none", "packed", "shared"])
@pytest.mark.parametrize("make", [lambda d: RotaryPositionalEmbeddings(d, 64), lambda d: _long_rope(d, 64)])
@pytest.mark.parametrize("threads", [1, 2])
def test_the_c_rotation_has_the_pytorch_ops_bits(dtype, positions, make, threads):
    gen = torch.Generator().manual_seed(0)
    b, s, h, d = 3, 40, 4, 16
    x = (torch.randn(b, s, h, d, generator=gen) * 3).to(dtype)
    grad = torch.randn(b, s, h, d, generator=gen).to(dtype)
    x[0, 0, 0, :4] = torch.tensor([0.0, -0.0, float("inf"), 1e-40])  # zeros, an infinity, a subnormal
    input_pos = {
        "none": None,
        "packed": torch.cat([torch.arange(25), torch.arange(15)]).repeat(b, 1),  # positions restart per example
        "shared": torch.arange(5, 5 + s),
    }[positions]
    rope = make(d)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out, dx, native = _rope_and_grad(rope, x, input_pos, grad, native=True)
        ref_out, ref_dx, _ = _rope_and_grad(rope, x, input_pos, grad, native=False)
    finally:
        torch.set_num_threads(before)
    assert native and out.dtype == dtype
    _assert_same_bits(out, ref_out)
    _assert_same_bits(dx, ref_dx)


def _assert_same_bits(a, b):
    """Bit for bit, NaN for NaN (the infinity makes one: inf * sin(0))."""
    assert torch.equal(a.isnan(), b.isnan())
    bits = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    assert torch.equal(a.nan_to_num(0.0).view(bits), b.nan_to_num(0.0).view(bits))


def test_views_the_kernel_cannot_take_run_the_pytorch_ops():
    """A partial rotation passes a strided view (the first channels of each head): the PyTorch ops rotate
    it; the result is the same as a contiguous copy rotated by the kernel."""
    x = torch.randn(2, 8, 2, 24).to(torch.bfloat16)
    partial = PartialRotaryEmbeddings(RotaryPositionalEmbeddings(16, 32), head_dim=24)
    out, _, native = _rope_and_grad(partial, x, None, torch.ones_like(x), native=True)
    assert not native
    assert torch.equal(out[..., :16], partial.rope(x[..., :16].contiguous()))


def test_fake_tensors_take_the_pytorch_ops():
    """The memory estimator runs the model on fake tensors: they take the PyTorch ops (which it counts)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rope = RotaryPositionalEmbeddings(16, 32)
    with FakeTensorMode(allow_non_fake_inputs=True):
        x = torch.empty(2, 8, 2, 16, dtype=torch.bfloat16)
        out, grad, native = _rope_and_grad(rope, x, None, torch.ones_like(x), native=True)
    assert not native and out.shape == grad.shape == x.shape

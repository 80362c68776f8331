"""RoPE's hand-written backward (``_Rotate``) against autograd through the plain composite formula."""

import pytest
import torch

from torchtune.modules import Llama3ScaledRoPE, RotaryPositionalEmbeddings
from torchtune.modules.position_embeddings import LongRoPE, PartialRotaryEmbeddings


def _composite(rope, x, input_pos=None):
    """The formula as autograd would see it: fp32 pairs, four products, a stack, cast back."""
    seq_len = x.size(1)
    table = rope._table(seq_len, input_pos).view(-1, seq_len, 1, rope.dim // 2, 2)
    pairs = x.float().reshape(*x.shape[:-1], rope.dim // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    cos, sin = table[..., 0], table[..., 1]
    return torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1).flatten(-2).to(x.dtype)


def _value_and_grad(fn, x, grad_out):
    x = x.detach().requires_grad_(True)
    out = fn(x)
    out.backward(grad_out)
    return out.detach(), x.grad


ROPES = {
    "llama2": lambda: RotaryPositionalEmbeddings(dim=16, max_seq_len=24),
    "llama3_scaled": lambda: Llama3ScaledRoPE(dim=16, max_seq_len=24, scale_factor=8.0, old_context_len=16),
    "longrope": lambda: LongRoPE(
        dim=16,
        max_seq_len=24,
        base=10000.0,
        short_factor=[1.0 + 0.1 * i for i in range(8)],
        long_factor=[2.0 + 0.3 * i for i in range(8)],
        original_max_seq_len=12,
        scale_factor=2.0,
    ),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", sorted(ROPES))
@pytest.mark.parametrize("positions", [False, True])
def test_values_and_gradients_are_the_composites_bit_for_bit(kind, dtype, positions):
    torch.manual_seed(0)
    rope = ROPES[kind]()
    seq_len = 20 if kind == "longrope" else 10  # past LongRoPE's original length: its long table
    x = torch.randn(2, seq_len, 3, 16).to(dtype)
    grad_out = torch.randn(2, seq_len, 3, 16).to(dtype)
    pos = torch.stack([torch.randperm(seq_len), torch.arange(seq_len)]) if positions else None
    out, grad = _value_and_grad(lambda t: rope(t, input_pos=pos), x, grad_out)
    ref_out, ref_grad = _value_and_grad(lambda t: _composite(rope, t, pos), x, grad_out)
    assert out.dtype == dtype and grad.dtype == dtype
    assert torch.equal(out, ref_out)
    assert torch.equal(grad, ref_grad)


def test_gradient_is_the_inverse_rotation_and_passes_gradcheck():
    from torchtune.modules.position_embeddings import _Rotate

    rope = RotaryPositionalEmbeddings(dim=8, max_seq_len=8)
    table = rope._table(5, None).view(1, 5, 1, 4, 2).double()  # float64 throughout: the exact Jacobian
    x = torch.randn(1, 5, 2, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: _Rotate.apply(t, table), (x,))
    ctx = type("Ctx", (), {"saved_tensors": (table,)})()
    with torch.no_grad():
        undone = _Rotate.backward(ctx, _Rotate.apply(x, table))[0]  # a rotation's transpose is its inverse
    torch.testing.assert_close(undone, x, atol=1e-6, rtol=0)  # the fp32 table: cos^2 + sin^2 = 1 to ~1e-7


def test_partial_rotation_of_a_strided_slice():
    torch.manual_seed(0)
    partial = PartialRotaryEmbeddings(RotaryPositionalEmbeddings(dim=8, max_seq_len=16), head_dim=12)
    x = torch.randn(2, 6, 3, 12).bfloat16()
    grad_out = torch.randn(2, 6, 3, 12).bfloat16()
    out, grad = _value_and_grad(partial, x, grad_out)
    ref_out, ref_grad = _value_and_grad(
        lambda t: torch.cat([_composite(partial.rope, t[..., :8]), t[..., 8:]], dim=-1), x, grad_out
    )
    assert torch.equal(out, ref_out) and torch.equal(grad, ref_grad)

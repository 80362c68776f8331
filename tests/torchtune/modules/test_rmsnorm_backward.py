"""RMSNorm's hand-written backward against autograd through the composite formula it replaces."""

import pytest
import torch

from torchtune.modules import RMSNorm
from torchtune.modules.rms_norm import GemmaRMSNorm, _RMSNormFn


def _composite(norm, x):
    x32 = x.float()
    normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + norm.eps)
    if isinstance(norm, GemmaRMSNorm):
        return (normed * (1.0 + norm.scale.float())).type_as(x)
    return norm.scale * normed.type_as(x)


def _run(fn, norm, x, grad_out):
    x = x.detach().requires_grad_(True)
    norm.scale.grad = None
    out = fn(x)
    out.backward(grad_out)
    return out.detach(), x.grad, norm.scale.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", [RMSNorm, GemmaRMSNorm])
def test_same_output_and_gradients_as_autograd_through_the_composite(kind, dtype):
    torch.manual_seed(0)
    norm = kind(64).to(dtype)
    with torch.no_grad():
        norm.scale.copy_(torch.randn(64))
    x = (torch.randn(3, 7, 64) * 5).to(dtype)
    grad_out = torch.randn(3, 7, 64).to(dtype)
    out, dx, dscale = _run(norm, norm, x, grad_out)
    ref_out, ref_dx, ref_dscale = _run(lambda t: _composite(norm, t), norm, x, grad_out)
    assert out.dtype == dtype and dx.dtype == dtype and dscale.dtype == dtype
    assert torch.equal(out, ref_out)  # the forward is the composite op for op
    if dtype == torch.float32:
        torch.testing.assert_close(dx, ref_dx, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(dscale, ref_dscale, atol=1e-5, rtol=1e-5)
    else:  # the same fp32 derivative, rounded once to bf16: within one bf16 step of autograd's
        step = ref_dx.float().abs().clamp(min=1e-30) * 2.0**-7
        assert ((dx.float() - ref_dx.float()).abs() <= step).all()
        torch.testing.assert_close(dscale.float(), ref_dscale.float(), atol=0, rtol=2.0**-7)


@pytest.mark.parametrize("kind", [RMSNorm, GemmaRMSNorm])
def test_gradcheck_in_float64(kind):
    torch.manual_seed(0)
    norm = kind(8, eps=1e-3).double()
    with torch.no_grad():
        norm.scale.copy_(torch.randn(8))
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    scale = norm.scale.detach().clone().requires_grad_(True)
    gemma = kind is GemmaRMSNorm
    assert torch.autograd.gradcheck(lambda t, s: _RMSNormFn.apply(t, s, norm.eps, gemma), (x, scale))


def test_frozen_scale_and_frozen_input():
    norm = RMSNorm(16)
    norm.scale.requires_grad_(False)
    x = torch.randn(4, 16, requires_grad=True)
    norm(x).sum().backward()
    assert x.grad is not None and norm.scale.grad is None
    norm.scale.requires_grad_(True)
    norm(torch.randn(4, 16)).sum().backward()
    assert norm.scale.grad is not None


def test_saves_the_input_and_one_number_per_row():
    norm = RMSNorm(256).bfloat16()
    x = torch.randn(8, 32, 256, dtype=torch.bfloat16, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(
        lambda t: saved.append(t.numel() * t.element_size()) or t, lambda t: t
    ):
        norm(x)
    assert sum(saved) == x.numel() * 2 + 8 * 32 * 4 + 256 * 2  # x (bf16), rstd (fp32 per row), scale

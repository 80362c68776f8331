"""liger-kernel's compiled Triton kernels on a CUDA device against our plain PyTorch path: every family's model
in fp32 (values and gradients) and in bf16 (no less accurate than the plain bf16 model against fp32), the
fused linear cross-entropy in bf16 with fp32 accumulation, and the recipe through the real `tune` command
with every liger option on. The same checks run on the CPU under Triton's interpreter
(tests/torchtune/modules/test_liger.py). Skipped where PyTorch sees no GPU or liger-kernel is missing."""

from __future__ import annotations

import copy
import importlib.util
import math

import pytest
import torch

from tests._helpers.tiny_run import make_tiny_run, read_losses, run_tune
from tests.torchtune.modules.test_liger import EXPECTED, FAMILIES, VOCAB, _logits_and_grads, _model, _packed_batch
from torchtune.modules import _liger
from torchtune.modules.loss import ChunkedCrossEntropyLoss, LigerLinearCrossEntropyLoss

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None, reason="pip install 'plaintune[liger]'"),
]


def _on_cuda(model, dtype):
    return model.to(device="cuda", dtype=dtype)


def _batch():
    tokens, mask, input_pos = _packed_batch()
    weights = torch.randn(2, 11, VOCAB, generator=torch.Generator().manual_seed(2))
    return tokens.cuda(), mask.cuda(), input_pos.cuda(), weights.cuda()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_model_with_liger_kernels_matches_the_plain_model_in_fp32(family):
    plain = _on_cuda(_model(family), torch.float32)
    liger = copy.deepcopy(plain)
    assert _liger.apply_liger_kernels(liger) == EXPECTED[family]
    tokens, mask, input_pos, weights = _batch()
    logits, grads = _logits_and_grads(plain, tokens, mask, input_pos, weights)
    liger_logits, liger_grads = _logits_and_grads(liger, tokens, mask, input_pos, weights)
    torch.testing.assert_close(liger_logits, logits, rtol=1e-4, atol=1e-4)
    for name, grad in grads.items():
        torch.testing.assert_close(liger_grads[name], grad, rtol=1e-3, atol=1e-4, msg=name)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_liger_in_bf16_is_as_close_to_fp32_as_the_plain_bf16_model(family):
    reference = _on_cuda(_model(family), torch.float32)
    plain = _on_cuda(copy.deepcopy(reference), torch.bfloat16)
    liger = copy.deepcopy(plain)
    _liger.apply_liger_kernels(liger)
    tokens, mask, input_pos, weights = _batch()
    exact, _ = _logits_and_grads(reference, tokens, mask, input_pos, weights)
    plain_error = (_logits_and_grads(plain, tokens, mask, input_pos, weights)[0].float() - exact).abs().mean()
    liger_error = (_logits_and_grads(liger, tokens, mask, input_pos, weights)[0].float() - exact).abs().mean()
    assert liger_error <= 1.5 * plain_error + 1e-3, (liger_error, plain_error)


def test_compiled_layers_with_liger_kernels_match_the_eager_plain_model():
    """compile=True and liger_kernels=True together, as build_model sets them up (liger first, then each
    layer compiled in place): the kernels run inside the compiled layers."""
    plain = _on_cuda(_model("llama2"), torch.float32)
    liger = copy.deepcopy(plain)
    _liger.apply_liger_kernels(liger)
    for layer in liger.layers:
        layer.compile()
    tokens, mask, input_pos, weights = _batch()
    logits, grads = _logits_and_grads(plain, tokens, mask, input_pos, weights)
    liger_logits, liger_grads = _logits_and_grads(liger, tokens, mask, input_pos, weights)
    torch.testing.assert_close(liger_logits, logits, rtol=1e-4, atol=1e-4)
    for name, grad in grads.items():
        torch.testing.assert_close(liger_grads[name], grad, rtol=1e-3, atol=1e-4, msg=name)


def test_rms_norm_of_many_short_rows_matches_the_plain_one():
    """32,768 rows or more of at most 256 channels take liger-kernel's other RMSNorm kernels (blocks of rows):
    the q/k norms of a real batch (2 x 2048 tokens x 32 heads of 128 channels). Too slow for the interpreter."""
    from torchtune.modules import RMSNorm

    x = torch.randn(2 * 2048 * 32, 128, device="cuda", requires_grad=True)
    plain = RMSNorm(128).cuda()
    with torch.no_grad():
        plain.scale.copy_(torch.randn(128))
    liger = _liger.LigerRMSNorm(plain)
    grad = torch.randn_like(x)
    expected = torch.autograd.grad(plain(x), (x, plain.scale), grad)
    got = torch.autograd.grad(liger(x), (x, plain.scale), grad.clone())
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-3)


def _loss_and_grads(loss_fn, hidden, weight, labels):
    hidden = hidden.clone().requires_grad_()
    output = torch.nn.Linear(hidden.size(-1), weight.size(0), bias=False, device="cuda", dtype=weight.dtype)
    output.weight = torch.nn.Parameter(weight.clone())
    loss = loss_fn(output, hidden, labels)
    (loss * 0.5).backward()  # a micro-batch's share scales the gradients
    return loss.detach(), hidden.grad.float(), output.weight.grad.float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_fused_linear_cross_entropy_matches_the_chunked_loss(dtype):
    g = torch.Generator(device="cuda").manual_seed(3)
    hidden = torch.randn(1000, 256, generator=g, device="cuda").to(dtype)
    weight = (torch.randn(32000, 256, generator=g, device="cuda") * 0.05).to(dtype)
    labels = torch.randint(0, 32000, (1000,), generator=g, device="cuda")
    labels[::7] = -100
    expected = _loss_and_grads(ChunkedCrossEntropyLoss(num_output_chunks=4), hidden, weight, labels)
    got = _loss_and_grads(LigerLinearCrossEntropyLoss(), hidden, weight, labels)
    tol = dict(rtol=1e-4, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-4)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **tol)


def test_tune_run_with_every_liger_option_matches_the_plain_run(tmp_path):
    config = make_tiny_run(tmp_path, model_dims=dict(embed_dim=256, num_heads=8, num_kv_heads=4))
    common = ["device=cuda", "dtype=fp32", "optimizer._component_=torch.optim.AdamW", "max_steps_per_epoch=4"]
    liger = ["liger_kernels=True", "loss._component_=torchtune.modules.loss.LigerLinearCrossEntropyLoss"]
    losses = {}
    for name, overrides in {"plain": [], "liger": liger}.items():
        out = tmp_path / name
        result = run_tune(
            ["run", "full_finetune_single_device", "--config", str(config), f"output_dir={out}", *common, *overrides],
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        losses[name] = read_losses(out)
    assert len(losses["liger"]) == 4 and all(math.isfinite(x) for x in losses["liger"])
    assert losses["liger"] == pytest.approx(losses["plain"], rel=1e-3)

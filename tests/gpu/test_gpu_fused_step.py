"""On a real GPU: a packed batch's FlexAttention path gives the dense-mask path's gradients (a CPU runs its
forward only), the fused bitsandbytes kernels compile to what the eager arithmetic writes, and a logged step
of the recipe's step syncs the host once.

Run with ``make test-gpu``; skipped with the reason where PyTorch sees no CUDA GPU.
"""

import pytest
import torch

from torchtune.datasets import packed_collate
from torchtune.models.llama2 import llama2
from torchtune.modules.loss import CrossEntropyLoss
from torchtune.training import StochasticRounding, forward_loss

pytestmark = pytest.mark.gpu


def _packs(segments, vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    packs = []
    for lengths in segments:
        tokens = torch.randint(1, vocab, (sum(lengths),), generator=g)
        packs.append(
            {
                "tokens": tokens,
                "labels": tokens.clone(),
                "input_pos": torch.cat([torch.arange(k) for k in lengths]),
                "seq_lens": torch.tensor(lengths),
            }
        )
    return packs


def test_flex_attention_gives_the_dense_paths_gradients():
    from torchtune.modules.sliding_window import window_kernel_device

    torch.manual_seed(0)
    with torch.device("cuda"):
        model = llama2(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, max_seq_len=512)
    batch = packed_collate(_packs([[100, 150, 50], [1, 299]]))
    grads = {}
    for path in ("flex", "dense"):
        model.zero_grad(set_to_none=True)
        # on CUDA a packed batch takes FlexAttention; "dense": as a CPU would, the dense mask through SDPA
        with window_kernel_device("cuda" if path == "flex" else "cpu"):
            loss = forward_loss(model, CrossEntropyLoss(), batch, device=torch.device("cuda"))
        loss.backward()
        grads[path] = (loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()})
    torch.testing.assert_close(grads["flex"][0], grads["dense"][0], rtol=0, atol=1e-5)
    for name, grad in grads["dense"][1].items():
        torch.testing.assert_close(grads["flex"][1][name], grad, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize("component", ["PagedAdamW", "PagedAdamW8bit"])
def test_fused_bitsandbytes_kernel_writes_the_eager_arithmetic(component):
    """The compiled kernel (Triton) against the same arithmetic run op by op on the GPU (``fused=False``)."""
    bnb = pytest.importorskip("bitsandbytes")
    from torchtune.training.optim import _fused_step as fs

    out = {}
    for fused in (True, False):
        torch.manual_seed(0)
        param = torch.nn.Parameter((torch.rand(512, 1024, device="cuda") + 0.5).bfloat16())
        opt = getattr(bnb.optim, component)([param], lr=1e-3)
        rounding = StochasticRounding(seed=0, device=torch.device("cuda"), fused=fused)
        for _ in range(3):
            param.grad = torch.randn(512, 1024, device="cuda").bfloat16()
            assert fs.bnb_adam_step(opt, param, rounding, None)
        out[fused] = (param.detach().clone(), opt.state[param]["state1"].clone())
    assert (out[True][0] == out[False][0]).float().mean() > 0.999  # FMA contraction aside, the same bits
    if out[True][1].dtype == torch.uint8:
        assert (out[True][1] == out[False][1]).float().mean() > 0.999
    else:
        torch.testing.assert_close(out[True][1], out[False][1], rtol=2e-6, atol=1e-12)

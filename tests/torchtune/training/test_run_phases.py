"""The whole run in `tune estimate-memory`: set-up, steps, step checkpoint save and resume load, and
attention counted as the kernel CUDA runs."""

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from torchtune.config import load_config
from torchtune.training.estimate._attention_kernels import target_attention
from torchtune.training.estimate._checkpoint_memory import estimate_run_memory
from torchtune.training.estimate._memory_estimator import StorageCounter

# big enough that bitsandbytes pages the state of most weights (>= 1e5 elements), small enough for seconds
DIMS = ["+model.vocab_size=2048", "+model.num_layers=2", "+model.embed_dim=256", "+model.num_heads=4"]
DIMS += ["+model.num_kv_heads=4"]


def _cfg(optimizer, *extra):
    return load_config(
        "llama2/7B_full_low_memory",
        ["model._component_=torchtune.models.llama2.llama2_tiny", *DIMS, f"optimizer._component_={optimizer}", *extra],
    )


def _weights_and_largest(cfg):
    """(bf16 bytes of all weights, of the largest weight, fp32 moments of the weights bitsandbytes pages)"""
    from torchtune import config
    from torchtune.utils import set_default_dtype

    with torch.device("meta"), set_default_dtype(torch.bfloat16):
        model = config.instantiate(cfg.model)
    sizes = [p.numel() * 2 for p in model.parameters()]
    paged = sum(2 * 4 * p.numel() for p in model.parameters() if p.numel() >= 1e5)
    return sum(sizes), max(sizes), paged


@pytest.fixture(scope="module")
def paged_run():
    pytest.importorskip("bitsandbytes")
    cfg = _cfg("bitsandbytes.optim.PagedAdamW")
    return cfg, estimate_run_memory(cfg, seq_len=64, batch_size=2)


def test_phases_are_reported_in_run_order(paged_run):
    _, est = paged_run
    assert [p.name for p in est.phases] == [
        "set-up (load weights)",
        "training steps",
        "step checkpoint save",
        "resume load",
    ]
    out = est.format()
    for p in est.phases:
        assert p.name in out
    assert "whole run (device peak)" in out and "host RAM" in out


def test_save_and_resume_need_no_device_memory_beyond_the_weights(paged_run):
    """Issue 17's bound on the code path of the 7B config (PagedAdamW in backward): save and resume each
    peak at most one tensor above what the device holds anyway (weights + the state of the parameters
    below bitsandbytes' paging threshold of 1e5 elements)."""
    cfg, est = paged_run
    weights, largest, paged = _weights_and_largest(cfg)
    setup, save, resume = est.phase("set-up"), est.phase("step checkpoint save"), est.phase("resume load")
    assert setup.weights == resume.weights >= weights
    assert setup.device_peak == setup.weights == setup.device_end  # loading copies into the weights in place
    assert save.device_start == save.device_end == resume.device_end  # the run's resident device memory
    assert 0 <= save.transient <= largest
    assert 0 <= resume.transient <= largest
    assert resume.device_start == 0  # a new process
    # the paged state is in managed memory in both, never on the device
    assert save.managed_peak == resume.managed_peak == paged  # two fp32 moments of the large weights


def test_resume_host_ram_holds_the_state_once_plus_one_parameter(paged_run):
    cfg, est = paged_run
    weights, largest, paged = _weights_and_largest(cfg)
    resume = est.phase("resume load")
    # mapped pages are given back parameter by parameter: the host holds the paged state (managed) and
    # at most one parameter's fp32 moments more
    assert resume.host_ram_peak <= resume.managed_peak + 2 * 4 * largest // 2 + 1_000_000
    save = est.phase("step checkpoint save")
    # streaming save: one converted tensor on the host at a time (two for a permuted q/k weight)
    assert save.host_peak <= 2 * largest + 1_000_000


def test_flash_attention_saves_output_and_logsumexp_only():
    """On CUDA, bf16 attention without a mask is the flash kernel: for backward it keeps the output and an
    fp32 log-sum-exp (b x h x s), never the s x s weights; its backward adds FA2's fp32 workspaces."""
    b, h, s, d = 2, 4, 256, 64
    saved = []
    with FakeTensorMode(), StorageCounter() as counter:
        q = torch.empty(b, h, s, d, dtype=torch.bfloat16, requires_grad=True)
        with (
            target_attention("cuda") as kernels,
            torch.autograd.graph.saved_tensors_hooks(
                lambda t: saved.append((t.dtype, tuple(t.shape))) or t, lambda t: t
            ),
        ):
            out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
            before = counter.current
            counter.reset_window()
            out.backward(torch.ones_like(out))
    assert kernels == {"flash": 1}
    assert (torch.float32, (b, h, s)) in saved  # the log-sum-exp
    assert all(shape[-2:] != (s, s) for _, shape in saved)
    bhsd = b * h * s * d
    # backward: dq, dk, dv (bf16) + dq_accum (fp32, s rounded to 128) + softmax_d, on top of what was live
    workspace = b * s * h * d * 4 + b * h * s * 4
    assert counter.window_peak - before >= 3 * bhsd * 2 + workspace


def test_memory_efficient_kernel_for_fp32_and_masks():
    with FakeTensorMode():
        q = torch.empty(1, 2, 64, 32, requires_grad=True)
        mask = torch.ones(1, 1, 64, 64, dtype=torch.bool)
        with target_attention("cuda") as kernels:
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
            F.scaled_dot_product_attention(q.bfloat16(), q.bfloat16(), q.bfloat16(), attn_mask=mask)
    assert kernels == {"memory-efficient": 2}

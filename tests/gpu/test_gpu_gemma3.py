"""Gemma 3 on a CUDA device: the chunked sliding-window kernel (the CUDA path) equals the plain mask
and needs no s x s memory, and a tiny Gemma 3 gives transformers' logits on the GPU. Skipped where
PyTorch sees no GPU (`make test-gpu` runs it)."""

from __future__ import annotations

import pytest
import torch

from torchtune.modules.sliding_window import sliding_window_attention

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _run(q, k, v, chunked):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = sliding_window_attention(q, k, v, window=1024, scale=256**-0.5, chunked=chunked)
    out.float().square().sum().backward()
    torch.cuda.synchronize()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    return out.detach(), grads, torch.cuda.max_memory_allocated() - base


def test_chunked_window_equals_plain_and_has_no_s_by_s_memory():
    torch.manual_seed(0)
    b, h, s, d = 1, 8, 8192, 256  # Gemma 3 4B's heads at 8192 tokens, window 1024
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    assert sliding_window_attention(q[..., :16, :], k[..., :16, :], v[..., :16, :], window=4).is_cuda
    plain_out, plain_grads, plain_peak = _run(q, k, v, chunked=False)
    out, grads, peak = _run(q, k, v, chunked=None)  # CUDA picks the chunked path itself
    torch.testing.assert_close(out, plain_out, atol=2e-2, rtol=2e-2)
    for g, pg in zip(grads, plain_grads):
        torch.testing.assert_close(g, pg, atol=5e-2, rtol=5e-2)
    # the plain path's boolean mask alone is s*s bytes (64 MiB) and its bias s*s*2 per batch row
    print(f"peak extra memory: chunked {peak / 2**20:.0f} MiB, plain {plain_peak / 2**20:.0f} MiB")
    assert peak < plain_peak - s * s


def test_tiny_gemma3_logits_equal_transformers_on_cuda(tmp_path):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    from torchtune.models.gemma3 import gemma3, hf_to_tune
    from torchtune.models.gemma3._hf import builder_args

    config = transformers.Gemma3TextConfig(
        vocab_size=300,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=20,
        sliding_window=7,
        sliding_window_pattern=3,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        max_position_embeddings=128,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    hf = transformers.Gemma3ForCausalLM(config)
    with torch.no_grad():
        for p in hf.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    hf.save_pretrained(tmp_path)
    hf = hf.cuda().eval()
    import json

    cfg = json.loads((tmp_path / "config.json").read_text())
    ours = gemma3(**builder_args(cfg, tmp_path / "config.json"), max_seq_len=128)
    ours.load_state_dict(
        hf_to_tune(load_file(tmp_path / "model.safetensors"), num_heads=4, num_kv_heads=2, head_dim=32)
    )
    ours = ours.cuda().eval()
    tokens = torch.randint(0, 300, (2, 50), device="cuda")  # chunked windows on CUDA
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), hf(tokens).logits.float(), atol=1e-4, rtol=1e-4)

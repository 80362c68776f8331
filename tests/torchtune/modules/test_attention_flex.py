"""FlexAttention for packed batches: its block mask is the dense block-causal mask's, a packed tiny model
trains through it to the dense path's loss and gradients, and it is the path a packed batch takes on CUDA."""

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from torchtune.datasets import packed_collate
from torchtune.models.llama2 import llama2
from torchtune.modules import attention_flex
from torchtune.modules.attention_flex import block_causal_block_mask, document_ids, uses_flex_attention
from torchtune.modules.loss import CrossEntropyLoss
from torchtune.modules.sliding_window import window_kernel_device
from torchtune.training import forward_loss

SEGMENTS = [[100, 150, 50], [1, 299], [300], [128, 128, 44]]  # 300 tokens: 3 blocks of 128, the last one partial


def _packs(segments, vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    packs = []
    for lengths in segments:
        n = sum(lengths)
        tokens = torch.randint(1, vocab, (n,), generator=g)
        packs.append({"tokens": tokens, "labels": tokens.clone(), "input_pos": None, "seq_lens": torch.tensor(lengths)})
        packs[-1]["input_pos"] = torch.cat([torch.arange(k) for k in lengths])
    return packs


def test_block_mask_is_create_block_masks():
    """Empty, partial and full blocks as ``create_block_mask`` finds them from the mask function, without an
    s x s tensor; lengths that are not a multiple of the block size included."""
    batch = packed_collate(_packs(SEGMENTS))
    doc = document_ids(batch["input_pos"])
    assert doc[0].unique().tolist() == [0, 1, 2] and doc[2].unique().tolist() == [0]
    ours = block_causal_block_mask(doc)

    def mask_mod(b, h, q, kv):
        return (q >= kv) & (doc[b, q] == doc[b, kv])

    want = create_block_mask(mask_mod, len(SEGMENTS), None, 300, 300, device="cpu")
    for name in ("kv_num_blocks", "full_kv_num_blocks", "q_num_blocks", "full_q_num_blocks"):
        assert torch.equal(getattr(ours, name), getattr(want, name)), name
    for name, count in (("kv_indices", "kv_num_blocks"), ("full_kv_indices", "full_kv_num_blocks")):
        got, ref, n = getattr(ours, name), getattr(want, name), getattr(want, count)
        for b in range(len(SEGMENTS)):
            for i in range(n.shape[-1]):
                k = int(n[b, 0, i])
                assert sorted(got[b, 0, i, :k].tolist()) == sorted(ref[b, 0, i, :k].tolist()), (name, b, i)
    # and at the element level, the dense mask packed_collate builds
    assert torch.equal(ours.to_dense(), want.to_dense())


def _model():
    torch.manual_seed(0)
    return llama2(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=64, max_seq_len=512)


def _loss(model, batch, flex):
    calls = []
    real = attention_flex.flex_attention

    def spy(*args, **kwargs):
        calls.append(type(args[3]).__name__)
        return real(*args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, torch.no_grad():
        patch.setattr(attention_flex, "flex_attention", spy)
        target = window_kernel_device("cuda" if flex else None)
        with target:
            loss = forward_loss(model, CrossEntropyLoss(), batch, device=torch.device("cpu"))
    return loss, calls


def test_packed_tiny_model_through_flex_attention_equals_the_dense_mask_path():
    """fp32 on the CPU (FlexAttention's unfused reference there; compiled on a GPU): the loss of a packed batch
    (grouped-query heads, a partial last block) within 1e-5 of the dense-mask SDPA path. torch 2.13 runs
    FlexAttention's forward on a CPU but not its backward (eager or compiled: NotImplementedError), so the
    gradients are compared on a GPU (tests/gpu/test_gpu_flex_attention.py)."""
    model = _model()
    batch = packed_collate(_packs(SEGMENTS[:2]))
    dense_loss, dense_calls = _loss(model, batch, flex=False)
    flex_loss, flex_calls = _loss(model, batch, flex=True)
    assert dense_calls == [] and flex_calls == ["BlockMask"] * 2  # one call per layer
    torch.testing.assert_close(flex_loss, dense_loss, rtol=0, atol=1e-5)
    assert abs(dense_loss.item() - 4.16) < 0.3  # near ln 64 at random weights: a real loss, not a degenerate one


def test_flex_attention_is_chosen_for_packed_batches_on_cuda_only():
    model = _model()
    assert uses_flex_attention(torch.device("cuda"), model)
    assert uses_flex_attention(torch.device("cuda", 1), model)
    assert not uses_flex_attention(torch.device("cpu"), model)
    with window_kernel_device("cuda"):  # the memory estimator and the launch counter count the CUDA path
        assert uses_flex_attention(torch.device("cpu"), model)
    # a soft cap or a sliding window needs the dense mask: those models keep SDPA
    capped = _model()
    capped.layers[0].attn.softcap = 50.0
    assert not uses_flex_attention(torch.device("cuda"), capped)
    windowed = _model()
    windowed.layers[1].attn.sliding_window = 16
    assert not uses_flex_attention(torch.device("cuda"), windowed)


def test_a_flex_attention_that_cannot_compile_stops_the_run(monkeypatch):
    from torchtune import TuneError

    def broken(fn, **kwargs):
        raise RuntimeError("no working Triton here")

    monkeypatch.setattr(attention_flex, "_COMPILED", {})
    monkeypatch.setattr(torch, "compile", broken)
    q = torch.empty(1, 2, 256, 16, device="meta")  # plays a GPU's tensor: the compiled path
    doc = torch.zeros(1, 256, dtype=torch.int32, device="meta")
    with pytest.raises(TuneError, match="no working Triton here.*dataset.packed=False"):
        attention_flex.flex_attention(q, q, q, block_causal_block_mask(doc))

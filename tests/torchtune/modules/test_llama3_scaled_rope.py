"""Llama3ScaledRoPE: the frequencies of transformers' llama3 RoPE, each regime of the scaling, fp32 cache
rebuilt after meta-device construction."""

import math

import pytest
import torch

from torchtune.modules import Llama3ScaledRoPE, RotaryPositionalEmbeddings

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    "head_dim, factor, original", [(64, 32.0, 8192), (128, 8.0, 8192), (16, 8.0, 64)], ids=["3.2-1B", "3.1-8B", "tiny"]
)
def test_frequencies_equal_transformers_llama3_rope(head_dim, factor, original):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = transformers.LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        max_position_embeddings=131_072,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500_000.0,
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        },
    )
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](config, torch.device("cpu"))
    rope = Llama3ScaledRoPE(head_dim, max_seq_len=16, base=500_000, scale_factor=factor, old_context_len=original)
    got = rope.inverse_frequencies(torch.device("cpu"))
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)


def test_each_regime_of_the_scaling():
    plain = RotaryPositionalEmbeddings(16, max_seq_len=8, base=500_000).inverse_frequencies("cpu")
    scaled = Llama3ScaledRoPE(16, max_seq_len=8, base=500_000, scale_factor=8.0, old_context_len=64)
    freqs = scaled.inverse_frequencies("cpu")
    wavelen = 2 * math.pi / plain
    high = wavelen < 64 / 4
    low = wavelen > 64 / 1
    middle = ~high & ~low
    assert high.any() and low.any() and middle.any()
    assert torch.equal(freqs[high], plain[high])
    torch.testing.assert_close(freqs[low], plain[low] / 8.0)
    # in between: strictly between the kept and the fully divided frequency
    assert torch.all(freqs[middle] < plain[middle]) and torch.all(freqs[middle] > plain[middle] / 8.0)


def test_cache_is_rebuilt_after_meta_construction():
    with torch.device("meta"):
        rope = Llama3ScaledRoPE(16, max_seq_len=32, scale_factor=32.0, old_context_len=64)
    rope.to_empty(device="cpu")
    expected = Llama3ScaledRoPE(16, max_seq_len=32, scale_factor=32.0, old_context_len=64).cache
    assert rope.cache.dtype == torch.float32 and torch.equal(rope.cache, expected)


def test_rejects_factors_the_blend_cannot_use():
    with pytest.raises(ValueError, match="high_freq_factor"):
        Llama3ScaledRoPE(16, low_freq_factor=4.0, high_freq_factor=4.0)

"""torchtune's Llama 3 builders (``llama3``, ``llama3_8b``, ``llama3_70b``): plain RoPE at base 500000, 8192
tokens; and Llama 3.1's 405B."""

from __future__ import annotations

import torch

from torchtune.models.llama3 import llama3, llama3_8b, llama3_70b
from torchtune.models.llama3_1 import Llama3ScaledRoPE, llama3_1_405b
from torchtune.modules import RotaryPositionalEmbeddings


def test_llama3_builders():
    with torch.device("meta"):
        small, large, huge = llama3_8b(), llama3_70b(), llama3_1_405b()
    rope = small.layers[0].attn.pos_embeddings
    assert type(rope) is RotaryPositionalEmbeddings and rope.base == 500_000 and small.max_seq_len == 8192
    assert sum(p.numel() for p in small.parameters()) == 8_030_261_248
    assert (len(large.layers), large.layers[0].attn.num_heads, large.layers[0].mlp.w1.out_features) == (80, 64, 28_672)
    assert isinstance(huge.layers[0].attn.pos_embeddings, Llama3ScaledRoPE) and len(huge.layers) == 126
    tiny = llama3(vocab_size=32, num_layers=1, num_heads=4, num_kv_heads=2, embed_dim=64, max_seq_len=16)
    assert tiny.layers[0].mlp.w1.out_features == 256  # torchtune's default width rule
    assert tiny.norm.eps == 1e-5


def test_scaled_rope_defaults_are_torchtunes():
    rope = Llama3ScaledRoPE(16)
    assert (rope.max_seq_len, rope.base, rope.scale_factor, rope.old_context_len) == (4096, 10_000, 8.0, 8192)

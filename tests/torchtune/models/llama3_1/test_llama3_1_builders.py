"""Llama 3.1 builders: the published 8B/70B shapes, untied output, RoPE scaled by 8."""

import pytest
import torch

from torchtune.models.llama3_1 import llama3_1, llama3_1_8b, llama3_1_70b
from torchtune.modules import Llama3ScaledRoPE


@pytest.mark.parametrize(
    "builder, params, shape",
    [
        (llama3_1_8b, 8_030_261_248, (32, 32, 8, 4096, 14336)),
        (llama3_1_70b, 70_553_706_496, (80, 64, 8, 8192, 28672)),
    ],
)
def test_published_shapes_on_meta(builder, params, shape):
    with torch.device("meta"):
        model = builder()
    assert sum(p.numel() for p in model.parameters()) == params
    attn = model.layers[0].attn
    assert (len(model.layers), attn.num_heads, attn.num_kv_heads, attn.embed_dim) == shape[:4]
    assert model.layers[0].mlp.w1.out_features == shape[4]
    assert "output.weight" in model.state_dict()  # 3.1 does not tie
    rope = attn.pos_embeddings
    assert isinstance(rope, Llama3ScaledRoPE) and (rope.base, rope.scale_factor) == (500_000, 8.0)


def test_8b_bf16_weights_are_16_06_gb():
    with torch.device("meta"):
        model = llama3_1_8b()
    assert round(sum(p.numel() for p in model.parameters()) * 2 / 1e9, 2) == 16.06


def test_default_feed_forward_and_overrides():
    model = llama3_1(vocab_size=64, num_layers=1, num_heads=4, num_kv_heads=1, embed_dim=64, max_seq_len=32)
    assert model.layers[0].mlp.w1.out_features == 256 and model.layers[0].attn.num_kv_heads == 1
    small = llama3_1_8b(
        num_layers=1, vocab_size=64, embed_dim=64, num_heads=4, num_kv_heads=2, intermediate_dim=32, max_seq_len=32
    )
    assert len(small.layers) == 1 and small.tok_embeddings.num_embeddings == 64

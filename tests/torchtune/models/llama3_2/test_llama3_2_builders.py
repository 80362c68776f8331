"""Llama 3.2 builders: the published 1B/3B shapes, tied embeddings, RoPE scaled by 32."""

import pytest
import torch

from torchtune.models.llama3_2 import llama3_2, llama3_2_1b, llama3_2_3b
from torchtune.modules import Llama3ScaledRoPE, TiedLinear


@pytest.mark.parametrize(
    "builder, params, shape",
    [
        # (layers, heads, kv heads, width, feed-forward)
        (llama3_2_1b, 1_235_814_400, (16, 32, 8, 2048, 8192)),
        (llama3_2_3b, 3_212_749_824, (28, 24, 8, 3072, 8192)),
    ],
)
def test_published_shapes_on_meta(builder, params, shape):
    with torch.device("meta"):
        model = builder()
    assert sum(p.numel() for p in model.parameters()) == params
    attn = model.layers[0].attn
    assert (len(model.layers), attn.num_heads, attn.num_kv_heads, attn.embed_dim) == shape[:4]
    assert model.layers[0].mlp.w1.out_features == shape[4]
    assert model.tok_embeddings.num_embeddings == 128_256 and model.max_seq_len == 131_072
    assert isinstance(model.output, TiedLinear) and "output.weight" not in model.state_dict()
    rope = attn.pos_embeddings
    assert isinstance(rope, Llama3ScaledRoPE)
    assert (rope.base, rope.scale_factor, rope.low_freq_factor, rope.high_freq_factor, rope.old_context_len) == (
        500_000,
        32.0,
        1.0,
        4.0,
        8192,
    )
    assert model.layers[0].sa_norm.eps == 1e-5


def test_component_builder_keeps_torchtune_argument_order_and_can_untie():
    model = llama3_2(128, 1, 4, 2, 32, 64, 0.0, 10_000, 48, 1e-6, 16, False)
    rope = model.layers[0].attn.pos_embeddings
    assert (rope.base, rope.scale_factor, model.layers[0].mlp.w1.out_features, model.norm.eps) == (10_000, 16, 48, 1e-6)
    assert isinstance(model.output, torch.nn.Linear) and "output.weight" in model.state_dict()

"""torchtune's Mistral names: ``mistral_7b`` is v0.1 (the weights torchtune's configs load; here with v0.1's
window), ``mistral_7b_v0_3`` ours, ``mistral_classifier`` / ``mistral_reward_7b``; the tokenizer's arguments."""

from __future__ import annotations

import torch

from torchtune.models.mistral import (
    mistral,
    mistral_7b,
    mistral_7b_v0_1,
    mistral_7b_v0_3,
    mistral_classifier,
    mistral_reward_7b,
)


def test_builders():
    with torch.device("meta"):
        v01, v03, reward = mistral_7b(), mistral_7b_v0_3(), mistral_reward_7b()
    assert (v01.tok_embeddings.num_embeddings, v01.layers[0].attn.sliding_window) == (32_000, 4096)
    assert (
        v01.layers[0].attn.pos_embeddings.base == 10_000 and sum(p.numel() for p in v01.parameters()) == 7_241_732_096
    )
    assert (v03.tok_embeddings.num_embeddings, v03.layers[0].attn.sliding_window) == (32_768, None)
    assert v03.layers[0].attn.pos_embeddings.base == 1_000_000
    assert reward.output.out_features == 1 and reward.layers[0].attn.sliding_window is None
    args = dict(vocab_size=32, num_layers=1, num_heads=4, num_kv_heads=2, embed_dim=16, intermediate_dim=24)
    classifier = mistral_classifier(3, **args, max_seq_len=8)
    assert classifier(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 3)
    assert mistral(**args, max_seq_len=8).layers[0].attn.pos_embeddings.base == 10_000  # torchtune's default
    assert mistral_7b_v0_1 is not mistral_7b  # same model, torchtune's name kept as a function of its own

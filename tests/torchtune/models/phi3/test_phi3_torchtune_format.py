"""Phi-3 (and Phi-4) as torchtune 0.6.1 builds them: its state dicts (the fused projections split, q/k rows in
Hugging Face's order) load into our builders with transformers' logits; its builders' documented differences."""

from __future__ import annotations

import pytest
import torch

from tests._helpers.hf_models import BASE, hf_logits, make_hf_model, torchtune_format

transformers = pytest.importorskip("transformers")

TOKENS = torch.randint(0, BASE["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(1))
ARGS = dict(
    vocab_size=BASE["vocab_size"],
    num_layers=BASE["num_hidden_layers"],
    num_heads=BASE["num_attention_heads"],
    num_kv_heads=BASE["num_key_value_heads"],
    embed_dim=BASE["hidden_size"],
    intermediate_dim=BASE["intermediate_size"],
    max_seq_len=BASE["max_position_embeddings"],
    norm_eps=BASE["rms_norm_eps"],
    rope_base=BASE["rope_theta"],
)


@pytest.mark.parametrize("builder", ["phi3.phi3", "phi4.phi4"])
def test_torchtune_state_dict_gives_transformers_logits(builder):
    from torchtune.config._instantiate import import_component

    hf_model = make_hf_model("Phi3Config", dict(sliding_window=None, tie_word_embeddings=False))
    model = import_component(f"torchtune.models.{builder}")(**ARGS).eval()
    model.load_state_dict(torchtune_format(hf_model, interleave=False, fused=True), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf_logits(hf_model, TOKENS), atol=1e-5, rtol=1e-5)


def test_builders_and_their_documented_differences():
    """phi3_mini has the published 2047-token window (torchtune 0.6.1: none), phi4_14b RoPE base 250000
    (torchtune 0.6.1: 10000, one override away); both rotate halves."""
    from torchtune.models.phi3 import Phi3RotaryPositionalEmbeddings, phi3_mini
    from torchtune.models.phi4 import phi4_14b

    with torch.device("meta"):
        mini, phi4, phi4_tt = phi3_mini(), phi4_14b(), phi4_14b(rope_base=10_000)
    assert mini.layers[0].attn.sliding_window == 2047 and mini.layers[0].attn.num_kv_heads == 32
    assert phi4.layers[0].attn.pos_embeddings.base == 250_000 and phi4_tt.layers[0].attn.pos_embeddings.base == 10_000
    assert not phi4.layers[0].attn.pos_embeddings.interleaved
    rope = Phi3RotaryPositionalEmbeddings(16, max_seq_len=8)
    assert (rope.base, rope.interleaved) == (10_000, False)


def test_torchtunes_conversion_functions():
    from torchtune.models.phi3 import phi3_hf_to_tune, phi3_tune_to_hf

    hf_model = make_hf_model("Phi3Config", dict(sliding_window=None, tie_word_embeddings=False))
    ours = phi3_hf_to_tune(dict(hf_model.state_dict()), num_heads=4, num_kv_heads=2, dim=64)
    want = torchtune_format(hf_model, interleave=False, fused=True)
    assert sorted(ours) == sorted(want) and all(torch.equal(ours[k], want[k]) for k in want)
    back, hf_state = phi3_tune_to_hf(ours), hf_model.state_dict()
    assert sorted(back) == sorted(hf_state) and all(torch.equal(back[k], hf_state[k]) for k in hf_state)

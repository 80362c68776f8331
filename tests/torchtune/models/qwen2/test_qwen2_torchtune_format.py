"""Qwen2 / Qwen2.5 as torchtune 0.6.1 builds them: its state dicts (q/k rows in Hugging Face's order, RoPE over
the halves of each head) load into our builders with transformers' logits; its builder names and tokenizer
arguments work."""

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


@pytest.mark.parametrize("builder", ["qwen2.qwen2", "qwen2_5.qwen2_5"])
@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_torchtune_state_dict_gives_transformers_logits(builder, tied):
    """torchtune's Qwen2 checkpoint of transformers' weights (renamed, rows as they are) strict-loads and computes
    Qwen2ForCausalLM's logits: the RoPE layout is torchtune's (rotating interleaved pairs would be off by ~0.03)."""
    from torchtune.config._instantiate import import_component

    hf_model = make_hf_model("Qwen2Config", dict(tie_word_embeddings=tied))
    model = import_component(f"torchtune.models.{builder}")(**ARGS, tie_word_embeddings=tied).eval()
    model.load_state_dict(torchtune_format(hf_model, interleave=False), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), hf_logits(hf_model, TOKENS), atol=1e-5, rtol=1e-5)


def test_builders_are_torchtunes():
    """torchtune's names and numbers: base and instruct differ in context (and epsilon from 14B on); our short
    names are the instruct shapes; qwen2 defaults to torchtune's epsilon 1e-5, qwen2_5 to Qwen2.5's 1e-6."""
    from torchtune.models import qwen2, qwen2_5

    with torch.device("meta"):
        base, instruct = qwen2_5.qwen2_5_14b_base(), qwen2_5.qwen2_5_14b_instruct()
        tiny_qwen2 = qwen2.qwen2(**{**ARGS, "norm_eps": 1e-5})
        default_qwen2 = qwen2.qwen2(**{k: v for k, v in ARGS.items() if k != "norm_eps"})
        default_qwen2_5 = qwen2_5.qwen2_5(**{k: v for k, v in ARGS.items() if k != "norm_eps"})
    assert (base.max_seq_len, base.norm.eps) == (131_072, 1e-5)
    assert (instruct.max_seq_len, instruct.norm.eps) == (32_768, 1e-6)
    assert qwen2_5.qwen2_5_7b is qwen2_5.qwen2_5_7b_instruct
    assert default_qwen2.norm.eps == tiny_qwen2.norm.eps == 1e-5 and default_qwen2_5.norm.eps == 1e-6
    rope = default_qwen2.layers[0].attn.pos_embeddings
    assert type(rope).__name__ == "Qwen2RotaryPositionalEmbeddings" and not rope.interleaved
    assert rope.base == ARGS["rope_base"] and qwen2.Qwen2RotaryPositionalEmbeddings(8).base == 1_000_000.0


def test_torchtunes_conversion_functions():
    """qwen2_hf_to_tune gives torchtune's format (renamed, rows as they are; no lm_head when tied) and
    qwen2_tune_to_hf gives transformers' tensors back; convert_weights' get_mapped_key renames as torchtune's."""
    from torchtune.models.convert_weights import get_mapped_key
    from torchtune.models.qwen2 import qwen2_hf_to_tune, qwen2_tune_to_hf

    hf_model = make_hf_model("Qwen2Config", dict(tie_word_embeddings=True))
    hf_state = {k: v for k, v in hf_model.state_dict().items() if k != "lm_head.weight"}
    sizes = dict(num_heads=4, num_kv_heads=2, dim=64, tie_word_embeddings=True)
    ours = qwen2_hf_to_tune(dict(hf_model.state_dict()), **sizes)
    want = torchtune_format(hf_model, interleave=False)
    assert sorted(ours) == sorted(want) and all(torch.equal(ours[k], want[k]) for k in want)
    back = qwen2_tune_to_hf(ours, **sizes)
    assert sorted(back) == sorted(hf_state) and all(torch.equal(back[k], hf_state[k]) for k in hf_state)
    mapping = {"model.layers.{}.mlp.up_proj.weight": "layers.{}.mlp.w3.weight"}
    assert get_mapped_key("model.layers.3.mlp.up_proj.weight", mapping) == "layers.3.mlp.w3.weight"
    with pytest.raises(Exception, match="unexpected key"):
        get_mapped_key("model.layers.3.mlp.other.weight", mapping)

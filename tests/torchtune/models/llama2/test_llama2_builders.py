"""Llama2 builders: published parameter counts, defaults and weight-name conversion."""

import pytest
import torch

from torchtune import TuneError
from torchtune.models.llama2 import (
    hf_to_tune,
    llama2,
    llama2_7b,
    llama2_13b,
    llama2_70b,
    llama2_tiny,
    meta_to_tune,
    scale_hidden_dim_for_mlp,
    tune_to_hf,
    tune_to_meta,
)


@pytest.mark.parametrize(
    "builder, expected", [(llama2_7b, 6_738_415_616), (llama2_13b, 13_015_864_320), (llama2_70b, 68_976_648_192)]
)
def test_published_parameter_counts_on_meta(builder, expected):
    with torch.device("meta"):
        model = builder()
    assert sum(p.numel() for p in model.parameters()) == expected


def test_intermediate_dim_rule():
    assert scale_hidden_dim_for_mlp(4096) == 11008
    assert scale_hidden_dim_for_mlp(5120) == 13824
    assert llama2_tiny().layers[0].mlp.w1.out_features == scale_hidden_dim_for_mlp(64) == 256


def test_tiny_is_overridable():
    m = llama2_tiny(vocab_size=100, num_layers=1)
    assert m.tok_embeddings.num_embeddings == 100 and len(m.layers) == 1
    assert m.layers[0].attn.num_kv_heads == 2


def test_state_dict_names_follow_the_contract():
    names = set(llama2_tiny(num_layers=1).state_dict())
    assert names == {
        "tok_embeddings.weight",
        "norm.scale",
        "output.weight",
        *(f"layers.0.attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "output_proj")),
        "layers.0.sa_norm.scale",
        "layers.0.mlp_norm.scale",
        *(f"layers.0.mlp.{w}.weight" for w in ("w1", "w2", "w3")),
    }


def _random_sd(**kw):
    torch.manual_seed(0)
    model = llama2(vocab_size=32, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=16, **kw)
    return {k: torch.randn_like(v) for k, v in model.state_dict().items()}


def test_hf_round_trip_is_exact_and_permutes_qk():
    sd = _random_sd()
    hf = tune_to_hf(sd, num_heads=4, num_kv_heads=2, dim=32)
    assert "model.layers.1.self_attn.k_proj.weight" in hf and "lm_head.weight" in hf
    assert not torch.equal(hf["model.layers.0.self_attn.q_proj.weight"], sd["layers.0.attn.q_proj.weight"])
    assert torch.equal(hf["model.layers.0.self_attn.v_proj.weight"], sd["layers.0.attn.v_proj.weight"])
    back = hf_to_tune(hf, num_heads=4, num_kv_heads=2, dim=32)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd)


def test_hf_derivable_buffers_dropped_unknown_keys_listed():
    hf = tune_to_hf(_random_sd(), num_heads=4, num_kv_heads=2, dim=32)
    hf["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(4)
    assert "layers.0.attn.q_proj.weight" in hf_to_tune(hf, num_heads=4, num_kv_heads=2, dim=32)
    hf["model.layers.0.self_attn.q_proj.bias"] = torch.ones(32)
    with pytest.raises(TuneError, match=r"q_proj\.bias"):
        hf_to_tune(hf, num_heads=4, num_kv_heads=2, dim=32)


def test_meta_round_trip():
    sd = _random_sd()
    meta = tune_to_meta(sd)
    assert "layers.0.attention.wq.weight" in meta and "layers.1.ffn_norm.weight" in meta
    meta["rope.freqs"] = torch.ones(4)
    back = meta_to_tune(meta)
    assert back.keys() == sd.keys() and all(torch.equal(back[k], sd[k]) for k in sd)


def test_llama2_tokenizer_builder(tmp_path):
    from tests._helpers.tokenizer import make_spm_tokenizer
    from torchtune.models.llama2 import llama2_tokenizer

    tokenizer = llama2_tokenizer(str(make_spm_tokenizer(tmp_path)), max_seq_len=64)
    assert tokenizer.max_seq_len == 64
    ids = tokenizer.encode("Hello world")
    assert ids[0] == tokenizer.bos_id == 1 and ids[-1] == tokenizer.eos_id == 2
    assert tokenizer.decode(ids) == "Hello world"

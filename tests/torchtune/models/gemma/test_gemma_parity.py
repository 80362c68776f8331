"""Gemma (1) against transformers' GemmaForCausalLM on a random tiny config (multi-query attention, a head_dim of
its own): the Hugging Face folder loads with the same logits and saves back to one transformers loads; the
state dict torchtune 0.6.1 writes loads with the same logits."""

from __future__ import annotations

import pytest
import torch

from tests._helpers.hf_models import BASE, hf_logits, make_hf_folder, torchtune_format
from torchtune._errors import TuneError
from torchtune.utils import FullModelHFCheckpointer

transformers = pytest.importorskip("transformers")

EXTRA = dict(head_dim=24, num_key_value_heads=1, hidden_act="gelu_pytorch_tanh", tie_word_embeddings=True)
TOKENS = torch.randint(0, BASE["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(1))


def _gemma(**overrides):
    from torchtune.models.gemma import gemma

    args = dict(
        vocab_size=BASE["vocab_size"],
        num_layers=BASE["num_hidden_layers"],
        num_heads=BASE["num_attention_heads"],
        head_dim=EXTRA["head_dim"],
        num_kv_heads=EXTRA["num_key_value_heads"],
        embed_dim=BASE["hidden_size"],
        intermediate_dim=BASE["intermediate_size"],
        max_seq_len=BASE["max_position_embeddings"],
        norm_eps=BASE["rms_norm_eps"],
        rope_base=BASE["rope_theta"],
    )
    return gemma(**{**args, **overrides})


def test_hf_folder_both_ways_and_torchtune_format(tmp_path):
    hf_model = make_hf_folder(tmp_path / "hf", "GemmaConfig", EXTRA)
    expected = hf_logits(hf_model, TOKENS)
    checkpointer = FullModelHFCheckpointer(tmp_path / "hf", ["model.safetensors"], "GEMMA", output_dir=tmp_path / "out")
    model = _gemma()
    checkpointer.check_model(model)
    model.load_state_dict(checkpointer.load_checkpoint()["model"])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(TOKENS), expected, atol=1e-5, rtol=1e-5)
    saved = checkpointer.save_checkpoint({"model": model.state_dict()}, epoch=0)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved, attn_implementation="sdpa").float().eval()
    torch.testing.assert_close(hf_logits(reloaded, TOKENS), expected, atol=1e-5, rtol=1e-5)

    fresh = _gemma().eval()
    fresh.load_state_dict(torchtune_format(hf_model, interleave=True), strict=True)
    with torch.no_grad():
        torch.testing.assert_close(fresh(TOKENS), expected, atol=1e-5, rtol=1e-5)

    # a Llama builder of the same sizes fits every weight shape, and is named before any weight is read
    from torchtune.models.llama2._component_builders import llama_decoder
    from torchtune.modules import RotaryPositionalEmbeddings

    with torch.device("meta"):
        llama = llama_decoder(
            vocab_size=96, num_layers=2, num_heads=4, num_kv_heads=1, embed_dim=64, max_seq_len=64,
            intermediate_dim=80, attn_dropout=0.0, norm_eps=1e-6, head_dim=24, tie_word_embeddings=True,
            rope=RotaryPositionalEmbeddings(24, 64, base=1000.0),
        )  # fmt: skip
    with pytest.raises(TuneError, match=r"model_type gemma .*config.json true, model false"):
        checkpointer.check_model(llama)


def test_builders():
    from torchtune.models.gemma import GemmaNormEmbeddings, gemma_2b, gemma_7b

    with torch.device("meta"):
        small, large = gemma_2b(), gemma_7b()
    assert sum(p.numel() for p in small.parameters()) == 2_506_172_416
    assert (small.layers[0].attn.num_kv_heads, large.layers[0].attn.num_kv_heads, large.head_dim) == (1, 16, 256)
    emb = GemmaNormEmbeddings(4, 9)
    assert emb.embed_scale == 3.0 and emb(torch.tensor([1])).allclose(emb.weight[1] * 3.0)

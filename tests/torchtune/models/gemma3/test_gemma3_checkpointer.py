"""FullModelHFCheckpointer with model_type=GEMMA3 on folders transformers wrote: both config.json forms
(Gemma3ForCausalLM and Gemma3ForConditionalGeneration), the checks before any weight is read, and saved
folders that transformers loads back with the same logits."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torchtune._errors import TuneError  # noqa: E402
from torchtune.models.gemma3 import gemma3  # noqa: E402
from torchtune.models.gemma3._hf import builder_args  # noqa: E402
from torchtune.training import FullModelHFCheckpointer  # noqa: E402

TEXT = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,
    query_pre_attn_scalar=20,
    sliding_window=6,
    sliding_window_pattern=3,
    rope_scaling={"rope_type": "linear", "factor": 8.0},
    max_position_embeddings=64,
    pad_token_id=0,
)


def _randomize(model):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.eval()


def _causal_lm(folder):
    model = _randomize(transformers.Gemma3ForCausalLM(transformers.Gemma3TextConfig(**TEXT)))
    model.save_pretrained(folder)
    return model


def _multimodal(folder):
    vision = transformers.SiglipVisionConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
    )
    config = transformers.Gemma3Config(text_config=TEXT, vision_config=vision.to_dict(), mm_tokens_per_image=4)
    model = _randomize(transformers.Gemma3ForConditionalGeneration(config))
    model.save_pretrained(folder)
    return model


def _load(folder, out):
    ckpt = FullModelHFCheckpointer(folder, ["model.safetensors"], model_type="GEMMA3", output_dir=out)
    config = json.loads((folder / "config.json").read_text())
    with torch.device("meta"):
        meta = gemma3(**builder_args(config, folder / "config.json"), max_seq_len=64)
    ckpt.check_model(meta)  # before any weight is read
    model = gemma3(**builder_args(config, folder / "config.json"), max_seq_len=64).eval()
    model.load_state_dict(ckpt.load_checkpoint()["model"])
    return ckpt, model


@pytest.mark.parametrize("make", [_causal_lm, _multimodal], ids=["Gemma3ForCausalLM", "Gemma3ForConditionalGeneration"])
def test_load_and_save_both_config_forms(tmp_path, make):
    hf = make(tmp_path / "in")
    tokens = torch.randint(1, TEXT["vocab_size"], (2, 17))
    with torch.no_grad():
        expected = hf(input_ids=tokens).logits
    ckpt, ours = _load(tmp_path / "in", tmp_path / "out")
    with torch.no_grad():
        torch.testing.assert_close(ours(tokens), expected, atol=1e-5, rtol=1e-5)

    folder = ckpt.save_checkpoint({"model": ours.state_dict()}, epoch=0)
    saved = json.loads((folder / "config.json").read_text())
    assert saved["architectures"] == ["Gemma3ForCausalLM"] and saved["model_type"] == "gemma3_text"
    back = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    assert type(back).__name__ == "Gemma3ForCausalLM"
    with torch.no_grad():
        torch.testing.assert_close(back(tokens).logits, expected, atol=1e-5, rtol=1e-5)


def test_wrong_builder_and_wrong_model_type_are_refused_before_any_weight(tmp_path):
    _causal_lm(tmp_path / "in")
    ckpt = FullModelHFCheckpointer(
        tmp_path / "in", ["model.safetensors"], model_type="GEMMA3", output_dir=tmp_path / "o"
    )
    args = builder_args(json.loads((tmp_path / "in" / "config.json").read_text()), tmp_path / "x")
    with torch.device("meta"):
        wrong = gemma3(**{**args, "sliding_window_size": 8, "query_pre_attn_scalar": 24}, max_seq_len=64)
    with pytest.raises(
        TuneError, match=r"sliding_window: config.json 6, model 8.*query_pre_attn_scalar: config.json 20"
    ):
        ckpt.check_model(wrong)
    with pytest.raises(TuneError, match="model_type=GEMMA3"):
        FullModelHFCheckpointer(tmp_path / "in", ["model.safetensors"], model_type="LLAMA2", output_dir=tmp_path / "o")

"""The family of a Hugging Face folder is read from its config.json, and every mismatch is one paragraph
before any weight is read (the weight files here are not even valid safetensors)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from torchtune._errors import TuneError
from torchtune.training import FullModelHFCheckpointer

QWEN3 = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "num_hidden_layers": 2,
    "vocab_size": 512,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "tie_word_embeddings": True,
}


def _folder(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes(b"not weights: nothing may read them")
    return folder


def _checkpointer(folder: Path, model_type: str):
    return FullModelHFCheckpointer(folder, ["model.safetensors"], model_type=model_type, output_dir=folder.parent / "o")


def test_unknown_family_names_supported_and_closest(tmp_path):
    folder = _folder(tmp_path, {**QWEN3, "model_type": "qwen3_moe", "architectures": ["Qwen3MoeForCausalLM"]})
    with pytest.raises(TuneError) as err:
        _checkpointer(folder, "QWEN3")
    msg = str(err.value)
    assert "model_type 'qwen3_moe', which this library does not implement" in msg
    assert "QWEN3 (Qwen3)" in msg and "MISTRAL (Mistral)" in msg and "PHI4 (Phi-3 / Phi-4)" in msg
    assert "closest supported one is Qwen3 ('qwen3', checkpointer.model_type=QWEN3)" in msg


def test_yaml_model_type_that_does_not_match_the_folder(tmp_path):
    folder = _folder(tmp_path, QWEN3)
    with pytest.raises(TuneError, match=r"model_type=LLAMA3_2 does not match .*Qwen3 model.*model_type=QWEN3"):
        _checkpointer(folder, "LLAMA3_2")
    with pytest.raises(TuneError, match=r"model_type=MISTRAL does not match .*whose model_type is QWEN3"):
        _checkpointer(folder, "MISTRAL")
    with pytest.raises(TuneError, match=r"model_type=GEMMA9 is not supported; use one of .*QWEN2 \(Qwen2 / Qwen2.5\)"):
        _checkpointer(folder, "GEMMA9")
    assert _checkpointer(folder, "qwen3")._model_type == "QWEN3"  # any case


def test_architectures_alone_identify_the_family(tmp_path):
    folder = _folder(tmp_path, {k: v for k, v in QWEN3.items() if k != "model_type"})
    assert _checkpointer(folder, "QWEN3")._family.name == "Qwen3"


def test_sizes_that_do_not_fit_the_builder_name_key_and_both_values(tmp_path):
    import torch

    from torchtune.models.qwen3 import qwen3_0_6b
    from torchtune.training import check_model_matches_checkpoint

    checkpointer = _checkpointer(_folder(tmp_path, QWEN3), "QWEN3")
    with pytest.raises(TuneError) as err:
        check_model_matches_checkpoint({"_component_": "torchtune.models.qwen3.qwen3_0_6b"}, checkpointer)
    msg = str(err.value)
    for part in (
        "hidden_size: config.json 64, model 1024",
        "num_hidden_layers: config.json 2, model 28",
        "vocab_size: config.json 512, model 151936",
        "head_dim: config.json 32, model 128",
    ):
        assert part in msg
    with torch.device("meta"):
        assert qwen3_0_6b().tok_embeddings.weight.is_meta


def test_unsupported_config_features_are_refused(tmp_path):
    folder = _folder(tmp_path, {**QWEN3, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
    with pytest.raises(TuneError, match=r"RoPE scaling of type 'yarn'.*Qwen3 models here implement plain RoPE"):
        _checkpointer(folder, "QWEN3")


def test_meta_checkpointer_refuses_other_families(tmp_path):
    from torchtune.training import FullModelMetaCheckpointer

    folder = _folder(tmp_path, QWEN3)
    with pytest.raises(TuneError, match="Meta's consolidated.00.pth format holds Llama 2 and Llama 3 / 3.1 only"):
        FullModelMetaCheckpointer(folder, ["model.safetensors"], model_type="QWEN3", output_dir=tmp_path / "o")


def test_torchtune_model_type_names():
    """Every ``checkpointer.model_type`` torchtune 0.6.1's configs of these families use names a family here."""
    from torchtune.models._hf_family import canonical_model_type

    expected = {
        "LLAMA2": "LLAMA2",
        "LLAMA3": "LLAMA3",
        "LLAMA3_2": "LLAMA3_2",
        "MISTRAL": "MISTRAL",
        "QWEN2": "QWEN2",
        "PHI3_MINI": "PHI4",
        "PHI4": "PHI4",
        "GEMMA": "GEMMA",
        "GEMMA2": "GEMMA2",
    }
    assert {name: canonical_model_type(name) for name in expected} == expected

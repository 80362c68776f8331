"""FullModelHFCheckpointer against Hugging Face transformers: logits parity both ways, shards, .bin, bad inputs."""

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from torchtune import TuneError
from torchtune.models.llama2 import llama2
from torchtune.training.checkpointing import FullModelHFCheckpointer, validate_state_dict

transformers = pytest.importorskip("transformers")

VOCAB, DIM, LAYERS, HEADS, FFN, SEQ = 128, 64, 2, 4, 160, 64


def _hf_model(num_kv_heads: int):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=SEQ,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        attn_implementation="eager",
    )
    model = transformers.LlamaForCausalLM(config).eval()
    # HF initialises norms to ones; random norms make the test sensitive to a mixed-up norm.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)
    return model


def _our_model(num_kv_heads: int):
    return llama2(VOCAB, LAYERS, HEADS, num_kv_heads, DIM, SEQ, intermediate_dim=FFN, norm_eps=1e-5).eval()


def _tokens():
    return torch.randint(0, VOCAB, (2, 24), generator=torch.Generator().manual_seed(3))


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


def _load_into_ours(checkpointer, num_kv_heads):
    sd = checkpointer.load_checkpoint()["model"]
    model = _our_model(num_kv_heads)
    validate_state_dict(model, sd)
    model.load_state_dict(sd)
    return model


@pytest.mark.parametrize("num_kv_heads", [HEADS, 2], ids=["multi-head", "grouped-query"])
def test_logits_match_transformers_both_ways(tmp_path, num_kv_heads):
    hf = _hf_model(num_kv_heads)
    hf.save_pretrained(tmp_path / "in")
    (tmp_path / "in" / "tokenizer_config.json").write_text("{}")
    tokens = _tokens()
    expected = _hf_logits(hf, tokens)

    ckpt = FullModelHFCheckpointer(tmp_path / "in", ["model.safetensors"], output_dir=tmp_path / "out")
    ours = _load_into_ours(ckpt, num_kv_heads)
    with torch.no_grad():
        logits = ours(tokens)
    assert (logits - expected).abs().max() <= 1e-5

    folder = ckpt.save_checkpoint({"model": ours.state_dict()}, epoch=0)
    assert folder == tmp_path / "out" / "epoch_0"
    # torchtune's layout: numbered shards with their index, whatever the input's file names
    assert {p.name for p in folder.iterdir()} == {
        "model-00001-of-00001.safetensors",
        "model.safetensors.index.json",
        "config.json",
        "generation_config.json",
        "tokenizer_config.json",
        "manifest.json",
    }
    reloaded = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert (_hf_logits(reloaded, tokens) - expected).abs().max() <= 1e-5
    # the written tensors are the HF tensors, bit for bit
    before, after = (
        load_file(tmp_path / "in" / "model.safetensors"),
        load_file(folder / "model-00001-of-00001.safetensors"),
    )
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_sharded_input_keeps_files_and_index(tmp_path):
    hf = _hf_model(2)
    hf.save_pretrained(tmp_path / "in", max_shard_size="100KB")
    index_name = "model.safetensors.index.json"
    index = json.loads((tmp_path / "in" / index_name).read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2

    ckpt = FullModelHFCheckpointer(tmp_path / "in", index_name, output_dir=tmp_path / "out")
    ours = _load_into_ours(ckpt, 2)
    tokens = _tokens()
    with torch.no_grad():
        assert (ours(tokens) - _hf_logits(hf, tokens)).abs().max() <= 1e-5
    folder = ckpt.save_checkpoint({"model": ours.state_dict()}, epoch=1, step=7, intermediate=True)
    assert folder.name == "step_7"
    new_index = json.loads((folder / index_name).read_text())
    assert new_index["weight_map"] == index["weight_map"]
    assert new_index["metadata"]["total_size"] == sum(
        t.numel() * t.element_size() for s in shards for t in load_file(tmp_path / "in" / s).values()
    )
    assert sorted(p.name for p in folder.glob("*.safetensors")) == shards
    reloaded = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert (_hf_logits(reloaded, tokens) - _hf_logits(hf, tokens)).abs().max() <= 1e-5


@pytest.mark.parametrize("safe_serialization", [False, True])
def test_bin_input_is_written_as_safe_serialization_says(tmp_path, safe_serialization):
    hf = _hf_model(2)
    hf.save_pretrained(tmp_path / "in")
    (tmp_path / "in" / "model.safetensors").unlink()
    torch.save(hf.state_dict(), tmp_path / "in" / "pytorch_model.bin")
    ckpt = FullModelHFCheckpointer(
        tmp_path / "in", ["pytorch_model.bin"], output_dir=tmp_path / "out", safe_serialization=safe_serialization
    )
    ours = _load_into_ours(ckpt, 2)
    tokens = _tokens()
    with torch.no_grad():
        assert (ours(tokens) - _hf_logits(hf, tokens)).abs().max() <= 1e-5
    folder = ckpt.save_checkpoint({"model": ours.state_dict()}, epoch=0)
    if safe_serialization:  # torchtune's default: safetensors whatever the input was
        assert not list(folder.glob("*.bin"))
        written = load_file(folder / "model-00001-of-00001.safetensors")
        index = json.loads((folder / "model.safetensors.index.json").read_text())
    else:
        assert not list(folder.glob("*.safetensors"))
        written = torch.load(folder / "model-00001-of-00001.bin", weights_only=True)
        index = json.loads((folder / "pytorch_model.bin.index.json").read_text())
    assert set(index["weight_map"].values()) == {
        f"model-00001-of-00001.{'safetensors' if safe_serialization else 'bin'}"
    }
    assert all(torch.equal(written[k], v) for k, v in hf.state_dict().items())
    reloaded = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert (_hf_logits(reloaded, tokens) - _hf_logits(hf, tokens)).abs().max() <= 1e-5


# --- bad inputs ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("hf")
    _hf_model(2).save_pretrained(folder)
    return folder


def test_missing_folder_and_file_name_the_key(tmp_path, hf_folder):
    with pytest.raises(TuneError, match="checkpointer.checkpoint_dir") as e:
        FullModelHFCheckpointer(tmp_path / "nope", ["model.safetensors"], output_dir=tmp_path / "out")
    assert str(tmp_path / "nope") in str(e.value)
    with pytest.raises(TuneError, match="checkpointer.checkpoint_files") as e:
        FullModelHFCheckpointer(hf_folder, ["model-00001.safetensors"], output_dir=tmp_path / "out")
    assert "model-00001.safetensors" in str(e.value)


def test_output_inside_checkpoint_dir_is_refused(hf_folder):
    for out in (hf_folder, hf_folder / "out"):
        with pytest.raises(TuneError, match="checkpointer.output_dir"):
            FullModelHFCheckpointer(hf_folder, ["model.safetensors"], output_dir=out)


def test_shape_mismatch_lists_both_shapes_and_hints_at_builder(tmp_path, hf_folder):
    sd = FullModelHFCheckpointer(hf_folder, ["model.safetensors"], output_dir=tmp_path).load_checkpoint()["model"]
    wrong = llama2(VOCAB * 2, LAYERS, HEADS, 2, DIM, SEQ, intermediate_dim=FFN)
    with pytest.raises(TuneError) as e:
        validate_state_dict(wrong, sd)
    msg = str(e.value)
    assert "tok_embeddings.weight: checkpoint (128, 64) vs model (256, 64)" in msg
    assert "output.weight" in msg and "model builder" in msg and "config.json" in msg


def test_missing_and_unexpected_keys_are_listed(tmp_path, hf_folder):
    sd = FullModelHFCheckpointer(hf_folder, ["model.safetensors"], output_dir=tmp_path).load_checkpoint()["model"]
    del sd["layers.1.mlp.w2.weight"]
    sd["layers.2.mlp.w2.weight"] = torch.zeros(DIM, FFN)
    with pytest.raises(TuneError) as e:
        validate_state_dict(_our_model(2), sd)
    assert "missing from the checkpoint: layers.1.mlp.w2.weight" in str(e.value)
    assert "not in the model: layers.2.mlp.w2.weight" in str(e.value)


def test_unknown_hf_tensor_is_an_error(tmp_path, hf_folder):
    folder = tmp_path / "extra"
    folder.mkdir()
    (folder / "config.json").write_text((hf_folder / "config.json").read_text())
    tensors = load_file(hf_folder / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(DIM)
    save_file(tensors, folder / "model.safetensors")
    ckpt = FullModelHFCheckpointer(folder, ["model.safetensors"], output_dir=tmp_path / "out")
    with pytest.raises(TuneError, match=r"model\.layers\.0\.self_attn\.q_proj\.bias"):
        ckpt.load_checkpoint()

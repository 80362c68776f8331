"""Llama 3.x Hugging Face folders: logits equal transformers' in fp32 both ways (HF -> ours -> HF), with
llama3 RoPE scaling and with tied embeddings, for both spellings of the RoPE settings in config.json;
tied saves omit lm_head; model_type, tie and RoPE mismatches stop with one message."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from torchtune import TuneError
from torchtune.models.llama3_1 import llama3_1
from torchtune.models.llama3_2 import llama3_2
from torchtune.modules import TiedLinear
from torchtune.training.checkpointing import FullModelHFCheckpointer, FullModelMetaCheckpointer, validate_state_dict

transformers = pytest.importorskip("transformers")

VOCAB, DIM, LAYERS, HEADS, KV_HEADS, FFN, SEQ = 160, 64, 2, 4, 2, 96, 256
# head_dim 16 and an 64-token original context put the 8 frequencies in all three regimes of the
# llama3 scaling: kept (wavelength < 16), blended, and divided by the factor (wavelength > 64).
ROPE = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
THETA = 500_000.0


def _hf_model(tied: bool, factor: float = 8.0):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=DIM,
        intermediate_size=FFN,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=SEQ,
        rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "llama3", "rope_theta": THETA, **ROPE, "factor": factor},
        tie_word_embeddings=tied,
        attn_implementation="eager",
    )
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.uniform_(0.5, 1.5)  # ones would hide a mixed-up norm
            elif "q_proj" in name or "k_proj" in name:
                p.mul_(8.0)  # sharp attention, so that positions (RoPE) shape the logits
    return model


def _our_model(tied: bool, factor: float = 8.0):
    builder = llama3_2 if tied else llama3_1
    return builder(
        VOCAB,
        LAYERS,
        HEADS,
        KV_HEADS,
        DIM,
        SEQ,
        intermediate_dim=FFN,
        norm_eps=1e-5,
        rope_base=500_000,
        scale_factor=factor,
        tie_word_embeddings=tied,
        old_context_len=64,
    ).eval()


def _tokens():
    # 200 positions: well past the 64-token "original context", where the scaling matters.
    return torch.randint(0, VOCAB, (2, 200), generator=torch.Generator().manual_seed(3))


def _hf_logits(model, tokens):
    with torch.no_grad():
        return model(tokens).logits


def _hub_style_config(folder):
    """Rewrite config.json as the hub's Llama 3.x folders have it: top-level rope_theta, rope_scaling."""
    path = folder / "config.json"
    config = json.loads(path.read_text())
    params = config.pop("rope_parameters")
    config["rope_theta"] = params.pop("rope_theta")
    config["rope_scaling"] = params
    path.write_text(json.dumps(config, indent=2))


@pytest.mark.parametrize("config_style", ["rope_parameters", "rope_scaling"])
@pytest.mark.parametrize("tied", [False, True], ids=["llama3_1-untied", "llama3_2-tied"])
def test_logits_match_transformers_both_ways(tmp_path, tied, config_style):
    hf = _hf_model(tied)
    hf.save_pretrained(tmp_path / "in")
    if config_style == "rope_scaling":
        _hub_style_config(tmp_path / "in")
        # transformers reads the hub spelling to the same model
        again = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "in", attn_implementation="eager").eval()
        assert torch.equal(_hf_logits(again, _tokens()), _hf_logits(hf, _tokens()))
    assert ("lm_head.weight" in load_file(tmp_path / "in" / "model.safetensors")) is not tied
    tokens = _tokens()
    expected = _hf_logits(hf, tokens)

    model_type = "LLAMA3_2" if tied else "LLAMA3"
    ckpt = FullModelHFCheckpointer(tmp_path / "in", ["model.safetensors"], model_type, output_dir=tmp_path / "out")
    sd = ckpt.load_checkpoint()["model"]
    assert ("output.weight" in sd) is not tied
    ours = _our_model(tied)
    assert isinstance(ours.output, TiedLinear) is tied
    validate_state_dict(ours, sd)
    ours.load_state_dict(sd)
    ckpt.check_model(ours)
    with torch.no_grad():
        logits = ours(tokens)
    assert (logits - expected).abs().max() <= 1e-5

    folder = ckpt.save_checkpoint({"model": ours.state_dict()}, epoch=0)
    written = load_file(folder / "model-00001-of-00001.safetensors")
    before = load_file(tmp_path / "in" / "model.safetensors")
    assert written.keys() == before.keys() and all(torch.equal(before[k], written[k]) for k in before)
    assert ("lm_head.weight" in written) is not tied
    assert json.loads((folder / "config.json").read_text()) == json.loads((tmp_path / "in" / "config.json").read_text())
    reloaded = transformers.LlamaForCausalLM.from_pretrained(folder, attn_implementation="eager").eval()
    assert (_hf_logits(reloaded, tokens) - expected).abs().max() <= 1e-5


def test_scaling_changes_logits_so_the_parity_test_can_fail(tmp_path):
    """With factor 32 instead of 8 the same weights give other logits: the RoPE scaling is exercised."""
    hf = _hf_model(tied=False)
    ours = _our_model(tied=False, factor=32.0)
    hf.save_pretrained(tmp_path / "in")
    ckpt = FullModelHFCheckpointer(tmp_path / "in", ["model.safetensors"], "LLAMA3", output_dir=tmp_path / "out")
    ours.load_state_dict(ckpt.load_checkpoint()["model"])
    with torch.no_grad():
        assert (ours(_tokens()) - _hf_logits(hf, _tokens())).abs().max() > 1e-2  # 1000x the parity tolerance
    with pytest.raises(TuneError, match=r"factor=8.*factor=32|model.scale_factor"):
        ckpt.check_model(ours)


def test_tied_lm_head_present_in_the_file_is_dropped(tmp_path, caplog):
    hf = _hf_model(tied=True)
    hf.save_pretrained(tmp_path / "in")
    tensors = load_file(tmp_path / "in" / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"] + 1.0
    save_file(tensors, tmp_path / "in" / "model.safetensors")
    ckpt = FullModelHFCheckpointer(tmp_path / "in", ["model.safetensors"], "LLAMA3_2", output_dir=tmp_path / "out")
    with caplog.at_level("WARNING", logger="torchtune"):
        sd = ckpt.load_checkpoint()["model"]
    assert "output.weight" not in sd and "lm_head.weight differs" in caplog.text
    ours = _our_model(tied=True)
    ours.load_state_dict(sd)
    folder = ckpt.save_checkpoint({"model": ours.state_dict()}, epoch=0)
    assert "lm_head.weight" not in load_file(folder / "model-00001-of-00001.safetensors")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("llama3_folders")
    _hf_model(tied=False).save_pretrained(root / "llama3_1")
    _hf_model(tied=True).save_pretrained(root / "llama3_2")
    return root


@pytest.mark.parametrize(
    "folder, model_type, expected",
    [("llama3_1", "LLAMA2", "LLAMA3"), ("llama3_1", "LLAMA3_2", "LLAMA3"), ("llama3_2", "LLAMA3", "LLAMA3_2")],
)
def test_model_type_not_matching_config_json_stops_at_construction(tmp_path, folders, folder, model_type, expected):
    (folders / folder / "model.safetensors").chmod(0o000)  # proves no weight is read before the error
    try:
        with pytest.raises(TuneError) as err:
            FullModelHFCheckpointer(folders / folder, ["model.safetensors"], model_type, output_dir=tmp_path)
    finally:
        (folders / folder / "model.safetensors").chmod(0o644)
    msg = str(err.value)
    assert f"checkpointer.model_type={model_type} does not match" in msg
    assert f"Set checkpointer.model_type={expected}" in msg and "rope_theta=500000" in msg


def test_llama2_folder_with_llama3_model_type_is_refused(tmp_path):
    from tests._helpers.tiny_run import make_hf_checkpoint

    folder = make_hf_checkpoint(tmp_path / "llama2", vocab_size=VOCAB)
    with pytest.raises(TuneError, match="describes a Llama 2 model.*Set checkpointer.model_type=LLAMA2"):
        FullModelHFCheckpointer(folder, ["model.safetensors"], "LLAMA3", output_dir=tmp_path / "out")
    with pytest.raises(TuneError, match="Llama 3.1 is LLAMA3"):
        FullModelHFCheckpointer(folder, ["model.safetensors"], "LLAMA3_1", output_dir=tmp_path / "out")


def test_tie_mismatch_between_folder_and_builder_names_the_fix(tmp_path, folders):
    tied_sd = FullModelHFCheckpointer(
        folders / "llama3_2", ["model.safetensors"], "LLAMA3_2", output_dir=tmp_path
    ).load_checkpoint()["model"]
    with pytest.raises(TuneError, match="tie_word_embeddings: true.*tied embeddings"):
        validate_state_dict(_our_model(tied=False), tied_sd)
    untied_sd = FullModelHFCheckpointer(
        folders / "llama3_1", ["model.safetensors"], "LLAMA3", output_dir=tmp_path
    ).load_checkpoint()["model"]
    with pytest.raises(TuneError, match="model.tie_word_embeddings=False"):
        validate_state_dict(_our_model(tied=True), untied_sd)


def test_unsupported_rope_type_and_meta_llama3_2_are_refused(tmp_path, folders):
    folder = tmp_path / "yarn"
    folder.mkdir()
    config = json.loads((folders / "llama3_1" / "config.json").read_text())
    config["rope_parameters"] = {"rope_type": "yarn", "rope_theta": THETA, "factor": 4.0}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "model.safetensors").write_bytes((folders / "llama3_1" / "model.safetensors").read_bytes())
    with pytest.raises(TuneError, match="RoPE of type 'yarn'"):
        FullModelHFCheckpointer(folder, ["model.safetensors"], "LLAMA3", output_dir=tmp_path / "out")
    (folder / "consolidated.00.pth").write_bytes(b"")
    with pytest.raises(TuneError, match="FullModelHFCheckpointer"):
        FullModelMetaCheckpointer(folder, ["consolidated.00.pth"], "LLAMA3_2", output_dir=tmp_path / "out")

"""Every Llama-shaped family against transformers on random tiny configs with its shape features on: the
folder transformers writes loads into our model with the same logits (fp32, 1e-5), and the folder our
checkpointer saves loads back into transformers with the same logits."""

from __future__ import annotations

import json

import pytest
import torch

from tests._helpers.hf_models import BASE, make_hf_folder
from torchtune._errors import TuneError
from torchtune.training import FullModelHFCheckpointer

transformers = pytest.importorskip("transformers")

SEQ = 24

# (model_type, HF config class, our component builder, config.json values, builder-only arguments)
CASES = {
    # head_dim 32 with 4 heads of a 64-wide model: independent of hidden_size / heads, as Qwen3 has it.
    "qwen3_tied": ("QWEN3", "Qwen3Config", "torchtune.models.qwen3.qwen3", dict(head_dim=32, tie_word_embeddings=True)),
    "qwen3_untied_bias": (
        "QWEN3",
        "Qwen3Config",
        "torchtune.models.qwen3.qwen3",
        dict(head_dim=16, tie_word_embeddings=False, attention_bias=True),
    ),
    "qwen2_5_tied": ("QWEN2", "Qwen2Config", "torchtune.models.qwen2_5.qwen2_5", dict(tie_word_embeddings=True)),
    "qwen2_5_untied": ("QWEN2", "Qwen2Config", "torchtune.models.qwen2_5.qwen2_5", dict(tie_word_embeddings=False)),
    # v0.1: a window shorter than the sequence; v0.3: none, and a head_dim of its own (as Mistral Nemo).
    "mistral_window": (
        "MISTRAL",
        "MistralConfig",
        "torchtune.models.mistral.mistral",
        dict(sliding_window=7, tie_word_embeddings=False),
    ),
    "mistral_v0_3": (
        "MISTRAL",
        "MistralConfig",
        "torchtune.models.mistral.mistral",
        dict(sliding_window=None, head_dim=24, tie_word_embeddings=False),
    ),
    "phi4": ("PHI4", "Phi3Config", "torchtune.models.phi4.phi4", dict(sliding_window=None, tie_word_embeddings=False)),
    # torchtune's builders and model_type names for the same folders
    "qwen2": ("QWEN2", "Qwen2Config", "torchtune.models.qwen2.qwen2", dict(tie_word_embeddings=False)),
    "phi3_mini": ("PHI3_MINI", "Phi3Config", "torchtune.models.phi3.phi3", dict(sliding_window=9)),
    "phi4_window": ("PHI4", "Phi3Config", "torchtune.models.phi4.phi4", dict(sliding_window=9)),
}


def _builder_args(config: dict) -> dict:
    args = dict(
        vocab_size=config["vocab_size"],
        num_layers=config["num_hidden_layers"],
        num_heads=config["num_attention_heads"],
        num_kv_heads=config["num_key_value_heads"],
        embed_dim=config["hidden_size"],
        intermediate_dim=config["intermediate_size"],
        max_seq_len=config["max_position_embeddings"],
        norm_eps=config["rms_norm_eps"],
        rope_base=config["rope_theta"],
        tie_word_embeddings=config.get("tie_word_embeddings", False),
    )
    if config.get("head_dim"):
        args["head_dim"] = config["head_dim"]
    if config.get("attention_bias"):
        args["attention_bias"] = True
    if config.get("sliding_window"):
        args["sliding_window"] = config["sliding_window"]
    return args


def _logits_hf(model, tokens):
    with torch.no_grad():
        return model(tokens).logits.float()


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_both_ways(tmp_path, case):
    from torchtune.config._instantiate import import_component

    model_type, config_class, builder, extra = CASES[case]
    hf_model = make_hf_folder(tmp_path / "hf", config_class, extra)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    tokens = torch.randint(0, BASE["vocab_size"], (2, SEQ), generator=torch.Generator().manual_seed(1))

    checkpointer = FullModelHFCheckpointer(
        tmp_path / "hf", ["model.safetensors"], model_type=model_type, output_dir=tmp_path / "out"
    )
    builder_fn = import_component(builder)
    model = builder_fn(**_builder_args({**BASE, **extra, "tie_word_embeddings": config["tie_word_embeddings"]}))
    checkpointer.check_model(model)  # config.json and builder agree
    model.load_state_dict(checkpointer.load_checkpoint()["model"])
    model.eval()
    with torch.no_grad():
        ours = model(tokens)
    expected = _logits_hf(hf_model, tokens)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=1e-5)

    saved = checkpointer.save_checkpoint({"model": model.state_dict()}, epoch=0)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved, attn_implementation="sdpa").float().eval()
    assert type(reloaded).__name__ == config["architectures"][0]
    torch.testing.assert_close(_logits_hf(reloaded, tokens), expected, atol=1e-5, rtol=1e-5)
    # Same tensors and names as transformers wrote, so the folder is theirs.
    from safetensors.torch import load_file

    theirs, mine = (
        load_file(tmp_path / "hf" / "model.safetensors"),
        load_file(saved / "model-00001-of-00001.safetensors"),
    )
    assert sorted(theirs) == sorted(mine)
    assert all(torch.equal(theirs[k], mine[k]) for k in theirs)


def test_sliding_window_changes_logits_past_the_window(tmp_path):
    """The window is really applied: the same weights with full attention give other logits once the
    sequence is longer than the window, and the same ones within it."""
    from torchtune.models.mistral import mistral

    args = _builder_args({**BASE})
    torch.manual_seed(0)
    windowed = mistral(**args, sliding_window=7).eval()
    full = mistral(**args).eval()
    full.load_state_dict(windowed.state_dict())
    tokens = torch.randint(0, BASE["vocab_size"], (1, SEQ))
    with torch.no_grad():
        a, b = windowed(tokens), full(tokens)
    torch.testing.assert_close(a[:, :7], b[:, :7])
    assert not torch.allclose(a[:, 7:], b[:, 7:])


def test_builder_that_does_not_fit_config_is_named_before_loading(tmp_path):
    from torchtune.models.qwen3 import qwen3

    make_hf_folder(tmp_path / "hf", "Qwen3Config", dict(head_dim=32, tie_word_embeddings=True))
    checkpointer = FullModelHFCheckpointer(
        tmp_path / "hf", ["model.safetensors"], model_type="QWEN3", output_dir=tmp_path / "out"
    )
    args = _builder_args({**BASE, "head_dim": 16, "tie_word_embeddings": True})
    with torch.device("meta"):
        model = qwen3(**args)
    with pytest.raises(TuneError, match=r"head_dim: config.json 32, model 16 \(builder argument head_dim\)"):
        checkpointer.check_model(model)


# Phi-4-mini's features on a tiny Phi-3: RoPE on half of each 16-channel head, LongRoPE past 16 tokens.
SHORT, LONG = [1.0, 1.1, 1.3, 1.6], [1.5, 3.0, 7.0, 11.0]
PHI4_MINI = dict(
    tie_word_embeddings=True,
    sliding_window=None,
    partial_rotary_factor=0.5,
    original_max_position_embeddings=16,
    rope_scaling={"type": "longrope", "short_factor": SHORT, "long_factor": LONG},
)


@pytest.mark.parametrize("hub_spelling", [False, True], ids=["transformers5", "hub"])
def test_phi4_mini_partial_rotary_and_longrope_match_transformers(tmp_path, hub_spelling):
    """Both tables (short within the pretraining context, long past it, chosen per call from the largest
    position as transformers does), the cos/sin scale, the unrotated channels, and their weight layout;
    config.json as transformers 5 saves it (rope_parameters) and as the hub has it (rope_scaling)."""
    from torchtune.models.phi4 import phi4

    hf_model = make_hf_folder(tmp_path / "hf", "Phi3Config", PHI4_MINI)
    config_path = tmp_path / "hf" / "config.json"
    if hub_spelling:
        config = json.loads(config_path.read_text())
        config.pop("rope_parameters", None)
        config.update(rope_theta=BASE["rope_theta"], **PHI4_MINI)
        config_path.write_text(json.dumps(config))
    checkpointer = FullModelHFCheckpointer(
        tmp_path / "hf", ["model.safetensors"], model_type="PHI4", output_dir=tmp_path / "out"
    )
    args = _builder_args({**BASE, "tie_word_embeddings": True})
    longrope = dict(rope_short_factor=SHORT, rope_long_factor=LONG, rope_original_max_seq_len=16, rope_scale_factor=4.0)
    model = phi4(**args, rotary_dim=8, **longrope)
    checkpointer.check_model(model)
    model.load_state_dict(checkpointer.load_checkpoint()["model"])
    model.eval()
    tokens = torch.randint(0, BASE["vocab_size"], (2, SEQ), generator=torch.Generator().manual_seed(1))
    for n in (12, SEQ):  # short factors, then long ones
        expected = _logits_hf(hf_model, tokens[:, :n])
        with torch.no_grad():
            torch.testing.assert_close(model(tokens[:, :n]), expected, atol=1e-5, rtol=1e-5)
            positions = torch.arange(n).expand(2, n)  # the table picked on the device, as with packed data
            torch.testing.assert_close(model(tokens[:, :n], input_pos=positions), expected, atol=1e-5, rtol=1e-5)

    saved = checkpointer.save_checkpoint({"model": model.state_dict()}, epoch=0)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved, attn_implementation="sdpa").float().eval()
    torch.testing.assert_close(_logits_hf(reloaded, tokens), _logits_hf(hf_model, tokens), atol=1e-5, rtol=1e-5)

    # a builder without the scaling, or rotating whole heads, is named before any weight is read
    with torch.device("meta"):
        plain = phi4(**args, rotary_dim=8)
        full = phi4(**args, **{**longrope, "rope_short_factor": [1.0] * 8, "rope_long_factor": [2.0] * 8})
    with pytest.raises(TuneError, match=r"rope_scaling / rope_parameters: config.json"):
        checkpointer.check_model(plain)
    with pytest.raises(TuneError, match=r"partial_rotary_factor x head_dim: config.json 8, model none"):
        checkpointer.check_model(full)


def test_phi4_mini_rope_tables_survive_meta_construction():
    """Built on the meta device and given weights with assign=True (as the recipes load), both LongRoPE
    tables are rebuilt by init_buffers: the model computes what one built on the CPU computes."""
    from torchtune.models.phi4 import phi4

    args = dict(
        _builder_args({**BASE, "tie_word_embeddings": True}),
        rotary_dim=8,
        rope_short_factor=SHORT,
        rope_long_factor=LONG,
        rope_original_max_seq_len=16,
        rope_scale_factor=4.0,
    )
    torch.manual_seed(0)
    eager = phi4(**args).eval()
    with torch.device("meta"):
        lazy = phi4(**args)
    lazy.load_state_dict(eager.state_dict(), assign=True)
    lazy.init_buffers(torch.device("cpu"))
    lazy.eval()
    tokens = torch.randint(0, BASE["vocab_size"], (1, SEQ))
    with torch.no_grad():
        assert torch.equal(lazy(tokens), eager(tokens))

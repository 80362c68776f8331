"""Gemma 2 against transformers' Gemma2ForCausalLM on a random tiny config with every feature switched on:
attention-logit and final-logit soft-capping (caps low enough to bend random logits), local layers with a
window shorter than the sequence, a query scale and head_dim of their own, grouped-query attention. And
torchtune 0.6.1's Gemma 2 state dict: refused as it is, loadable for torchtune's numbers."""

from __future__ import annotations

import pytest
import torch

from tests._helpers.hf_models import BASE, hf_logits, make_hf_folder, torchtune_format
from torchtune._errors import ConfigError, TuneError
from torchtune.utils import FullModelHFCheckpointer

transformers = pytest.importorskip("transformers")

EXTRA = dict(
    num_hidden_layers=3,
    head_dim=16,
    query_pre_attn_scalar=24,
    sliding_window=7,
    attn_logit_softcapping=5.0,
    final_logit_softcapping=3.0,
    tie_word_embeddings=True,
)
TOKENS = torch.randint(0, BASE["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(1))


def _gemma2(**overrides):
    from torchtune.models.gemma2 import gemma2

    args = dict(
        vocab_size=BASE["vocab_size"],
        num_layers=EXTRA["num_hidden_layers"],
        num_heads=BASE["num_attention_heads"],
        head_dim=EXTRA["head_dim"],
        num_kv_heads=BASE["num_key_value_heads"],
        embed_dim=BASE["hidden_size"],
        intermediate_dim=BASE["intermediate_size"],
        max_seq_len=BASE["max_position_embeddings"],
        norm_eps=BASE["rms_norm_eps"],
        rope_base=BASE["rope_theta"],
        hidden_capping_value=EXTRA["attn_logit_softcapping"],
        final_capping_value=EXTRA["final_logit_softcapping"],
        sliding_window_size=EXTRA["sliding_window"],
        query_pre_attn_scalar=EXTRA["query_pre_attn_scalar"],
    )
    return gemma2(**{**args, **overrides})


@pytest.fixture(scope="module")
def hf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gemma2") / "hf"
    return folder, make_hf_folder(folder, "Gemma2Config", EXTRA, attn_implementation="eager")


def test_hf_folder_both_ways(hf, tmp_path):
    folder, hf_model = hf
    expected = hf_logits(hf_model, TOKENS)
    checkpointer = FullModelHFCheckpointer(folder, ["model.safetensors"], "GEMMA2", output_dir=tmp_path / "out")
    model = _gemma2()
    checkpointer.check_model(model)
    model.load_state_dict(checkpointer.load_checkpoint()["model"])
    with torch.no_grad():
        torch.testing.assert_close(model.eval()(TOKENS), expected, atol=1e-5, rtol=1e-5)
    saved = checkpointer.save_checkpoint({"model": model.state_dict()}, epoch=0)
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(saved, attn_implementation="eager").float().eval()
    torch.testing.assert_close(hf_logits(reloaded, TOKENS), expected, atol=1e-5, rtol=1e-5)
    # each cap and the window are named when the builder lacks them, before any weight is read
    with torch.device("meta"):
        for wrong, key in (
            (dict(hidden_capping_value=50.0), "attn_logit_softcapping"),
            (dict(final_capping_value=30.0), "final_logit_softcapping"),
            (dict(sliding_window_size=4096), "sliding_window"),
            (dict(soft_cap_hidden_states=True), "capped logits, not hidden states"),
        ):
            with pytest.raises(TuneError, match=key):
                checkpointer.check_model(_gemma2(**wrong))


def test_torchtune_state_dict_is_refused_or_loaded_for_torchtunes_numbers(hf):
    _, hf_model = hf
    expected = hf_logits(hf_model, TOKENS)
    state = torchtune_format(hf_model, interleave=True, gemma2=True)
    with pytest.raises(TuneError, match="soft_cap_hidden_states=True"):
        _gemma2().load_state_dict(state)
    # torchtune's computation: the final cap on the normed hidden states (its numbers, not Gemma 2's)
    torchtune_style = _gemma2(soft_cap_hidden_states=True).eval()
    torchtune_style.load_state_dict(state, strict=True)
    # renamed, the same weights run as Gemma 2
    renamed = {("norm.scale" if k == "norm.rms_norm.scale" else k): v for k, v in state.items()}
    model = _gemma2().eval()
    model.load_state_dict(renamed, strict=True)
    with torch.no_grad():
        torch.testing.assert_close(model(TOKENS), expected, atol=1e-5, rtol=1e-5)
        assert (torchtune_style(TOKENS) - expected).abs().max() > 0.1


def test_window_and_caps_change_the_logits_and_losses_respect_the_cap(hf):
    _, hf_model = hf
    model = _gemma2().eval()
    state = torchtune_format(hf_model, interleave=True, gemma2=True)
    model.load_state_dict({("norm.scale" if k == "norm.rms_norm.scale" else k): v for k, v in state.items()})
    with torch.no_grad():
        capped = model(TOKENS)
    assert capped.abs().max() <= EXTRA["final_logit_softcapping"]
    assert [layer.attn.sliding_window for layer in model.layers] == [7, None, 7]

    from torchtune.modules.loss import CEWithChunkedOutputLoss, ChunkedCrossEntropyLoss, CrossEntropyLoss

    labels = TOKENS.roll(-1, dims=1)
    with torch.no_grad():
        hidden = model(TOKENS, output_hidden_states=True)
        plain = CrossEntropyLoss()(model.output, hidden, labels)
        want = torch.nn.functional.cross_entropy(capped.reshape(-1, capped.size(-1)), labels.reshape(-1))
        torch.testing.assert_close(plain, want)
        torch.testing.assert_close(CEWithChunkedOutputLoss(num_output_chunks=4)(model.output, hidden, labels), want)
        with pytest.raises(ConfigError, match="soft-cap"):
            ChunkedCrossEntropyLoss()(model.output, hidden, labels)


def test_builders():
    from torchtune.models.gemma2 import gemma2_2b, gemma2_27b

    with torch.device("meta"):
        small, large = gemma2_2b(), gemma2_27b()
    attn = small.layers[0].attn
    assert (attn.softcap, small.output.softcap, attn.sliding_window, small.layers[1].attn.sliding_window) == (
        50.0,
        30.0,
        4096,
        None,
    )
    assert large.layers[0].attn.scale == pytest.approx(144**-0.5)

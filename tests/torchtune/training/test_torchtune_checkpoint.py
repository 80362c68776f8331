"""A checkpoint folder torchtune 0.6.1's own recipe wrote (tests/assets/torchtune_061_checkpoint, made by
scripts/make_torchtune_checkpoint.py in a torchtune venv): its weights load here with torchtune's logits,
its base model's ``.bin`` file is read with ``weights_only=True``, and its recipe_state.pt is refused with
the reason."""

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from torchtune import TuneError, training
from torchtune.models.llama2 import llama2

ASSET = Path(__file__).resolve().parents[2] / "assets" / "torchtune_061_checkpoint"
DIMS = dict(vocab_size=1000, num_layers=1, num_heads=2, num_kv_heads=1, embed_dim=16, max_seq_len=64)


def _model_from(folder: Path, files, tmp_path) -> torch.nn.Module:
    checkpointer = training.FullModelHFCheckpointer(
        checkpoint_dir=str(folder), checkpoint_files=files, model_type="LLAMA2", output_dir=str(tmp_path / "out")
    )
    model = llama2(**DIMS, intermediate_dim=32)
    model.load_state_dict(checkpointer.load_checkpoint()["model"])
    return model.eval()


def test_weights_torchtune_trained_give_its_logits(tmp_path):
    expected = torch.load(ASSET / "logits.pt", weights_only=True)
    model = _model_from(ASSET / "epoch_0", expected["files"], tmp_path)
    with torch.no_grad():
        logits = model(expected["tokens"]).float()
    # the same fp32 ops on the same weights: equal up to the order of float additions in the kernels
    torch.testing.assert_close(logits, expected["logits"], rtol=0, atol=1e-5)


def test_the_bin_weights_torchtunes_llama2_configs_download_load_with_weights_only(tmp_path, monkeypatch):
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", spy)
    model = _model_from(ASSET / "base", ["pytorch_model.bin"], tmp_path)
    assert calls and all(c is True for c in calls)
    assert model.tok_embeddings.weight.shape == (1000, 16)


def test_torchtunes_recipe_state_is_refused_with_the_reason(tmp_path):
    cfg = OmegaConf.create(
        {
            "resume_from_checkpoint": True,
            "checkpointer": {"recipe_checkpoint": str(ASSET / "recipe_state.pt"), "checkpoint_dir": str(ASSET)},
        }
    )
    settings = training.RunSettings(
        optimizer_in_bwd=False, batch_size=2, gradient_accumulation_steps=1, seed=1234, max_steps_per_epoch=2, epochs=2
    )
    with pytest.raises(TuneError) as info:
        training.resolve_resume(cfg, settings)
    message = " ".join(str(info.value).split())
    assert "was written by torchtune (after 1 of 2 epochs)" in message
    assert "the position in the data order" in message and "resume_from_checkpoint=False" in message

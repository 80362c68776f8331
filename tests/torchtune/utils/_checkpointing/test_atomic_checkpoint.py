"""Atomic saves, manifests and the Meta checkpointer (no transformers needed).

Resuming is tested in tests/torchtune/training/test_resume.py.
"""

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from torchtune import TuneError
from torchtune.models.llama2 import llama2_tiny, tune_to_hf, tune_to_meta
from torchtune.training import FullModelHFCheckpointer, FullModelMetaCheckpointer
from torchtune.utils._checkpointing import _streaming_write, find_latest_checkpoint, verify_manifest

HEADS, KV_HEADS, DIM = 4, 2, 64  # llama2_tiny


def _tiny_sd(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    return {k: torch.randn_like(v) for k, v in llama2_tiny().state_dict().items()}


@pytest.fixture
def hf_dir(tmp_path) -> Path:
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file(tune_to_hf(_tiny_sd(), num_heads=HEADS, num_kv_heads=KV_HEADS, dim=DIM), folder / "model.safetensors")
    (folder / "config.json").write_text(
        json.dumps({"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS, "hidden_size": DIM})
    )
    (folder / "tokenizer.model").write_bytes(b"not a real tokenizer")
    return folder


def _ckpt(hf_dir, out, **kw):
    return FullModelHFCheckpointer(hf_dir, ["model.safetensors"], output_dir=out, **kw)


# What a save writes: torchtune's numbered shard and its index (the index is how a saved folder is read back).
WEIGHTS = "model-00001-of-00001.safetensors"
INDEX = "model.safetensors.index.json"


def _reload(folder, out):
    return FullModelHFCheckpointer(folder, [INDEX], output_dir=out)


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_save_writes_manifest_and_recipe_state(tmp_path, hf_dir):
    ckpt = _ckpt(hf_dir, tmp_path / "out")
    sd = ckpt.load_checkpoint()["model"]
    assert _equal(sd, _tiny_sd())
    folder = ckpt.save_checkpoint(
        {"model": sd, "step": 3, "optimizer": {"exp_avg": torch.ones(2)}}, epoch=0, step=3, intermediate=True
    )
    manifest = json.loads((folder / "manifest.json").read_text())
    assert (manifest["step"], manifest["epoch"], manifest["intermediate"]) == (3, 0, True)
    assert set(manifest["files"]) == {
        WEIGHTS,
        INDEX,
        "config.json",
        "generation_config.json",  # written when the input has none
        "tokenizer.model",
        "recipe_state.pt",
    }
    assert manifest["files"][WEIGHTS]["size"] == (folder / WEIGHTS).stat().st_size
    verify_manifest(folder)
    # no recipe state keys -> no recipe_state.pt
    assert not (ckpt.save_checkpoint({"model": sd}, epoch=1) / "recipe_state.pt").exists()


def test_disk_full_keeps_previous_checkpoint(tmp_path, hf_dir, monkeypatch):
    out = tmp_path / "out"
    ckpt = _ckpt(hf_dir, out)
    sd = ckpt.load_checkpoint()["model"]
    first = ckpt.save_checkpoint({"model": sd}, epoch=0, step=1, intermediate=True)

    real_write = _streaming_write.HashingFile.write

    def full_disk(self, data):  # the disk fills up in the middle of the weights file
        if self.size > 1000:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        return real_write(self, data)

    monkeypatch.setattr(_streaming_write.HashingFile, "write", full_disk)
    for step in (2, 1):  # a new step, and a re-save of the existing one
        with pytest.raises(TuneError, match="disk is full") as e:
            ckpt.save_checkpoint({"model": sd}, epoch=0, step=step, intermediate=True)
        assert "previous checkpoint" in str(e.value)
        assert sorted(p.name for p in out.iterdir()) == ["step_1"]  # no temp folder left, no step_2
        verify_manifest(first)
    monkeypatch.undo()
    assert _equal(_reload(first, tmp_path / "out2").load_checkpoint()["model"], sd)


def test_resave_replaces_and_leftovers_are_cleaned(tmp_path, hf_dir):
    out = tmp_path / "out"
    ckpt = _ckpt(hf_dir, out)
    ckpt.save_checkpoint({"model": _tiny_sd(0)}, epoch=0, step=1, intermediate=True)
    crashed = out / ".tmp-step_2-12345"
    crashed.mkdir()
    (crashed / "model.safetensors").write_bytes(b"half")
    assert find_latest_checkpoint(out) == out / "step_1"
    folder = ckpt.save_checkpoint({"model": _tiny_sd(1)}, epoch=0, step=1, intermediate=True)
    assert sorted(p.name for p in out.iterdir()) == ["step_1"]
    assert _equal(_reload(folder, tmp_path / "o2").load_checkpoint()["model"], _tiny_sd(1))


@pytest.mark.parametrize("damage", ["truncate", "corrupt"])
def test_damaged_file_is_caught_and_previous_suggested(tmp_path, hf_dir, damage):
    out = tmp_path / "out"
    ckpt = _ckpt(hf_dir, out)
    sd = ckpt.load_checkpoint()["model"]
    ckpt.save_checkpoint({"model": sd}, epoch=0, step=1, intermediate=True)
    second = ckpt.save_checkpoint({"model": sd}, epoch=0, step=2, intermediate=True)
    weights = second / WEIGHTS
    data = bytearray(weights.read_bytes())
    if damage == "truncate":
        weights.write_bytes(bytes(data[: len(data) // 2]))
    else:
        data[-10] ^= 0xFF
        weights.write_bytes(bytes(data))
    with pytest.raises(TuneError, match="truncated" if damage == "truncate" else "corrupted") as e:
        _reload(second, tmp_path / "o2").load_checkpoint()
    assert str(weights) in str(e.value) and str(out / "step_1") in str(e.value)


def test_meta_round_trip(tmp_path):
    folder = tmp_path / "meta"
    folder.mkdir()
    meta_sd = tune_to_meta(_tiny_sd())
    meta_sd["rope.freqs"] = torch.ones(8)
    torch.save(meta_sd, folder / "consolidated.00.pth")
    (folder / "params.json").write_text(json.dumps({"dim": DIM, "n_heads": HEADS}))
    ckpt = FullModelMetaCheckpointer(folder, ["consolidated.00.pth"], output_dir=tmp_path / "out")
    sd = ckpt.load_checkpoint()["model"]
    assert _equal(sd, _tiny_sd())
    model = llama2_tiny()
    model.load_state_dict(sd)
    saved = ckpt.save_checkpoint({"model": model.state_dict()}, epoch=2)
    assert {p.name for p in saved.iterdir()} == {"consolidated.00.pth", "params.json", "manifest.json"}
    again = FullModelMetaCheckpointer(saved, "consolidated.00.pth", output_dir=tmp_path / "out2").load_checkpoint()
    assert _equal(again["model"], sd)

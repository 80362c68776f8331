"""Loads check sizes always; checksums before the load or in a background thread (verify_checksums)."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch
from safetensors.torch import save_file

from torchtune import TuneError
from torchtune.utils._checkpointing import _manifest
from torchtune.utils._checkpointing._atomic import write_folder_atomically
from torchtune.utils._checkpointing._manifest import verify_checkpoint_files


@pytest.fixture
def folder(tmp_path):
    def write(tmp):
        save_file({"w": torch.arange(4096, dtype=torch.float32)}, tmp / "model.safetensors")
        (tmp / "config.json").write_text("{}")

    return write_folder_atomically(tmp_path / "step_2", write, step=2, epoch=0, intermediate=True)


def _flip_middle_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_background_check_finds_a_corrupted_file_after_loading(folder, monkeypatch):
    _flip_middle_byte(folder / "model.safetensors")
    hashed = []
    real = _manifest.file_digest
    monkeypatch.setattr(_manifest, "file_digest", lambda p, *a: hashed.append(p.name) or real(p, *a))
    job = verify_checkpoint_files(folder, ["model.safetensors", "config.json"], "background")
    assert job is not None  # returns at once: the sizes are right
    with pytest.raises(TuneError, match=r"model\.safetensors does not match the checksum .*corrupted"):
        job.check(wait=True)
    assert job.done and "model.safetensors" in hashed
    with pytest.raises(TuneError, match="corrupted"):  # and keeps saying so
        job.check()


def test_before_load_hashes_first_and_sizes_are_always_checked(folder):
    verify_checkpoint_files(folder, ["model.safetensors"], "before_load")  # intact: no error, no job
    assert verify_checkpoint_files(folder, ["model.safetensors"], "background").check(wait=True) is None
    _flip_middle_byte(folder / "model.safetensors")
    with pytest.raises(TuneError, match="corrupted"):
        verify_checkpoint_files(folder, ["model.safetensors"], "before_load")
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-10])
    for mode in ("before_load", "background"):
        with pytest.raises(TuneError, match=r"has \d+ bytes but was saved with \d+ \(truncated\?\)"):
            verify_checkpoint_files(folder, ["model.safetensors"], mode)


def test_unknown_mode_names_the_key(folder):
    with pytest.raises(TuneError, match="checkpointer.verify_checksums='sometimes'.*before_load.*background"):
        verify_checkpoint_files(folder, ["model.safetensors"], "sometimes")


def test_a_folder_without_manifest_has_nothing_to_check(tmp_path):
    save_file({"w": torch.zeros(3)}, tmp_path / "model.safetensors")
    assert verify_checkpoint_files(tmp_path, ["model.safetensors"], "background") is None


def test_format_1_manifests_are_verified_with_sha256(folder):
    """Checkpoints written before XXH3 (manifest format 1, sha256 entries) still load and verify."""
    manifest_path = folder / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    assert manifest["format_version"] == 2 and all("xxh3_128" in e for e in manifest["files"].values())
    manifest["format_version"] = 1
    manifest["files"] = {
        name: {"size": e["size"], "sha256": hashlib.sha256((folder / name).read_bytes()).hexdigest()}
        for name, e in manifest["files"].items()
    }
    manifest_path.write_text(json.dumps(manifest))
    verify_checkpoint_files(folder, ["model.safetensors", "config.json"], "before_load")
    _flip_middle_byte(folder / "model.safetensors")
    with pytest.raises(TuneError, match="corrupted"):
        verify_checkpoint_files(folder, ["model.safetensors"], "before_load")

"""Saves stream tensor by tensor and hash while writing: same bytes for readers, one pass, bounded memory."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import xxhash
from safetensors.torch import load_file, save_file

from torchtune.models.llama2 import llama2, scale_hidden_dim_for_mlp, tune_to_hf
from torchtune.training import FullModelHFCheckpointer
from torchtune.training.estimate._memory_estimator import StorageCounter
from torchtune.utils._checkpointing import _manifest
from torchtune.utils._checkpointing._streaming_write import (
    HashingFile,
    safetensors_order,
    save_torch,
    write_safetensors,
)

HEADS, KV_HEADS, DIM, LAYERS, VOCAB = 4, 2, 64, 3, 256


def _model_sd(seed: int = 0, dtype=torch.float32) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    model = llama2(
        vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM, max_seq_len=64
    )
    return {k: torch.randn_like(v, dtype=dtype) for k, v in model.state_dict().items()}


@pytest.fixture
def hf_dir(tmp_path) -> Path:
    folder = tmp_path / "base"
    folder.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": DIM,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "num_hidden_layers": LAYERS,
        "intermediate_size": scale_hidden_dim_for_mlp(DIM),
        "vocab_size": VOCAB,
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "torch_dtype": "float32",
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file(tune_to_hf(_model_sd(), num_heads=HEADS, num_kv_heads=KV_HEADS, dim=DIM), folder / "model.safetensors")
    return folder


def _ckpt(folder: Path, out: Path) -> FullModelHFCheckpointer:
    return FullModelHFCheckpointer(folder, ["model.safetensors"], model_type="LLAMA2", output_dir=out)


def _xxh3(data: bytes) -> str:
    return xxhash.xxh3_128(data).hexdigest()


@pytest.mark.parametrize("size", [0, 100, 3 << 20, (8 << 20) + 5])
def test_hashing_file_hashes_what_it_writes(tmp_path, size):
    data = torch.randint(0, 256, (size,), dtype=torch.uint8).numpy().tobytes()
    with HashingFile(tmp_path / "f") as f:
        f.write(b"head")
        f.write(data)
    on_disk = (tmp_path / "f").read_bytes()
    assert on_disk == b"head" + data
    assert f.size == len(on_disk) and f.digest == _xxh3(on_disk)


def test_streamed_safetensors_read_back_as_written(tmp_path):
    tensors = {
        "a.bf16": torch.randn(3, 5).to(torch.bfloat16),
        "b.f32": torch.randn(7),
        "c.scalar": torch.tensor(2.5, dtype=torch.float64),
        "d.empty": torch.empty(0, 4),
        "e.int": torch.arange(9, dtype=torch.int32).reshape(3, 3),
        "f.bool": torch.tensor([True, False, True]),
    }
    specs = safetensors_order((k, t.dtype, t.shape) for k, t in tensors.items())
    written = write_safetensors(tmp_path / "x.safetensors", specs, (tensors[k] for k, _, _ in specs))
    back = load_file(tmp_path / "x.safetensors")
    assert back.keys() == tensors.keys()
    for k, t in tensors.items():
        assert back[k].dtype == t.dtype and torch.equal(back[k], t), k
    assert written.digest == _xxh3((tmp_path / "x.safetensors").read_bytes())

    with pytest.raises(ValueError, match="announced as"):
        write_safetensors(tmp_path / "y.safetensors", specs, (torch.zeros(1) for _ in specs))


def test_save_torch_hashes_the_file(tmp_path):
    obj = {"state": {0: {"exp_avg": torch.randn(300, 300)}}, "step": 3}
    written = save_torch(obj, tmp_path / "r.pt")
    assert written.digest == _xxh3((tmp_path / "r.pt").read_bytes())
    assert torch.equal(
        torch.load(tmp_path / "r.pt", weights_only=True)["state"][0]["exp_avg"], obj["state"][0]["exp_avg"]
    )


def test_save_reads_no_weight_file_back_and_manifest_is_right(tmp_path, hf_dir, monkeypatch):
    ckpt = _ckpt(hf_dir, tmp_path / "out")
    sd = ckpt.load_checkpoint()["model"]
    hashed_after_write = []
    real = _manifest.file_digest
    monkeypatch.setattr(_manifest, "file_digest", lambda p, *a: hashed_after_write.append(Path(p).name) or real(p, *a))
    recipe_state = {"optimizer": {"state": {0: {"exp_avg": torch.randn(64, 64)}}}, "global_step": 1}
    folder = ckpt.save_checkpoint({"model": sd, **recipe_state}, epoch=0, step=1, intermediate=True)
    # only the small side files are hashed after writing; the weights and recipe state were hashed in passing
    assert "model-00001-of-00001.safetensors" not in hashed_after_write and "recipe_state.pt" not in hashed_after_write
    assert "config.json" in hashed_after_write
    monkeypatch.undo()
    manifest = json.loads((folder / "manifest.json").read_text())
    for name, entry in manifest["files"].items():
        data = (folder / name).read_bytes()
        assert entry == {"size": len(data), "xxh3_128": _xxh3(data)}, name
    # the file holds exactly the HF tensors a one-shot conversion gives
    expected = tune_to_hf(sd, num_heads=HEADS, num_kv_heads=KV_HEADS, dim=DIM)
    back = load_file(folder / "model-00001-of-00001.safetensors")
    assert back.keys() == expected.keys() and all(torch.equal(back[k], expected[k]) for k in expected)


def test_save_needs_at_most_one_tensor_of_extra_memory(tmp_path, hf_dir):
    """Every new storage a save makes, counted by the estimator's counter on real tensors: on this CPU
    the q/k permutation's copy is the only one, one tensor at a time (converting the whole state dict
    first, as before, held every q/k copy at once: 2 x LAYERS tensors)."""
    ckpt = _ckpt(hf_dir, tmp_path / "out")
    model = llama2(
        vocab_size=VOCAB, num_layers=LAYERS, num_heads=HEADS, num_kv_heads=KV_HEADS, embed_dim=DIM, max_seq_len=64
    )
    model.load_state_dict(ckpt.load_checkpoint()["model"])
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    optimizer.step()
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    q_proj = model.layers[0].attn.q_proj.weight
    counter = StorageCounter()
    for t in [*model.state_dict().values(), *(v for s in optimizer.state.values() for v in s.values())]:
        counter.track(t)  # what the run holds anyway: weights and optimizer state
    held = counter.current
    with counter:
        ckpt.save_checkpoint(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, epoch=0, step=1, intermediate=True
        )
    extra = counter.peak - held
    assert 0 < extra <= -(-largest // 512) * 512
    assert extra >= q_proj.numel() * q_proj.element_size()  # the one permuted copy was counted

"""Per-rank host memory of a sharded load and of the final save stays at the rank's shards plus about one
tensor, for a model several times that bound (2 processes over gloo).

Each process measures its own resident set (``VmHWM``, the peak, reset through ``/proc/self/clear_refs``
right before the measured call; file pages of the memory-mapped checkpoint count too) as a delta around
the load and around the save only. glibc is told to give every large block back to the system when it is
freed (``MALLOC_MMAP_THRESHOLD_``): what is measured is what the code keeps alive, not what the allocator
keeps cached. The saved folder must hold exactly the input's tensors (load and save are exact).
"""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path

import torch
import torch.multiprocessing as mp

from torchtune.models.llama2 import llama2

# ~201 MB of fp32 weights; the largest tensors (w1/w2/w3) are 16 MB, the q/k projections 4 MB
SHAPE = dict(vocab_size=512, num_layers=3, num_heads=8, num_kv_heads=8, embed_dim=1024, intermediate_dim=4096)
MB = 2**20
LARGEST = 4096 * 1024 * 4
# what a rank may hold beyond its shards while loading or saving: one full tensor gathered or read,
# its converted copy and buffers; a quarter of the model
BUDGET = 3 * LARGEST


def _hf_config() -> dict:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": SHAPE["vocab_size"],
        "hidden_size": SHAPE["embed_dim"],
        "intermediate_size": SHAPE["intermediate_dim"],
        "num_hidden_layers": SHAPE["num_layers"],
        "num_attention_heads": SHAPE["num_heads"],
        "num_key_value_heads": SHAPE["num_kv_heads"],
        "max_position_embeddings": 64,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def _write_folder(folder: Path) -> int:
    from safetensors.torch import save_file

    from torchtune.models.llama2._convert_weights import tune_to_hf

    folder.mkdir()
    torch.manual_seed(0)
    model = llama2(**SHAPE, max_seq_len=64)
    state = tune_to_hf(model.state_dict(), SHAPE["num_heads"], SHAPE["num_kv_heads"], SHAPE["embed_dim"])
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(_hf_config()))
    return sum(t.numel() * t.element_size() for t in state.values())


def _status(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def _peak_delta(fn) -> int:
    """Peak resident bytes above the level before ``fn`` ran."""
    before = _status("VmRSS")
    try:
        Path("/proc/self/clear_refs").write_text("5")  # the peak restarts from the current level
    except OSError:  # kernel without it: sample instead (may miss a short peak)
        return _sampled_peak_delta(fn, before)
    fn()
    return _status("VmHWM") - before


def _sampled_peak_delta(fn, before: int) -> int:
    peak, done = [before], threading.Event()

    def sample():
        while not done.is_set():
            peak[0] = max(peak[0], _status("VmRSS"))
            done.wait(0.0005)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(peak[0], _status("VmRSS")) - before


def _rank(rank: int, port: int, folder: str, out: str, results: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    from torchtune import training
    from torchtune.training import FullModelHFCheckpointer

    info = training.init_distributed("cpu")
    try:
        with torch.device("meta"):
            model = llama2(**SHAPE, max_seq_len=64)
        training.shard_model(model, mesh=info.mesh)
        checkpointer = FullModelHFCheckpointer(folder, ["model.safetensors"], output_dir=out)
        load = _peak_delta(
            lambda: training.load_sharded_weights(model, checkpointer.open_weights(), device=torch.device("cpu"))
        )
        shards = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
        save = _peak_delta(lambda: training.save_full_weights(model, checkpointer, info, epoch=0, step=1))
        Path(results, f"{rank}.json").write_text(json.dumps({"load": load, "shards": shards, "save": save}))
    finally:
        training.destroy_distributed()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_load_and_final_save_hold_one_tensor_beyond_the_shards(tmp_path, monkeypatch):
    model_bytes = _write_folder(tmp_path / "hf")
    assert model_bytes > 4 * BUDGET  # the model is several times what a rank may add
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", str(128 * 1024))  # read by the spawned processes' glibc
    (tmp_path / "results").mkdir()
    mp.spawn(
        _rank,
        args=(_free_port(), str(tmp_path / "hf"), str(tmp_path / "out"), str(tmp_path / "results")),
        nprocs=2,
        join=True,
    )
    results = [json.loads((tmp_path / "results" / f"{r}.json").read_text()) for r in range(2)]
    report = ", ".join(
        f"rank {r}: load {m['load'] / MB:.0f} MB (shards {m['shards'] / MB:.0f} MB), save {m['save'] / MB:.0f} MB"
        for r, m in enumerate(results)
    )
    for m in results:
        assert m["shards"] <= model_bytes / 2 + MB, report
        assert m["load"] - m["shards"] <= BUDGET, report
        assert m["save"] <= BUDGET, report

    from safetensors.torch import load_file

    before = load_file(tmp_path / "hf" / "model.safetensors")
    after = load_file(tmp_path / "out" / "epoch_0" / "model-00001-of-00001.safetensors")
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)

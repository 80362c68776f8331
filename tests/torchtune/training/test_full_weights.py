"""The streamed final save on 2 gloo processes when rank 0's writer fails mid-stream (a full disk after
the first tensor): every rank leaves the stream and raises the same error, none waits in a gather, and
nothing is left under the checkpoint's name."""

from __future__ import annotations

import errno
import json
import os
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp

from tests.torchtune.training.test_host_memory_scaling import _free_port, _hf_config
from torchtune.models.llama2 import llama2

SHAPE = dict(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, intermediate_dim=48)


def _write_folder(folder: Path) -> None:
    from safetensors.torch import save_file

    from torchtune.models.llama2._convert_weights import tune_to_hf

    folder.mkdir()
    torch.manual_seed(0)
    state = tune_to_hf(llama2(**SHAPE, max_seq_len=16).state_dict(), 4, 2, 32)
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = _hf_config()
    config.update(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2)
    config.update(num_attention_heads=4, num_key_value_heads=2)
    (folder / "config.json").write_text(json.dumps(config))


def _full_disk_after_one_tensor(path, specs, tensors):
    next(iter(tensors))  # one tensor was gathered and converted
    raise OSError(errno.ENOSPC, "No space left on device", str(path))


def _rank(rank: int, port: int, folder: str, out: str, results: str) -> None:
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1")
    os.environ["MASTER_PORT"] = str(port)
    from torchtune import training
    from torchtune.training import FullModelHFCheckpointer
    from torchtune.training.checkpointing import _checkpointer

    _checkpointer._write_safetensors_file = _full_disk_after_one_tensor
    info = training.init_distributed("cpu")
    try:
        with torch.device("meta"):
            model = llama2(**SHAPE, max_seq_len=16)
        training.shard_model(model, mesh=info.mesh)
        checkpointer = FullModelHFCheckpointer(folder, ["model.safetensors"], output_dir=out)
        training.load_sharded_weights(model, checkpointer.open_weights(), device=torch.device("cpu"))
        try:
            training.save_full_weights(model, checkpointer, info, epoch=0, step=1)
            outcome = "saved"
        except training.RankErrors as exc:
            outcome = str(exc)
        Path(results, f"{rank}.txt").write_text(outcome)
    finally:
        training.destroy_distributed()


def test_a_failed_write_on_rank_0_ends_every_rank_with_its_message(tmp_path):
    _write_folder(tmp_path / "hf")
    (tmp_path / "results").mkdir()
    args = (_free_port(), str(tmp_path / "hf"), str(tmp_path / "out"), str(tmp_path / "results"))
    context = mp.start_processes(_rank, args=args, nprocs=2, join=False, start_method="spawn")
    deadline = time.monotonic() + 120
    while not context.join(timeout=5):
        if time.monotonic() > deadline:  # a rank left waiting in a gather: fail instead of hanging
            for process in context.processes:
                process.kill()
            raise AssertionError("a rank did not finish within 120 s after rank 0's write failed")
    messages = [(tmp_path / "results" / f"{r}.txt").read_text() for r in range(2)]
    assert messages[0] == messages[1], messages
    assert "Writing the full weights failed on rank 0" in messages[0] and "the disk is full" in messages[0]
    assert not (tmp_path / "out" / "epoch_0").exists()
    assert not [p.name for p in (tmp_path / "out").iterdir() if p.name.startswith(".tmp-")]

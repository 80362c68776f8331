"""The recipe's set-up checks the cheap things first: a data set that does not fit (a missing column) is
reported before any weight is read, so a 7B run fails in seconds instead of after minutes of loading; the
checkpoint's headers are checked before its weights, and `tune validate` reads the headers only."""

from __future__ import annotations

import ctypes
import json
import mmap
import os

import pytest
import torch
from omegaconf import OmegaConf

from tests._helpers.tiny_run import build_recipe
from torchtune import config, training
from torchtune._assets import asset_path
from torchtune._cli.tune import main
from torchtune._errors import TuneError
from torchtune.training import FullModelHFCheckpointer
from torchtune.training.estimate._checkpoint_memory import write_hf_folder

READS: list[str] = []


class RecordingCheckpointer(FullModelHFCheckpointer):
    """The real HF checkpointer, recording each time it reads the weights or their headers."""

    def check_headers(self, model):
        READS.append("headers")
        return super().check_headers(model)

    def load_checkpoint(self):
        READS.append("weights")
        return super().load_checkpoint()


def test_missing_data_column_is_reported_before_any_weight_is_read(tmp_path):
    rows = [{"instruction": f"Say {i}", "input": "", "output": f"{i}"} for i in range(40)]
    data = tmp_path / "data.json"
    data.write_text(json.dumps([{k: v for k, v in row.items() if k != "output"} for row in rows]))
    cfg = config.load_config("llama2/tiny_full")
    overrides = {
        "output_dir": str(tmp_path / "out"),
        "checkpointer._component_": f"{__name__}.RecordingCheckpointer",
        "dataset.data_files": str(data),
        "validation_dataset": None,
        "eval_every_n_steps": None,
        "log_peak_memory_stats": False,
    }
    READS.clear()
    with pytest.raises(TuneError, match="output"):
        build_recipe(cfg, **overrides)
    assert READS == []  # the column error came first

    data.write_text(json.dumps(rows))  # the same set-up with the column reads the headers, then the weights once
    build_recipe(cfg, **overrides)
    assert READS == ["headers", "weights"]


def _resident_bytes(path) -> int:
    """Bytes of ``path`` in the page cache (mincore): what has been read of it, by read() or a memory map."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        mapping = mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)
    pages = (ctypes.c_ubyte * ((size + mmap.PAGESIZE - 1) // mmap.PAGESIZE))()
    anchor = ctypes.c_char.from_buffer(mapping)
    rc = libc.mincore(ctypes.addressof(anchor), size, pages)
    del anchor
    mapping.close()
    assert rc == 0, os.strerror(ctypes.get_errno())
    return sum(p & 1 for p in pages) * mmap.PAGESIZE


def test_1b_checkpoint_missing_column_before_any_read_and_validate_reads_headers_only(tmp_path):
    """Llama 3.2 1B's shapes (2.5 GB of bf16 weights, as a hole): the run's set-up reports a missing data column
    without opening the weights; `tune validate` with the column checks all 1B headers against the model
    and reads none of the 2.5 GB (measured in the page cache)."""
    cfg = config.load_config("llama3_2/1B_full_single_device")
    # a Hugging Face folder of the 1B's real size whose weights are a hole (a sparse file: no disk used);
    # reading its weights would bring gigabytes into the page cache
    skeleton = training.model_skeleton(cfg.model, dtype=torch.bfloat16)
    weights = write_hf_folder(skeleton, tmp_path / "Llama-3.2-1B", "LLAMA3_2")
    assert os.path.getsize(weights) > 2_400_000_000
    rows = [{"instruction": f"Say {i}", "input": "", "output": f"{i}"} for i in range(40)]
    data = tmp_path / "data.json"
    data.write_text(json.dumps([{k: v for k, v in row.items() if k != "output"} for row in rows]))
    overrides = {
        "output_dir": str(tmp_path / "out"),
        "device": "cpu",
        "tokenizer": {  # the demo tokenizer: the 1B's own is a download (its 1,000 ids fit the 128,256 rows)
            "_component_": "torchtune.models.llama2.llama2_tokenizer",
            "path": asset_path("demo/tokenizer.model"),
            "max_seq_len": None,
        },
        "dataset.source": "json",
        "dataset.data_files": str(data),
        "checkpointer._component_": f"{__name__}.RecordingCheckpointer",
        "checkpointer.checkpoint_dir": str(weights.parent),
    }
    READS.clear()
    with pytest.raises(TuneError, match="has no column"):
        build_recipe(cfg, **overrides)
    assert READS == []
    assert _resident_bytes(weights) < 1_000_000  # the header's pages at most

    data.write_text(json.dumps(rows))
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value, merge=False)
    mine = tmp_path / "1B.yaml"
    OmegaConf.save(cfg, mine, resolve=True)
    assert main(["validate", str(mine), "--recipe", "full_finetune_single_device"]) == 0
    assert READS == ["headers"]
    assert _resident_bytes(weights) < 10_000_000  # the header (~20 kB) and read-ahead; the weights are 2.5 GB


def test_distributed_recipe_checks_the_data_before_any_weight_is_read(tmp_path):
    """The distributed recipe's set-up runs in the single-device order (as a world of one process here;
    test_full_finetune_distributed checks that two ranks stop with one message)."""
    from recipes.full_finetune_distributed import FullFinetuneRecipeDistributed

    rows = [{"instruction": f"Say {i}", "input": "", "output": f"{i}"} for i in range(8)]
    data = tmp_path / "data.json"
    data.write_text(json.dumps([{k: v for k, v in row.items() if k != "output"} for row in rows]))
    cfg = config.load_config("llama2/tiny_full_distributed")
    cfg.output_dir = str(tmp_path / "out")
    cfg.checkpointer._component_ = f"{__name__}.RecordingCheckpointer"
    cfg.dataset.data_files = str(data)
    READS.clear()
    recipe = FullFinetuneRecipeDistributed(cfg)
    try:
        with pytest.raises(TuneError, match=r"has no column\(s\) 'output'"):
            recipe.setup()
    finally:
        recipe.cleanup()
    assert READS == []

"""The recipe's set-up checks the cheap things first: a data set that does not fit (a missing column) is
reported before any weight is read, so a 7B run fails in seconds instead of after minutes of loading."""

from __future__ import annotations

import json

import pytest

from tests._helpers.tiny_run import build_recipe
from torchtune import config
from torchtune._errors import TuneError
from torchtune.utils import FullModelHFCheckpointer

READS: list[str] = []


class RecordingCheckpointer(FullModelHFCheckpointer):
    """The real HF checkpointer, recording each time it reads the weights."""

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

    data.write_text(json.dumps(rows))  # the same set-up with the column reads the weights once
    build_recipe(cfg, **overrides)
    assert READS == ["weights"]


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

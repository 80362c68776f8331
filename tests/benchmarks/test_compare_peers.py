"""benchmarks/compare_peers.py's pieces that run without the peers' venvs: the dtype it picks (and says
why), the whole-epoch summary, and our side of the comparison's config."""

import argparse

import pytest

from benchmarks import compare_peers


def test_dtype_auto_says_why():
    assert compare_peers.resolve_dtype("auto", "cuda") == ("bf16", "auto: CUDA")
    dtype, why = compare_peers.resolve_dtype("auto", "cpu")
    assert dtype in ("bf16", "fp32") and why.startswith("auto")
    assert compare_peers.resolve_dtype("fp32", "cpu") == ("fp32", "as asked (--dtype)")


def test_summary_is_trained_tokens_over_the_whole_epoch():
    runs = [
        {"setup_s": 2.0, "epoch_wall_s": 10.0, "epoch_cpu_s": 5.0, "steps": 2, "trained": [30, 70],
         "positions": [100, 100], "real": [90, 100]},
        {"setup_s": 4.0, "epoch_wall_s": 20.0, "epoch_cpu_s": 5.0, "steps": 2, "trained": [30, 70],
         "positions": [100, 100], "real": [90, 100]},
        {"setup_s": 3.0, "epoch_wall_s": 12.5, "epoch_cpu_s": 4.0, "steps": 2, "trained": [30, 70],
         "positions": [100, 100], "real": [90, 100]},
    ]  # fmt: skip
    s = compare_peers.summarize(runs)
    assert s["tok_s"] == pytest.approx(100 / 12.5)  # the median run, not the mean of steps
    assert s["tok_cpu_s"] == pytest.approx(100 / 5.0)
    assert s["padding"] == pytest.approx(0.05)
    assert s["setup_s"] == 3.0


def test_our_config_runs_a_whole_epoch_with_the_best_settings(tmp_path):
    args = argparse.Namespace(size="tiny", batch_size=4, seq_len=512, device="cpu", dtype="fp32", compile=False)
    assets = {"data": tmp_path / "d.json", "tokenizer": tmp_path / "t.model", "checkpoint": tmp_path / "ckpt"}
    cfg = compare_peers.recipe_config("ours", assets, tmp_path / "out", args)
    assert cfg["max_steps_per_epoch"] is None and cfg["epochs"] == 1
    assert cfg["dataset"]["packed"] is True and cfg["dataset"]["train_on_input"] is False
    assert cfg["optimizer_in_bwd"] is True and cfg["optimizer_in_bwd_group"] == "layer"
    assert cfg["loss"]["_component_"].endswith("ChunkedCrossEntropyLoss")

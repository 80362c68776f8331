"""benchmarks/gpu_memory_check.py in its CPU smoke mode: every phase of the real run (set-up, steps,
step checkpoint save, resume load, one more step) on a tiny model, with the estimate beside each."""

import json

import pytest
import torch

from benchmarks import gpu_memory_check

SMOKE = ["--model", "tiny", "--device", "cpu", "--dtype", "fp32", "--optimizer", "torch.optim.AdamW"]
SMOKE += ["--steps", "2", "--seq-len", "32"]


def test_cpu_smoke_runs_every_phase(tmp_path, capsys):
    out = tmp_path / "phases.jsonl"
    gpu_memory_check.main([*SMOKE, "--output-dir", str(tmp_path / "work"), "--json", str(out)])
    printed = capsys.readouterr().out
    results = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["phase"] for r in results] == [
        "set-up (load weights)",
        "training steps",
        "step checkpoint save",
        "resume load",
        "one more step",
    ]
    for r in results:
        assert r["host_peak_rss_gb"] > 0 and r["estimated_device_peak_gb"] > 0
        assert "torch_peak_allocated_gb" not in r  # no CUDA: no PyTorch device counters, no ballast
        assert r["phase"] in printed
    steps, resumed = results[1], results[4]
    assert steps["tokens_per_second"] > 0
    assert torch.isfinite(torch.tensor([steps["last_loss"], resumed["last_loss"]])).all()
    # the resume read a real step checkpoint: weights in HF format and the recipe state
    (folder,) = (tmp_path / "work" / "output").glob("step_*")
    assert (folder / "model-00001-of-00001.safetensors").stat().st_size > 0
    assert (folder / "recipe_state.pt").stat().st_size > 0


def test_unknown_model_is_a_usage_error():
    with pytest.raises(SystemExit):
        gpu_memory_check.main(["--model", "huge"])

"""On a real GPU: benchmarks/gpu_memory_check.py under a ballast cap, on a small model, in seconds.

Run with ``make test-gpu``; skipped with the reason where PyTorch sees no CUDA GPU.
"""

import json

import pytest
import torch

from benchmarks import gpu_memory_check

pytestmark = pytest.mark.gpu


def test_ballast_leaves_the_asked_memory_and_every_phase_reports(tmp_path):
    leave_gb = 4.0
    out = tmp_path / "phases.jsonl"
    gpu_memory_check.main(
        ["--model", "tiny", "--optimizer", "torch.optim.AdamW", "--steps", "3", "--seq-len", "64", "--leave-gb"]
        + [str(leave_gb), "--output-dir", str(tmp_path / "work"), "--json", str(out)]
    )
    results = [json.loads(line) for line in out.read_text().splitlines()]
    total = torch.cuda.get_device_properties(0).total_memory / 1e9
    for r in results:
        # the ballast took all but leave_gb of the card (the context is inside those leave_gb)
        assert r["ballast_gb"] == pytest.approx(total - leave_gb, abs=0.5)
        assert 0 <= r["torch_peak_allocated_gb"] <= r["torch_peak_reserved_gb"] < leave_gb
        assert 0 < r["driver_peak_in_use_gb"] < leave_gb + 0.1  # the context and the run, without the ballast
    assert results[1]["tokens_per_second"] > 0

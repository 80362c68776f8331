"""The flagship recipe's GPU path through the real `tune` command: bf16 on CUDA with checkpointing,
offloading, optimizer in backward (PagedAdamW where bitsandbytes is installed) and memory stats that
include the driver's sampled peak.

Run with ``make test-gpu``; skipped with the reason where PyTorch sees no CUDA GPU.
"""

import importlib.util
import math
from pathlib import Path

import pytest

from tests._helpers.tiny_run import make_tiny_run, read_losses, run_tune

pytestmark = pytest.mark.gpu

FLAGSHIP = [
    "epochs=1",
    "max_steps_per_epoch=4",
    "optimizer_in_bwd=True",
    "enable_activation_checkpointing=True",
    "enable_activation_offloading=True",
    "loss._component_=torchtune.modules.loss.ChunkedCrossEntropyLoss",
    "+loss.num_output_chunks=4",
    "log_peak_memory_stats=True",
]


def test_tune_run_on_cuda_in_bf16_matches_the_cpu_run_and_reports_the_driver_peak(tmp_path):
    config = make_tiny_run(tmp_path, model_dims=dict(embed_dim=256, num_heads=8, num_kv_heads=8))
    paged = importlib.util.find_spec("bitsandbytes") is not None
    optimizer = "bitsandbytes.optim.PagedAdamW" if paged else "torch.optim.AdamW"
    runs = {}
    for name, overrides in {
        "cuda": ["device=cuda", "dtype=bf16", f"optimizer._component_={optimizer}"],
        "cpu": ["device=cpu", "dtype=fp32", "optimizer._component_=torch.optim.AdamW"],
    }.items():
        out = tmp_path / name
        result = run_tune(
            ["run", "full_finetune_single_device", "--config", str(config), f"output_dir={out}", *FLAGSHIP, *overrides],
            timeout=600,
        )
        assert result.returncode == 0, result.stderr[-3000:]
        runs[name] = out
    cuda, cpu = read_losses(runs["cuda"]), read_losses(runs["cpu"])
    assert len(cuda) == len(cpu) == 4 and all(math.isfinite(x) for x in cuda)
    # the first loss is the forward of the same weights: bf16 rounding apart, the same number
    assert cuda[0] == pytest.approx(cpu[0], rel=0.02)

    from torchtune.training.metric_logging import read_metrics

    rows = [row for row in read_metrics(Path(runs["cuda"]) / "logs" / "metrics.jsonl") if "loss" in row]
    for row in rows:
        # the driver's figure includes the context and everything the caching allocator reserved
        assert row["peak_device_memory_used"] >= row["peak_memory_reserved"] >= row["peak_memory_alloc"] > 0

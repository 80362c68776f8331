"""Memory statistics: keys, units, and the CUDA allocator setting."""

import logging
import os

import torch

from torchtune.training import memory


def test_cpu_stats_report_host_rss_only():
    stats = memory.get_memory_stats("cpu")
    assert set(stats) == {"host_peak_rss", "host_rss"}
    big = torch.ones(50_000_000, dtype=torch.uint8)  # 50 MB touched: the peak grows past it
    assert memory.get_memory_stats(torch.device("cpu"))["host_peak_rss"] >= 0.05
    del big
    memory.reset_peak_memory_stats("cpu")  # a no-op on CPU, but callable


def test_set_cuda_alloc_conf_respects_the_user(monkeypatch):
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF", raising=False)
    assert memory.set_cuda_alloc_conf() is True
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    assert memory.set_cuda_alloc_conf() is False
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "max_split_size_mb:128"


def test_log_memory_stats(caplog):
    logger = logging.getLogger("test_memory")
    with caplog.at_level(logging.INFO, logger="test_memory"):
        memory.log_memory_stats({"peak_memory_alloc": 13.99, "host_peak_rss": 2.5}, logger, "end")
    assert "end:" in caplog.text
    assert "peak allocated (torch): 13.99 GB" in caplog.text
    assert "host peak RSS: 2.50 GB" in caplog.text

"""Memory statistics: keys, units, and the CUDA allocator setting."""

import logging
import os
import time

import pytest
import torch

from torchtune.training import memory


def test_cpu_stats_report_host_rss_only():
    stats = memory.get_memory_stats("cpu")
    assert set(stats) == {"host_peak_rss", "host_rss"}
    big = torch.ones(50_000_000, dtype=torch.uint8)  # 50 MB touched: the peak grows past it
    assert memory.get_memory_stats(torch.device("cpu"))["host_peak_rss"] >= 0.05
    del big
    memory.reset_peak_memory_stats("cpu")  # a no-op on CPU, but callable


@pytest.fixture
def no_alloc_conf(monkeypatch):
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_set_cuda_alloc_conf_sets_the_documented_variable(no_alloc_conf):
    assert memory.set_cuda_alloc_conf() is True
    assert os.environ["PYTORCH_ALLOC_CONF"] == "expandable_segments:True"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ  # a second name would be a second, conflicting setting


@pytest.mark.parametrize("name", ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
@pytest.mark.parametrize("value", ["max_split_size_mb:128", ""])
def test_set_cuda_alloc_conf_never_overrides_the_user(no_alloc_conf, name, value):
    no_alloc_conf.setenv(name, value)
    assert memory.set_cuda_alloc_conf() is False
    assert os.environ[name] == value
    other = {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"} - {name}
    assert not other & set(os.environ)


def test_device_peak_sampler_catches_a_peak_between_snapshots():
    """The sampler's thread sees a spike that has gone again by the time anyone takes a snapshot."""
    used = [1_000_000_000]
    peak = memory.DeviceMemoryPeak("cuda:0", interval_s=0.001, read=lambda: used[0], source="test")
    with peak:
        used[0] = 5_000_000_000  # e.g. the backward peak of one step
        deadline = time.monotonic() + 5
        while peak._peak < 5_000_000_000 and time.monotonic() < deadline:
            time.sleep(0.001)  # leave the sampler its turn (a step takes far longer than the interval)
        used[0] = 2_000_000_000
        assert peak.peak_bytes == 5_000_000_000
    assert peak._thread is None  # stopped
    assert peak.peak_bytes == 5_000_000_000  # kept after stop
    peak.reset()
    assert peak.peak_bytes == 2_000_000_000  # a new peak starts from what is in use now
    used[0] = 3_000_000_000
    assert peak.peak_bytes == 3_000_000_000  # reading takes a sample: a standing peak is never missed


def test_log_memory_stats(caplog):
    logger = logging.getLogger("test_memory")
    with caplog.at_level(logging.INFO, logger="test_memory"):
        memory.log_memory_stats({"peak_memory_alloc": 13.99, "host_peak_rss": 2.5}, logger, "end")
    assert "end:" in caplog.text
    assert "peak allocated (torch): 13.99 GB" in caplog.text
    assert "host peak RSS: 2.50 GB" in caplog.text

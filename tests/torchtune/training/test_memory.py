"""Memory statistics: keys, units, and the CUDA and host allocator settings."""

import json
import logging
import os
import subprocess
import sys
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
        # The loop ends as soon as the sampler has seen the spike; the deadline only keeps a broken
        # sampler from hanging the test. It is generous because a loaded machine may leave the
        # sampler's thread unscheduled for seconds: what is asserted is the sample, not its latency.
        deadline = time.monotonic() + 120
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
        memory.log_memory_stats({"peak_memory_alloc": 13.99, "host_peak_rss": 2.5}, "end", logger=logger)
    assert "end:" in caplog.text
    assert "peak allocated (torch): 13.99 GB" in caplog.text
    assert "host peak RSS: 2.50 GB" in caplog.text


# Run in a child process: the setting is process-wide. Allocates and frees a 128 MB tensor (the size
# of a 32000 x 1024 fp32 gradient) six times, counting the page faults of each round.
_REUSE_SCRIPT = """
import json, resource, sys, torch
from torchtune.training import memory
changed = again = None
if sys.argv[1] == "on":
    changed, again = memory.reuse_freed_host_memory(), memory.reuse_freed_host_memory()
elif sys.argv[1] == "if asked":  # what the recipes call for a CPU run
    changed, again = memory.reuse_freed_host_memory_if_asked(), memory.reuse_freed_host_memory_if_asked()
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    t = torch.ones(32000 * 1024)  # written: every page is touched
    del t
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"changed": changed, "again": again, "faults": faults}))
"""


def _reuse_run(mode, **env):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "LD_PRELOAD"} | env
    out = subprocess.run(
        [sys.executable, "-c", _REUSE_SCRIPT, mode], env=env, capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


glibc_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.confstr("CS_GNU_LIBC_VERSION") is None, reason="glibc's malloc only"
)


@glibc_linux
def test_reuse_freed_host_memory_stops_page_faults_of_large_blocks():
    default, reused = _reuse_run("off"), _reuse_run("on")
    pages = 32000 * 1024 * 4 // 4096
    # glibc's default: every 128 MB block is a fresh mmap, faulted in page by page each time
    assert all(f > 0.9 * pages for f in default["faults"]), default
    # reused: the heap grows twice to hold the block (the 64-byte aligned block does not fit the first
    # hole exactly), in rounds one and two or one and three depending on where earlier small blocks
    # lie in the heap; from round four on every round reuses its pages
    assert reused["changed"] is True and reused["again"] is False, reused
    assert sum(f > 0.5 * pages for f in reused["faults"][:3]) <= 2, reused
    assert all(f < 0.01 * pages for f in reused["faults"][3:]), reused


@glibc_linux
@pytest.mark.parametrize("env", [{"MALLOC_MMAP_MAX_": "65536"}, {"GLIBC_TUNABLES": "glibc.malloc.trim_threshold=0"}])
def test_reuse_freed_host_memory_leaves_a_user_setting_alone(env):
    result = _reuse_run("on", **env)
    assert result["changed"] is False, result


@glibc_linux
def test_recipes_keep_freed_host_memory_only_when_asked():
    """Opt-in: whole runs did not show it pays (docs/speed.md), so a CPU run leaves malloc alone unless
    TUNE_KEEP_FREED_HOST_MEMORY=1."""
    pages = 32000 * 1024 * 4 // 4096
    untouched = _reuse_run("if asked")
    assert untouched["changed"] is False and all(f > 0.9 * pages for f in untouched["faults"]), untouched
    asked = _reuse_run("if asked", TUNE_KEEP_FREED_HOST_MEMORY="1")
    assert asked["changed"] is True and asked["again"] is False, asked
    assert all(f < 0.01 * pages for f in asked["faults"][3:]), asked

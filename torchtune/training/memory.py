"""Memory statistics that hide nothing, and the CUDA allocator setting the recipe uses.

``get_memory_stats`` reports, in GB (1 GB = 1e9 bytes):

- ``peak_memory_alloc``, ``peak_memory_reserved``, ``peak_memory_active``: PyTorch's caching
  allocator counters (CUDA only). They do NOT see CUDA managed memory, which is where bitsandbytes'
  paged optimizers keep their state (32-bit PagedAdamW holds about 54 GB for Llama2-7B, mostly paged
  out to host RAM), nor the CUDA context.
- ``device_memory_used``: what the driver sees in use on the device (``torch.cuda.mem_get_info``:
  total - free). It includes managed memory that is resident, the CUDA context and other processes,
  so it is the number that tells whether a card really fits the run.
- ``host_peak_rss``: peak resident set size of this process on the host (``resource.getrusage``;
  ``psutil``'s current RSS when larger). Paged optimizer state that was paged out lands here.

On CPU the torch counters do not exist: only ``host_peak_rss`` (and ``host_rss``) are reported.
"""

from __future__ import annotations

import logging
import os
import resource
import sys
from typing import Optional, Union

import torch

_GB = 1e9
_ALLOC_CONF_VAR = "PYTORCH_CUDA_ALLOC_CONF"
_EXPANDABLE = "expandable_segments:True"

__all__ = ["get_memory_stats", "log_memory_stats", "reset_peak_memory_stats", "set_cuda_alloc_conf"]


def set_cuda_alloc_conf() -> bool:
    """Set ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` unless the user set the variable.

    Expandable segments let the caching allocator grow one mapping instead of keeping many
    fixed-size blocks, which removes most fragmentation (reserved - allocated) in a run whose
    tensor sizes change with the sequence length. It must happen before the first CUDA allocation,
    so the recipe calls it first thing. Returns True when it set the variable.
    """
    if _ALLOC_CONF_VAR in os.environ:
        return False
    os.environ[_ALLOC_CONF_VAR] = _EXPANDABLE
    return True


def _host_peak_rss_bytes() -> int:
    # ru_maxrss is kilobytes on Linux and bytes on macOS
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak = peak if sys.platform == "darwin" else peak * 1024
    try:
        import psutil

        peak = max(peak, psutil.Process().memory_info().rss)
    except ImportError:  # psutil is a dependency, but the peak above is enough without it
        pass
    return peak


def _host_rss_bytes() -> Optional[int]:
    try:
        import psutil
    except ImportError:
        return None
    return psutil.Process().memory_info().rss


def get_memory_stats(device: Union[torch.device, str]) -> dict[str, float]:
    """Memory statistics for ``device`` in GB (1e9 bytes), keyed for metrics.jsonl.

    CUDA: ``peak_memory_alloc``, ``peak_memory_reserved``, ``peak_memory_active`` (since the last
    ``reset_peak_memory_stats``), ``device_memory_used`` (driver's view: total - free, includes
    managed memory and the CUDA context), ``device_memory_total``, ``host_peak_rss`` and ``host_rss``.
    CPU (and other devices): ``host_peak_rss`` and ``host_rss`` only.
    """
    device = torch.device(device)
    stats: dict[str, float] = {}
    if device.type == "cuda":
        s = torch.cuda.memory_stats(device)
        stats["peak_memory_alloc"] = s.get("allocated_bytes.all.peak", 0) / _GB
        stats["peak_memory_reserved"] = s.get("reserved_bytes.all.peak", 0) / _GB
        stats["peak_memory_active"] = s.get("active_bytes.all.peak", 0) / _GB
        free, total = torch.cuda.mem_get_info(device)
        stats["device_memory_used"] = (total - free) / _GB
        stats["device_memory_total"] = total / _GB
    stats["host_peak_rss"] = _host_peak_rss_bytes() / _GB
    rss = _host_rss_bytes()
    if rss is not None:
        stats["host_rss"] = rss / _GB
    return stats


def reset_peak_memory_stats(device: Union[torch.device, str]) -> None:
    """Restart the torch peak counters of a CUDA device (a no-op elsewhere; host peak RSS cannot be reset)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


_LABELS = {
    "peak_memory_alloc": "peak allocated (torch)",
    "peak_memory_reserved": "peak reserved (torch)",
    "peak_memory_active": "peak active (torch)",
    "device_memory_used": "device in use (driver, incl. managed memory + context)",
    "device_memory_total": "device total",
    "host_peak_rss": "host peak RSS",
    "host_rss": "host RSS now",
}


def format_memory_stats(stats: dict[str, float], title: str = "Memory stats") -> str:
    """One line per statistic, e.g. ``peak allocated (torch): 13.99 GB``."""
    lines = [f"{title}:"]
    for key, value in stats.items():
        lines.append(f"  {_LABELS.get(key, key)}: {value:.2f} GB")
    return "\n".join(lines)


def log_memory_stats(
    stats: dict[str, float], logger: Optional[logging.Logger] = None, title: str = "Memory stats"
) -> None:
    """Log ``stats`` (from ``get_memory_stats``) at INFO level, one line per statistic."""
    (logger or logging.getLogger(__name__)).info(format_memory_stats(stats, title))

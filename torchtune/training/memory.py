"""Memory statistics that hide nothing, and the allocator settings the recipe uses (CUDA and host).

``get_memory_stats`` reports, in GB (1 GB = 1e9 bytes):

- ``peak_memory_alloc``, ``peak_memory_reserved``, ``peak_memory_active``: PyTorch's caching
  allocator counters (CUDA only). They do NOT see CUDA managed memory, which is where bitsandbytes'
  paged optimizers keep their state (32-bit PagedAdamW holds about 54 GB for Llama2-7B, mostly paged
  out to host RAM), nor the CUDA context.
- ``device_memory_used``: what the driver sees in use on the device now (NVML when ``nvidia-ml-py``
  is installed, else ``torch.cuda.mem_get_info``: total - free). It includes managed memory that is
  resident, the CUDA context and other processes.
- ``peak_device_memory_used``: the largest such driver figure since the ``DeviceMemoryPeak`` sampler
  given to ``get_memory_stats`` started (or was reset). A snapshot taken between steps misses the
  peak inside backward; the sampler reads the driver 20 times a second in a background thread (and once
  more when the figure is read), so this is the number that tells whether a card really fits the run.
- ``host_peak_rss``: peak resident set size of this process on the host (``resource.getrusage``;
  ``psutil``'s current RSS when larger). Paged optimizer state that was paged out lands here.

On CPU the torch counters do not exist: only ``host_peak_rss`` (and ``host_rss``) are reported.
"""

from __future__ import annotations

import gc
import logging
import os
import resource
import sys
import threading
from typing import Callable, Optional, Union

import torch

from torchtune.training.activations import set_activation_checkpointing
from torchtune.training.optim._optimizer import create_optim_in_bwd_wrapper, register_optim_in_bwd_hooks
from torchtune.utils._checkpointing._checkpoint_utils import OptimInBackwardWrapper
from torchtune.utils._device import get_torch_device_namespace

_GB = 1e9
# torch 2.13 documents PYTORCH_ALLOC_CONF; PYTORCH_CUDA_ALLOC_CONF is its older, still honoured name.
_ALLOC_CONF_VAR = "PYTORCH_ALLOC_CONF"
_ALLOC_CONF_VARS = (_ALLOC_CONF_VAR, "PYTORCH_CUDA_ALLOC_CONF")
_EXPANDABLE = "expandable_segments:True"

__all__ = [
    "DeviceMemoryPeak",
    "OptimizerInBackwardWrapper",
    "cleanup_before_training",
    "create_optim_in_bwd_wrapper",
    "get_memory_stats",
    "log_memory_stats",
    "reset_peak_memory_stats",
    "reuse_freed_host_memory",
    "reuse_freed_host_memory_if_asked",
    "register_optim_in_bwd_hooks",
    "set_activation_checkpointing",
    "set_cuda_alloc_conf",
]


def set_cuda_alloc_conf() -> bool:
    """Set ``PYTORCH_ALLOC_CONF=expandable_segments:True`` unless the user configured the allocator.

    Expandable segments let the caching allocator grow one mapping instead of keeping many
    fixed-size blocks, which removes most fragmentation (reserved - allocated) in a run whose
    tensor sizes change with the sequence length. A user's ``PYTORCH_ALLOC_CONF`` or (older name)
    ``PYTORCH_CUDA_ALLOC_CONF`` is left as it is, even if empty: setting the new name beside the old
    one would override the user's choice. The allocator reads the variable when CUDA starts, so the
    recipe calls this first thing. Returns True when it set the variable.
    """
    if any(name in os.environ for name in _ALLOC_CONF_VARS):
        return False
    os.environ[_ALLOC_CONF_VAR] = _EXPANDABLE
    return True


# glibc's mallopt parameters (malloc.h) and the environment variables by which a user sets them.
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4
_MALLOC_ENV_VARS = ("MALLOC_MMAP_MAX_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_")
# mallopt takes an int: the most free memory the heap may keep at its top before giving it back.
_KEEP_FREED_BYTES = 2**31 - 1
_host_reuse_set = False


def reuse_freed_host_memory() -> bool:
    """Make glibc's malloc keep freed blocks in the process for reuse, as CUDA's caching allocator does.

    By default glibc serves every block over 32 MB with a fresh ``mmap`` and unmaps it when freed. A
    training step on the CPU frees and re-allocates the same large blocks every step (the gradients of
    the embedding and the output projection: 128 MB each for a 32000 x 1024 vocabulary), so each step
    faults in and zeroes those pages again: 64,000 page faults and about 8% of a step's CPU time for
    the 168M benchmark model (docs/speed.md). With ``mmap`` off for large blocks
    (``M_MMAP_MAX=0``) and the heap trimmed only beyond 2 GB of free space at its top, the freed
    blocks are reused. The price: host memory freed by the run stays with the process (its RSS
    stays near its peak), as device memory stays reserved on a GPU.

    Opt-in (``reuse_freed_host_memory_if_asked``): measured on whole runs it did not clearly pay.
    Left alone when the user configured malloc (``MALLOC_*_`` variables or ``glibc.malloc`` tunables),
    preloads another allocator (``LD_PRELOAD``), or the C library is not glibc. Process-wide, so it
    is for a program's entry point (the recipe calls it for a CPU run), never on import. Returns True
    when it changed the settings.
    """
    global _host_reuse_set
    if _host_reuse_set:
        return False
    if not sys.platform.startswith("linux") or os.environ.get("LD_PRELOAD"):
        return False
    if any(name in os.environ for name in _MALLOC_ENV_VARS) or "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - only glibc has it (musl has mallopt but other semantics)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # mallopt returns 1 on success; a failed call changes nothing, so there is nothing to undo
    _host_reuse_set = bool(mallopt(_M_MMAP_MAX, 0)) & bool(mallopt(_M_TRIM_THRESHOLD, _KEEP_FREED_BYTES))
    return _host_reuse_set


# The opt-in for CPU runs: whole-epoch runs of the 168M model (docs/speed.md, against every peer) did not
# show keeping freed blocks pays (1.20x faster in one run's median, 1.15x slower in the next, each within
# its run's spread), and its price (a resident set held near its peak) is certain.
KEEP_FREED_HOST_MEMORY = "TUNE_KEEP_FREED_HOST_MEMORY"


def reuse_freed_host_memory_if_asked() -> bool:
    """``reuse_freed_host_memory()`` when ``TUNE_KEEP_FREED_HOST_MEMORY=1`` is set (the recipes call it for
    a CPU run); otherwise malloc stays as it is. Returns True when it changed the settings."""
    return os.environ.get(KEEP_FREED_HOST_MEMORY) == "1" and reuse_freed_host_memory()


_READERS: dict[torch.device, tuple[Callable[[], int], str]] = {}


def _driver_memory_reader(device: torch.device) -> tuple[Callable[[], int], str]:
    """A function returning the bytes in use on ``device`` as the driver reports them, and its source.

    NVML (``nvidia-ml-py``) reads the driver without touching the CUDA context, so it is safe and
    cheap from a background thread; without it, ``cudaMemGetInfo`` (total - free) gives the same figure.
    """
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device in _READERS:
        return _READERS[device]
    if not torch.version.hip:
        try:
            import pynvml

            pynvml.nvmlInit()
            # CUDA_VISIBLE_DEVICES renumbers devices for CUDA but not for NVML
            handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda._get_nvml_device_index(device))
            pynvml.nvmlDeviceGetMemoryInfo(handle)
            _READERS[device] = (lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)), "NVML"
            return _READERS[device]
        except Exception:  # not installed, or no NVML on this driver: the CUDA runtime has the figure too
            pass

    def read() -> int:
        free, total = torch.cuda.mem_get_info(device)
        return total - free

    _READERS[device] = read, "cudaMemGetInfo"
    return _READERS[device]


class DeviceMemoryPeak:
    """Peak of the device memory in use (driver's view), sampled in a background thread.

    ``torch.cuda.max_memory_allocated`` misses CUDA managed memory (paged optimizer state) and the
    context; the driver's figure includes them but is only a snapshot. This samples it every
    ``interval_s`` seconds from ``start()`` to ``stop()`` and keeps the largest value. Reading
    ``peak_bytes`` takes one more sample first, so a peak that is still standing is never missed;
    a spike shorter than the interval can be. The default interval, 50 ms, keeps the thread off the
    step: each sample takes the GIL for an NVML query (~10-50 us) while the training thread is launching
    kernels, so a 7B step (~0.7 s on a GPU) sees about 14 of them, not the 350 a 2 ms interval made.
    Usable as a context manager.

    Args:
        device: the CUDA device.
        interval_s: seconds between samples.
        read: bytes in use now; by default NVML (``nvidia-ml-py``), else ``torch.cuda.mem_get_info``.
        source: what ``read`` reads, for reports (set from the default reader when ``read`` is None).
    """

    def __init__(
        self,
        device: Union[torch.device, str],
        interval_s: float = 0.05,
        read: Optional[Callable[[], int]] = None,
        source: str = "custom",
    ) -> None:
        self.device = torch.device(device)
        self.interval_s = interval_s
        if read is None:
            read, source = _driver_memory_reader(self.device)
        self.source = source
        self._read = read
        self._peak = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _sample(self) -> None:
        value = self._read()
        with self._lock:
            if value > self._peak:
                self._peak = value

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def start(self) -> "DeviceMemoryPeak":
        """Take a first sample and start the sampling thread (a daemon: it never blocks exit)."""
        if self._thread is None:
            self._sample()
            logging.getLogger(__name__).info(
                "Peak sampler: %s for %s, every %.0f ms", self.source, self.device, self.interval_s * 1e3
            )
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="device-memory-peak", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop sampling (after one last sample); ``peak_bytes`` keeps the peak seen."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._sample()

    def reset(self) -> None:
        """Start a new peak from the value in use now."""
        with self._lock:
            self._peak = 0
        self._sample()

    @property
    def peak_bytes(self) -> int:
        self._sample()
        with self._lock:
            return self._peak

    def __enter__(self) -> "DeviceMemoryPeak":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _host_peak_rss_bytes() -> int:
    # Linux: VmHWM, this process's own peak. ru_maxrss also keeps the peak of the process before exec,
    # which for a run started from a large Python process (a notebook, pytest) is that process's.
    try:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmHWM:"))
        peak = int(line.split()[1]) * 1024
    except (OSError, StopIteration, ValueError):  # not Linux: ru_maxrss, bytes on macOS
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


def get_memory_stats(
    device: Union[torch.device, str], reset_stats: bool = True, *, device_peak: Optional[DeviceMemoryPeak] = None
) -> dict[str, float]:
    """Memory statistics for ``device`` in GB (1e9 bytes; torchtune reports GiB), keyed for metrics.jsonl.

    CUDA: ``peak_memory_alloc``, ``peak_memory_reserved``, ``peak_memory_active`` (since the last
    reset), ``device_memory_used`` (driver's view now: includes managed memory and the CUDA context),
    ``peak_device_memory_used`` (the driver's figure at its peak, when a running ``device_peak`` sampler is
    given), ``device_memory_total``, ``host_peak_rss`` and ``host_rss``. CPU (and other devices):
    ``host_peak_rss`` and ``host_rss`` only (torchtune raises ValueError on a CPU).

    ``reset_stats`` (torchtune's default): restart the peaks after reading them, so the next call reports
    the peak since this one; the recipes pass False and report the run's peak so far.
    """
    if isinstance(reset_stats, DeviceMemoryPeak):
        raise TypeError("get_memory_stats(device, device_peak=...): pass the sampler by keyword")
    device = torch.device(device)
    stats: dict[str, float] = {}
    if device.type == "cuda":
        s = torch.cuda.memory_stats(device)
        stats["peak_memory_alloc"] = s.get("allocated_bytes.all.peak", 0) / _GB
        stats["peak_memory_reserved"] = s.get("reserved_bytes.all.peak", 0) / _GB
        stats["peak_memory_active"] = s.get("active_bytes.all.peak", 0) / _GB
        stats["device_memory_used"] = _driver_memory_reader(device)[0]() / _GB
        if device_peak is not None:
            stats["peak_device_memory_used"] = device_peak.peak_bytes / _GB
        stats["device_memory_total"] = torch.cuda.get_device_properties(device).total_memory / _GB
    stats["host_peak_rss"] = _host_peak_rss_bytes() / _GB
    rss = _host_rss_bytes()
    if rss is not None:
        stats["host_rss"] = rss / _GB
    if reset_stats:
        reset_peak_memory_stats(device, device_peak)
    return stats


def reset_peak_memory_stats(device: Union[torch.device, str], device_peak: Optional[DeviceMemoryPeak] = None) -> None:
    """Restart the torch peak counters of a CUDA device and ``device_peak``'s peak (a no-op on other
    devices; host peak RSS cannot be reset)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if device_peak is not None:
        device_peak.reset()


_LABELS = {
    "peak_memory_alloc": "peak allocated (torch)",
    "peak_memory_reserved": "peak reserved (torch)",
    "peak_memory_active": "peak active (torch)",
    "device_memory_used": "device in use now (driver, incl. managed memory + context)",
    "peak_device_memory_used": "peak device in use (driver, sampled; incl. managed memory + context)",
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


DEFAULT_LOG_MESSAGE = "Memory stats after model init:"


def log_memory_stats(
    stats: dict[str, float], message: str = DEFAULT_LOG_MESSAGE, *, logger: Optional[logging.Logger] = None
) -> None:
    """Log ``stats`` (from ``get_memory_stats``) at INFO level: ``message``, then one line per statistic."""
    (logger or logging.getLogger("torchtune")).info(format_memory_stats(stats, message.rstrip(":")))


def cleanup_before_training() -> None:
    """Collect garbage, return the accelerator's cached blocks to it and restart its peak counters, so the
    training loop's peaks are its own (a no-op for the accelerator on a machine without one)."""
    gc.collect()
    namespace = get_torch_device_namespace()
    if namespace is torch.cpu or not hasattr(namespace, "reset_peak_memory_stats"):
        return
    namespace.empty_cache()
    namespace.reset_peak_memory_stats()


# torchtune's names at torchtune's path (torchtune.training.memory); one implementation each, here or in optim/
# and activations.
OptimizerInBackwardWrapper = OptimInBackwardWrapper

"""Host RAM, pinned memory, PCIe traffic and step time of ``fsdp_cpu_offload: True``.

With CPU offload the model's home is host memory: bf16 shards, the optimizer state and the gradients
waiting for the CPU optimizer worker all sit in RAM, and every step moves each layer's weights to the
GPU (forward, and again in backward when ``fsdp_reshard_after_forward``) and its gradient back. This
module computes those figures from the parameter shapes alone (a meta-device model), so the recipe can
compare them with the machine before anything loads (``check_offload_host_memory``), and
``tune estimate-memory`` can print them per phase next to the fake-tensor device peak.

Host RAM per phase (this process; ``world_size`` ranks share the shards):

- load: the shards (copied from the memory-mapped checkpoint, whose file pages the kernel may drop)
  plus one tensor being pinned (FSDP2 copies each shard into pinned memory at its first use);
- steps: shards + optimizer state + the gradients waiting for the worker (``max_pending_bytes``,
  plus the largest gradient) + offloaded activations;
- save: shards + state + one full tensor and its converted copy (step checkpoints write the host
  shards in place, or from a host copy of shards and state with ``async_checkpoint``; full HF folders
  are streamed by rank 0 one gathered tensor at a time, ``training.distributed._full_weights``);
- resume: shards + state (loaded in place) + one tensor being read.
"""

from __future__ import annotations

import dataclasses
import logging
import resource
import time
from typing import Any, Dict, Optional

import torch
from torch import nn

from torchtune._errors import TuneError
from torchtune.config._instantiate import COMPONENT_KEY
from torchtune.training.optim._cpu_optimizer_worker import DEFAULT_MAX_PENDING_BYTES

log = logging.getLogger("torchtune")

__all__ = [
    "OffloadPlan",
    "device_side_config",
    "format_host_step_plan",
    "host_step_plan",
    "check_offload_for_run",
    "check_offload_host_memory",
    "format_offload_plan",
    "machine_memory",
    "measure_cpu_optimizer_throughput",
    "offload_plan",
]

GB = 1e9
PCIE_GB_PER_S = 25.0  # PCIe 4.0 x16 in practice, each way (the figure the paged-state estimate uses too)
# What a 16-core desktop's memory streams (dual-channel DDR5-5600: 89.6 GB/s peak, about two thirds of it in
# practice): the CPU optimizer step reads and writes the weights and state and reads the gradients once, so
# this bounds it however many cores step (assumed, not measured).
HOST_MEMORY_GB_PER_S = 60.0
# Room left to the OS, the Python process, CUDA's host-side allocations and the data loader.
HOST_HEADROOM_BYTES = 4 * 10**9
# torchao's 8-bit/4-bit AdamW: two moments of 1 (0.5) byte an element plus one fp32 scale per block
# (block_size 256 / 128 by default), as its OptimState8bit/OptimState4bit hold them. Other optimizers
# are measured (``measure_state_layout``), which for torchao would compile its step at start-up.
CPU_OPTIMIZERS = ("torchtune.training.CPUAdamW", "torchtune.training.CPUSGD")
_TORCHAO_STATE = {"AdamW8bit": (1.0, 256), "Adam8bit": (1.0, 256), "AdamW4bit": (0.5, 128), "Adam4bit": (0.5, 128)}


@dataclasses.dataclass
class OffloadPlan:
    """Bytes of one process of an offloaded run (see the module docstring for what each phase holds)."""

    params: int  # the host shards (in ``dtype``)
    optimizer_state: int
    pending_gradients: int  # gradients waiting for the CPU optimizer worker, at most
    largest_tensor: int
    activations: int  # offloaded activations (host), when known
    pinned: int  # page-locked: the shards when pinned, plus pinned activation buffers
    full_copy: int  # the streamed full save: one gathered full tensor on the host and its converted copy
    h2d_per_step: int  # bytes copied host -> device per step
    d2h_per_step: int  # bytes copied device -> host per step
    device_buffers: int = 0  # what stays on the device outside the steps (RoPE tables)
    staged_copy: int = 0  # async_checkpoint: a host copy of the shards and state, written in the background

    @property
    def phases(self) -> Dict[str, int]:
        resident = self.params + self.optimizer_state
        return {
            "load": self.params + self.largest_tensor,
            "steps": resident + self.pending_gradients + self.activations,
            "save": resident + max(self.full_copy, self.staged_copy, self.largest_tensor),
            "resume": resident + self.largest_tensor,
        }

    @property
    def host_ram(self) -> int:
        return max(self.phases.values())

    def pcie_seconds(self, gb_per_s: float = PCIE_GB_PER_S) -> float:
        """Copy time of a step at ``gb_per_s`` each way, both directions overlapped (the longer one)."""
        return max(self.h2d_per_step, self.d2h_per_step) / (gb_per_s * GB)


def _state_bytes(cfg_optimizer: Any, shape: tuple, dtype: torch.dtype) -> int:
    from torchtune.training.estimate._memory_estimator import _import, measure_state_layout
    from torchtune.training.optim._cpu_optimizers import state_bytes

    node = {k: v for k, v in dict(cfg_optimizer).items() if k != COMPONENT_KEY}
    component = str(cfg_optimizer[COMPONENT_KEY])
    name = component.rsplit(".", 1)[-1]
    numel = int(torch.Size(shape).numel())
    if component in CPU_OPTIMIZERS:  # its layout is known: measuring would step a tensor of this size
        default = "bf16"
        tensors = 2 if name == "CPUAdamW" else (1 if float(node.get("momentum", 0.0)) else 0)
        return state_bytes(shape, str(node.get("state_dtype", default)), tensors)
    if component.startswith("torchao.optim.") and name in _TORCHAO_STATE:
        per_element, default_block = _TORCHAO_STATE[name]
        block = int(node.get("block_size", default_block))
        blocks = -(-numel // block)
        return round(2 * (numel * per_element + 4 * blocks))
    device_bytes, paged_bytes = measure_state_layout(_import(component), node, numel, dtype)
    return device_bytes + paged_bytes


def _nbytes(numel: int, dtype: torch.dtype) -> int:
    return numel * torch.empty((), dtype=dtype).element_size()


def offload_plan(
    model: nn.Module,
    cfg_optimizer: Any,
    *,
    world_size: int = 1,
    dtype: Optional[torch.dtype] = None,
    pin_memory: bool = True,
    reshard_after_forward: bool = True,
    activations: int = 0,
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
    async_checkpoint: bool = False,
) -> OffloadPlan:
    """The host-side figures of ``model`` (may be on the meta device, unsharded) trained with
    ``fsdp_cpu_offload`` on ``world_size`` ranks, for this process."""
    params = [p for p in model.parameters()]
    dtype = dtype or params[0].dtype
    local = [-(-p.numel() // world_size) for p in params]  # FSDP2 pads shards to equal size
    # FSDP2 shards the first dimension: each rank's part has ceil(dim0 / world_size) rows
    shapes = [(-(-p.shape[0] // world_size), *p.shape[1:]) if p.dim() else (1,) for p in params]
    shard_bytes = sum(_nbytes(n, dtype) for n in local)
    try:
        state = sum(_state_bytes(cfg_optimizer, shape, dtype) for shape, p in zip(shapes, params) if p.requires_grad)
    except Exception as exc:  # noqa: BLE001 - e.g. a low-rank optimizer, built per matrix: not a reason to stop
        log.info("fsdp_cpu_offload: the optimizer state is left out of the host RAM check (%s).", exc)
        state = 0
    largest = max(_nbytes(n, dtype) for n in local)
    layer_params = {id(p) for layer in getattr(model, "layers", []) for p in layer.parameters()}
    layer_bytes = sum(_nbytes(n, dtype) for n, p in zip(local, params) if id(p) in layer_params)
    # forward copies every shard to the device; backward copies the decoder layers' again when they
    # were resharded after forward (the root stays gathered); every gradient shard comes back once
    h2d = shard_bytes + (layer_bytes if reshard_after_forward else 0)
    d2h = sum(_nbytes(n, dtype) for n, p in zip(local, params) if p.requires_grad)
    return OffloadPlan(
        params=shard_bytes,
        optimizer_state=state,
        pending_gradients=min(d2h, max_pending_bytes + largest),
        largest_tensor=largest,
        activations=activations,
        pinned=(shard_bytes if pin_memory else 0) + activations,
        full_copy=2 * max(_nbytes(p.numel(), dtype) for p in params),
        h2d_per_step=h2d + activations,
        d2h_per_step=d2h + activations,
        device_buffers=sum(b.numel() * b.element_size() for b in model.buffers()),
        staged_copy=shard_bytes + state if async_checkpoint else 0,
    )


def machine_memory() -> Dict[str, Optional[int]]:
    """This machine's ``MemAvailable`` (bytes, /proc/meminfo; psutil elsewhere) and the locked-memory
    limit (``RLIMIT_MEMLOCK`` soft limit in bytes; None when unlimited)."""
    available: Optional[int] = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
    except OSError:
        import psutil

        available = int(psutil.virtual_memory().available)
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return {"available": available, "memlock": None if soft == resource.RLIM_INFINITY else int(soft)}


def check_offload_for_run(model: nn.Module, cfg: Any, world_size: int, dtype: torch.dtype) -> bool:
    """The distributed recipe's check with ``fsdp_cpu_offload``: ``offload_plan`` of ``model`` (on the meta
    device, before any weight loads) against this machine; returns whether to pin (``check_offload_host_memory``)."""
    plan = offload_plan(
        model, cfg.optimizer, world_size=world_size, dtype=dtype, async_checkpoint=bool(cfg.async_checkpoint)
    )
    return check_offload_host_memory(plan, pin_memory=torch.cuda.is_available())


def check_offload_host_memory(plan: OffloadPlan, *, pin_memory: bool, config_hint: str = "") -> bool:
    """Compare ``plan`` with this machine before anything loads; returns whether to pin.

    Raises ``TuneError`` naming both figures when the host RAM the run needs (plus 4 GB for the rest of
    the system) exceeds what is available. When the pinned bytes exceed the locked-memory limit
    (``ulimit -l``, which page-locking counts against in containers and for unprivileged users), or
    pinning fails, the run goes on with pageable copies and says so in a warning.
    """
    machine = machine_memory()
    available = machine["available"]
    need = plan.host_ram + HOST_HEADROOM_BYTES
    if available is not None and need > available:
        worst = max(plan.phases, key=plan.phases.get)
        raise TuneError(
            f"fsdp_cpu_offload=True needs about {plan.host_ram / GB:.1f} GB of host RAM (the {worst} phase: "
            f"{plan.params / GB:.1f} GB of weights, {plan.optimizer_state / GB:.1f} GB of optimizer state, "
            f"{plan.pending_gradients / GB:.1f} GB of gradients waiting for the CPU step) plus "
            f"{HOST_HEADROOM_BYTES / GB:.0f} GB for the system, but this machine has {available / GB:.1f} GB "
            "available (MemAvailable). Lower the need with 8-bit optimizer state (optimizer._component_="
            "torchtune.training.CPUAdamW optimizer.state_dtype=8bit), enable_activation_offloading=False, or more "
            f"processes on more GPUs (each holds 1/N of it){config_hint}; or free host memory."
        )
    if not pin_memory:
        return False
    limit = machine["memlock"]
    if limit is not None and plan.pinned > limit:
        log.warning(
            "fsdp_cpu_offload: pinning %.1f GB of host memory exceeds the locked-memory limit of %.3f GB "
            "(ulimit -l); host<->GPU copies fall back to pageable memory (slower, not overlapped). Raise the "
            "limit (ulimit -l unlimited, or the container's memlock ulimit) to pin.",
            plan.pinned / GB,
            limit / GB,
        )
        return False
    try:
        torch.empty(1).pin_memory()
    except RuntimeError as exc:
        log.warning(
            "fsdp_cpu_offload: host memory cannot be pinned here (%s); host<->GPU copies fall back to pageable "
            "memory (slower, not overlapped).",
            str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
        )
        return False
    return True


def measure_cpu_optimizer_throughput(
    cfg_optimizer: Any, *, numel: int = 1 << 24, dtype: torch.dtype = torch.bfloat16, steps: int = 3
) -> Dict[str, float]:
    """Parameters a second the config's optimizer steps on a ``CPUOptimizerWorker``, pinned to the cores
    it would use in a run (all but one), after one warm-up step (which compiles torchao's step).
    Returns the rate (``params_per_s``, wall clock on the worker's cores), the rate per core (``per_core``:
    parameters per CPU-second of the process, which other jobs on a busy machine do not slow), the worker's
    cores and its intra-op threads."""
    from torchtune import config
    from torchtune.training.optim._cpu_optimizer_worker import CPUOptimizerWorker

    worker = CPUOptimizerWorker()
    result: Dict[str, float] = {}

    def bench() -> None:
        # a matrix, as the model's are (CPUAdamW keeps 8-bit state for tensors of two or more dimensions)
        param = nn.Parameter(torch.randn(numel // 4096, 4096, dtype=torch.float32).to(dtype))
        optimizer = config.instantiate(cfg_optimizer, [param])
        grad = torch.randn_like(param) * 1e-3  # made once: making it is no part of a step
        param.grad = grad
        optimizer.step()  # warm-up: state made, torchao's step compiled
        start, cpu = time.perf_counter(), time.process_time()
        for _ in range(steps):
            param.grad = grad
            optimizer.step()
        result["params_per_s"] = numel * steps / (time.perf_counter() - start)
        result["per_core"] = numel * steps / max(time.process_time() - cpu, 1e-9)
        result["threads"] = float(torch.get_num_threads())

    try:
        worker.submit(bench)
        worker.wait()
    finally:
        worker.close()
    result["cores"] = float(len(worker.cores or []))
    return result


def optimizer_memory_bytes(plan: "OffloadPlan") -> int:
    """Host memory bytes one CPU optimizer step streams: the weights and the state read and written, each
    gradient read."""
    return 2 * plan.params + plan.d2h_per_step - plan.activations + 2 * plan.optimizer_state


def cpu_step_seconds(
    trainable: int, memory_bytes: int, throughput: Dict[str, float], target_cores: int = 16
) -> Dict[str, float]:
    """The CPU optimizer step's estimated seconds on a ``target_cores`` host: the measured rate per core (params
    per CPU-second) times ``target_cores``, and no faster than ``HOST_MEMORY_GB_PER_S`` streams ``memory_bytes``.
    Returns both bounds and the step (the larger)."""
    cores = max(int(throughput["cores"]), 1)
    by_cores = trainable / (throughput["per_core"] * target_cores)
    by_memory = memory_bytes / (HOST_MEMORY_GB_PER_S * GB)
    return {"by_cores": by_cores, "by_memory": by_memory, "step": max(by_cores, by_memory), "cores": cores}


def _cpu_step_line(trainable: int, plan: "OffloadPlan", throughput: Dict[str, Any], target_cores: int):
    """The report's "CPU optimizer step" line and its seconds: the measured per-core rate scaled to the target
    host, bounded below by the time to stream the optimizer's host memory once."""
    cpu = cpu_step_seconds(trainable, optimizer_memory_bytes(plan), throughput, target_cores)
    line = (
        f"  {'CPU optimizer step':<34}{cpu['step']:>9.2f} s for {trainable / 1e9:.2f}B parameters on a "
        f"{target_cores}-core host: {cpu['by_cores']:.2f} s from {throughput['per_core'] / 1e6:.0f}M params per "
        f"CPU-second measured on {cpu['cores']} core(s) of this machine, per core, times {target_cores}; at least "
        f"{cpu['by_memory']:.2f} s "
        f"to stream {optimizer_memory_bytes(plan) / GB:.1f} GB of host memory at {HOST_MEMORY_GB_PER_S:g} GB/s"
    )
    return line, cpu["step"]


def format_offload_plan(
    plan: OffloadPlan,
    *,
    trainable: int,
    device_steps: int,
    throughput: Optional[Dict[str, float]] = None,
    target_cores: int = 16,
    gb_per_s: float = PCIE_GB_PER_S,
) -> str:
    """The lines ``tune estimate-memory`` prints for an offloaded config (all labelled estimated)."""
    lines = [
        "With fsdp_cpu_offload (estimated: the steps' device peak from the fake-tensor run above, the rest from "
        "the parameter shapes; host RAM per phase in the table above; 1 GB = 1e9 bytes):"
    ]
    # outside the steps nothing but the RoPE tables is on the device: weights load into, are saved from
    # and resume into host memory
    lines.append(
        f"  {'device peak per phase':<34}load {plan.device_buffers / GB:.2f} GB, steps {device_steps / GB:.2f} GB, "
        f"save {plan.device_buffers / GB:.2f} GB, resume {plan.device_buffers / GB:.2f} GB"
    )
    lines.append(
        f"  {'host RAM, what makes it':<34}{plan.params / GB:>9.2f} GB of weights, "
        f"{plan.optimizer_state / GB:.2f} GB of optimizer state, up to {plan.pending_gradients / GB:.2f} GB of "
        "gradients queued for the CPU optimizer worker"
    )
    lines.append(f"  {'pinned (page-locked)':<34}{plan.pinned / GB:>9.2f} GB")
    up, down = plan.h2d_per_step / (gb_per_s * GB), plan.d2h_per_step / (gb_per_s * GB)
    lines.append(
        f"  {'PCIe per step':<34}{plan.h2d_per_step / GB:>9.2f} GB to the GPU ({up:.2f} s) + "
        f"{plan.d2h_per_step / GB:.2f} GB back ({down:.2f} s) at {gb_per_s:g} GB/s each way (PCIe 4.0 x16); the "
        "uploads overlap compute, the gradient copies back do not: FSDP2 copies a gradient synchronously when a "
        "post-accumulate-grad hook (optimizer in backward) reads it, so they add to backward's time"
    )
    if throughput is not None:
        cpu_line, cpu_step = _cpu_step_line(trainable, plan, throughput, target_cores)
        lines.append(cpu_line)
        lines.append(
            f"  {'step time, at least':<34}{max(up, down, cpu_step):>9.2f} s (estimated: the longest of the "
            "uploads, the copies back and the CPU step, which runs on a worker beside backward; GPU compute not "
            "included, and the copies back come on top of it)"
        )
    return "\n".join(lines)


def host_step_plan(
    model: nn.Module,
    cfg_optimizer: Any,
    *,
    dtype: torch.dtype,
    activations: int = 0,
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
) -> OffloadPlan:
    """The host side of ``optimizer_on_cpu`` (``training.optim._host_optimizer``) for ``model`` (may be on the meta
    device): pinned host weights, the optimizer state, the gradient ring, and ``activations`` bytes of
    offloaded activations (pinned, the device estimate's); per step every gradient down and every weight up,
    and the offloaded activations each way."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    weights = sum(_nbytes(p.numel(), dtype) for p in trainable)
    try:
        state = sum(_state_bytes(cfg_optimizer, tuple(p.shape), dtype) for p in trainable)
    except Exception as exc:  # noqa: BLE001 - e.g. an optimizer that cannot be measured here
        log.info("optimizer_on_cpu: the optimizer state is left out of the host RAM figures (%s).", exc)
        state = 0
    largest = max(_nbytes(p.numel(), dtype) for p in trainable)
    ring = max(int(max_pending_bytes), 2 * largest) + largest  # as register_host_step_hooks sizes it
    return OffloadPlan(
        params=weights,
        optimizer_state=state,
        pending_gradients=ring,
        largest_tensor=largest,
        activations=activations,
        pinned=weights + ring + activations,
        full_copy=largest,
        h2d_per_step=weights + activations,
        d2h_per_step=weights + activations,
    )


def device_side_config(cfg: Any) -> Any:
    """``cfg`` with ``optimizer_on_cpu`` as the device sees it: weights, activations and each gradient until it is
    copied out, no optimizer state (a stateless in-backward stand-in for the estimator's fake-tensor run)."""
    from omegaconf import OmegaConf

    device_cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    device_cfg.optimizer = {COMPONENT_KEY: "torch.optim.SGD", "lr": 0.0}
    device_cfg.optimizer_on_cpu = False
    device_cfg.bf16_stochastic_rounding = False
    return device_cfg


def format_host_step_plan(
    plan: OffloadPlan,
    *,
    trainable: int,
    device_steps: int,
    throughput: Optional[Dict[str, float]] = None,
    target_cores: int = 16,
    gb_per_s: float = PCIE_GB_PER_S,
) -> str:
    """The lines ``tune estimate-memory`` prints for ``optimizer_on_cpu`` (all labelled estimated)."""
    phases = plan.phases
    lines = [
        "With optimizer_on_cpu (estimated: the device peak from the fake-tensor run above, with the optimizer's state "
        "on the host; the rest from the parameter shapes; 1 GB = 1e9 bytes):",
        f"  {'device peak in the steps':<34}{device_steps / GB:>9.2f} GB (nothing paged: no optimizer state on the "
        "device)",
        f"  {'host RAM per phase':<34}load {phases['load'] / GB:.2f} GB, steps {phases['steps'] / GB:.2f} GB, save "
        f"{phases['save'] / GB:.2f} GB, resume {phases['resume'] / GB:.2f} GB: {plan.params / GB:.2f} GB of host "
        f"weights, {plan.optimizer_state / GB:.2f} GB of optimizer state, a {plan.pending_gradients / GB:.2f} GB ring "
        f"of gradients waiting for their step, {plan.activations / GB:.2f} GB of offloaded activations",
        f"  {'pinned (page-locked)':<34}{plan.pinned / GB:>9.2f} GB",
    ]
    up, down = plan.h2d_per_step / (gb_per_s * GB), plan.d2h_per_step / (gb_per_s * GB)
    grads = plan.d2h_per_step - plan.activations
    lines.append(
        f"  {'PCIe per step':<34}{grads / GB:>9.2f} GB of gradients to the host and {grads / GB:.2f} GB of weights "
        f"back, each on a copy stream of its own beside backward (non-blocking), {plan.activations / GB:.2f} GB of "
        f"offloaded activations each way: {down:.2f} s down, {up:.2f} s up at {gb_per_s:g} GB/s each way (PCIe "
        "4.0 x16)"
    )
    if throughput is not None:
        cpu_line, cpu_step = _cpu_step_line(trainable, plan, throughput, target_cores)
        lines.append(cpu_line)
        lines.append(
            f"  {'step time, at least':<34}{max(up, down, cpu_step):>9.2f} s (estimated: the longest of the copies "
            "and the CPU step, which overlap backward; GPU compute not included)"
        )
    return "\n".join(lines)

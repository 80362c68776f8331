"""torchtune's profiler set-up: ``torch.profiler.profile`` from a config's ``profiler`` node, or a stand-in that
does nothing when profiling is off, so a training loop calls ``prof.step()`` either way."""

from __future__ import annotations

import datetime
import logging
import os
import time
from functools import partial
from pathlib import Path
from typing import Any, Optional, Tuple

import torch
from omegaconf import DictConfig

from torchtune.utils._device import get_world_size_and_rank

log = logging.getLogger("torchtune")

PROFILER_KEY = "profiler"
DEFAULT_PROFILER_ACTIVITIES = {
    torch.profiler.ProfilerActivity.CPU,
    torch.profiler.ProfilerActivity.CUDA,
    torch.profiler.ProfilerActivity.XPU,
}
DEFAULT_SCHEDULE: dict = {"wait_steps": 5, "warmup_steps": 5, "active_steps": 2, "num_cycles": 1}
DEFAULT_TRACE_OPTS: dict = {"profile_memory": False, "with_stack": False, "record_shapes": True, "with_flops": False}
DEFAULT_PROFILE_DIR: str = "profiler_output"

__all__ = [
    "DEFAULT_PROFILER_ACTIVITIES",
    "DEFAULT_PROFILE_DIR",
    "DEFAULT_SCHEDULE",
    "DEFAULT_TRACE_OPTS",
    "DummyProfiler",
    "PROFILER_KEY",
    "setup_torch_profiler",
    "trace_handler",
]


def _warn(msg: str) -> None:
    if get_world_size_and_rank()[1] == 0:
        log.warning(msg)


def trace_handler(
    prof: torch.profiler.profile, output_dir: str, metric: str = "self_cuda_time_total", row_limit: int = 25
) -> None:
    """Write one profiling cycle's artifacts into ``output_dir/iteration_<step>``: the trace (TensorBoard /
    Perfetto, gzipped), the table of event averages sorted by ``metric``, the stacks (``with_stack``) and, on
    rank 0 with CUDA and ``profile_memory``, the memory timeline and snapshot. Each file is prefixed by the rank."""
    world_size, rank = get_world_size_and_rank()
    folder = os.path.join(output_dir, f"iteration_{prof.step_num}")
    os.makedirs(folder, exist_ok=True)
    begin = time.monotonic()
    now = datetime.datetime.now()
    worker = f"r{rank}-{now.year}-{now.month}-{now.day}-{now.hour}-{now.minute}"
    torch.profiler.tensorboard_trace_handler(folder, worker_name=worker, use_gzip=True)(prof)
    if rank == 0:
        log.info("Dumped the traces of step %d in %.2f s", prof.step_num, time.monotonic() - begin)
    if prof.profile_memory and torch.cuda.is_available() and rank == 0:
        try:
            prof.export_memory_timeline(f"{folder}/rank{rank}_memory-timeline.html")
        except Exception as exc:  # the timeline export is known to fail on some traces: keep the rest
            log.warning("Failed to export the memory timeline: %s", exc)
        torch.cuda.memory._dump_snapshot(f"{folder}/rank{rank}_memory_snapshot.pickle")
    if prof.with_stack:
        prof.export_stacks(f"{folder}/rank{rank}_stacks.txt", metric=metric)
    table = prof.key_averages(group_by_input_shape=prof.record_shapes, group_by_stack_n=5).table(
        sort_by=metric, row_limit=row_limit
    )
    Path(folder, f"rank{rank}_key_averages.txt").write_text(f"{table}\n")
    if world_size > 1:
        torch.distributed.barrier()


class DummyProfiler:
    """The profiler when profiling is off: a context manager whose ``start``, ``stop`` and ``step`` do nothing."""

    def __enter__(self) -> "DummyProfiler":
        return self

    def __exit__(self, *args: Any) -> None:
        pass

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

    def step(self) -> None:
        pass


def setup_torch_profiler(
    enabled: bool = False,
    cpu: bool = True,
    cuda: bool = True,
    xpu: bool = True,
    profile_memory: bool = DEFAULT_TRACE_OPTS["profile_memory"],
    with_stack: bool = DEFAULT_TRACE_OPTS["with_stack"],
    record_shapes: bool = DEFAULT_TRACE_OPTS["record_shapes"],
    with_flops: bool = DEFAULT_TRACE_OPTS["with_flops"],
    wait_steps: Optional[int] = None,
    warmup_steps: Optional[int] = None,
    active_steps: Optional[int] = None,
    num_cycles: Optional[int] = None,
    output_dir: Optional[str] = None,
) -> Tuple[Any, DictConfig]:
    """A ``torch.profiler.profile`` and the settings it got (as a ``DictConfig``), or, with ``enabled=False``,
    ``(DummyProfiler(), {"enabled": False})``.

    Activities: CPU, CUDA and XPU as asked (none asked: all three). The schedule (``torch.profiler.schedule``'s
    ``wait``, ``warmup``, ``active``, ``repeat``) takes ``DEFAULT_SCHEDULE`` for the steps not given; the loop
    calls ``prof.step()`` once per optimizer step. ``profile_memory`` turns ``with_stack`` and ``record_shapes``
    on (it needs them). Each cycle's artifacts go to ``output_dir`` (default ``profiler_output``) through
    :func:`trace_handler`.
    """
    if not enabled:
        _warn("Profiling disabled.")
        return DummyProfiler(), DictConfig({"enabled": False})
    flags = {
        torch.profiler.ProfilerActivity.CPU: cpu,
        torch.profiler.ProfilerActivity.CUDA: cuda,
        torch.profiler.ProfilerActivity.XPU: xpu,
    }
    activities = [activity for activity, wanted in flags.items() if wanted]
    if not activities:
        _warn("No activities specified, defaulting to CPU + CUDA + XPU")
        activities = sorted(DEFAULT_PROFILER_ACTIVITIES, key=str)
        cpu = cuda = xpu = True
    given = {"wait_steps": wait_steps, "warmup_steps": warmup_steps, "active_steps": active_steps}
    given["num_cycles"] = num_cycles
    missing = [k for k, v in given.items() if v is None]
    schedule_args = {k: DEFAULT_SCHEDULE[k] if v is None else v for k, v in given.items()}
    if missing:
        _warn(
            "Profiler schedule: "
            + ", ".join(f"{k} = {schedule_args[k]}" for k in missing)
            + (" (no schedule given: the defaults)" if len(missing) == len(given) else " (not given: the defaults)")
        )
    schedule = torch.profiler.schedule(
        wait=schedule_args["wait_steps"],
        warmup=schedule_args["warmup_steps"],
        active=schedule_args["active_steps"],
        repeat=schedule_args["num_cycles"],
    )
    if profile_memory:
        _warn("profile_memory needs with_stack and record_shapes: both are turned on.")
    with_stack = with_stack or profile_memory
    record_shapes = record_shapes or profile_memory
    # stacks are exported only with the experimental verbose config (pytorch/pytorch#100253)
    experimental = torch._C._profiler._ExperimentalConfig(verbose=True) if with_stack else None
    if output_dir is None:
        _warn(f"No profiler output_dir given, writing to {DEFAULT_PROFILE_DIR}")
        output_dir = DEFAULT_PROFILE_DIR
    Path(output_dir).mkdir(parents=True, exist_ok=True)
    output_dir = str(output_dir)
    profiler = torch.profiler.profile(
        activities=activities,
        profile_memory=profile_memory,
        with_stack=with_stack,
        record_shapes=record_shapes,
        with_flops=with_flops,
        schedule=schedule,
        experimental_config=experimental,
        on_trace_ready=partial(trace_handler, output_dir=output_dir),
    )
    settings = {
        "enabled": enabled,
        "output_dir": output_dir,
        "cpu": cpu,
        "cuda": cuda,
        "xpu": xpu,
        "profile_memory": profile_memory,
        "with_stack": with_stack,
        "record_shapes": record_shapes,
        "with_flops": with_flops,
        **schedule_args,
    }
    return profiler, DictConfig(settings)


def build_profiler(node: Any) -> Any:
    """The profiler of a recipe's ``profiler`` node: ``DummyProfiler`` when the node is null or
    ``enabled: False``, else what its ``_component_`` builds (``setup_torch_profiler`` returns
    ``(profiler, cfg)``: the profiler is kept). The recipe enters it around training and steps it after each
    optimizer step."""
    if node is None or not node.get("enabled", True):
        return DummyProfiler()
    from torchtune import config

    built = config.instantiate(node)
    return built[0] if isinstance(built, tuple) else built

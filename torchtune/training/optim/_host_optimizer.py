"""Weights on the device, the optimizer on the host: a single-device run with nothing paged (``optimizer_on_cpu``).

The bf16 weights stay on the GPU (7B: 13.5 GB); their optimizer state never goes there. Each trainable
parameter has a host copy of its weight (pinned) that the optimizer steps. Optimizer in backward, per parameter:
the parameter's hook (``register_post_accumulate_grad_hook``) copies its gradient into a pinned host buffer on a
copy stream of its own (non-blocking: backward goes on launching kernels) and frees the device gradient once the
copy has run; the CPU optimizer worker (``CPUOptimizerWorker``, on the other cores) waits for that copy, steps
the host weight (``step_parameter``: CPUAdamW's one-pass kernel, rounding included) and copies the updated bf16
weight back to the device on an upload stream. The step ends (``HostStepOptimInBackward.wait``) when the worker
has stepped every parameter, and the device's compute stream waits for the uploads: the next forward reads the
updated weights.

Why the order is safe: the hook fires after the parameter's last use in backward was launched (its gradient is
complete), the gradient copy waits for that work on the device, the upload is issued after the copy has
completed, and the next step's copy of the same parameter (which the worker waits for before it steps the host
weight again) runs after that step's forward, which waits for the uploads.

Host memory: the pinned host weights, the optimizer state, and one pinned ring of gradient buffers
(``max_pending_bytes`` plus the largest gradient): a gradient waits in it until its step ran; when the ring is
full the hook waits for the worker (backward then runs at the CPU's pace). PCIe per step: every gradient down
and every weight up, overlapped with backward.

On a CPU device (tests) the same path runs with synchronous copies: the device weights are CPU tensors too.
"""

from __future__ import annotations

import collections
import threading
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch
from torch import nn
from torch.optim import Optimizer

from torchtune._errors import ConfigError
from torchtune.training.optim._cpu_optimizer_worker import (
    DEFAULT_MAX_PENDING_BYTES,
    CPUOptimizerWorker,
    WorkerOptimInBackward,
)

__all__ = ["GradientRing", "HostStepOptimInBackward", "host_parameters", "register_host_step_hooks"]

_ALIGN = 64


class GradientRing:
    """One pinned host buffer that gradients waiting for their CPU step are copied into, first in, first out
    (the worker steps them in that order): ``take`` the next ``nbytes`` (waiting while the ring is full),
    ``give`` back the oldest."""

    def __init__(self, nbytes: int, pin: bool) -> None:
        self.size = -(-int(nbytes) // _ALIGN) * _ALIGN
        self.buffer = torch.empty(self.size, dtype=torch.uint8, pin_memory=pin)
        self._taken: "collections.deque[Tuple[int, int]]" = collections.deque()  # (start, end) in order
        self._head = 0
        self._done = threading.Condition()

    def _fits(self, n: int) -> Optional[int]:
        """Where ``n`` bytes go next, or None while the ring is full."""
        if not self._taken:
            return 0
        tail = self._taken[0][0]
        if self._head > tail:  # not wrapped: free are [head, size) and [0, tail)
            if self._head + n <= self.size:
                return self._head
            return 0 if n <= tail else None
        return self._head if self._head + n <= tail else None  # wrapped: free is [head, tail)

    def take(self, nbytes: int) -> torch.Tensor:
        n = -(-int(nbytes) // _ALIGN) * _ALIGN
        if n > self.size:
            raise ValueError(f"a gradient of {nbytes} bytes is larger than the ring of {self.size}")
        with self._done:
            while (start := self._fits(n)) is None:
                self._done.wait()
            self._taken.append((start, start + n))
            self._head = start + n
        return self.buffer[start : start + int(nbytes)]

    def give(self) -> None:
        with self._done:
            self._taken.popleft()
            if not self._taken:
                self._head = 0
            self._done.notify_all()


def host_parameters(model: nn.Module, names: List[str], pin: bool) -> Dict[str, nn.Parameter]:
    """A host copy of each named trainable parameter (pinned where the device is a GPU): what the optimizer
    steps."""
    params = dict(model.named_parameters())
    out = {}
    for name in names:
        p = params[name]
        host = torch.empty(p.shape, dtype=p.dtype, device="cpu", pin_memory=pin)
        host.copy_(p.detach())
        out[name] = nn.Parameter(host, requires_grad=True)
    return out


class HostStepOptimInBackward(WorkerOptimInBackward):
    """``WorkerOptimInBackward`` over the host copies: ``wait`` also makes the device's compute stream wait for
    the weights copied back, so whatever runs next on the device (the next forward, a save) reads them."""

    def __init__(self, optim_map: Mapping[str, Optimizer], worker: CPUOptimizerWorker, upload: Any) -> None:
        super().__init__(optim_map, worker)
        self.upload = upload

    def wait(self) -> None:
        super().wait()
        if self.upload is not None:
            torch.cuda.current_stream().wait_stream(self.upload)

    def close(self) -> None:
        self.worker.close()


def register_host_step_hooks(
    model: nn.Module,
    host: Mapping[str, nn.Parameter],
    optim_map: Mapping[str, Optimizer],
    *,
    step: Callable[[Optimizer, nn.Parameter], None],
    grad_norm: Any = None,
    max_pending_bytes: int = DEFAULT_MAX_PENDING_BYTES,
) -> HostStepOptimInBackward:
    """The hooks of the module docstring on ``model``'s parameters named in ``host``; ``step(optimizer,
    host_parameter)`` steps one host parameter (its gradient set) and frees the gradient. Returns the wrapper
    the recipe holds."""
    device = next(iter(model.parameters())).device
    cuda = device.type == "cuda"
    down = torch.cuda.Stream(device) if cuda else None
    up = torch.cuda.Stream(device) if cuda else None
    params = dict(model.named_parameters())
    largest = max(p.numel() * p.element_size() for p in host.values())
    ring = GradientRing(max(int(max_pending_bytes), 2 * largest) + largest, pin=cuda)
    worker = CPUOptimizerWorker()
    for name, hp in host.items():
        p = params[name]
        if p.dtype != hp.dtype or p.shape != hp.shape:
            raise ConfigError(f"optimizer_on_cpu: the host copy of {name} does not match the parameter.")
        p.register_post_accumulate_grad_hook(_hook(name, hp, optim_map[name], ring, worker, step, grad_norm, down, up))
    return HostStepOptimInBackward(optim_map, worker, up)


def _hook(name, hp, optimizer, ring, worker, step, grad_norm, down, up) -> Callable[[torch.Tensor], None]:
    def hook(p: torch.Tensor) -> None:
        grad = p.grad
        p.grad = None
        if grad_norm is not None:
            grad_norm.add(grad)
        buffer = ring.take(grad.numel() * grad.element_size())  # waits while the ring is full
        host_grad = buffer.view(grad.dtype).view(grad.shape)
        copied = None
        if down is not None:
            down.wait_stream(torch.cuda.current_stream())  # the gradient, and every use of the weight, launched
            with torch.cuda.stream(down):
                host_grad.copy_(grad, non_blocking=True)
                copied = down.record_event()
            grad.record_stream(down)  # the device gradient's memory is reused only after the copy
        else:
            host_grad.copy_(grad)
        del grad

        def job() -> None:
            if copied is not None:
                copied.synchronize()
            hp.grad = host_grad
            try:
                step(optimizer, hp)
            finally:
                hp.grad = None
                ring.give()
            if up is not None:
                with torch.cuda.stream(up):
                    up.wait_event(copied)
                    p.data.copy_(hp.data, non_blocking=True)
            else:
                p.data.copy_(hp.data)

        worker.submit(job)

    return hook

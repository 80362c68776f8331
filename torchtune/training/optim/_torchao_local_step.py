"""torchao's low-bit AdamW stepped on FSDP2's local shards of bf16 parameters.

torchao 0.18's compiled Adam step fails on DTensor parameters in bf16 (dynamo traces ``exp_avg.float()``
through DTensor into its ``OptimState8bit``, which has no ``aten.view.dtype``): the distributed recipe's
bf16 + ``torchao.optim.AdamW8bit`` could not take a step, offloaded or not. Its state is already per
shard (torchao makes each rank's quantized buffer from the local shard and wraps it as a DTensor, so
its blocks never span ranks), and Adam is elementwise, so stepping each rank's local tensors computes
exactly what the DTensor step means. ``step_on_local_shards`` does that for one optimizer: for the
step, its parameters, gradients and state are the DTensors' local tensors (the same storage, updated
in place); afterwards the DTensors are back, so checkpoints (torch.distributed.checkpoint) still see
sharded state.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List

import torch
from torch.optim import Optimizer

__all__ = ["init_state", "local_state", "needs_local_step", "step_on_local_shards"]


def needs_local_step(optimizer: Optimizer) -> bool:
    """A torchao optimizer holding DTensor parameters (whose own step fails on bf16 ones)."""
    from torchtune.training.distributed._dtensor import is_dtensor

    return type(optimizer).__module__.startswith("torchao.optim") and any(
        is_dtensor(p) for g in optimizer.param_groups for p in g["params"]
    )


def step_on_local_shards(optimizer: Optimizer) -> Optimizer:
    """Make ``optimizer.step()`` run on the local shards (see the module docstring); returns it."""
    original = optimizer.step

    @functools.wraps(original)
    def step(closure: Any = None) -> Any:
        return _local_step(optimizer, original, closure)

    optimizer.step = step  # type: ignore[method-assign]
    return optimizer


def init_state(optimizer: Any, param: torch.Tensor, group: Dict[str, Any]) -> None:
    """What torchao's step does for a parameter's first step, on the parameter itself (a DTensor: its
    _new_buffer makes the quantized buffer from the local shard and wraps it as a DTensor of the parameter's
    placements)."""
    state = optimizer.state[param]
    state["step"] = torch.tensor(0.0)
    state["exp_avg"] = optimizer._new_buffer(param, True)
    state["exp_avg_sq"] = optimizer._new_buffer(param, False)
    if group.get("amsgrad"):
        state["max_exp_avg_sq"] = optimizer._new_buffer(param, False)


def local_state(value: Any) -> Any:
    """A state value as the local tensor it wraps (itself when not a DTensor)."""
    if not hasattr(value, "to_local"):
        return value
    local = value.to_local()
    # DTensor.from_local keeps an alias (a view) of the quantized state; dynamo rebuilds a view of a
    # tensor subclass by replaying view ops (aten.view.dtype) that torchao's state does not implement.
    # The view's base is the same state object with the same buffers.
    return local._base if local._base is not None else local


@torch.no_grad()
def _local_step(optimizer: Any, original: Callable[..., Any], closure: Any) -> Any:
    swapped: List[tuple] = []  # (group, index, DTensor parameter, local parameter)
    for group in optimizer.param_groups:
        for i, p in enumerate(group["params"]):
            if p.grad is None or not hasattr(p, "to_local"):
                continue
            if len(optimizer.state[p]) == 0:
                init_state(optimizer, p, group)
            local = torch.nn.Parameter(p.to_local(), requires_grad=p.requires_grad)  # the same storage
            local.grad = p.grad.to_local()
            optimizer.state[local] = {k: local_state(v) for k, v in optimizer.state[p].items()}
            group["params"][i] = local
            swapped.append((group, i, p, local))
    try:
        return original(closure)
    finally:
        for group, i, p, local in swapped:
            group["params"][i] = p
            optimizer.state.pop(local, None)  # its tensors are the DTensors' local ones, updated in place
            local.grad = None

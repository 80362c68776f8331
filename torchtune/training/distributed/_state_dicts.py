"""torchtune's full <-> sharded state-dict functions, on this library's FSDP2 pieces: a full model state dict
loaded into a sharded model, a sharded model's full state dict gathered on rank 0's host, and an optimizer's
state between its full and sharded forms (``torch.distributed.checkpoint.state_dict``)."""

from __future__ import annotations

from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_optimizer_state_dict,
)
from torch.optim import Optimizer

from torchtune.training.distributed._fsdp import load_full_state_dict
from torchtune.training.distributed._full_weights import full_tensor

__all__ = [
    "gather_cpu_state_dict",
    "get_full_optimizer_state_dict",
    "load_from_full_model_state_dict",
    "load_from_full_optimizer_state_dict",
]


def load_from_full_model_state_dict(
    model: nn.Module, full_sd: Dict[str, Any], device: torch.device, strict: bool = False, cpu_offload: bool = False
) -> None:
    """Load the full state dict ``full_sd`` (torchtune names) into a model sharded by ``shard_model``: each rank
    keeps its rows, on ``device`` (the host with ``cpu_offload``). Always strict: names and shapes must match
    (torchtune's ``strict=False`` is not honoured; a missing weight would stay on the meta device).

    Raises:
        TuneError: the state dict does not fit the model (names and shapes listed).
    """
    load_full_state_dict(model, full_sd, device=torch.device("cpu") if cpu_offload else torch.device(device))


def gather_cpu_state_dict(
    model: nn.Module, is_rank_zero: bool, device: Optional[torch.device] = None, adapter_weights_only: bool = False
) -> Dict[str, Any]:
    """The full state dict of a sharded model on rank 0's host, gathered one tensor at a time (every rank
    joins each gather); ``{}`` on the other ranks. ``adapter_weights_only``: only the trainable parameters.
    A collective."""
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    out: Dict[str, Any] = {}
    for name, tensor in model.state_dict().items():
        if adapter_weights_only and name not in trainable:
            continue
        gathered = full_tensor(tensor.detach())
        if is_rank_zero:
            out[name] = gathered.cpu()
        del gathered
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
    return out


def get_full_optimizer_state_dict(
    model: nn.Module, opt: Optimizer, is_rank_zero: bool, device: Optional[torch.device] = None
) -> Dict[str, Any]:
    """The full optimizer state of a sharded model on rank 0's host (``{}`` elsewhere); a collective."""
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, cpu_offload=True)
    state = get_optimizer_state_dict(model=model, optimizers=opt, options=options)
    return state if is_rank_zero else {}


def load_from_full_optimizer_state_dict(
    model: nn.Module, opt: Optimizer, full_sd: Dict[str, Any], device: torch.device
) -> None:
    """Load a full optimizer state (from :func:`get_full_optimizer_state_dict`, rank 0's counts) into ``opt``
    over the sharded model, each rank keeping its shards; a collective."""
    options = StateDictOptions(
        full_state_dict=True, broadcast_from_rank0=True, cpu_offload=torch.device(device).type == "cpu"
    )
    set_optimizer_state_dict(model=model, optimizers=opt, optim_state_dict=full_sd, options=options)

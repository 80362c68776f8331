"""DTensor checks that never import ``torch.distributed.tensor`` themselves.

FSDP2's sharded parameters, their gradients and their optimizer state are DTensors; code shared with the
single-device recipe asks about them through these two functions, so a single-device run or
``tune validate`` never pays for that import (a second of CPU)."""

from __future__ import annotations

import sys
from typing import Any

import torch

__all__ = ["is_dtensor", "local_shard"]


def is_dtensor(tensor: Any) -> bool:
    """Whether ``tensor`` is a DTensor. No tensor can be one before something else imported the module."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a DTensor (a view: writing into it writes the DTensor), or ``tensor`` itself."""
    return tensor.to_local() if is_dtensor(tensor) else tensor

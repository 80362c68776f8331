"""Full (unsharded) weights of a sharded model written by rank 0, one tensor at a time.

An epoch or final checkpoint of the distributed recipe is a Hugging Face folder written by rank 0.
Gathering the whole model first would put all of it in rank 0's host memory (about 138 GB for a bf16
70B). Instead rank 0 writes the folder with the checkpointer's streaming writer and asks for each
tensor as the writer needs it: it broadcasts the tensor's name, every rank joins the all-gather of
that one parameter, and rank 0 moves it to its host, converts and writes it, and frees it before the
next. Host memory on rank 0: one full tensor, its converted copy and the file buffers. The other
ranks follow rank 0's requests until it says it is done, so the order of the writer (files, dtypes,
names) never has to be known in advance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Dict, Mapping, Optional, TypeVar

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from torchtune.training.distributed._fsdp import DistributedInfo, raise_if_any_rank_failed

__all__ = ["FullWeightStream", "full_tensor", "full_weights_writer", "save_full_weights", "write_full_weights"]

T = TypeVar("T")


class FullWeightStream:
    """Full tensors of ``model``'s parameters, gathered one at a time on rank 0's request (a collective)."""

    def __init__(self, model: nn.Module, info: DistributedInfo) -> None:
        self._info = info
        self._tensors = model.state_dict()  # DTensor shards (or plain tensors): nothing is gathered yet
        self.specs: Dict[str, Any] = {k: (t.dtype, t.shape) for k, t in self._tensors.items()}

    def fetch(self, key: str) -> torch.Tensor:
        """Rank 0: the full tensor ``key`` on the host (the other ranks must be in :meth:`serve`)."""
        self._announce(key)
        return self._gather(key).to("cpu")

    def serve(self) -> None:
        """Every rank but 0: join the gathers rank 0 asks for, until it calls :meth:`done`."""
        while True:
            key = self._announce(None)
            if key is None:
                return
            self._gather(key)

    def done(self) -> None:
        """Rank 0: no more tensors (the other ranks leave :meth:`serve`)."""
        if self._info.world_size > 1:
            self._announce(None)

    def _announce(self, key: Optional[str]) -> Optional[str]:
        if self._info.world_size == 1:
            return key
        box = [key]
        dist.broadcast_object_list(box, src=0, group=self._info.cpu_group)
        return box[0]

    def _gather(self, key: str) -> torch.Tensor:
        return full_tensor(self._tensors[key].detach())


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a DTensor shard (a collective: every rank of its mesh calls it), or ``tensor``."""
    if not isinstance(tensor, DTensor):
        return tensor
    if tensor.device.type != tensor.device_mesh.device_type:
        # fsdp_cpu_offload: the shard is in host memory, the collective runs on the mesh's device
        tensor = tensor.to(tensor.device_mesh.device_type)
    return tensor.full_tensor()


def write_full_weights(
    model: nn.Module, info: DistributedInfo, write: Callable[[Mapping[str, Any], Callable[[str], torch.Tensor]], T]
) -> Optional[T]:
    """Run ``write(specs, fetch)`` on rank 0 while the other ranks serve its gathers; a collective.

    ``specs`` is ``{name: (dtype, shape)}`` of every parameter, ``fetch(name)`` its full tensor on the
    host. Returns ``write``'s result on rank 0, ``None`` elsewhere.

    Raises:
        RankErrors: on every rank when ``write`` (or a gather) failed on any.
    """
    stream = FullWeightStream(model, info)
    error: Optional[BaseException] = None
    result: Optional[T] = None
    try:
        if info.is_rank_zero:
            try:
                result = write(stream.specs, stream.fetch)
            finally:
                stream.done()  # also after a failure: the other ranks must not wait for more
        else:
            stream.serve()
    except Exception as exc:  # noqa: BLE001 - reported on every rank by raise_if_any_rank_failed
        error = exc
    raise_if_any_rank_failed(error, info, "Writing the full weights")
    return result


def full_weights_writer(model: nn.Module, checkpointer: Any, info: DistributedInfo) -> Callable[[Path], Any]:
    """``folder -> {file: checksum}``: the full weights in the checkpointer's format written into a folder
    that the caller publishes (the sharded checkpoint's ``write_weights``); a collective."""

    def write(folder: Path) -> Any:
        return write_full_weights(model, info, lambda specs, fetch: checkpointer.write_weights(specs, fetch, folder))

    return write


def save_full_weights(model: nn.Module, checkpointer: Any, info: DistributedInfo, *, epoch: int, step: int) -> Path:
    """The final checkpoint: ``output_dir/epoch_{epoch}`` with the full weights alone, written atomically
    by rank 0 one tensor at a time; a collective. Returns the folder (on every rank).

    Raises:
        RankErrors: on every rank when the save failed; nothing is left under the folder's name.
    """
    folder = write_full_weights(
        model, info, lambda specs, fetch: checkpointer.save_weights(specs, fetch, epoch=epoch, step=step)
    )
    if info.world_size > 1:
        box = [None if folder is None else str(folder)]
        dist.broadcast_object_list(box, src=0, group=info.cpu_group)
        folder = box[0]
    return Path(folder)

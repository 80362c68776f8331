"""What the distributed recipe composes: process group and device mesh set-up, FSDP2 sharding.

Processes are launched by torchrun (``tune run --nproc_per_node N ...`` hands over to
``torch.distributed.run``); this module only reads what torchrun put in the environment (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``/``MASTER_PORT``) and joins the process group. Run
without torchrun, the distributed recipe is a world of one process (the way to use CPU offloading
of parameters on one GPU). Communication is PyTorch's own: NCCL on CUDA, gloo on CPU.

Sharding is FSDP2 (``torch.distributed.fsdp.fully_shard``): each decoder layer is one unit whose
parameters are all-gathered just before it computes and freed again after, then the root takes what
is left (token embedding, final norm, output projection). Parameters stay DTensors sharded along
dim 0 between steps, so optimizer state is sharded too.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard

from torchtune._errors import TuneError

log = logging.getLogger("torchtune")

__all__ = [
    "DistributedInfo",
    "backend_for_device",
    "destroy_distributed",
    "get_world_size_and_rank",
    "init_distributed",
    "is_rank_zero",
    "launched_by_torchrun",
    "shard_model",
]

# torchrun sets all of them for every process it starts.
_TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
# The backend each device type communicates with; the other pairings fail deep inside a collective.
_BACKENDS = {"cuda": "nccl", "cpu": "gloo"}


@dataclass(frozen=True)
class DistributedInfo:
    """Where this process stands in the run: its rank, the world, its device and the mesh over the world."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    mesh: DeviceMesh

    @property
    def is_rank_zero(self) -> bool:
        return self.rank == 0


def launched_by_torchrun() -> bool:
    """True in a process started by torchrun (its environment names rank, world and rendezvous)."""
    return all(name in os.environ for name in _TORCHRUN_ENV)


def backend_for_device(device_type: str, backend: Optional[str] = None) -> str:
    """The communication backend for ``device_type``: NCCL for CUDA, gloo for CPU.

    ``backend`` given explicitly must be the one that device type uses.

    Raises:
        TuneError: the device type has no backend here, or ``backend`` is the other device's.
    """
    expected = _BACKENDS.get(device_type)
    if expected is None:
        raise TuneError(
            f"The distributed recipe runs on CUDA (NCCL) or CPU (gloo); device '{device_type}' has no "
            "communication backend here. Set device: cuda or device: cpu."
        )
    if backend is not None and backend != expected:
        other = next(d for d, b in _BACKENDS.items() if b == backend) if backend in _BACKENDS.values() else None
        hint = f" ({backend} is for device: {other})" if other else ""
        raise TuneError(
            f"dist_backend: {backend} does not work with device: {device_type}{hint}: collectives of "
            f"{device_type} tensors need {expected}. Set dist_backend: {expected} (or null to pick it from the "
            f"device), or change device."
        )
    return expected


def init_distributed(device: Union[str, torch.device], backend: Optional[str] = None) -> DistributedInfo:
    """Join the process group torchrun set up (or, without torchrun, a world of one) and pick this rank's device.

    On CUDA each process takes ``cuda:LOCAL_RANK`` (``torch.cuda.set_device``, before any CUDA
    allocation, so NCCL and the caching allocator use that GPU). ``device`` is the config's device
    type (``cuda`` or ``cpu``); an index in it is refused, because torchrun's local rank decides it.

    Raises:
        TuneError: the backend does not fit the device; CUDA asked for without a GPU per local rank;
            a device with an index.
    """
    device = torch.device(device)
    if device.index is not None:
        raise TuneError(
            f"device: {device} names a GPU index, but in the distributed recipe each process takes the GPU of "
            f"its local rank (cuda:LOCAL_RANK). Set device: {device.type}."
        )
    backend = backend_for_device(device.type, backend)
    if launched_by_torchrun():
        rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ["LOCAL_RANK"])
    else:
        rank, world_size, local_rank = 0, 1, 0
    if device.type == "cuda":
        if not torch.cuda.is_available() or local_rank >= torch.cuda.device_count():
            raise TuneError(
                f"Process with local rank {local_rank} needs GPU cuda:{local_rank}, but this machine shows "
                f"{torch.cuda.device_count() if torch.cuda.is_available() else 0} CUDA device(s). Start at most that "
                "many processes per node (--nproc_per_node), or set device: cpu (gloo) to try the run on CPU."
            )
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if launched_by_torchrun():
            dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
        else:
            # one process, nobody to rendezvous with: an in-memory store instead of MASTER_ADDR/PORT
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    mesh = init_device_mesh(device.type, (world_size,), mesh_dim_names=("dp_shard",))
    return DistributedInfo(rank, world_size, local_rank, device, backend, mesh)


def destroy_distributed() -> None:
    """Leave the process group (at the end of a run; a no-op when none was joined)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def get_world_size_and_rank() -> tuple[int, int]:
    """``(world_size, rank)`` of the process group, ``(1, 0)`` outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def is_rank_zero() -> bool:
    """True on the process that logs and writes files (rank 0, or the only process)."""
    return get_world_size_and_rank()[1] == 0


def shard_model(
    model: nn.Module,
    *,
    mesh: Optional[DeviceMesh] = None,
    param_dtype: Optional[torch.dtype] = None,
    reduce_dtype: Optional[torch.dtype] = None,
    reshard_after_forward: Union[bool, int] = True,
    cpu_offload: bool = False,
    pin_memory: Optional[bool] = None,
) -> nn.Module:
    """Shard ``model`` with FSDP2: ``fully_shard`` on every decoder layer, then on the root; returns ``model``.

    Call it after activation checkpointing and compile (both patch the layers in place; FSDP2 only
    adds hooks around them) and before building the optimizer (the optimizer must hold the sharded
    parameters). The model may be on the meta device: load weights after sharding (each rank then
    materialises only its shards). Parameter names do not change, so checkpoints and in-backward
    optimizer keys are those of the single-device recipe.

    Args:
        mesh: 1-D device mesh to shard over; default: all ranks of the default process group.
        param_dtype: dtype the all-gathered parameters compute in (``None``: the dtype they are stored
            in). bf16 here with fp32 storage keeps fp32 master weights and optimizer state.
        reduce_dtype: dtype gradients are reduce-scattered in (``None``: ``param_dtype``). fp32 here
            sums the ranks' bf16 gradients without bf16 rounding at twice the communication.
        reshard_after_forward: free each layer's gathered parameters after its forward and gather
            them again in backward (True: least memory, one more all-gather per layer); False keeps
            them until backward; an int reshards to groups of that many ranks (e.g. one node).
            The root is never resharded after forward (backward needs it first).
        cpu_offload: keep sharded parameters, gradients and optimizer state in host memory
            (``CPUOffloadPolicy``); each layer's parameters visit the device only while it computes,
            and the optimizer steps on the CPU.
        pin_memory: pin the offloaded host memory (faster, asynchronous copies); default: when CUDA
            is available (pinning needs it).
    """
    from torchtune.modules import TransformerDecoderLayer

    if isinstance(reshard_after_forward, bool):
        pass
    elif not isinstance(reshard_after_forward, int) or reshard_after_forward < 1:
        raise TuneError(
            f"fsdp_reshard_after_forward is {reshard_after_forward!r}: use True, False or a positive number of ranks "
            "to reshard to (a divisor of the world size)."
        )
    mp_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    if cpu_offload:
        offload_policy: OffloadPolicy = CPUOffloadPolicy(
            pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory
        )
    else:
        offload_policy = OffloadPolicy()
    kwargs = dict(mesh=mesh, mp_policy=mp_policy, offload_policy=offload_policy)
    layers = [m for m in model.modules() if isinstance(m, TransformerDecoderLayer)]
    if not layers:
        raise TuneError(
            f"shard_model found no TransformerDecoderLayer in {type(model).__name__}: FSDP2 would gather the whole "
            "model at once, which saves no memory. Build the model with torchtune's TransformerDecoder."
        )
    for i, layer in enumerate(layers):
        # The last layer's backward comes right after forward: resharding it would only gather it again.
        last = i == len(layers) - 1
        fully_shard(layer, reshard_after_forward=False if last else reshard_after_forward, **kwargs)
    # The root's reshard_after_forward is left to FSDP2, which keeps the root's parameters gathered
    # after forward: the loss applies model.output (and, tied, the embedding) to the hidden states
    # after the model's forward returned, and backward needs them first anyway.
    fully_shard(model, **kwargs)
    return model

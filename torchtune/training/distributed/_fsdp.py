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
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Dict, List, NoReturn, Optional, Union

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor, Shard

from torchtune._errors import TuneError, TuneRuntimeError, TuneValueError
from torchtune.utils._device import get_world_size_and_rank

if TYPE_CHECKING:
    from torchtune.utils._checkpointing._weight_reader import WeightReader

log = logging.getLogger("torchtune")

__all__ = [
    "DistributedInfo",
    "agree_on_seed",
    "backend_for_device",
    "destroy_distributed",
    "get_distributed_backend",
    "get_shard_conditions",
    "exit_process",
    "get_world_size_and_rank",
    "init_distributed",
    "is_distributed",
    "is_rank_zero",
    "launched_by_torchrun",
    "set_torch_num_threads",
    "shard_model",
    "validate_no_params_on_meta_device",
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
    # gloo group for small host-side agreements (stop flags, errors, configs) that must not wait for
    # the GPU: on CPU runs it is the default group
    cpu_group: Any = None

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


def is_distributed() -> bool:
    """True in a process torchrun started (rank, world and rendezvous in its environment) where torch.distributed
    is available."""
    return launched_by_torchrun() and dist.is_available()


def get_distributed_backend(device_type: str, offload_ops_to_cpu: bool = False) -> str:
    """The backend ``init_process_group`` takes for ``device_type`` (``nccl`` for CUDA, ``gloo`` for CPU);
    with ``offload_ops_to_cpu``, ``"cuda:nccl,cpu:gloo"``-style, so collectives of host tensors (FSDP CPU
    offload, host-side agreements) have a backend too.

    Raises:
        TuneError: a device type without a backend here.
    """
    backend = backend_for_device(device_type)
    return f"{device_type}:{backend},cpu:gloo" if offload_ops_to_cpu and device_type != "cpu" else backend


def init_distributed(
    device: Union[str, torch.device, None] = None, backend: Optional[str] = None, **kwargs: Any
) -> Union[DistributedInfo, bool]:
    """Join the process group torchrun set up (or, without torchrun, a world of one) and pick this rank's device.

    On CUDA each process takes ``cuda:LOCAL_RANK`` (``torch.cuda.set_device``, before any CUDA
    allocation, so NCCL and the caching allocator use that GPU). ``device`` is the config's device
    type (``cuda`` or ``cpu``); an index in it is refused, because torchrun's local rank decides it.
    Returns the rank's ``DistributedInfo``.

    torchtune's call, without ``device`` (``init_distributed(backend="nccl", ...)``): outside torchrun nothing
    happens and it returns False; under torchrun ``torch.distributed.init_process_group(backend=..., **kwargs)``
    and True.

    Raises:
        TuneError: the backend does not fit the device; CUDA asked for without a GPU per local rank;
            a device with an index.
    """
    if device is None:
        if not is_distributed():
            return False
        dist.init_process_group(backend=backend, **kwargs)
        return True
    if kwargs:
        raise TypeError(f"init_distributed(device, backend) takes no other arguments: {sorted(kwargs)}")
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
    cpu_group = dist.new_group(backend="gloo") if backend != "gloo" else dist.group.WORLD
    return DistributedInfo(rank, world_size, local_rank, device, backend, mesh, cpu_group)


def destroy_distributed(info: Optional[DistributedInfo] = None) -> None:
    """Leave the process group (at the end of a run; a no-op when none was joined). ``info``, after a run
    that ended on every rank: first a barrier, so no rank tears its connections down while another is
    still in a collective (a gloo peer closing mid-collective can abort the other process at exit). Not
    after a failure: the other ranks may be gone, and a barrier would wait for them."""
    if dist.is_available() and dist.is_initialized():
        if info is not None and info.world_size > 1:
            dist.barrier(group=info.cpu_group)
        dist.destroy_process_group()


def exit_process(main: Callable[[], Any]) -> NoReturn:
    """Run ``main`` (a distributed recipe's ``recipe_main``) and end this process with its exit status.

    Started by torchrun, the process ends with ``os._exit`` once ``main`` has returned (or raised: its traceback
    is printed first) and stdout, stderr and the log handlers are flushed: Python's interpreter finalization
    never runs. gloo's worker threads (``pt_gloo_runloop``) live as long as their process group object, which
    outlives ``destroy_process_group`` while anything holds it (the device mesh, every DTensor); a collective's
    tensors they release after the interpreter began finalizing need the GIL, which then ends that thread with
    a forced unwind through C++ code: ``terminate called without an active exception``, exit -6 (1 in 4 refused
    resumes of two processes did). Without torchrun (one process), an ordinary ``sys.exit``.
    """
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code
    except BaseException:  # noqa: BLE001 - printed as Python would, then the same exit status
        import traceback

        traceback.print_exc()
        code = 1
    if code is None:
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    if not launched_by_torchrun():
        sys.exit(code)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def is_rank_zero() -> bool:
    """True on the process that logs and writes files (rank 0, or the only process)."""
    return get_world_size_and_rank()[1] == 0


def get_shard_conditions(
    name: str, module: nn.Module, names_to_match: Optional[List[str]] = None, *args: Any, **kwargs: Any
) -> bool:
    """torchtune's shard condition: True for a decoder layer (a module named ``....layers.<i>``) or a module
    whose name is in ``names_to_match``."""
    if names_to_match and name in names_to_match:
        return True
    parts = name.split(".")
    return len(parts) >= 2 and parts[-2] == "layers" and parts[-1].isdigit()


def validate_no_params_on_meta_device(model: nn.Module) -> None:
    """Refuse a model that still has a parameter or buffer on the meta device (a load that missed it).

    Raises:
        RuntimeError: naming the first one.
    """
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if tensor.is_meta:
            raise TuneRuntimeError(
                f"Unexpected param or buffer {name} on meta device: the weights loaded did not fill it. Check that "
                "the checkpoint holds every parameter of the model (and call model.init_buffers for RoPE)."
            )


def set_torch_num_threads() -> None:
    """Give each process of the group an equal share of the host's cores (``torch.set_num_threads``), so the
    ranks on one node do not oversubscribe it."""
    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))


def shard_model(
    model: nn.Module,
    shard_conditions: Optional[List[Callable[[str, nn.Module], bool]]] = None,
    *,
    mesh: Optional[DeviceMesh] = None,
    dp_mesh: Optional[DeviceMesh] = None,
    param_dtype: Optional[torch.dtype] = None,
    reduce_dtype: Optional[torch.dtype] = None,
    reshard_after_forward: Union[bool, int] = True,
    cpu_offload: bool = False,
    pin_memory: Optional[bool] = None,
    sum_gradients: bool = False,
) -> nn.Module:
    """Shard ``model`` with FSDP2: ``fully_shard`` on every decoder layer (or, torchtune's call, on every
    module for which one of ``shard_conditions(name, module)`` holds, deepest first), then on the root;
    returns ``model``.

    Call it after activation checkpointing and compile (both patch the layers in place; FSDP2 only
    adds hooks around them) and before building the optimizer (the optimizer must hold the sharded
    parameters). The model may be on the meta device: load weights after sharding (each rank then
    materialises only its shards). Parameter names do not change, so checkpoints and in-backward
    optimizer keys are those of the single-device recipe.

    Args:
        shard_conditions: torchtune's selectors of the modules to shard (e.g. ``[get_shard_conditions]``);
            None: the decoder layers.
        mesh: 1-D device mesh to shard over; default: all ranks of the default process group.
        dp_mesh: torchtune's name of ``mesh``.
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
        sum_gradients: reduce-scatter the sum of the ranks' gradients instead of their mean; right
            when each rank's loss is already divided by the token count of all ranks together.
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
    mesh = mesh if dp_mesh is None else dp_mesh
    if shard_conditions is not None:
        layers = [m for n, m in reversed(list(model.named_modules())) if any(c(n, m) for c in shard_conditions)]
        layers = [m for m in layers if m is not model]
    else:
        layers = [m for m in model.modules() if isinstance(m, TransformerDecoderLayer)]
    if not layers:
        raise TuneValueError(
            f"No layer modules were sharded: shard_model found no TransformerDecoderLayer in {type(model).__name__} "
            "(or no module shard_conditions select), so FSDP2 would gather the whole model at once, which saves no "
            "memory. Build the model with torchtune's TransformerDecoder, or check the shard conditions."
        )
    for i, layer in enumerate(layers):
        # The last layer's backward comes right after forward: resharding it would only gather it again.
        last = shard_conditions is None and i == len(layers) - 1
        fully_shard(layer, reshard_after_forward=False if last else reshard_after_forward, **kwargs)
    # The root's reshard_after_forward is left to FSDP2, which keeps the root's parameters gathered
    # after forward: the loss applies model.output (and, tied, the embedding) to the hidden states
    # after the model's forward returned, and backward needs them first anyway.
    fully_shard(model, **kwargs)
    # gloo has no AVG or PREMUL_SUM reduction: there FSDP2 must reduce with SUM and divide itself
    force_sum = dist.is_initialized() and dist.get_backend(mesh.get_group() if mesh is not None else None) == "gloo"
    for module in model.modules():
        if isinstance(module, FSDPModule):
            if sum_gradients:
                module.set_gradient_divide_factor(1.0)
            if sum_gradients or force_sum:
                module.set_force_sum_reduction_for_comms(True)
    return model


def log_sharded_model(model: nn.Module, world_size: int, cpu_offload: bool) -> None:
    """One log line: the model's size, dtype and what each rank holds of it."""
    params = list(model.parameters())
    log.info(
        "Sharded over %d process(es)%s: %.1fM parameters, %s, %.1fM per rank",
        world_size,
        " with CPU offload" if cpu_offload else "",
        sum(p.numel() for p in params) / 1e6,
        params[0].dtype if params else None,
        sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in params) / 1e6,
    )


def _local_rows(rows: int, world_size: int, rank: int) -> tuple[int, int]:
    """The dim-0 rows FSDP2 gives ``rank``: ``torch.chunk``'s split, the last ranks may get fewer or none."""
    chunk = -(-rows // world_size)
    start = min(rank * chunk, rows)
    return start, min(start + chunk, rows)


def load_sharded_weights(model: nn.Module, reader: "WeightReader", *, device: torch.device) -> None:
    """Load a checkpoint into a model sharded by :func:`shard_model`, each rank reading only its rows.

    Names and shapes are checked from ``reader.shapes`` before any weight is read. Then, tensor by
    tensor, this rank's dim-0 rows are read (memory-mapped, converted to torchtune's layout by the
    reader) and copied into a shard of the parameter's dtype on ``device``: the rank's host holds its
    shards (with ``cpu_offload``) plus one tensor's rows in flight, never the whole model. ``device``
    is the rank's device, or the CPU with ``cpu_offload`` (FSDP2 pins them at its first forward). The
    model may be on the meta device; non-persistent buffers (RoPE) are rebuilt by the caller
    (``model.init_buffers(device)``). No communication.

    Raises:
        TuneError: the weights do not fit the model (names and shapes are listed).
    """
    from torchtune.training.checkpointing import validate_state_dict

    validate_state_dict(model, {k: torch.empty(shape, device="meta") for k, shape in reader.shapes.items()})
    sharded: Dict[str, torch.Tensor] = {}
    for name, param in model.state_dict().items():
        shape = reader.shapes[name]
        if not isinstance(param, DTensor):  # held by no FSDP unit: the whole tensor
            local = torch.empty(shape, dtype=param.dtype, device=device)
            local.copy_(reader.read(name))
            sharded[name] = nn.Parameter(local, requires_grad=param.requires_grad)
            continue
        mesh, placements = param.device_mesh, param.placements
        if len(placements) != 1 or placements[0] != Shard(0):
            raise ValueError(f"{name} is sharded as {placements}; load_sharded_weights handles FSDP2's Shard(0)")
        start, stop = _local_rows(shape[0], mesh.size(), mesh.get_local_rank())
        # a fresh tensor of exactly the shard: never a view that keeps a mapped file or a wider read alive
        local = torch.empty((stop - start, *shape[1:]), dtype=param.dtype, device=device)
        if stop > start:
            local.copy_(reader.read(name, start, stop))
        stride = torch.empty(shape, device="meta").stride()
        sharded[name] = nn.Parameter(
            DTensor.from_local(local, mesh, placements, shape=shape, stride=stride, run_check=False),
            requires_grad=param.requires_grad,
        )
    model.load_state_dict(sharded, strict=True, assign=True)


def load_full_state_dict(model: nn.Module, state_dict: Dict[str, torch.Tensor], *, device: torch.device) -> None:
    """:func:`load_sharded_weights` from a full state dict in torchtune names (in memory or memory-mapped)."""
    from torchtune.utils._checkpointing._weight_reader import StateDictReader

    load_sharded_weights(model, StateDictReader(state_dict), device=device)


class RankErrors(TuneError):
    """Setup failed on some ranks; every rank raises it, and only rank 0 prints it (``quiet`` elsewhere)."""

    def __init__(self, message: str, quiet: bool) -> None:
        super().__init__(message)
        self.quiet = quiet


def raise_if_any_rank_failed(error: Optional[BaseException], info: DistributedInfo, what: str) -> None:
    """Make the ranks agree on whether ``what`` worked: a collective on ``info.cpu_group``.

    Each rank passes the exception it caught (or ``None``). If any rank failed, every rank raises
    ``RankErrors`` with the messages of the failed ranks (one message when they all said the same),
    so no rank goes on into a collective the failed one will never join, and rank 0 prints one
    paragraph instead of one per process.

    Raises:
        RankErrors: some rank failed.
    """
    mine = None if error is None else (str(error) if isinstance(error, TuneError) else repr(error))
    if info.world_size == 1:
        messages = [mine]
    else:
        messages = [None] * info.world_size
        dist.all_gather_object(messages, mine, group=info.cpu_group)
    failed = [(rank, m) for rank, m in enumerate(messages) if m is not None]
    if not failed:
        return
    if len({m for _, m in failed}) == 1:
        ranks = "every rank" if len(failed) == info.world_size else "rank " + ", ".join(str(r) for r, _ in failed)
        message = failed[0][1] if info.world_size == 1 else f"{what} failed on {ranks}: {failed[0][1]}"
    else:
        message = f"{what} failed on {len(failed)} of {info.world_size} ranks:\n\n" + "\n\n".join(
            f"rank {r}: {m}" for r, m in failed
        )
    raise RankErrors(message, quiet=not info.is_rank_zero) from error


def check_same_config(cfg: Any, info: DistributedInfo) -> None:
    """All ranks run the same config (a node started with other overrides or another version of the
    file would train something else, or wait forever in mismatched collectives).

    Raises:
        RankErrors: naming the keys whose values differ, and on which ranks.
    """
    if info.world_size == 1:
        return
    from omegaconf import OmegaConf

    # Unresolved: the config file and the overrides each rank was started with. ${...} values may
    # resolve differently per node on purpose (${oc.env:...}, install paths of ${asset:...}).
    mine = OmegaConf.to_container(cfg, resolve=False)
    everyone: list = [None] * info.world_size
    dist.all_gather_object(everyone, mine, group=info.cpu_group)
    differing = sorted({key for other in everyone for key in _differing_keys(everyone[0], other)})
    if differing:
        shown = "; ".join(
            f"{key}: " + ", ".join(f"rank {r}={_lookup(c, key)!r}" for r, c in enumerate(everyone))
            for key in differing[:5]
        )
        raise RankErrors(
            f"The processes of this run were started with different configs ({shown}"
            f"{'; ...' if len(differing) > 5 else ''}). Every rank must run the same config and overrides: start "
            "all nodes with the same command line (and the same config file contents).",
            quiet=not info.is_rank_zero,
        )


def _differing_keys(a: Any, b: Any, prefix: str = "") -> list:
    if isinstance(a, dict) and isinstance(b, dict):
        keys = []
        for key in sorted(set(a) | set(b), key=str):
            keys += _differing_keys(a.get(key, _MISSING), b.get(key, _MISSING), f"{prefix}{key}.")
        return keys
    return [] if a == b else [prefix.rstrip(".")]


def _lookup(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(cfg, dict) or part not in cfg:
            return "<missing>"
        cfg = cfg[part]
    return cfg


_MISSING = object()


def agree_on_seed(seed: Optional[int], info: DistributedInfo) -> int:
    """The one seed of the run on every rank: ``seed``, or (``None``) one rank 0 draws, broadcast.

    A collective on ``info.cpu_group``; call it before anything draws random numbers. Each rank
    drawing its own seed would shuffle the data differently per rank, so the ranks' every-N-th
    slices of their orders would overlap (duplicates and missed examples in one epoch) and the run
    would not be the single-process run with the same global batch.
    """
    if seed is None and info.is_rank_zero:
        from torchtune.utils import draw_seed

        seed = draw_seed()
    if info.world_size == 1:
        return int(seed)
    value = torch.tensor([-1 if seed is None else int(seed)], dtype=torch.int64)
    dist.broadcast(value, src=0, group=info.cpu_group)
    return int(value.item())


def any_rank(flag: bool, info: DistributedInfo) -> bool:
    """True on every rank if ``flag`` is True on any (a host-side all-reduce on ``info.cpu_group``)."""
    if info.world_size == 1:
        return flag
    value = torch.tensor([int(flag)], dtype=torch.int32)
    dist.all_reduce(value, op=dist.ReduceOp.MAX, group=info.cpu_group)
    return bool(value.item())

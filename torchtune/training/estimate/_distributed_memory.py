"""Per-GPU peak memory of the distributed recipe for a world size, on one CPU process.

``tune estimate-memory --config llama2/70B_full --world-size 8`` answers "how much does
each of 8 GPUs need" before anyone rents them. Rank 0 of a world of ``world_size`` is simulated:

- a fake process group (PyTorch's ``fake`` backend: every collective returns at once without
  communicating) and a 1-D device mesh over it, so ``fully_shard`` shards for that world size;
- fake tensors (``FakeTensorMode``): the model is built on the meta device, sharded with the recipe's
  ``shard_model`` (decoder layers, then the root, with the config's mixed precision,
  ``reshard_after_forward`` and CPU offload), and only the local shards are materialised;
- the counter of ``_memory_estimator`` on the recipe's own training step (optimizer in backward or
  not, activation checkpointing/offloading, chunked loss), which sees a DTensor as its local shard and
  the buffers FSDP2 allocates itself: all-gather inputs/outputs, the unsharded parameters of the layer
  in compute (FSDP2 frees them by resizing storage to 0, which is counted too), unsharded gradients
  and reduce-scatter buffers.

Every rank of an FSDP2 run holds the same amounts (shards are equal up to padding), so rank 0's peak
is the per-GPU peak. With ``fsdp_cpu_offload: True`` the sharded parameters, their gradients and the
optimizer state live in host memory and the optimizer steps on the CPU: those bytes are reported as
host RAM, and only what visits the device (the gathered layer, activations, unsharded gradients
before their copy to the host) is in the device peak.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from torchtune._errors import TuneError
from torchtune.training.estimate._memory_estimator import (
    CATEGORIES,
    MemoryEstimate,
    _device_type,
    _inner_tensors,
    _storage_key,
    _Tracker,
    default_seq_len,
    prepare_estimate,
    profile_memory,
)

__all__ = [
    "DISTRIBUTED_CATEGORIES",
    "HostMemory",
    "estimate_distributed_memory",
    "estimate_host_memory",
    "fake_world",
    "parse_world_sizes",
]

# "gathered weights": the unsharded parameters of the layers whose all-gather has landed (in
# param_dtype), i.e. what FSDP2 adds on top of the local shards
DISTRIBUTED_CATEGORIES = ("weights", "gathered_weights", *CATEGORIES[1:])


@contextlib.contextmanager
def fake_world(world_size: int) -> Iterator[Any]:
    """A process group of ``world_size`` ranks in which this process is rank 0 and no collective
    communicates (PyTorch's ``fake`` backend), with a 1-D device mesh over it; destroyed on exit.

    Raises:
        TuneError: a process group is already initialised in this process.
    """
    import torch.distributed as dist
    import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the "fake" backend)
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        raise TuneError(
            "The distributed memory estimate simulates its own process group, but this process is already "
            "in one. Run tune estimate-memory as a plain command, not under torchrun."
        )
    dist.init_process_group("fake", store=dist.HashStore(), rank=0, world_size=world_size)
    try:
        # the fake CPU tensors stand for the device (see _memory_estimator), so the mesh is on "cpu"
        yield init_device_mesh("cpu", (world_size,), mesh_dim_names=("dp_shard",))
    finally:
        dist.destroy_process_group()


def parse_world_sizes(text: str) -> list[int]:
    """``"1,2,8"`` -> ``[1, 2, 8]``.

    Raises:
        TuneError: an entry is not a positive whole number.
    """
    sizes = []
    for part in str(text).split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise TuneError(
                f"--world-size {text}: each entry must be a positive whole number of processes (GPUs), "
                "e.g. --world-size 8 or --world-size 1,2,8."
            )
        sizes.append(int(part))
    return sizes


class _ShardedTracker(_Tracker):
    """Categories under FSDP2: the parameters registered at set-up are the local shards (weights);
    parameters the modules hold later are unsharded all-gather results (gathered weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.sharded: list[nn.Parameter] = []

    def classify(self) -> dict[int, str]:
        tags = super().classify()  # activations, optimizer state, gradients, weights of current params
        if self.model is None:
            return tags
        local = set()
        for p in self.sharded:
            for inner in _inner_tensors(p):
                local.add(_storage_key(inner))
            if p.grad is not None:
                for inner in _inner_tensors(p.grad):
                    tags[_storage_key(inner)] = "gradients"
        for p in self.model.parameters():
            for inner in _inner_tensors(p):
                key = _storage_key(inner)
                if key not in local:
                    tags[key] = "gathered_weights"
        for key in local:
            tags[key] = "weights"
        return tags


def estimate_distributed_memory(
    cfg: Any,
    world_size: int,
    seq_len: Optional[int] = None,
    batch_size: Optional[int] = None,
    steps: int = 2,
    fake: bool = True,
    attention: str = "target",
) -> MemoryEstimate:
    """Per-GPU peak memory of ``full_finetune_distributed`` for ``cfg`` on ``world_size`` GPUs.

    ``batch_size`` is the global batch, split evenly over the ranks (default: the config's
    ``global_batch_size``, else its ``batch_size`` per process times ``world_size``); each simulated rank
    runs ``batch_size // world_size`` sequences of ``seq_len`` tokens. With
    ``fake=False`` the same runs on real CPU tensors (to check the estimate on a small model).
    ``attention`` as in ``estimate_recipe_memory``: ``"target"`` counts the kernel ``cfg.device``
    runs (CUDA flash / memory-efficient SDPA), ``"native"`` the CPU's own.

    Raises:
        TuneError: the batch does not split over ``world_size`` ranks; an optimizer FSDP2 cannot use.
    """
    from torchtune import config, training
    from torchtune.training.activations import get_act_offloading_ctx_manager
    from torchtune.training.distributed._fsdp import shard_model
    from torchtune.training.run._step import TrainStep

    if attention not in ("target", "native"):
        raise ValueError(f"attention must be 'target' or 'native', got {attention!r}")
    if world_size < 1:
        raise TuneError(f"world_size must be at least 1, got {world_size}.")
    seq_len = int(seq_len) if seq_len is not None else default_seq_len(cfg)
    if batch_size is None:
        global_batch = cfg.get("global_batch_size")
        batch_size = global_batch if global_batch is not None else training.positive_int(cfg, "batch_size") * world_size
    batch = int(batch_size)
    if batch % world_size != 0:
        raise TuneError(
            f"global batch {batch} does not split over {world_size} processes (each rank takes the global batch / "
            f"world size sequences). Pick a global_batch_size that is a multiple of {world_size}, or set batch_size "
            "(per process) instead."
        )
    local_batch = batch // world_size
    component = str(cfg.optimizer._component_)
    if component.startswith("bitsandbytes."):
        raise TuneError(
            f"optimizer._component_={component}: the distributed recipe refuses bitsandbytes optimizers (they "
            "cannot step FSDP2's sharded parameters exactly), so there is nothing to estimate. Use "
            "torchao.optim.AdamW8bit or torchao.optim.AdamW4bit (small state), or torch.optim.AdamW."
        )
    cfg, device, dtype, notes = prepare_estimate(cfg)
    settings = fsdp_settings(cfg)
    notes.insert(
        0,
        f"rank 0 of {world_size} simulated with a fake process group; {local_batch} of the global batch of "
        f"{batch} sequences per rank; FSDP2 {_describe(settings)}",
    )
    tracker = _ShardedTracker()

    offload = settings["cpu_offload"]
    # with CPU offload the sharded parameters, their gradients and the optimizer (state and step)
    # are host memory; without, nullcontext keeps everything on the simulated device
    on_host = (lambda: tracker.counter.host()) if offload else contextlib.nullcontext

    def setup() -> tuple[nn.Module, Callable[[], Any]]:
        # on the meta device first: a rank never holds the whole model, only its shards
        model = training.build_model(
            cfg.model,
            device=torch.device("meta"),
            dtype=dtype,
            enable_activation_checkpointing=bool(cfg.enable_activation_checkpointing),
        )
        shard_model(model, mesh=mesh, **settings)
        with on_host():
            model.to_empty(device=device)
        model.init_buffers(device)  # RoPE's cache is not offloaded
        tracker.sharded = list(model.parameters())
        # the recipe's rounding (each rank steps its shard: AdamW in one fused pass, others in fp32 slices)
        rounding = training.build_stochastic_rounding(
            bool(cfg.get("bf16_stochastic_rounding", False)), dtype=dtype, seed=0, device=device
        )
        optimizer = training.build_optimizer(
            cfg.optimizer, model, optimizer_in_bwd=bool(cfg.optimizer_in_bwd), rounding=rounding
        )
        if offload:
            for opt in getattr(optimizer, "optim_map", {"": optimizer}).values():
                opt.step = _wrapped(opt.step, on_host)
        step = TrainStep(
            model,
            optimizer,
            config.instantiate(cfg.loss),
            device=device,
            activations_ctx=get_act_offloading_ctx_manager(model, bool(cfg.enable_activation_offloading)),
            clip_grad_norm=cfg.clip_grad_norm,
            rounding=rounding,
            select_label_positions=False,  # every position labelled: the worst case, and fake labels say no more
        )
        vocab = model.tok_embeddings.num_embeddings
        data = {
            "tokens": torch.randint(0, vocab, (local_batch, seq_len)),
            "labels": torch.randint(0, vocab, (local_batch, seq_len)),
        }
        return model, lambda: step(data)

    with (
        fake_world(world_size) as mesh,
        _simulated_cpu_offload(tracker) if offload else contextlib.nullcontext(),
        _parameter_steps_on_host(on_host) if offload else contextlib.nullcontext(),
    ):
        estimate = profile_memory(
            setup,
            steps=steps,
            fake=fake,
            tracker=tracker,
            categories=DISTRIBUTED_CATEGORIES,
            attention_device=_device_type(cfg) if attention == "target" else "cpu",
        )
    if offload:
        estimate.host_label = "FSDP offload, activations"  # parameters, gradients, optimizer
        notes.append(
            "fsdp_cpu_offload=True: sharded parameters, gradients and optimizer state (and the optimizer step) "
            "are in host memory; each layer's parameters are copied to the device while it computes"
        )
    estimate.notes = notes + estimate.notes
    return estimate


@contextlib.contextmanager
def _parameter_steps_on_host(on_host: Callable[[], Any]) -> Iterator[None]:
    """With CPU offload every tensor of a parameter's step is a host tensor, those made around
    ``optimizer.step()`` too (stochastic rounding's fp32 slices, the bf16 state its first step makes):
    the hooks' ``step_parameter`` runs inside ``on_host`` for the estimate."""
    from torchtune.training.optim import _optimizer

    original = _optimizer.step_parameter
    _optimizer.step_parameter = _wrapped(original, on_host)
    try:
        yield
    finally:
        _optimizer.step_parameter = original


def _wrapped(fn: Callable[..., Any], ctx: Callable[[], Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        with ctx():
            return fn(*args, **kwargs)

    return call


@contextlib.contextmanager
def _simulated_cpu_offload(tracker: _Tracker) -> Iterator[None]:
    """Make FSDP2's host<->device copies real copies while fake CPU tensors stand for the device.

    With ``CPUOffloadPolicy`` FSDP2 copies each host shard to the device before the all-gather and
    each reduce-scattered gradient back to the host; here both sides are CPU tensors, so those
    ``.to()`` calls would return their input and neither copy would be counted. Inside this context
    (private FSDP2 internals of the pinned torch version): the all-gather input is made from a
    device copy of the host shard, and in ``foreach_reduce`` a ``.to("cpu")`` of a device tensor
    becomes a copy counted as host memory.
    """
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    param_cls = _fsdp_param.FSDPParam
    original_inputs = param_cls.all_gather_inputs
    original_reduce = _fsdp_param_group.foreach_reduce
    original_to = torch.Tensor.to
    in_reduce = [False]

    def all_gather_inputs(self: Any) -> list[torch.Tensor]:
        if not self.offload_to_cpu or self.sharded_state != _fsdp_param.ShardedState.SHARDED:
            return original_inputs.fget(self)
        host = self._sharded_param_data
        self._sharded_param_data = host.clone()  # the H2D copy (freed after the cast to param_dtype)
        try:
            return original_inputs.fget(self)
        finally:
            self._sharded_param_data = host

    def foreach_reduce(*args: Any, **kwargs: Any) -> Any:
        in_reduce[0] = True
        try:
            return original_reduce(*args, **kwargs)
        finally:
            in_reduce[0] = False

    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        target = kwargs.get("device", args[0] if args else None)
        counter = tracker.counter
        if (
            in_reduce[0]
            and counter is not None
            and not counter.in_host
            and isinstance(target, (torch.device, str))
            and torch.device(target).type == "cpu"
            and _storage_key(self) not in counter.host_keys()
        ):
            with counter.host():
                return self.clone()  # the D2H copy of the gradient
        return original_to(self, *args, **kwargs)

    param_cls.all_gather_inputs = property(all_gather_inputs)
    _fsdp_param_group.foreach_reduce = foreach_reduce
    torch.Tensor.to = to
    try:
        yield
    finally:
        param_cls.all_gather_inputs = original_inputs
        _fsdp_param_group.foreach_reduce = original_reduce
        torch.Tensor.to = original_to


def fsdp_settings(cfg: Any) -> dict[str, Any]:
    """``shard_model``'s keyword arguments from the config's FSDP keys, as the distributed recipe reads them."""
    from torchtune.utils import get_dtype

    param_dtype = cfg.fsdp_param_dtype
    return {
        "param_dtype": None if param_dtype is None else get_dtype(param_dtype, torch.device("cpu")),
        "reduce_dtype": torch.float32 if cfg.fsdp_reduce_dtype == "fp32" else None,
        "reshard_after_forward": bool(cfg.fsdp_reshard_after_forward),
        "cpu_offload": bool(cfg.fsdp_cpu_offload),
    }


def _describe(settings: dict[str, Any]) -> str:
    param = settings["param_dtype"]
    compute = "the storage dtype" if param is None else str(param).replace("torch.", "")
    reduce = "fp32" if settings["reduce_dtype"] is not None else "the compute dtype"
    return (
        f"parameters gathered in {compute}, gradients reduced in {reduce}, "
        f"reshard_after_forward={settings['reshard_after_forward']}, "
        f"cpu_offload={settings['cpu_offload']}"
    )


# The parameters whose rows Hugging Face stores in its rotary half-split order: a sharded load reads
# them widened to whole heads and un-permutes a copy.
_PERMUTED = ("attn.q_proj.weight", "attn.k_proj.weight", "attn.q_proj.bias", "attn.k_proj.bias")


@dataclasses.dataclass
class HostMemory:
    """Host RAM one process of the distributed recipe needs in each phase, in bytes (estimated from the
    sharded parameter shapes and what each phase's code keeps alive)."""

    world_size: int
    load: int  # start from the base weights: its shards (with CPU offload) + one tensor's rows in flight
    steps: int  # training steps: what the step estimate puts in host memory (CPU offload, offloaded activations)
    step_save: int  # a step checkpoint (DCP): one shard staged at a time, or a full copy with async_checkpoint
    full_save_rank0: int  # epoch/final HF folder on rank 0: one gathered full tensor + its converted copy
    full_save_other: int  # the same save on the other ranks (they gather on the device)
    notes: list[str] = dataclasses.field(default_factory=list)

    def format(self) -> str:
        gb = 1e9
        lines = [
            "Host RAM per process (estimated from the sharded parameter shapes; the process itself, CUDA context "
            "and page cache not included):",
            f"  {'load (base weights)':<32}{self.load / gb:>9.2f} GB",
            f"  {'training steps':<32}{self.steps / gb:>9.2f} GB",
            f"  {'step checkpoint save':<32}{self.step_save / gb:>9.2f} GB",
            f"  {'epoch/final save, rank 0':<32}{self.full_save_rank0 / gb:>9.2f} GB",
            f"  {'epoch/final save, other ranks':<32}{self.full_save_other / gb:>9.2f} GB",
        ]
        return "\n".join(lines + [f"Note: {note}" for note in self.notes])


def estimate_host_memory(cfg: Any, world_size: int, estimate: Optional[MemoryEstimate] = None) -> HostMemory:
    """Per-process host RAM of ``full_finetune_distributed`` on ``world_size`` processes for ``cfg``, from
    the model's parameter shapes on the meta device (seconds, even for 70B) and, for the steps, the host
    bytes of the step ``estimate`` (:func:`estimate_distributed_memory`; without one, none).

    Each phase follows what its code holds at its peak: the load (``load_sharded_weights``) the
    rank's shards when they live in host memory plus, for the one tensor in flight, its rows
    memory-mapped and, for a q/k projection, the un-permuted copy of those rows widened to whole heads;
    a step save (DCP) one local tensor staged to the host, or with ``async_checkpoint`` a host copy of
    the rank's weights and optimizer state; an epoch/final save (``save_full_weights``) one gathered
    full tensor on rank 0's host plus its permuted copy. The checkpoint files are taken to hold the
    training dtype.
    """
    from torchtune import training
    from torchtune.training.distributed._fsdp import _local_rows
    from torchtune.utils import get_dtype

    dtype = get_dtype(cfg.dtype, torch.device("cpu"))
    model = training.build_model(cfg.model, device=torch.device("meta"), dtype=dtype)
    head_dim = next((m.head_dim for m in model.modules() if hasattr(m, "head_dim") and hasattr(m, "q_proj")), 1)
    offload = bool(cfg.fsdp_cpu_offload)
    local_weights = largest_local = load_in_flight = largest_full = 0
    for name, p in model.named_parameters():
        rows = p.shape[0] if p.dim() else 1
        row_bytes = p.numel() // max(rows, 1) * p.element_size()
        start, stop = _local_rows(rows, world_size, 0)  # rank 0 holds the largest chunk
        local = (stop - start) * row_bytes
        local_weights += local
        largest_local = max(largest_local, local)
        permuted = name.endswith(_PERMUTED)
        # whole heads around the rows: at most one partial head at each end
        widened = min(rows, -(-(stop - start) // head_dim) * head_dim + head_dim) * row_bytes if permuted else 0
        load_in_flight = max(load_in_flight, 2 * widened if permuted else local)  # mapped rows (+ copy)
        largest_full = max(largest_full, p.numel() * p.element_size() * (2 if permuted else 1))
    steps = estimate.host_bytes_needed if estimate is not None else 0
    resident = steps if offload else 0  # parameters, gradients and optimizer state in host memory
    device_state = 0 if estimate is None or offload else estimate.breakdown.get("optimizer_state", 0)
    async_copy = (local_weights + device_state if not offload else steps) if cfg.get("async_checkpoint", False) else 0
    notes = [
        f"load: the rank's rows of one tensor at a time ({load_in_flight / 1e9:.2f} GB at most), memory-mapped "
        "from the checkpoint files"
        + ("; the shards themselves live in host memory (fsdp_cpu_offload)" if offload else ""),
        f"epoch/final save: rank 0 holds one gathered tensor and its converted copy ({largest_full / 1e9:.2f} GB at "
        "most), never the whole model",
    ]
    if cfg.get("async_checkpoint", False):
        notes.append("async_checkpoint=True: a step save keeps a host copy of the rank's weights and optimizer state")
    return HostMemory(
        world_size=world_size,
        load=(local_weights if offload else 0) + load_in_flight,
        steps=steps,
        step_save=resident + max(largest_local, async_copy),
        full_save_rank0=resident + largest_full,
        full_save_other=resident,
        notes=notes,
    )

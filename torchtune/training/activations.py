"""Activation checkpointing per decoder layer and offloading of saved activations to host memory.

Checkpointing (``set_activation_checkpointing``) keeps only each layer's input for backward and
recomputes the layer's inside during backward. The layer's ``forward`` is patched in place instead of
wrapping the layer in another module, so parameter names and state_dict keys do not change.

Offloading (``OffloadActivations``) moves the tensors that autograd saves for backward -- with
checkpointing, the layer inputs at the checkpoint boundaries -- to pinned host memory on a side CUDA
stream during forward, and copies them back during backward, so the saved activations stop growing
GPU memory with sequence length.
"""

from __future__ import annotations

import contextlib
import functools
import weakref
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional, Union

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

from torchtune._errors import TuneValueError

__all__ = [
    "ACWrapPolicyType",
    "CudaCopies",
    "NoOpManager",
    "OffloadActivations",
    "SimulatedCopies",
    "apply_selective_activation_checkpointing",
    "get_act_offloading_ctx_manager",
    "set_activation_checkpointing",
    "simulate_offloading",
]

_ORIGINAL_FORWARD = "_tt_forward_before_checkpointing"


def _checkpointed_forward(original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    if not torch.is_grad_enabled():
        # nothing is saved without grad (evaluation, generation): recomputing would only cost time
        return original(*args, **kwargs)
    return checkpoint(original, *args, use_reentrant=False, **kwargs)


def _checkpoint(module: nn.Module) -> bool:
    """Patch ``module``'s forward to run under ``torch.utils.checkpoint``; False if it already does."""
    if hasattr(module, _ORIGINAL_FORWARD):
        return False
    original = module.forward
    setattr(module, _ORIGINAL_FORWARD, original)
    # instance attribute shadows the class's forward; nn.Module.__call__ picks it up
    module.forward = functools.partial(_checkpointed_forward, original)
    return True


# What ``auto_wrap_policy`` may be: a module type, several (a set, as torchtune passes them), or torchtune's
# callable policy ``policy(module=..., recurse=..., nonwrapped_numel=...) -> bool``.
ACWrapPolicyType = Union[type, Iterable[type], Callable[..., bool]]


def set_activation_checkpointing(model: nn.Module, auto_wrap_policy: ACWrapPolicyType, **kwargs: Any) -> int:
    """Checkpoint the submodules of ``model`` the policy selects; returns how many were newly checkpointed.

    ``auto_wrap_policy``: a module type or a set of them (every submodule of one of those types), or a callable
    policy as torchtune takes it, asked for each submodule with ``recurse=False``. ``kwargs``: torchtune's
    ``check_fn(module) -> bool`` is honoured as another selector; nothing else is accepted.

    Uses ``torch.utils.checkpoint`` with ``use_reentrant=False`` (works with keyword arguments,
    with optimizer-in-backward hooks and with saved-tensor hooks such as ``OffloadActivations``).
    The forward is patched in place instead of wrapping the module (torchtune wraps it in a
    ``CheckpointWrapper``), so parameter names and state-dict keys are unchanged. Calling it twice does not
    checkpoint a module twice.
    """
    check_fn = kwargs.pop("check_fn", None)
    if kwargs:
        raise TypeError(f"set_activation_checkpointing got arguments it does not take: {sorted(kwargs)}")
    if isinstance(auto_wrap_policy, type) or not callable(auto_wrap_policy):
        types = (auto_wrap_policy,) if isinstance(auto_wrap_policy, type) else tuple(auto_wrap_policy)

        def selected(module: nn.Module) -> bool:
            return isinstance(module, types)

    else:

        def selected(module: nn.Module) -> bool:
            numel = sum(p.numel() for p in module.parameters())
            return bool(auto_wrap_policy(module=module, recurse=False, nonwrapped_numel=numel))

    count = 0
    for module in list(model.modules()):
        if module is not model and selected(module) and (check_fn is None or check_fn(module)):
            count += _checkpoint(module)
    return count


def apply_selective_activation_checkpointing(
    model: nn.Module, ac_mode: str, ac_option: Optional[Union[int, str]]
) -> int:
    """Checkpoint ``model.layers`` as torchtune's ``ac_mode`` says: ``"full"`` every layer; ``"selective"`` every
    ``ac_option``-th layer (1: all; 0: all); ``"none"`` none. Returns how many were newly checkpointed.

    Raises:
        ValueError: a negative or non-numeric ``ac_option`` in selective mode.
        NotImplementedError: another ``ac_mode``.
    """
    if ac_mode == "none":
        return 0
    if ac_mode == "full":
        every = 1
    elif ac_mode == "selective":
        try:
            every = int(ac_option)  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise TuneValueError(
                f"Selective layer AC policy (every_x_layer) expects a positive integer, received {ac_option!r} "
                "(selective op checkpointing is not implemented)."
            ) from exc
        if every < 0:
            raise TuneValueError(
                f"Selective layer AC policy (every_x_layer) expects a positive integer, received {every}"
            )
        every = every or 1
    else:
        raise NotImplementedError(
            f"Unknown AC type or AC config {ac_mode!r}. Only 'none', 'full' and 'selective' (every N-th layer) "
            "are implemented."
        )
    return sum(_checkpoint(layer) for i, layer in enumerate(model.layers, start=1) if i % every == 0)


def is_activation_checkpointed(module: nn.Module) -> bool:
    """True when ``set_activation_checkpointing`` patched ``module``."""
    return hasattr(module, _ORIGINAL_FORWARD)


# The memory estimator runs on fake CPU tensors that stand for device tensors. While it is inside
# ``simulate_offloading(host_ctx)``, CPU tensors are offloaded as if they were on an accelerator, and
# the host copies are made inside ``host_ctx()`` so the estimator counts them as host memory.
# ``on_saved`` is told about every saved tensor that stays on (or comes back to) the "device", so the
# estimator can count it as an activation (saved-tensor hooks do not nest: only the innermost runs).
_SIMULATED_HOST_CTX: Optional[Callable[[], ContextManager]] = None
_ON_SAVED: Optional[Callable[[torch.Tensor], None]] = None


@contextlib.contextmanager
def simulate_offloading(
    host_ctx: Callable[[], ContextManager], on_saved: Optional[Callable[[torch.Tensor], None]] = None
) -> Iterator[None]:
    """Treat CPU tensors as device tensors in ``OffloadActivations`` (used by the memory estimator).

    The simulation runs the same bookkeeping as CUDA (``SimulatedCopies``): a tensor being copied
    to the host stays on the "device" until the copy is known to be done, and backward brings
    ``prefetch`` tensors back ahead of use, so the estimate counts what a GPU holds, not instant copies.

    Args:
        host_ctx: factory of the context inside which host copies are allocated.
        on_saved: called with each saved tensor that stays on the device or is brought back to it.
    """
    global _SIMULATED_HOST_CTX, _ON_SAVED
    previous = _SIMULATED_HOST_CTX, _ON_SAVED
    _SIMULATED_HOST_CTX, _ON_SAVED = host_ctx, on_saved
    try:
        yield
    finally:
        _SIMULATED_HOST_CTX, _ON_SAVED = previous


def _observe(t: torch.Tensor) -> torch.Tensor:
    if _ON_SAVED is not None:
        _ON_SAVED(t)
    return t


def _storage_key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


# --- the copy engines ----------------------------------------------------------------------------------
# OffloadActivations decides what waits on what; an engine carries it out. ``CudaCopies`` is the real
# one. ``SimulatedCopies`` runs the same decisions on CPU tensors with copies that finish at once (the
# memory estimator, and tests that record the decisions): streams and events are plain tokens there.


class CudaCopies:
    """Streams, events, pinned host buffers and asynchronous copies on CUDA."""

    device_type = "cuda"

    def __init__(self, pin_memory: bool = True) -> None:
        self.pin_memory = pin_memory

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def new_stream(self, device: torch.device) -> Any:
        return torch.cuda.Stream(device)

    def on(self, stream: Any) -> ContextManager:
        """Work and allocations inside run on ``stream`` (an allocation belongs to that stream's pool)."""
        return torch.cuda.stream(stream)

    def record(self, stream: Any) -> Any:
        return stream.record_event()

    def wait(self, stream: Any, event: Any) -> None:
        """``stream`` waits (on the GPU; the CPU goes on) until ``event`` has happened."""
        stream.wait_event(event)

    def wait_stream(self, stream: Any, other: Any) -> None:
        stream.wait_stream(other)

    def host_buffer(self, t: torch.Tensor) -> torch.Tensor:
        # pinned: the copy can run asynchronously; the caching host allocator keeps the block until
        # the copies that use it have finished. empty_like keeps the strides autograd saved.
        return torch.empty_like(t, device="cpu", pin_memory=self.pin_memory)

    def device_buffer(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        return torch.empty_like(host, device=device)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = True) -> None:
        dst.copy_(src, non_blocking=non_blocking)


class SimulatedCopies:
    """The engine on CPU tensors that stand for device tensors: every copy is done when it returns.

    Host buffers are made inside ``host_ctx()`` (the estimator counts them as host memory).
    Subclass it to watch the bookkeeping: every operation goes through one method.
    """

    device_type = "cpu"

    def __init__(self, host_ctx: Optional[Callable[[], ContextManager]] = None) -> None:
        self.host_ctx = host_ctx or contextlib.nullcontext

    def current_stream(self, device: torch.device) -> Any:
        return "compute"

    def new_stream(self, device: torch.device) -> Any:
        return object()

    def on(self, stream: Any) -> ContextManager:
        return contextlib.nullcontext()

    def record(self, stream: Any) -> Any:
        return object()

    def wait(self, stream: Any, event: Any) -> None:
        pass

    def wait_stream(self, stream: Any, other: Any) -> None:
        pass

    def host_buffer(self, t: torch.Tensor) -> torch.Tensor:
        with self.host_ctx():
            return torch.empty_like(t)

    def device_buffer(self, host: torch.Tensor, device: torch.device) -> torch.Tensor:
        return torch.empty_like(host)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, non_blocking: bool = True) -> None:
        dst.copy_(src)


_CUDA = CudaCopies()


class _Offloaded:
    """A saved tensor that lives in host memory until backward needs it."""

    __slots__ = ("host", "device", "event", "index", "engine", "uses")

    def __init__(self, host: torch.Tensor, device: torch.device, event: Any, index: int, engine: Any) -> None:
        self.host = host
        self.device = device
        self.event = event  # the device->host copy; None when it was synchronous
        self.index = index
        self.engine = engine
        self.uses = 1  # how many saved-tensor slots hold it (one tensor saved by several ops is moved once)


class _ViewOf:
    """A saved view of an offloaded tensor: the view's geometry on top of the tensor brought back."""

    __slots__ = ("base", "size", "stride", "offset")

    def __init__(self, base: _Offloaded, size: torch.Size, stride: tuple[int, ...], offset: int) -> None:
        self.base, self.size, self.stride, self.offset = base, size, stride, offset


class OffloadActivations(saved_tensors_hooks):
    """Context manager: tensors saved for backward go to (pinned) host memory and come back in backward.

    Wrap the model's forward (and backward) in it. Only tensors of at least ``min_offload_bytes`` are
    moved, never parameters or tensors sharing a parameter's storage (they stay alive on the device
    anyway): pass ``model`` so that saved weight views that autograd or a compiled graph makes are
    recognised too.

    On CUDA, forward copies each tensor to the host on a side stream. The compute stream waits for
    that copy (on the GPU, the CPU goes on) before the tensor is released, and that happens when the
    ``max_in_flight``-th next tensor is packed, so at most ``max_in_flight`` device tensors (with
    checkpointing: about one layer input) are held for copying however far the CPU runs ahead.
    Backward copies each tensor back on another side stream into memory of that stream, together
    with the next ``prefetch`` tensors backward will ask for: each copy waits for the forward copy of
    the same tensor, and compute waits only for the copy of the tensor it uses now, so bringing back
    the next layer's input overlaps the current layer's backward. A copy's memory belongs to the copy
    stream and goes back to its pool when autograd lets the tensor go (on the host, while the GPU may
    still be using it); before new copies are made, the copy stream waits for the compute work queued
    so far, which includes every use of the copies let go, so a reused block is never overwritten
    early. Streams and events only: the host never waits for the GPU, however far ahead it runs, and
    the device copies alive stay about ``prefetch + 2`` (each reused in stream order, not held until the
    host sees the GPU done with it).

    A tensor saved by several ops (an RMSNorm saves its input twice; q, k and v projections each save a
    flattened view of the same input) is moved once each way, unless it was changed in place in between.

    On CPU there is no device memory to save, so packing is a no-op by design; the tensors that would
    move are still counted (``offloaded_bytes``, ``offloaded_tensors``), which keeps the code path
    testable.

    Args:
        min_offload_bytes: smaller tensors stay where they are (copies of tiny tensors cost more than
            they save).
        model: its parameters' storages are never offloaded (read at each ``__enter__``).
        use_streams: copy on side CUDA streams (True) or synchronously on the current stream (False).
        prefetch: how many tensors to bring back ahead of use in backward.
        max_in_flight: how many device tensors may wait for their copy to the host in forward.
        copies: the engine for tensors of ``copies.device_type`` (default: ``CudaCopies`` for CUDA
            tensors); a ``SimulatedCopies`` makes CPU tensors go through the CUDA bookkeeping.
        use_pin_memory: torchtune's: host copies in pinned memory (False: pageable memory, whose copies
            cannot overlap compute).
        max_fwd_stash_size: torchtune's name of ``max_in_flight`` (its default is 5, ours 1).
        min_offload_size: torchtune's name of ``min_offload_bytes``.
    """

    def __init__(
        self,
        min_offload_bytes: int = 1024,
        model: Optional[nn.Module] = None,
        use_streams: bool = True,
        prefetch: int = 1,
        max_in_flight: int = 1,
        copies: Optional[Any] = None,
        *,
        use_pin_memory: bool = True,
        max_fwd_stash_size: Optional[int] = None,
        min_offload_size: Optional[int] = None,
    ) -> None:
        max_in_flight = max_in_flight if max_fwd_stash_size is None else max_fwd_stash_size
        min_offload_bytes = min_offload_bytes if min_offload_size is None else min_offload_size
        if copies is None and not use_pin_memory:
            copies = CudaCopies(pin_memory=False)
        if max_in_flight < 1 or prefetch < 0:
            raise ValueError(f"max_in_flight must be >= 1 and prefetch >= 0, got {max_in_flight} and {prefetch}")
        self.min_offload_bytes = min_offload_bytes
        self.use_streams = use_streams
        self.prefetch = prefetch
        self.max_in_flight = max_in_flight
        self._model = model
        self._copies = copies
        self._param_keys: set[int] = set()
        self.offloaded_bytes = 0
        self.offloaded_tensors = 0
        self._next_index = 0
        # forward: index -> (copy event, device tensor, its stream, engine), until compute has waited
        self._in_flight: dict[int, tuple[Any, torch.Tensor, Any, Any]] = {}
        self._by_index: dict[int, _Offloaded] = {}  # packed and not yet unpacked
        # id(tensor) -> (weak reference, packed) of this forward's offloaded tensors: q/k/v projections
        # all save the same input; it is copied once each way
        self._packed_ids: dict[int, tuple[Any, int, _Offloaded]] = {}
        self._shared: dict[int, torch.Tensor] = {}  # brought back and still to be unpacked by other slots
        self._back: dict[int, tuple[torch.Tensor, Any]] = {}  # prefetched: (device copy, ready event)
        self._streams: dict[tuple[str, torch.device], Any] = {}
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> "OffloadActivations":
        # One instance serves every step: start each from nothing (the previous backward consumed
        # all it saved).
        self.offloaded_bytes = 0
        self.offloaded_tensors = 0
        self._release_in_flight(keep=0)
        self._by_index.clear()
        self._back.clear()
        self._packed_ids.clear()
        self._shared.clear()
        if self._model is not None:
            # at each step: a weight replaced since (load_state_dict(assign=True), to_empty) has a new storage
            self._param_keys = {_storage_key(p) for p in self._model.parameters()}
        super().__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        # a forward-only context (backward outside it): release what still waits for its copy now
        self._release_in_flight(keep=0)
        super().__exit__(*exc)

    # --- helpers ----------------------------------------------------------------------------------
    def _is_param_like(self, t: torch.Tensor) -> bool:
        if isinstance(t, nn.Parameter) or (t._base is not None and isinstance(t._base, nn.Parameter)):
            return True
        if t.is_leaf and t.requires_grad:  # a leaf that trains is a parameter in all but type
            return True
        return bool(self._param_keys) and _storage_key(t) in self._param_keys

    def _engine(self, t: torch.Tensor) -> Any:
        """The copy engine for ``t``, or None when ``t`` is already in host memory."""
        if self._copies is not None and t.device.type == self._copies.device_type:
            return self._copies
        if t.device.type == "cuda":
            return _CUDA
        if _SIMULATED_HOST_CTX is not None and t.device.type == "cpu":
            return SimulatedCopies(_SIMULATED_HOST_CTX)
        return None

    def _stream(self, engine: Any, kind: str, device: torch.device) -> Any:
        key = (kind, device)
        if key not in self._streams:
            self._streams[key] = engine.new_stream(device)
        return self._streams[key]

    def _release_in_flight(self, keep: int) -> None:
        """Let go of all but the newest ``keep`` device tensors waiting for their copy to the host.

        The compute stream waits for each copy before the reference is dropped, so the caching
        allocator can hand the block out again in that stream's order, after the copy has read it.
        """
        while len(self._in_flight) > keep:
            index = next(iter(self._in_flight))  # the oldest
            event, _, stream, engine = self._in_flight.pop(index)
            engine.wait(stream, event)

    # --- hooks ------------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Any:
        nbytes = t.numel() * t.element_size()
        if nbytes < self.min_offload_bytes or self._is_param_like(t):
            return _observe(t)
        engine = self._engine(t)
        if engine is None:
            self.offloaded_bytes += nbytes  # CPU: already in host memory; counted as what would move
            self.offloaded_tensors += 1
            return t
        root = self._whole_base(t)
        if root is not t:
            # a reshaped or transposed view of a whole tensor (the q/k/v projections' flattened input):
            # move the tensor it views, once, and rebuild the view in backward
            packed = self._pack(root)
            if isinstance(packed, _Offloaded):
                return _ViewOf(packed, t.size(), t.stride(), t.storage_offset() - root.storage_offset())
            return _observe(t)
        seen = self._packed_ids.get(id(t))
        if seen is not None and seen[0]() is t and seen[1] == t._version and seen[2].index in self._by_index:
            seen[2].uses += 1  # the same tensor, unchanged, saved again: it is on its way already
            return seen[2]
        self.offloaded_bytes += nbytes
        self.offloaded_tensors += 1
        index = self._next_index
        self._next_index += 1
        compute = engine.current_stream(t.device)
        host = engine.host_buffer(t)
        if self.use_streams:
            self._release_in_flight(keep=self.max_in_flight - 1)
            d2h = self._stream(engine, "d2h", t.device)
            engine.wait_stream(d2h, compute)  # t is written by work queued on the compute stream
            with engine.on(d2h):
                engine.copy(host, t)
                event = engine.record(d2h)
            self._in_flight[index] = (event, t, compute, engine)  # t must live until the copy has read it
        else:
            engine.copy(host, t, non_blocking=False)
            event = None
        packed = _Offloaded(host, t.device, event, index, engine)
        self._by_index[index] = packed
        self._packed_ids[id(t)] = (weakref.ref(t), t._version, packed)
        return packed

    def _whole_base(self, t: torch.Tensor) -> torch.Tensor:
        """The tensor ``t`` is a view of, when ``t`` covers all of it (same elements and dtype, contiguous
        base, so a copy of the base has its layout); else ``t`` itself (a slice is moved on its own)."""
        base = t._base
        if base is None or base.numel() != t.numel() or base.dtype != t.dtype or not base.is_contiguous():
            return t
        if self._is_param_like(base):
            return t
        return base

    def _bring_back(self, packed: _Offloaded) -> tuple[torch.Tensor, Any]:
        """A device copy of ``packed`` and the event after which it is complete (None: complete now)."""
        engine = packed.engine
        if not self.use_streams:
            device_copy = engine.device_buffer(packed.host, packed.device)
            engine.copy(device_copy, packed.host, non_blocking=False)
            return device_copy, None
        h2d = self._stream(engine, "h2d", packed.device)
        with engine.on(h2d):
            if packed.event is not None:
                engine.wait(h2d, packed.event)  # the host copy must be complete; no CPU sync
            # allocated from the copy stream's pool, so the copy waits for no compute work
            device_copy = engine.device_buffer(packed.host, packed.device)
            engine.copy(device_copy, packed.host)
            ready = engine.record(h2d)
        return device_copy, ready

    def _unpack(self, packed: Any) -> torch.Tensor:
        if isinstance(packed, _ViewOf):
            base = self._unpack(packed.base)
            return base.as_strided(packed.size, packed.stride, base.storage_offset() + packed.offset)
        if not isinstance(packed, _Offloaded):
            return packed  # already reported to the observer when it was packed
        self._release_in_flight(keep=0)  # backward has started: forward's copies are all queued
        self._packed_ids.clear()
        shared = self._shared.get(packed.index)
        if shared is not None:  # brought back for another slot of the same tensor
            packed.uses -= 1
            if packed.uses <= 0:
                del self._shared[packed.index]
            return _observe(shared)
        engine = packed.engine
        entry = self._back.pop(packed.index, None)
        # backward runs in reverse order of saving: start bringing back the next ones now
        ahead = [i for i in range(packed.index - 1, packed.index - 1 - self.prefetch, -1) if i in self._by_index]
        ahead = [i for i in ahead if i not in self._back]
        if self.use_streams and (entry is None or ahead):
            # new copies reuse the copy stream's blocks that autograd let go: after their uses, queued so far
            compute = engine.current_stream(packed.device)
            engine.wait_stream(self._stream(engine, "h2d", packed.device), compute)
        tensor, ready = entry if entry is not None else self._bring_back(packed)
        if ready is not None:
            compute = engine.current_stream(packed.device)
            engine.wait(compute, ready)  # this tensor's copy only, not the prefetches behind it
        for index in ahead:
            self._back[index] = self._bring_back(self._by_index[index])
        self._by_index.pop(packed.index, None)
        packed.uses -= 1
        if packed.uses > 0:
            self._shared[packed.index] = tensor
        return _observe(tensor)


def _identity(t: torch.Tensor) -> torch.Tensor:
    return t


class NoOpManager(saved_tensors_hooks):
    """Saved-tensor hooks that keep every tensor as it is. Only the innermost saved-tensor hooks run, so inside
    this context an enclosing ``OffloadActivations`` offloads nothing: a region of code opts out of it."""

    def __init__(self) -> None:
        super().__init__(_identity, _identity)


def get_act_offloading_ctx_manager(
    model: nn.Module, enable_activation_offloading: bool, **kwargs: Any
) -> ContextManager:
    """``OffloadActivations(model=model, **kwargs)`` when enabled, else ``contextlib.nullcontext()``.

    The recipe wraps the model's forward in the returned context manager.
    """
    if enable_activation_offloading:
        return OffloadActivations(model=model, **kwargs)
    return contextlib.nullcontext()

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
from typing import Any, Callable, ContextManager, Iterable, Iterator, Optional, Union

import torch
from torch import nn
from torch.autograd.graph import saved_tensors_hooks
from torch.utils.checkpoint import checkpoint

__all__ = [
    "NoOpManager",
    "OffloadActivations",
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


def set_activation_checkpointing(model: nn.Module, layer_types: Union[type, Iterable[type]]) -> int:
    """Checkpoint every submodule of ``model`` whose type is in ``layer_types``; returns how many.

    Uses ``torch.utils.checkpoint`` with ``use_reentrant=False`` (works with keyword arguments,
    with optimizer-in-backward hooks and with saved-tensor hooks such as ``OffloadActivations``).
    Parameter names are unchanged. Calling it twice does not checkpoint a layer twice.
    """
    types = (layer_types,) if isinstance(layer_types, type) else tuple(layer_types)
    count = 0
    for module in model.modules():
        if isinstance(module, types) and not hasattr(module, _ORIGINAL_FORWARD):
            original = module.forward
            setattr(module, _ORIGINAL_FORWARD, original)
            # instance attribute shadows the class's forward; nn.Module.__call__ picks it up
            module.forward = functools.partial(_checkpointed_forward, original)
            count += 1
    return count


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


class _Offloaded:
    """A saved tensor that lives in host memory until backward needs it."""

    __slots__ = ("host", "device", "event", "index")

    def __init__(self, host: torch.Tensor, device: torch.device, event: Any, index: int) -> None:
        self.host = host
        self.device = device
        self.event = event
        self.index = index


class OffloadActivations(saved_tensors_hooks):
    """Context manager: tensors saved for backward go to (pinned) host memory and come back in backward.

    Wrap the model's forward in it. Only tensors of at least ``min_offload_bytes`` are moved, never
    parameters (they stay alive on the device anyway; a saved weight view shares their storage).

    On CUDA the device->host copy runs on a side stream and the device tensor is released once the
    copy has finished; in backward each tensor is copied back on another side stream, together with
    the next ``prefetch`` tensors backward will ask for, so the copy overlaps compute.

    On CPU there is no device memory to save, so packing is a no-op by design; the tensors that would
    move are still counted (``offloaded_bytes``, ``offloaded_tensors``), which keeps the code path
    testable.

    Args:
        min_offload_bytes: smaller tensors stay where they are (copies of tiny tensors cost more than
            they save).
        model: optional; its parameters' storages are never offloaded (views of them are detected
            without it too).
        use_streams: copy on side CUDA streams (True) or on the current stream (False).
        prefetch: how many tensors to bring back ahead of time in backward (CUDA only).
    """

    def __init__(
        self,
        min_offload_bytes: int = 1024,
        model: Optional[nn.Module] = None,
        use_streams: bool = True,
        prefetch: int = 1,
    ) -> None:
        self.min_offload_bytes = min_offload_bytes
        self.use_streams = use_streams
        self.prefetch = prefetch
        self._param_keys: set[int] = set()
        if model is not None:
            self._param_keys = {_storage_key(p) for p in model.parameters()}
        self.offloaded_bytes = 0
        self.offloaded_tensors = 0
        self._next_index = 0
        self._in_flight: list[tuple[Any, torch.Tensor]] = []  # (event, device tensor) until copied
        self._by_index: dict[int, _Offloaded] = {}
        self._back: dict[int, torch.Tensor] = {}  # prefetched device copies, by index
        self._d2h: Optional[Any] = None
        self._h2d: Optional[Any] = None
        super().__init__(self._pack, self._unpack)

    def __enter__(self) -> "OffloadActivations":
        # One instance serves every step: start each from nothing (the previous backward consumed
        # all it saved).
        self.offloaded_bytes = 0
        self.offloaded_tensors = 0
        self._by_index.clear()
        self._back.clear()
        super().__enter__()
        return self

    # --- helpers ----------------------------------------------------------------------------------
    def _is_param_like(self, t: torch.Tensor) -> bool:
        if isinstance(t, nn.Parameter) or (t._base is not None and isinstance(t._base, nn.Parameter)):
            return True
        if t.is_leaf and t.requires_grad:  # a leaf that trains is a parameter in all but type
            return True
        return bool(self._param_keys) and _storage_key(t) in self._param_keys

    def _release_finished(self, wait: bool = False) -> None:
        still = []
        for event, tensor in self._in_flight:
            if wait:
                event.synchronize()
            elif not event.query():
                still.append((event, tensor))
        self._in_flight = still

    # --- hooks ------------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor) -> Any:
        nbytes = t.numel() * t.element_size()
        if nbytes < self.min_offload_bytes or self._is_param_like(t):
            return _observe(t)
        simulated = _SIMULATED_HOST_CTX is not None and t.device.type == "cpu"
        if t.device.type != "cuda" and not simulated:
            self.offloaded_bytes += nbytes  # CPU: already in host memory; count what would move
            self.offloaded_tensors += 1
            return t
        self.offloaded_bytes += nbytes
        self.offloaded_tensors += 1
        index = self._next_index
        self._next_index += 1
        if simulated:
            with _SIMULATED_HOST_CTX():
                host = torch.empty_like(t)
                host.copy_(t)
            packed = _Offloaded(host, t.device, None, index)
        else:
            packed = self._pack_cuda(t, index)
        self._by_index[index] = packed
        return packed

    def _pack_cuda(self, t: torch.Tensor, index: int) -> _Offloaded:
        self._release_finished()
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
        if self.use_streams:
            if self._d2h is None:
                self._d2h = torch.cuda.Stream(t.device)
            self._d2h.wait_stream(torch.cuda.current_stream(t.device))
            with torch.cuda.stream(self._d2h):
                host.copy_(t, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self._d2h)
            # keep the device tensor referenced until the copy has read it; freed in _release_finished
            self._in_flight.append((event, t))
        else:
            host.copy_(t, non_blocking=False)
            event = None
        return _Offloaded(host, t.device, event, index)

    def _bring_back(self, packed: _Offloaded) -> torch.Tensor:
        if packed.device.type != "cuda":
            device_copy = torch.empty_like(packed.host)  # simulated: the "device" is the CPU
            device_copy.copy_(packed.host)
            return device_copy
        if packed.event is not None:
            packed.event.synchronize()
        if not self.use_streams:
            return packed.host.to(packed.device, non_blocking=False)
        if self._h2d is None:
            self._h2d = torch.cuda.Stream(packed.device)
        compute = torch.cuda.current_stream(packed.device)
        device_copy = torch.empty(packed.host.shape, dtype=packed.host.dtype, device=packed.device)
        self._h2d.wait_stream(compute)  # the allocation above is ordered on the compute stream
        with torch.cuda.stream(self._h2d):
            device_copy.copy_(packed.host, non_blocking=True)
        device_copy.record_stream(self._h2d)
        return device_copy

    def _unpack(self, packed: Any) -> torch.Tensor:
        if not isinstance(packed, _Offloaded):
            return packed  # already reported to the observer when it was packed
        if self._in_flight:
            self._release_finished(wait=True)  # backward started: every forward copy must be done
        tensor = self._back.pop(packed.index, None)
        if tensor is None:
            tensor = self._bring_back(packed)
        if packed.device.type == "cuda":
            # backward runs in reverse order of saving: start copying the next ones now
            for ahead in range(packed.index - 1, packed.index - 1 - self.prefetch, -1):
                nxt = self._by_index.get(ahead)
                if nxt is not None and ahead not in self._back:
                    self._back[ahead] = self._bring_back(nxt)
            if self._h2d is not None:
                torch.cuda.current_stream(packed.device).wait_stream(self._h2d)
        self._by_index.pop(packed.index, None)
        return _observe(tensor)


class NoOpManager(contextlib.nullcontext):
    """The context manager used when activation offloading is off."""


def get_act_offloading_ctx_manager(
    model: nn.Module, enable_activation_offloading: bool, **kwargs: Any
) -> ContextManager:
    """``OffloadActivations(model=model, **kwargs)`` when enabled, else a context manager that does nothing.

    The recipe wraps the model's forward in the returned context manager.
    """
    if enable_activation_offloading:
        return OffloadActivations(model=model, **kwargs)
    return NoOpManager()

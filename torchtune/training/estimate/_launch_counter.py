"""What one training step asks of a GPU, counted on a CPU: kernel launches by kind, host synchronisations,
host-to-device copies, and the host time of each parameter's optimizer step.

The step runs on its CUDA code path with the device played by ``meta`` tensors (shapes and dtypes, no
data, no memory) and the host by real CPU tensors, under ``LaunchCounter``, a ``TorchDispatchMode`` that sees
every ATen op, in forward and in backward (dispatch modes stay active inside the autograd engine). Meta
rather than the memory estimator's fake CPU tensors because a meta tensor is never a host tensor: a host
computation (the label positions of a batch on its host copy, an optimizer's step count) runs for real,
a device-to-host read is an op on a meta tensor, and a host-to-device copy is an op from a CPU tensor to a
meta one. ``Tensor.to("cuda")``/``.cuda()`` and ``cuda`` device arguments that reach an op run on ``meta``
(a factory called with ``device="cuda"`` initialises CUDA first: callers map it, ``mapped_device``).

How ops map to launches:

- ops on host tensors only: host work, no launch;
- views and metadata ops (``OpOverload.is_view``, ``detach``, ...) and allocations (``empty*``): no launch;
- every other op on a device tensor: one launch (a GEMM, an elementwise or reduction kernel, a fill);
- a region the code declares as compiled kernels (``kernel_region(kind, launches=n)``: an Inductor/Triton
  kernel, whose meta stand-in runs placeholder ops or none): ``n`` launches of ``kind``, whatever runs inside;
- attention: the CUDA kernel's own op, counted as its kernels (``ATTENTION_LAUNCHES``: FlashAttention-2's
  backward is three kernels, a compiled FlexAttention's forward one and its backward two);
- a copy between host and device: one launch of kind ``copy``, recorded as host-to-device (from pinned or
  pageable memory; CUDA waits for the stream before a copy from pageable memory) or device-to-host; a
  device-to-host copy that is not ``non_blocking`` into pinned memory is also a host sync;
- host syncs: ``aten._local_scalar_dense`` on a device tensor (``item()``, ``float(t)``, ``bool(t)``; the
  elements of one ``tolist()`` read together count once), a blocking device-to-host copy, an op whose output
  shape depends on device data (``nonzero``, ``masked_select``, ``unique``, ...), ``str``/``format`` of a
  device tensor (it reads the values), and host waits the code reports (``note_host_sync``: an event's or the
  device's ``synchronize``). GPU-side waits (a stream waiting for an event) are counted apart: they cost the
  host nothing;
- prefetches of paged (CUDA managed) optimizer state are counted apart (``note_prefetch``).

Kinds: ``optimizer`` (ops inside an in-backward optimizer hook or ``Optimizer.step``), ``rounding`` (inside
``kernel_region("rounding")``), ``attention``, ``norm`` (ops of a module whose class name ends in ``Norm``,
forward and the backward of the autograd nodes it made), ``copy`` (casts, clones, copies and host/device
transfers elsewhere) and ``other``.

This file imports nothing but torch, so a benchmark can load it by path beside another ``torchtune``
(torchtune 0.6.1, ``benchmarks/bench_step_launches.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from collections import Counter
from typing import Any, Callable, Iterator, Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves, tree_map

__all__ = [
    "DEVICE",
    "KINDS",
    "LaunchCounter",
    "StepCount",
    "counting",
    "kernel_region",
    "note_copy",
    "note_host_sync",
    "note_prefetch",
    "note_stream_wait",
    "optimizer_work",
]

DEVICE = torch.device("meta")  # plays the CUDA device
KINDS = ("optimizer", "rounding", "attention", "norm", "copy", "other")

_aten = torch.ops.aten
# no kernel: metadata, aliasing, allocation without initialisation
_NO_LAUNCH = {
    _aten.detach.default,
    _aten.alias.default,
    _aten.empty.memory_format,
    _aten.empty_like.default,
    _aten.empty_strided.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
    _aten.lift_fresh.default,
    _aten.set_.source_Storage_storage_offset,
    _aten.set_.source_Tensor,
    _aten.record_stream.default,
    _aten.is_pinned.default,
    _aten.is_same_size.default,
    _aten.sym_size.int,
    _aten.sym_stride.int,
    _aten.sym_numel.default,
    _aten.sym_storage_offset.default,
}
_COPIES = {
    _aten.copy_.default,
    _aten._to_copy.default,
    _aten.clone.default,
    _aten.lift_fresh_copy.default,
}
_DATA_DEPENDENT = {
    _aten.nonzero.default,
    _aten.masked_select.default,
    _aten._unique2.default,
    _aten.unique_dim.default,
    _aten.unique_consecutive.default,
    _aten.repeat_interleave.Tensor,
}
# CUDA attention ops and the kernels each launches
ATTENTION_LAUNCHES = {
    _aten._scaled_dot_product_flash_attention.default: 1,
    # FlashAttention-2's mha_bwd: dot(dO, O), the dq/dk/dv kernel, the fp32 dq accumulator's conversion
    _aten._scaled_dot_product_flash_attention_backward.default: 3,
    _aten._scaled_dot_product_efficient_attention.default: 1,
    _aten._scaled_dot_product_efficient_attention_backward.default: 1,
    _aten._efficient_attention_forward.default: 1,
    _aten._efficient_attention_backward.default: 1,
}

# stand-ins for compiled kernels, by name (defined in ``_attention_kernels``, which this file does not import)
NAMED_LAUNCHES = {
    "tune_kernels::flex_attention": ("attention", 1),
    "tune_kernels::flex_attention_backward": ("attention", 2),
}

_ACTIVE: Optional["LaunchCounter"] = None


def _storage_key(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError):
        return None


@dataclasses.dataclass
class StepCount:
    """What one step asked of the device (see the module docstring for what each figure counts)."""

    launches: dict[str, int]  # by kind
    host_syncs: list[str]  # what each one was
    h2d_pageable: int = 0
    h2d_pinned: int = 0
    d2h: int = 0
    stream_waits: int = 0  # GPU-side waits (no host cost)
    prefetches: int = 0  # paged-state prefetches
    optimizer_params: int = 0  # parameters stepped (in-backward hook calls, or in Optimizer.step)
    optimizer_host_s: float = 0.0  # host seconds in those steps, outside the ops' own dispatch
    optimizer_launches: int = 0  # launches inside them (optimizer and rounding kinds)

    @property
    def total(self) -> int:
        return sum(self.launches.values())

    @property
    def syncs(self) -> int:
        return len(self.host_syncs)

    def per_parameter_us(self) -> float:
        return 1e6 * self.optimizer_host_s / max(self.optimizer_params, 1)

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["total"] = self.total
        out["syncs"] = self.syncs
        return out


class LaunchCounter(TorchDispatchMode):
    """Counts device launches, host syncs and copies of the ops run under it (see the module docstring).

    Use through ``counting(counter)``, which also installs the module, optimizer and hook observers.
    ``reset()`` starts a new step; ``count()`` returns the figures since.
    """

    def __init__(self) -> None:
        super().__init__()
        self._host_marks: dict[int, bool] = {}  # meta storages standing for host memory -> pinned
        self._pinned_host: set[int] = set()  # real CPU storages the code pinned (or the loader would pin)
        self._module_kinds: list[str] = []  # kind of each module whose forward is running (norm or "")
        self._node_kinds: dict[int, str] = {}  # id(autograd node) -> kind, for backward
        self._nodes_alive: list[Any] = []  # keeps the nodes alive while their ids are keys
        self._regions: list[tuple[str, Optional[int]]] = []
        self._optimizer_depth = 0
        self._dispatch_s = 0.0  # time inside this mode (the ops' own dispatch), to leave out of host time
        self.reset()

    # --- the figures ------------------------------------------------------------------------------
    def reset(self) -> None:
        self._launches: Counter = Counter()
        self._syncs: list[str] = []
        self._h2d = {"pageable": 0, "pinned": 0}
        self._d2h = 0
        self._stream_waits = 0
        self._prefetches = 0
        self._params = 0
        self._opt_s = 0.0
        self._opt_launches = 0
        self._last_read: Optional[int] = None  # storage of the last scalar read, for tolist()'s elements
        self._node_kinds = {}
        self._nodes_alive = []

    def count(self) -> StepCount:
        return StepCount(
            launches={k: self._launches.get(k, 0) for k in KINDS},
            host_syncs=list(self._syncs),
            h2d_pageable=self._h2d["pageable"],
            h2d_pinned=self._h2d["pinned"],
            d2h=self._d2h,
            stream_waits=self._stream_waits,
            prefetches=self._prefetches,
            optimizer_params=self._params,
            optimizer_host_s=self._opt_s,
            optimizer_launches=self._opt_launches,
        )

    # --- what the code reports ------------------------------------------------------------------------
    def launch(self, kind: str, n: int = 1) -> None:
        if n <= 0:
            return
        self._launches[kind] += n
        if self._optimizer_depth:
            self._opt_launches += n
        self._last_read = None

    def host_sync(self, what: str) -> None:
        self._syncs.append(what)

    def copy(self, direction: str, pinned: bool, non_blocking: bool = True) -> None:
        """One host/device transfer (``h2d`` or ``d2h``), a launch of kind copy (or the region's kind)."""
        self.launch(self._context_kind("copy"))
        if direction == "h2d":
            self._h2d["pinned" if pinned else "pageable"] += 1
        else:
            self._d2h += 1
            if not (non_blocking and pinned):
                self.host_sync("device-to-host copy")

    def mark_host(self, t: torch.Tensor, pinned: bool) -> None:
        """``t`` (a meta tensor) stands for host memory, pinned or not."""
        key = _storage_key(t)
        if key is not None:
            self._host_marks[key] = pinned
            weakref.finalize(t.untyped_storage(), self._host_marks.pop, key, None)

    def mark_pinned(self, t: torch.Tensor) -> None:
        """Real host tensor ``t`` counts as pinned (a CPU-only build cannot pin)."""
        key = _storage_key(t)
        if key is not None:
            self._pinned_host.add(key)
            weakref.finalize(t.untyped_storage(), self._pinned_host.discard, key)

    def _is_host(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" or _storage_key(t) in self._host_marks

    def _is_pinned(self, t: torch.Tensor) -> bool:
        key = _storage_key(t)
        return self._host_marks.get(key, False) if t.device.type == "meta" else key in self._pinned_host

    # --- kinds ------------------------------------------------------------------------------------------
    def _context_kind(self, fallback: str) -> str:
        for kind, _ in reversed(self._regions):
            return kind
        if self._optimizer_depth:
            return "optimizer"
        if self._module_kinds and self._module_kinds[-1]:
            return self._module_kinds[-1]
        node = torch._C._current_autograd_node()
        if node is not None:
            kind = self._node_kinds.get(id(node))
            if kind:
                return kind
        return fallback

    def _declared(self) -> bool:
        return any(n is not None for _, n in self._regions)

    # --- the dispatch ---------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        start = time.perf_counter()
        try:
            return self._dispatch(func, args, kwargs or {})
        finally:
            self._dispatch_s += time.perf_counter() - start

    def _dispatch(self, func, args, kwargs):
        kwargs = dict(kwargs)
        if kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cuda":
            kwargs["device"] = DEVICE
        tensors = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_device = any(t.device.type == "meta" for t in tensors) or kwargs.get("device") == DEVICE

        if func is _aten.is_pinned.default:
            return self._is_pinned(args[0])
        if func in (_aten._pin_memory.default, _aten.pin_memory.default):
            self.mark_pinned(args[0])  # a CPU-only build cannot pin: the tensor counts as pinned
            return args[0]
        if func is _aten._local_scalar_dense.default:
            return self._scalar_read(args[0])
        if func in (_aten.empty_like.default, _aten.empty.memory_format) and "pin_memory" in kwargs:
            pinned = bool(kwargs.pop("pin_memory"))
            if on_device and kwargs.get("device") is not None and torch.device(kwargs["device"]).type == "cpu":
                # a host buffer for a device tensor (offloading): meta, marked as host memory
                kwargs["device"] = DEVICE
                out = func(*args, **kwargs)
                self.mark_host(out, pinned)
                return out
            out = func(*args, **kwargs)
            if pinned:
                self.mark_pinned(out)
            return out
        if func in (_aten.copy_.default, _aten._to_copy.default):
            moved = self._transfer(func, args, kwargs)
            if moved is not None:
                return moved
        if not on_device:
            return func(*args, **kwargs)  # host work
        if func in _DATA_DEPENDENT or (func is _aten.index.Tensor and _bool_index(args)):
            self.host_sync(f"{func} (output shape depends on device data)")
        out = func(*args, **kwargs)
        if func in _NO_LAUNCH or func.is_view or self._declared():
            return out
        if func in ATTENTION_LAUNCHES:
            self.launch("attention", ATTENTION_LAUNCHES[func])
        elif func.name() in NAMED_LAUNCHES:
            self.launch(*NAMED_LAUNCHES[func.name()])
        else:
            self.launch(self._context_kind("copy" if func in _COPIES else "other"))
        return out

    def _scalar_read(self, t: torch.Tensor) -> Any:
        if t.device.type != "meta":
            with _disable_current_modes():
                return t.item()
        key = _storage_key(t)
        if key not in self._host_marks and (key is None or key != self._last_read):
            self.host_sync("item() / tolist() / float() of a device tensor")
        self._last_read = key
        return _unknown(t.dtype)

    def _transfer(self, func, args, kwargs) -> Optional[torch.Tensor]:
        """A host<->device copy: counted, and done as an allocation on ``meta`` (nothing is read or written).
        None when the copy stays on one side (a cast, a clone: an ordinary op)."""
        if func is _aten._to_copy.default:
            src, target = args[0], kwargs.get("device")
            if target is None:
                return None
            src_host, dst_host = self._is_host(src), torch.device(target).type == "cpu"
            if src_host == dst_host:
                return None
            non_blocking = bool(kwargs.get("non_blocking", False))
            with _disable_current_modes():
                out = torch.empty_like(src, device=DEVICE, **_like_kwargs(kwargs))
            if dst_host:
                self.copy("d2h", False, non_blocking)  # into new pageable memory
                self.mark_host(out, False)
            else:
                self.copy("h2d", self._is_pinned(src), non_blocking)
            return out
        dst, src = args[0], args[1]
        dst_host, src_host = self._is_host(dst), self._is_host(src)
        if dst_host == src_host:
            return None
        non_blocking = bool(args[2]) if len(args) > 2 else bool(kwargs.get("non_blocking", False))
        if src_host:
            self.copy("h2d", self._is_pinned(src), non_blocking)
        else:
            self.copy("d2h", self._is_pinned(dst), non_blocking)
        return dst

    # --- observers installed by counting() ------------------------------------------------------------
    def _module_pre(self, module: torch.nn.Module, args: Any) -> None:
        self._module_kinds.append("norm" if type(module).__name__.endswith("Norm") else "")

    def _module_post(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        kind = self._module_kinds.pop() if self._module_kinds else ""
        if kind:
            self._mark_nodes(output, args, kind)

    def _mark_nodes(self, output: Any, inputs: Any, kind: str) -> None:
        """The autograd nodes between ``inputs`` and ``output`` (what backward runs for this module) get ``kind``."""
        stop = {id(t.grad_fn) for t in tree_leaves(inputs) if isinstance(t, torch.Tensor) and t.grad_fn is not None}
        todo = [t.grad_fn for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        seen: set[int] = set()
        while todo:
            node = todo.pop()
            if node is None or id(node) in seen or id(node) in stop or type(node).__name__ == "AccumulateGrad":
                continue
            seen.add(id(node))
            self._node_kinds[id(node)] = kind
            self._nodes_alive.append(node)
            todo.extend(next_node for next_node, _ in node.next_functions)

    @contextlib.contextmanager
    def optimizer_step(self, params: int = 1) -> Iterator[None]:
        """Inside: one optimizer step of ``params`` parameters (its host time is counted)."""
        self._optimizer_depth += 1
        start, inside = time.perf_counter(), self._dispatch_s
        try:
            yield
        finally:
            self._optimizer_depth -= 1
            if not self._optimizer_depth:
                self._opt_s += (time.perf_counter() - start) - (self._dispatch_s - inside)
                self._params += params

    @contextlib.contextmanager
    def region(self, kind: str, launches: Optional[int]) -> Iterator[None]:
        self._regions.append((kind, launches))
        try:
            yield
        finally:
            self._regions.pop()
        if launches is not None and not self._declared():
            self.launch(kind, launches)


def _unknown(dtype: torch.dtype) -> Any:
    """What a read of a device value returns here, where values are unknown: -1 (a NaN guard's "no bad step",
    whether read as an integer or among a logged step's floats), False for a bool."""
    if dtype == torch.bool:
        return False
    return -1.0 if dtype.is_floating_point else -1


def _bool_index(args: Any) -> bool:
    indices = args[1] if len(args) > 1 else []
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.device.type == "meta" for i in indices)


def _like_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k in ("dtype", "memory_format") and v is not None}


# --- what code reports to the counter that is running (no-ops without one) ----------------------------


@contextlib.contextmanager
def kernel_region(kind: str, launches: Optional[int] = None) -> Iterator[None]:
    """Ops inside count as ``kind``; with ``launches``, the region is that many launches (one compiled kernel,
    whose stand-in on meta/fake tensors runs placeholder ops or none). A no-op when nothing counts."""
    counter = _ACTIVE
    if counter is None:
        yield
        return
    with counter.region(kind, launches):
        yield


@contextlib.contextmanager
def optimizer_work() -> Iterator[None]:
    """Inside: optimizer work that runs outside a parameter's hook (a deferred multi-tensor step): its launches
    and host time are the optimizer step's (its parameters were counted by their hooks)."""
    counter = _ACTIVE
    if counter is None:
        yield
        return
    with counter.optimizer_step(0):
        yield


def note_host_sync(what: str) -> None:
    """The host waits for the device here (an event's or the device's ``synchronize``)."""
    if _ACTIVE is not None:
        _ACTIVE.host_sync(what)


def note_stream_wait() -> None:
    """A stream waits for an event or another stream (on the GPU: no host cost)."""
    if _ACTIVE is not None:
        _ACTIVE._stream_waits += 1


def note_copy(direction: str, pinned: bool, non_blocking: bool = True) -> None:
    """A host/device copy made by a copy engine that runs no op (``h2d`` or ``d2h``)."""
    if _ACTIVE is not None:
        _ACTIVE.copy(direction, pinned, non_blocking)


def note_prefetch() -> None:
    """A prefetch of paged (managed) memory to the device."""
    if _ACTIVE is not None:
        _ACTIVE._prefetches += 1


# --- the observers ------------------------------------------------------------------------------------


@contextlib.contextmanager
def counting(counter: LaunchCounter) -> Iterator[LaunchCounter]:
    """Count with ``counter``: its dispatch mode, module hooks (norm kind), the optimizer observers (each
    post-accumulate-grad hook registered inside is one parameter's in-backward step; ``Optimizer.step`` of a
    standard optimizer is one step of its parameters), and ``str``/``format`` of device tensors as host reads.
    Build the model and optimizer inside, so the hooks they register are observed."""
    global _ACTIVE
    from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    previous = _ACTIVE
    _ACTIVE = counter
    handles = [
        register_module_forward_pre_hook(counter._module_pre),
        register_module_forward_hook(counter._module_post),
    ]
    opened: list[Any] = []

    def pre(optimizer: Any, args: Any, kwargs: Any) -> None:
        if counter._optimizer_depth:  # an in-backward hook's step: already counted there
            opened.append(None)
            return
        params = sum(1 for g in optimizer.param_groups for p in g["params"] if p.grad is not None)
        region = counter.optimizer_step(params)
        region.__enter__()
        opened.append(region)

    def post(optimizer: Any, args: Any, kwargs: Any) -> None:
        region = opened.pop() if opened else None
        if region is not None:
            region.__exit__(None, None, None)

    handles += [register_optimizer_step_pre_hook(pre), register_optimizer_step_post_hook(post)]
    register_hook = torch.Tensor.register_post_accumulate_grad_hook
    fmt, rep = torch.Tensor.__format__, torch.Tensor.__repr__

    def observed_hook(self: torch.Tensor, hook: Callable[[torch.Tensor], None]) -> Any:
        def timed(param: torch.Tensor) -> None:
            with counter.optimizer_step(1):
                hook(param)

        return register_hook(self, timed)

    formatting: list[bool] = []

    def read(original: Callable[..., str]) -> Callable[..., str]:
        def reading(self: torch.Tensor, *args: Any) -> str:
            if formatting:  # format() calls repr(): one read
                return original(self, *args)
            if self.device.type == "meta" and not counter._is_host(self):
                counter.host_sync("str()/format() of a device tensor")
            formatting.append(True)
            try:
                return original(self, *args)
            finally:
                formatting.pop()

        return reading

    to, cuda, tolist = torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.tolist

    def tolist_meta(self: torch.Tensor) -> Any:
        if self.device.type != "meta":
            return tolist(self)
        if not counter._is_host(self):
            counter.host_sync("tolist() of a device tensor")
        out: Any = _unknown(self.dtype)
        for size in reversed(self.shape):
            out = [out] * size if not isinstance(out, list) else [list(out) for _ in range(size)]
        return out

    def to_meta(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # ``t.to("cuda")`` initialises CUDA before any dispatch: the device is swapped for meta first
        args, kwargs = mapped_device(args), mapped_device(kwargs)
        target = kwargs.get("device", args[0] if args and isinstance(args[0], (torch.device, str)) else None)
        if target is not None and torch.device(target) == DEVICE and self.device == DEVICE and counter._is_host(self):
            # a host buffer played by meta going to the device: no op would run (meta to meta), so counted here
            counter.copy("h2d", counter._is_pinned(self), bool(kwargs.get("non_blocking", False)))
            with _disable_current_modes():
                return torch.empty_like(self)
        return to(self, *args, **kwargs)

    def cuda_to_meta(self: torch.Tensor, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        return to(self, DEVICE, non_blocking=non_blocking)

    torch.Tensor.register_post_accumulate_grad_hook = observed_hook
    torch.Tensor.__format__, torch.Tensor.__repr__ = read(fmt), read(rep)
    torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.tolist = to_meta, cuda_to_meta, tolist_meta
    from torch.fx.experimental import _config as fx_config

    try:
        # nonzero on meta: the output as if every element were non-zero (its size is the worst case)
        with counter, fx_config.patch(meta_nonzero_assume_all_nonzero=True):
            yield counter
    finally:
        torch.Tensor.register_post_accumulate_grad_hook = register_hook
        torch.Tensor.__format__, torch.Tensor.__repr__ = fmt, rep
        torch.Tensor.to, torch.Tensor.cuda, torch.Tensor.tolist = to, cuda, tolist
        for handle in handles:
            handle.remove()
        _ACTIVE = previous


def mapped_device(value: Any) -> Any:
    """``value`` with every ``cuda`` device (a ``torch.device`` or a string) replaced by ``DEVICE``."""

    def swap(x: Any) -> Any:
        if isinstance(x, torch.device) and x.type == "cuda":
            return DEVICE
        if isinstance(x, str) and x.startswith("cuda"):
            return DEVICE
        return x

    return tree_map(swap, value)


@contextlib.contextmanager
def simulated_bitsandbytes() -> Iterator[None]:
    """bitsandbytes' optimizers as on CUDA, on meta tensors: state buffers of 1e5 elements or more are paged
    (marked as bitsandbytes marks its managed buffers, made by ``zeros_like``: the fill bitsandbytes launches),
    prefetches are counted (``note_prefetch``), and ``sync_gpu`` (``torch.cuda.synchronize()`` after every
    parameter's update) is a host sync. Their quantization maps are built on the host, as there. A no-op
    without bitsandbytes."""
    try:
        import bitsandbytes.functional as bnb_functional
        import bitsandbytes.optim.optimizer as bnb_optimizer
    except ImportError:
        yield
        return
    cls = bnb_optimizer.Optimizer8bit
    saved = (cls.get_state_buffer, cls.fill_qmap, bnb_functional.prefetch_tensor, bnb_optimizer.sync_gpu)

    def get_state_buffer(self: Any, p: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        buffer = torch.zeros_like(p, dtype=dtype)
        if self.is_paged and p.numel() >= 1e5:
            buffer.is_paged = True
            buffer.page_deviceid = 0
        return buffer

    def fill_qmap(self: Any) -> None:
        with _disable_current_modes():
            saved[1](self)

    def prefetch_tensor(a: torch.Tensor, to_cpu: bool = False) -> None:
        note_prefetch()

    def sync_gpu(t: torch.Tensor) -> None:
        if t.device.type == "meta":
            note_host_sync("torch.cuda.synchronize() (bitsandbytes' sync_gpu)")

    cls.get_state_buffer, cls.fill_qmap = get_state_buffer, fill_qmap
    bnb_functional.prefetch_tensor, bnb_optimizer.sync_gpu = prefetch_tensor, sync_gpu
    try:
        yield
    finally:
        cls.get_state_buffer, cls.fill_qmap = saved[0], saved[1]
        bnb_functional.prefetch_tensor, bnb_optimizer.sync_gpu = saved[2], saved[3]


class _Event:
    """A CUDA event as the counter sees it: recording is free, the host waiting for it is a sync."""

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        note_stream_wait()

    def synchronize(self) -> None:
        note_host_sync("event.synchronize()")

    def query(self) -> bool:
        return True


class _Stream:
    """A CUDA stream as the counter sees it (its work is counted by the ops themselves)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _Event:
        return event if event is not None else _Event()

    def wait_event(self, event: Any) -> None:
        note_stream_wait()

    def wait_stream(self, other: Any) -> None:
        note_stream_wait()

    def synchronize(self) -> None:
        note_host_sync("stream.synchronize()")


@contextlib.contextmanager
def simulated_cuda_streams() -> Iterator[None]:
    """``torch.cuda``'s streams, events and ``synchronize`` for code written for CUDA, on a build without it:
    stand-ins whose waits are counted (``event.synchronize()``, ``torch.cuda.synchronize()``: host syncs;
    ``wait_event``/``wait_stream``: GPU-side waits), ``torch.cuda.stream(s)`` a no-op context, and
    ``Tensor.record_stream`` a no-op."""
    cuda = torch.cuda
    names = ("Stream", "Event", "default_stream", "current_stream", "stream", "synchronize")
    saved = {name: getattr(cuda, name) for name in names}
    record_stream = torch.Tensor.record_stream
    compute = _Stream()
    cuda.Stream, cuda.Event = _Stream, lambda *args, **kwargs: _Event()
    cuda.default_stream = cuda.current_stream = lambda *args, **kwargs: compute
    cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    cuda.synchronize = lambda *args, **kwargs: note_host_sync("torch.cuda.synchronize()")
    torch.Tensor.record_stream = lambda self, stream: None
    try:
        yield
    finally:
        for name, value in saved.items():
            setattr(cuda, name, value)
        torch.Tensor.record_stream = record_stream

"""Peak-memory estimate of a training step, on fake tensors, split by what the memory holds.

How it counts: a ``TorchDispatchMode`` (``StorageCounter``) sees every tensor an op returns and
registers its storage once, with a ``weakref.finalize`` on the storage object that subtracts it when
the storage dies. Sizes are rounded up to 512 bytes as the CUDA caching allocator does. The same
counter runs on real tensors (``fake=False``), which is how the estimate is checked against a real run.

At every new peak the live storages are put into categories:

- weights: storages of the model's parameters and buffers;
- gradients: storages referenced by a parameter's ``.grad`` (with optimizer in backward each is freed
  in its hook, so at most a few are alive);
- optimizer state (device): tensors in ``optimizer.state`` of every optimizer that stepped;
- activations: storages autograd saved for backward, seen through saved-tensor hooks (layer inputs
  at checkpoint boundaries, non-checkpointed layers, the loss inputs). The recomputed insides of the
  layer being back-propagated under activation checkpointing are invisible to those hooks and count
  as temporaries;
- temporaries: everything else alive at that moment.

Optimizers from bitsandbytes and torchao do not run on fake tensors. For them the estimator uses
``LayoutOptimizer``: it runs the real optimizer class once on small real CPU tensors of the
parameter's dtype, measures the state bytes it creates per parameter (including per-block absmax and
quantization maps, and bitsandbytes' rules: 32-bit state below ``min_8bit_size`` elements, paged
buffers only from 1e5 elements), scales them linearly to the parameter's size, and allocates that many
bytes on the device, or counts them as paged/managed memory (not in the device peak, needs host RAM).

Fake tensors stand for device tensors but are CPU tensors here: fake CUDA tensors cannot take part in
autograd on a PyTorch build without CUDA, and SDPA picks its math kernel for them. The CPU flash
attention kernel saves the same tensors (output and fp32 log-sum-exp) as the CUDA flash kernel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import weakref
from typing import Any, Callable, ContextManager, Iterator, Optional

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_leaves

from torchtune.config._instantiate import COMPONENT_KEY

__all__ = [
    "CATEGORIES",
    "LayoutOptimizer",
    "MemoryEstimate",
    "StorageCounter",
    "measure_state_layout",
    "profile_memory",
]

GB = 1e9
CATEGORIES = ("weights", "gradients", "optimizer_state", "activations", "temporaries")
# device memory, anonymous host RAM, CUDA managed memory (paged optimizers), file pages of mmap loads
MEMORY_KINDS = ("device", "host", "managed", "mapped")
# PCIe 4.0 x16 moves about 25 GB/s each way in practice (32 GB/s raw): the bandwidth paged state is costed at.
PCIE_GB_PER_S = 25.0
_ALIGN = 512  # the CUDA caching allocator rounds every block up to a multiple of 512 bytes


def _rounded(nbytes: int) -> int:
    return 0 if nbytes == 0 else -(-nbytes // _ALIGN) * _ALIGN


def _storage_key(t: torch.Tensor) -> Optional[int]:
    try:
        return t.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, TypeError):  # tensor subclasses without one storage
        return None


def _inner_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding ``t``'s data (unwraps torchao-style tensor subclasses)."""
    # a plain Parameter is not a wrapper; a Parameter of a subclass (FSDP2's DTensor shards) is
    if hasattr(t, "__tensor_flatten__") and type(t) not in (torch.Tensor, nn.Parameter):
        try:
            names, _ = t.__tensor_flatten__()
        except Exception:  # not a wrapper subclass after all
            return [t]
        out: list[torch.Tensor] = []
        for name in names:
            inner = getattr(t, name)
            if isinstance(inner, torch.Tensor):  # DTensor also names its (opaque) device mesh
                out.extend(_inner_tensors(inner))
        return out
    return [t]


class StorageCounter(TorchDispatchMode):
    """Counts the bytes of live tensor storages created by ops while the mode is active.

    ``current``/``peak`` are device bytes. Host-side memory is counted apart, in three kinds:
    ``host`` (anonymous host RAM: allocations made inside ``host()``, and, with ``cpu_is_host``, every
    CPU tensor), ``managed`` (CUDA managed memory of paged optimizers: allocations inside ``managed()``)
    and ``mapped`` (file pages of memory-mapped loads: allocations inside ``mapped()``).
    ``cpu_is_host=False`` (the training steps) lets CPU fake tensors stand for the device;
    ``cpu_is_host=True`` (set-up, save, resume) has meta fake tensors stand for the device and CPU
    tensors for the host, so device-to-host copies are seen as what they are.
    ``classify`` (optional) is called at every new device peak and returns ``{storage key: category}``
    for the storages it recognises (one of ``categories``); the rest are temporaries. Storages resized in
    place (FSDP2 frees and re-allocates its all-gather buffers with ``untyped_storage().resize_``, which
    no dispatch mode sees) are followed inside ``resizes()``.
    """

    def __init__(
        self,
        classify: Optional[Callable[[], dict[int, str]]] = None,
        on_free: Optional[Callable[[int], None]] = None,
        cpu_is_host: bool = False,
        categories: tuple[str, ...] = CATEGORIES,
    ) -> None:
        super().__init__()
        self.classify = classify
        self.on_free = on_free
        self.cpu_is_host = cpu_is_host
        self.categories = categories
        self.peak_breakdown: dict[str, int] = {c: 0 for c in categories}
        self.peak_op = ""  # the op whose output made the peak
        self._op = ""
        self._tables: dict[str, dict[int, int]] = {kind: {} for kind in MEMORY_KINDS}
        # "host_ram": host + managed together, the host RAM a run needs when paged state is paged out
        self._current = {kind: 0 for kind in (*MEMORY_KINDS, "host_ram")}
        self._peak = dict(self._current)
        self._window_peak = dict(self._current)  # since the last reset_window()
        self._context: list[str] = []
        self._released: set[int] = set()  # storages alive but no longer counted (see release())

    # --- the figures ----------------------------------------------------------------------------
    @property
    def current(self) -> int:
        return self._current["device"]

    @property
    def peak(self) -> int:
        return self._peak["device"]

    @property
    def window_peak(self) -> int:
        return self._window_peak["device"]

    @property
    def host_current(self) -> int:
        return self._current["host"]

    @property
    def host_peak(self) -> int:
        return self._peak["host"]

    @property
    def _live(self) -> dict[int, int]:
        return self._tables["device"]

    @property
    def _host_live(self) -> dict[int, int]:
        return self._tables["host"]

    def current_bytes(self, kind: str) -> int:
        return self._current[kind]

    def window_peak_bytes(self, kind: str) -> int:
        return self._window_peak[kind]

    def reset_window(self) -> None:
        """Start a new window (one training step, one phase) for the ``window_peak`` figures."""
        self._window_peak = dict(self._current)

    # --- where new storages are counted -----------------------------------------------------------
    @contextlib.contextmanager
    def _kind(self, kind: str) -> Iterator[None]:
        self._context.append(kind)
        try:
            yield
        finally:
            self._context.pop()

    def host(self) -> ContextManager[None]:
        """Allocations made inside count as host memory (pinned host copies of offloaded tensors)."""
        return self._kind("host")

    def managed(self) -> ContextManager[None]:
        """Allocations made inside count as CUDA managed memory (paged optimizer state)."""
        return self._kind("managed")

    def mapped(self) -> ContextManager[None]:
        """Allocations made inside count as file pages of a memory-mapped load."""
        return self._kind("mapped")

    @contextlib.contextmanager
    def resizes(self) -> Iterator[None]:
        """Count in-place storage resizes (``UntypedStorage.resize_``) made inside."""
        original = torch.UntypedStorage.resize_

        def resize_(storage: torch.UntypedStorage, size: int) -> Any:
            out = original(storage, size)
            self._resized(storage)
            return out

        torch.UntypedStorage.resize_ = resize_
        try:
            yield
        finally:
            torch.UntypedStorage.resize_ = original

    def _resized(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        nbytes = _rounded(storage.nbytes())
        kind = next((k for k, table in self._tables.items() if key in table), None)
        if kind is None:  # a storage made before the counting started
            kind = self._context[-1] if self._context else "device"
            self._tables[kind][key] = 0
            weakref.finalize(storage, self._free, key)
        self._add(kind, key, nbytes - self._tables[kind][key])

    def release(self, t: torch.Tensor, kind: str) -> None:
        """Stop counting ``t``'s storage if it is counted as ``kind`` (its pages were given back)."""
        for inner in _inner_tensors(t):
            key = _storage_key(inner)
            if key in self._tables[kind]:
                nbytes = self._tables[kind].pop(key)
                self._current[kind] -= nbytes
                if kind in ("host", "managed"):
                    self._current["host_ram"] -= nbytes
                self._released.add(key)  # still alive: a later view of it must not count it again

    def counts_as(self, t: torch.Tensor, kind: str) -> bool:
        return _storage_key(t) in self._tables[kind]

    @property
    def in_host(self) -> bool:
        """True inside ``host()``."""
        return "host" in self._context

    def host_keys(self) -> set[int]:
        """Keys of the live storages counted as host memory."""
        return set(self._tables["host"])

    def track(self, t: torch.Tensor) -> None:
        """Count ``t``'s storage if it is not counted yet (also for tensors made before the mode)."""
        for inner in _inner_tensors(t):
            self._track_plain(inner)

    def _kind_of_new(self, t: torch.Tensor) -> str:
        if self._context:
            return self._context[-1]
        if self.cpu_is_host and t.device.type == "cpu":
            return "host"
        return "device"

    def _track_plain(self, t: torch.Tensor) -> None:
        if t.device.type == "meta" and not self.cpu_is_host:  # no memory (a model built on meta, then sharded)
            return
        key = _storage_key(t)
        if key is None or key in self._released:
            return
        nbytes = _rounded(t.untyped_storage().nbytes())
        for kind, table in self._tables.items():
            if key in table:
                if table[key] != nbytes:  # resized in place (an out= op grew it)
                    self._add(kind, key, nbytes - table[key])
                return
        kind = self._kind_of_new(t)
        self._tables[kind][key] = 0
        weakref.finalize(t.untyped_storage(), self._free, key)
        self._add(kind, key, nbytes)

    def _add(self, kind: str, key: int, delta: int) -> None:
        self._tables[kind][key] += delta
        self._count(kind, delta)
        if kind in ("host", "managed"):
            self._count("host_ram", delta)

    def _count(self, kind: str, delta: int) -> None:
        self._current[kind] += delta
        current = self._current[kind]
        if current > self._window_peak[kind]:
            self._window_peak[kind] = current
        if current > self._peak[kind]:
            self._peak[kind] = current
            if kind == "device":
                self._snapshot()

    def _free(self, key: int) -> None:
        self._released.discard(key)
        for kind, table in self._tables.items():
            if key in table:
                nbytes = table.pop(key)
                self._current[kind] -= nbytes
                if kind in ("host", "managed"):
                    self._current["host_ram"] -= nbytes
                break
        if self.on_free is not None:
            self.on_free(key)  # the address may be reused by a new storage: forget its tags

    def _snapshot(self) -> None:
        tags = self.classify() if self.classify is not None else {}
        breakdown = {c: 0 for c in self.categories}
        for key, nbytes in self._live.items():
            breakdown[tags.get(key, "temporaries")] += nbytes
        self.peak_breakdown = breakdown
        self.peak_op = self._op

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._op = str(func)
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out


# --- optimizer state layout for optimizers that cannot run on fake tensors --------------------------

_LAYOUT_CACHE: dict[tuple[str, tuple, int, torch.dtype], tuple[int, int]] = {}
# parameters up to this size are measured at their own size; larger ones at 2**17 and 2**18 elements,
# both above bitsandbytes' 1e5-element paging threshold so the two points have the same layout
_MEASURE_DIRECT_UP_TO = 1 << 17


def _import(path: str) -> Any:
    from torchtune.config import import_component

    return import_component(path)


def _measured_bytes(optimizer_cls: type, kwargs: dict[str, Any], numel: int, dtype: torch.dtype) -> tuple[int, int]:
    """(device bytes, paged bytes) of the state the real class creates for one param of ``numel``."""
    import warnings

    torch.manual_seed(0)
    param = nn.Parameter(torch.randn(numel, dtype=torch.float32).to(dtype))
    # torchao's stochastic rounding changes no state; its compiled rounding would also trace the
    # estimator's stand-in attention function, which dynamo cannot
    kwargs = {k: v for k, v in kwargs.items() if k != "bf16_stochastic_round"}
    optimizer = optimizer_cls([param], **kwargs)
    param.grad = torch.randn_like(param)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "paged optimizers are not supported on CPU": we only measure
        optimizer.step()
    # bitsandbytes allocates paged buffers only for tensors of >= 1e5 elements (get_state_buffer)
    paged = bool(getattr(optimizer, "is_paged", False)) and numel >= 1e5
    device_bytes = paged_bytes = 0
    seen: set[int] = set()
    for value in optimizer.state[param].values():
        if not isinstance(value, torch.Tensor):
            continue
        for inner in _inner_tensors(value):
            key = _storage_key(inner)
            if key in seen:
                continue
            seen.add(key)
            nbytes = inner.untyped_storage().nbytes()
            # the moment buffers (same size as the param) are the paged ones; absmax/qmap stay on device
            if paged and inner.numel() == numel:
                paged_bytes += nbytes
            else:
                device_bytes += nbytes
    return device_bytes, paged_bytes


def measure_state_layout(
    optimizer_cls: type, kwargs: dict[str, Any], numel: int, dtype: torch.dtype
) -> tuple[int, int]:
    """(device bytes, paged/managed bytes) of ``optimizer_cls``'s state for a parameter of ``numel``.

    Measured by one real step of the real class on CPU; parameters above 131072 elements are measured
    at 131072 and 262144 elements and extrapolated linearly (state is a per-element part plus
    per-block scales, both linear in the size).
    """
    key = (f"{optimizer_cls.__module__}.{optimizer_cls.__qualname__}", tuple(sorted(kwargs.items())), numel, dtype)
    if key in _LAYOUT_CACHE:
        return _LAYOUT_CACHE[key]
    with _disable_current_modes():  # real tensors, even when called under the fake mode
        if numel <= _MEASURE_DIRECT_UP_TO:
            result = _measured_bytes(optimizer_cls, kwargs, numel, dtype)
        else:
            n1, n2 = _MEASURE_DIRECT_UP_TO, 2 * _MEASURE_DIRECT_UP_TO
            d1, p1 = _measured_bytes(optimizer_cls, kwargs, n1, dtype)
            d2, p2 = _measured_bytes(optimizer_cls, kwargs, n2, dtype)
            scale = (numel - n1) / (n2 - n1)
            result = (round(d1 + (d2 - d1) * scale), round(p1 + (p2 - p1) * scale))
    _LAYOUT_CACHE[key] = result
    return result


# The counter of the estimate that is running: LayoutOptimizer allocates paged state as managed memory in it.
_ACTIVE_COUNTER: Optional[StorageCounter] = None


@contextlib.contextmanager
def _active(counter: StorageCounter) -> Iterator[StorageCounter]:
    global _ACTIVE_COUNTER
    previous, _ACTIVE_COUNTER = _ACTIVE_COUNTER, counter
    try:
        yield counter
    finally:
        _ACTIVE_COUNTER = previous


class LayoutOptimizer(torch.optim.Optimizer):
    """Stands in for a bitsandbytes/torchao optimizer under the fake mode (memory estimation only).

    Per parameter it allocates the state bytes the real class ``optimizer_component`` creates
    (``measure_state_layout``), laid out as bitsandbytes lays them out: for a paged optimizer the two
    moments ``state1``/``state2`` (the parameter's shape; fp32 for 32-bit, uint8 for 8-bit) in CUDA
    managed memory through ``get_state_buffer``, the rest (absmax, quantization maps) as one uint8
    ``device_state`` buffer on the parameter's device. ``is_paged``, ``get_state_buffer`` and, for
    bitsandbytes, ``load_state_dict`` (the real class's own method: it deep-copies the state and moves
    it to the device) behave as the real class's, so checkpoint code runs on it unchanged. The step is a
    plain in-place update, so the step's memory behaviour (grads read in place, no copies) matches the
    fused kernels; rounded, a bitsandbytes Adam's stand-in (``steps_fused``) is stepped as that in-place
    kernel too, other ones in fp32 slices, as their real step is.
    """

    paged_bytes_total = 0  # summed over every instance: one optimizer per parameter in backward
    # Its update reads each element alone, so a step may run on slices of a parameter, as bf16
    # stochastic rounding steps the real bitsandbytes optimizers (training.optim._stochastic_rounding).
    elementwise_step = True

    def __init__(self, params: Any, optimizer_component: str, **kwargs: Any) -> None:
        self.optimizer_cls = _import(optimizer_component)
        self.optimizer_component = optimizer_component
        self.real_kwargs = kwargs
        self.is_paged = optimizer_component.rsplit(".", 1)[-1].startswith("Paged")
        # a rounded step of a bitsandbytes Adam is one in-place kernel (``_fused_step``): so is this one's
        from torchtune.training.optim._fused_step import fused_component

        self.steps_fused = fused_component(optimizer_component)
        self.paged_bytes = 0
        # bitsandbytes' load_state_dict moves these keys to the device without casting them
        self.non_castable_tensor_keys = {"state1", "state2", "device_state", "paged_state"}
        self._FSDP_WRAPPED_QUANT_STATE_KEY = getattr(self.optimizer_cls, "_FSDP_WRAPPED_QUANT_STATE_KEY", None)
        super().__init__(params, {"lr": kwargs.get("lr", 1e-3)})

    def get_state_buffer(self, p: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """A state buffer of ``p``'s shape: managed memory when paged (bitsandbytes' rule: >= 1e5 elements)."""
        if not self.is_paged or p.numel() < 1e5:
            return torch.zeros_like(p, dtype=dtype)
        counter = _ACTIVE_COUNTER
        with counter.managed() if counter is not None else contextlib.nullcontext():
            buffer = torch.zeros_like(p, dtype=dtype)
        buffer.is_paged = True  # as bitsandbytes marks its paged buffers
        return buffer

    def init_state_for(self, p: torch.Tensor) -> None:
        """``p``'s state, allocated as at its first step (before a step that runs on slices of ``p``)."""
        self._init_state(p, self.state[p])

    def _init_state(self, p: torch.Tensor, state: dict[str, Any]) -> None:
        # an FSDP2 shard (DTensor): each rank holds the state of its local shard only
        local = p.to_local() if hasattr(p, "to_local") else p
        numel = local.numel()
        device_bytes, paged_bytes = measure_state_layout(self.optimizer_cls, self.real_kwargs, numel, p.dtype)
        state["step"] = 0
        moment_bytes = paged_bytes // (2 * numel) if paged_bytes else 0
        if paged_bytes and paged_bytes == 2 * numel * moment_bytes and moment_bytes in (1, 4):
            dtype = torch.float32 if moment_bytes == 4 else torch.uint8
            state["state1"] = self.get_state_buffer(p, dtype)
            state["state2"] = self.get_state_buffer(p, dtype)
        elif paged_bytes:
            counter = _ACTIVE_COUNTER
            with counter.managed() if counter is not None else contextlib.nullcontext():
                state["paged_state"] = torch.zeros(paged_bytes, dtype=torch.uint8, device=p.device)
        state["device_state"] = torch.zeros(device_bytes, dtype=torch.uint8, device=p.device)
        self.paged_bytes += paged_bytes
        LayoutOptimizer.paged_bytes_total += paged_bytes

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    self._init_state(p, state)
                state["step"] += 1
                p.add_(p.grad, alpha=-group["lr"])
        return None

    def load_state_dict(self, state_dict: dict[str, Any], **kwargs: Any) -> None:
        if self.optimizer_component.startswith("bitsandbytes."):
            # the real class's loading (move_to_device=...), run on this object's state
            self.optimizer_cls.load_state_dict(self, state_dict, **kwargs)
            return
        # torch's loading casts every state tensor of a floating-point parameter to the parameter's dtype,
        # also these byte buffers (uint8 -> bf16 doubles them); the real torchao state keeps its own layout
        saved = state_dict["state"]
        super().load_state_dict({**state_dict, "state": {}}, **kwargs)
        ids = [pid for group in state_dict["param_groups"] for pid in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for pid, param in zip(ids, params):
            if pid in saved:
                self.state[param] = {
                    k: v.to(param.device) if isinstance(v, torch.Tensor) else v for k, v in saved[pid].items()
                }


def _state_bytes(value: Any, seen: set[int]) -> int:
    """Bytes of the tensors in an optimizer state value: tensors, lists, dicts and the objects holding
    tensors (a low-rank optimizer's projector), each storage once."""
    if isinstance(value, torch.Tensor):
        total = 0
        for inner in _inner_tensors(value):
            key = _storage_key(inner)
            if key not in seen:
                seen.add(key)
                total += inner.untyped_storage().nbytes()
        return total
    if isinstance(value, (list, tuple)):
        return sum(_state_bytes(v, seen) for v in value)
    if isinstance(value, dict):
        return sum(_state_bytes(v, seen) for v in value.values())
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return sum(_state_bytes(v, seen) for v in vars(value).values())
    return 0


def _measured_low_rank_bytes(
    optimizer_cls: type, kwargs: dict[str, Any], group: dict[str, Any], shape: tuple[int, int], dtype: torch.dtype
) -> int:
    torch.manual_seed(0)
    param = nn.Parameter(torch.randn(shape, dtype=torch.float32).to(dtype))
    optimizer = optimizer_cls([{"params": [param], **group}], **kwargs)
    param.grad = torch.randn_like(param)
    optimizer.step()
    return _state_bytes(dict(optimizer.state[param]), set())


def measure_low_rank_state(
    optimizer_cls: type, kwargs: dict[str, Any], group: dict[str, Any], shape: tuple[int, ...], dtype: torch.dtype
) -> int:
    """Device bytes of a low-rank optimizer's state (moments, projector) for a matrix of ``shape``.

    Measured by one real step of the real class on CPU. The state is of the form
    a + b*m + c*n + d*m*n + e*m^2 + f*n^2 in the matrix's sides m x n (moments of rank x a side, the
    projection, and the square SVD factor that GaLore's projection is a view of, kept alive by it), so
    a large matrix is measured on six small ones of the same orientation (which side is longer decides
    the projection) and the six terms solved for.
    """
    key = (
        f"{optimizer_cls.__module__}.{optimizer_cls.__qualname__}",
        tuple(sorted((k, str(v)) for k, v in {**kwargs, **group}.items())),
        tuple(shape),
        dtype,
    )
    if key in _LAYOUT_CACHE:
        return _LAYOUT_CACHE[key][0]
    with _disable_current_modes():  # real tensors, even when called under the fake mode
        m, n = shape
        if m * n <= _MEASURE_DIRECT_UP_TO:
            result = _measured_low_rank_bytes(optimizer_cls, kwargs, group, (m, n), dtype)
        else:
            a = max(2 * int(group.get("rank", 1)), 8)
            # every sample keeps the orientation: m >= n from (4a, a), m < n from (a, 4a)
            base = (4 * a, a) if m >= n else (a, 4 * a)
            steps = [(1, 1), (2, 1), (1, 2), (2, 2), (3, 1), (1, 3)]
            if m < n:
                steps = [(j, i) for i, j in steps]
            samples = [(base[0] * i, base[1] * j) for i, j in steps]

            def features(x: int, y: int) -> list[float]:
                return [1.0, x, y, x * y, x * x, y * y]

            lhs = torch.tensor([features(x, y) for x, y in samples], dtype=torch.float64)
            rhs = torch.tensor(
                [float(_measured_low_rank_bytes(optimizer_cls, kwargs, group, xy, dtype)) for xy in samples],
                dtype=torch.float64,
            )
            coef = torch.linalg.solve(lhs, rhs)
            result = max(0, round(float(torch.tensor(features(m, n), dtype=torch.float64) @ coef)))
    _LAYOUT_CACHE[key] = (result, 0)
    return result


class LowRankLayoutOptimizer(torch.optim.Optimizer):
    """Stands in for a low-rank optimizer (apollo_torch, galore_torch) under the fake mode, whose step has
    data-dependent Python (APOLLO's norm-growth limiter, its seed draws) that fake tensors cannot run.

    Per parameter it allocates the state bytes the real class ``optimizer_component`` creates for that
    shape and param group (``measure_low_rank_state``). Its step holds two parameter-sized temporaries
    in the gradient's dtype at once, as the real steps do (see ``step``), before the in-place update;
    the low-rank temporaries (rank x a side) are left out.
    """

    def __init__(self, params: Any, optimizer_component: str, **kwargs: Any) -> None:
        from torchtune.training.optim._low_rank import LOW_RANK_OPTIMIZERS

        self.optimizer_cls = _import(optimizer_component)
        self.optimizer_component = optimizer_component
        self.group_keys = LOW_RANK_OPTIMIZERS[optimizer_component][1]
        self.real_kwargs = kwargs
        super().__init__(params, {"lr": kwargs.get("lr", 1e-3)})

    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> Optional[float]:
        for group in self.param_groups:
            options = {k: group[k] for k in self.group_keys if k in group}
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    nbytes = measure_low_rank_state(
                        self.optimizer_cls, self.real_kwargs, options, tuple(p.shape), p.dtype
                    )
                    state["step"] = 0
                    state["device_state"] = torch.zeros(nbytes, dtype=torch.uint8, device=p.device)
                state["step"] += 1
                # two parameter-sized temporaries at once, as the real step has: APOLLO's rescaled gradient
                # and its norm-limited copy (scaled_grad / limiter); GaLore's projected-back update and its
                # scaled copy (full_rank_grad * scale)
                update = p.grad * 1.0
                limited = update / 1.0
                del update
                p.add_(limited, alpha=-group["lr"])
                del limited
        return None


def layout_optimizer_config(component: str, kwargs: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The ``_component_`` node that replaces a bitsandbytes/torchao optimizer, or None for others."""
    if not component.startswith(("bitsandbytes.", "torchao.")):
        return None
    return {COMPONENT_KEY: f"{__name__}.LayoutOptimizer", "optimizer_component": component, **kwargs}


# --- profiling a training step ----------------------------------------------------------------------


@dataclasses.dataclass
class MemoryEstimate:
    """Peak device memory of a training run split into categories (bytes), plus host-side needs."""

    peak_bytes: int
    breakdown: dict[str, int]
    paged_optimizer_bytes: int = 0
    host_offload_peak_bytes: int = 0
    step_peaks: list[int] = dataclasses.field(default_factory=list)
    fake: bool = True
    peak_op: str = ""
    notes: list[str] = dataclasses.field(default_factory=list)
    attention: str = ""  # which attention kernel was counted
    host_label: str = "offloaded activations"  # what host_offload_peak_bytes holds

    @property
    def host_bytes_needed(self) -> int:
        """Host RAM the run needs besides the process itself: paged optimizer state + offloaded activations."""
        return self.paged_optimizer_bytes + self.host_offload_peak_bytes

    def as_gb(self) -> dict[str, float]:
        out = {name: nbytes / GB for name, nbytes in self.breakdown.items()}
        out["total"] = self.peak_bytes / GB
        out["paged_optimizer_state"] = self.paged_optimizer_bytes / GB
        out["host_offloaded_activations"] = self.host_offload_peak_bytes / GB
        return out

    def format(self, title: str = "Estimated peak device memory") -> str:
        rows = [(f"  {name.replace('_', ' ')}", nbytes) for name, nbytes in self.breakdown.items()]
        lines = [f"{title} (1 GB = 1e9 bytes):"]
        lines += [f"{label:<34}{nbytes / GB:>9.2f} GB" for label, nbytes in rows]
        lines.append(
            f"{'  total (device peak)':<34}{self.peak_bytes / GB:>9.2f} GB"
            + (f"  (reached at {self.peak_op})" if self.peak_op else "")
        )
        lines.append("Outside the device peak:")
        lines.append(
            f"{'  optimizer state, paged/managed':<34}{self.paged_optimizer_bytes / GB:>9.2f} GB"
            "  (CUDA managed memory; needs that much host RAM when paged out)"
        )
        if self.paged_optimizer_bytes:
            # With paged state every step reads and writes all of it (optimizer in backward steps every
            # parameter), and a 16 GB card cannot keep it resident next to the weights: it crosses PCIe
            # both ways each step.
            paged = self.paged_optimizer_bytes / GB
            seconds = paged / PCIE_GB_PER_S
            lines.append(
                f"{'  paged per step (estimated)':<34}{paged:>9.2f} GB in + {paged:.2f} GB out; at "
                f"{PCIE_GB_PER_S:g} GB/s each way (PCIe 4.0 x16) {seconds:.1f} s (directions overlapped) to "
                f"{2 * seconds:.1f} s per step, when the card cannot keep the state resident"
            )
        host_label = f"  {self.host_label} (host)"
        lines.append(f"{host_label:<34}{self.host_offload_peak_bytes / GB:>9.2f} GB  (pinned host memory)")
        lines.append(f"{'  host RAM needed for these':<34}{self.host_bytes_needed / GB:>9.2f} GB")
        lines += [f"Note: {note}" for note in self.notes]
        if self.attention:
            lines.append(f"Note: {self.attention}")
        return "\n".join(lines)


class _Tracker:
    """What the categories need to know: parameters, optimizers that stepped, saved tensors."""

    def __init__(self) -> None:
        self.model: Optional[nn.Module] = None
        self.optimizers: "weakref.WeakSet[torch.optim.Optimizer]" = weakref.WeakSet()
        self.saved: dict[int, None] = {}  # keys of storages saved for backward (pruned when freed)
        self.counter: Optional[StorageCounter] = None

    def on_saved(self, t: torch.Tensor) -> None:
        for inner in _inner_tensors(t):
            key = _storage_key(inner)
            if key is not None:
                self.saved[key] = None

    def classify(self) -> dict[int, str]:
        tags: dict[int, str] = {}
        live = self.counter._live if self.counter is not None else {}
        for key in self.saved:
            if key in live:
                tags[key] = "activations"
        for opt in list(self.optimizers):
            for state in opt.state.values():
                for value in state.values():
                    if isinstance(value, torch.Tensor):
                        for inner in _inner_tensors(value):
                            tags[_storage_key(inner)] = "optimizer_state"
        if self.model is not None:
            for p in self.model.parameters():
                if p.grad is not None:
                    for inner in _inner_tensors(p.grad):
                        tags[_storage_key(inner)] = "gradients"
            for t in [*self.model.parameters(), *self.model.buffers()]:
                for inner in _inner_tensors(t):
                    tags[_storage_key(inner)] = "weights"
        return tags


def profile_memory(
    setup: Callable[[], tuple[nn.Module, Callable[[], Any]]],
    steps: int = 2,
    fake: bool = True,
    tracker: Optional[_Tracker] = None,
    categories: tuple[str, ...] = CATEGORIES,
    attention_device: str = "cpu",
) -> MemoryEstimate:
    """Peak memory of ``steps`` calls of a training step, counted by ``StorageCounter``.

    ``setup()`` runs inside the counting (and, with ``fake=True``, inside ``FakeTensorMode``) and
    returns ``(model, step)``; ``step()`` runs one training step (forward, loss, backward, optimizer).
    Offloaded activations (``OffloadActivations``) are simulated as if CPU tensors were device tensors,
    their host copies counted separately. ``tracker`` (a ``_Tracker``) and ``categories`` replace the
    default split into categories (the distributed estimate adds gathered weights). ``attention_device="cuda"``
    counts attention as the CUDA kernels (``torchtune.training.estimate._attention_kernels``); only on fake tensors.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    from torchtune.training.activations import simulate_offloading
    from torchtune.training.estimate._attention_kernels import describe_attention, target_attention

    tracker = tracker if tracker is not None else _Tracker()
    counter = StorageCounter(classify=tracker.classify, categories=categories)
    tracker.counter = counter
    counter.on_free = lambda key: tracker.saved.pop(key, None)
    LayoutOptimizer.paged_bytes_total = 0
    handle = register_optimizer_step_pre_hook(lambda opt, args, kwargs: tracker.optimizers.add(opt))

    def pack(t: torch.Tensor) -> torch.Tensor:
        tracker.on_saved(t)
        return t

    step_peaks: list[int] = []
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext()
    try:
        with (
            fake_mode,
            counter,
            counter.resizes(),
            _active(counter),
            target_attention(attention_device if fake else "cpu") as kernels,
            simulate_offloading(counter.host, tracker.on_saved),
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t),
        ):
            model, step = setup()
            tracker.model = model
            for t in [*model.parameters(), *model.buffers()]:
                counter.track(t)  # in case they were made before the mode
            for _ in range(steps):
                counter.reset_window()
                step()
                step_peaks.append(counter.window_peak)
            estimate = MemoryEstimate(
                peak_bytes=counter.peak,
                breakdown=dict(counter.peak_breakdown),
                paged_optimizer_bytes=LayoutOptimizer.paged_bytes_total,
                host_offload_peak_bytes=counter.host_peak,
                step_peaks=step_peaks,
                fake=fake,
                peak_op=counter.peak_op,
                attention=describe_attention(kernels, attention_device if fake else "cpu"),
            )
            del model, step
    finally:
        handle.remove()
    return estimate


# --- a recipe's training step, on fake tensors ----------------------------------------------------------


def default_seq_len(cfg: Any) -> int:
    """The sequence length a config trains on: ``dataset.max_seq_len``, else ``tokenizer.max_seq_len``."""
    for section in ("dataset", "tokenizer"):
        node = cfg.get(section)
        value = node.get("max_seq_len") if node is not None else None
        if value:
            return int(value)
    from torchtune._errors import ConfigError

    raise ConfigError(
        "The config sets no dataset.max_seq_len (nor tokenizer.max_seq_len): pass --seq-len N "
        "to say how long the training sequences are."
    )


def _device_type(cfg: Any) -> str:
    return str(cfg.device).split(":", 1)[0]


def estimate_recipe_memory(
    cfg: Any,
    seq_len: Optional[int] = None,
    batch_size: Optional[int] = None,
    steps: int = 2,
    fake: bool = True,
    attention: str = "target",
) -> MemoryEstimate:
    """Peak memory of a finetune recipe's training step for ``cfg``, without weights or GPU.

    Builds the step the recipes run with ``torchtune.training.TrainStep.from_config`` (random init,
    no weights; the config's activation checkpointing/offloading, optimizer in backward or not, loss)
    and runs it ``steps`` times on a synthetic batch of ``batch_size`` x ``seq_len`` tokens. The device
    is simulated on CPU tensors; bitsandbytes/torchao optimizers become ``LayoutOptimizer``. With
    ``fake=False`` the same runs on real CPU tensors (to check the estimate on a small model).
    ``attention="target"`` counts attention as the kernel ``cfg.device`` runs (CUDA: flash or
    memory-efficient SDPA; a packed batch, ``dataset.packed: True``, through FlexAttention and its block
    mask), ``"native"`` as the CPU's own kernel (what a real CPU run does).
    """
    from torchtune import training

    if attention not in ("target", "native"):
        raise ValueError(f"attention must be 'target' or 'native', got {attention!r}")
    seq_len = int(seq_len) if seq_len is not None else default_seq_len(cfg)
    batch = int(batch_size) if batch_size is not None else training.positive_int(cfg, "batch_size")
    packed = cfg.get("dataset") is not None and bool(cfg.dataset.get("packed", False))
    cfg, device, dtype, notes = prepare_estimate(cfg)

    def setup() -> tuple[nn.Module, Callable[[], Any]]:
        # compile does not run on fake tensors; it changes temporaries only
        step = training.TrainStep.from_config(cfg, device=device, dtype=dtype, compile_model=False)
        # Every position labelled (the worst case): the step then projects all of them, and fake labels
        # cannot say which positions a real batch would leave out.
        step.select_label_positions = False
        vocab = step.model.tok_embeddings.num_embeddings
        # made inside the modes: on the fake run they are fake too (a real input would be copied
        # into a new fake storage when first used, which a real run does not do)
        data = {
            "tokens": torch.randint(0, vocab, (batch, seq_len)),
            "labels": torch.randint(0, vocab, (batch, seq_len)),
        }
        if packed:
            # a packed batch's positions (one segment a row: the mask's memory does not depend on where
            # segments end) and its dense mask, made as the loader makes it, on the host: a target that
            # takes FlexAttention builds its block mask from the positions and leaves the dense mask there
            data["input_pos"] = torch.arange(seq_len).expand(batch, seq_len).clone()
            with _disable_current_modes():
                data["mask"] = torch.ones(seq_len, seq_len, dtype=torch.bool).tril().expand(batch, -1, -1)
        return step.model, lambda: step(data)

    estimate = profile_memory(
        setup, steps=steps, fake=fake, attention_device=_device_type(cfg) if attention == "target" else "cpu"
    )
    estimate.notes = notes + estimate.notes
    return estimate


def prepare_estimate(cfg: Any) -> tuple[Any, torch.device, torch.dtype, list[str]]:
    """``(cfg, device, dtype, notes)`` for estimating ``cfg``'s step: a copy of the config whose
    bitsandbytes/torchao optimizer is replaced by ``LayoutOptimizer``, the CPU device the fake tensors
    stand on, the model dtype, and the notes the estimate prints.

    Raises:
        ConfigError: conflicting optimizer keys (``check_optimizer_settings``).
        TuneError: the optimizer's package is not installed.
    """
    from omegaconf import OmegaConf

    from torchtune import training
    from torchtune.utils import get_dtype

    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=False))
    training.check_optimizer_settings(cfg)
    device = torch.device("cpu")  # fake CPU tensors stand for the device (see the module docstring)
    dtype = get_dtype(cfg.dtype, device)
    notes = [
        f"simulated on fake tensors standing for device={cfg.device}; sizes rounded to "
        "512 bytes like the CUDA caching allocator; fragmentation (reserved - allocated) and the "
        "CUDA context (~0.3-0.5 GB) are not included"
    ]
    optimizer_node = OmegaConf.to_container(cfg.optimizer, resolve=True)
    component = optimizer_node.pop(COMPONENT_KEY)
    layout = layout_optimizer_config(component, optimizer_node)
    if training.is_low_rank(cfg.optimizer):
        from torchtune.training.optim._low_rank import LAYOUT_COMPONENT

        rest = dict(optimizer_node["rest"])
        rest_component = rest.pop(COMPONENT_KEY)
        rest_layout = layout_optimizer_config(rest_component, rest)
        if rest_layout is not None:
            _require(rest_component, "bitsandbytes" if rest_component.startswith("bitsandbytes.") else "torchao")
            optimizer_node["rest"] = rest_layout
        cfg.optimizer = {COMPONENT_KEY: LAYOUT_COMPONENT, "optimizer_component": component, **optimizer_node}
        notes.append(
            f"{component} state (low-rank moments and projector) measured per matrix from the real class on small "
            f"CPU matrices and solved for each matrix's shape; optimizer.rest ({rest_component}) as its own class"
        )
    elif layout is not None:
        _require(component, "bitsandbytes" if component.startswith("bitsandbytes.") else "torchao")
        cfg.optimizer = layout
        notes.append(
            f"{component} state measured per parameter from the real class on small CPU "
            "tensors and scaled to each parameter's size"
        )
    if not cfg.optimizer_in_bwd:
        notes.append("optimizer_in_bwd=False: a full set of gradients exists after backward")
    elif cfg.get("optimizer_in_bwd_group") == "layer":  # a distributed config has no such key
        notes.append(
            "optimizer_in_bwd_group=layer: each decoder layer's gradients stay until its last one is complete "
            "(counted: the step is simulated with that grouping)"
        )
    return cfg, device, dtype, notes


# --- the whole run: set-up, steps, step checkpoint save, resume ----------------------------------------


def _require(component: str, package: str) -> None:
    try:
        __import__(package)
    except ImportError as exc:
        from torchtune._errors import TuneError

        raise TuneError(
            f"optimizer._component_={component} needs {package} installed to measure its state "
            f"layout ({exc}). pip install {package}, or estimate with "
            "optimizer._component_=torch.optim.AdamW."
        ) from exc

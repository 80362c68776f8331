"""Stochastic rounding of bf16 weight updates, and the share of weights a step changed.

A bf16 weight has 8 significant bits: an update smaller than half its spacing (an Adam step at lr 2e-5
on any |w| >= 2^-7, such as an RMSNorm scale near 1) rounds back to the old value, and the weight never
moves. Stochastic rounding keeps the update in expectation: the update is computed in fp32 and the
result is rounded up or down to a neighbouring bf16 value with probability proportional to how close
it is. The random bits are a hash of (a per-call key, the element's index), the key made on the host
from the run's seed, a stream name and a call counter (a counter-based stream): no generator draws
them and no noise tensor holds them, the counters are saved in the recipe state, so runs are
reproducible and a resume is bitwise exact, on CPU and CUDA alike.

The rounding itself (``StochasticRounding.round_``) is one kernel per call that reads the fp32 result,
computes the bits and writes the bf16 tensor: on a CPU a C loop built once per machine
(``_native_kernels``), elsewhere a kernel compiled by Inductor (tensors of ``_COMPILE_MIN`` elements or
more); otherwise, and where neither can be built, the same arithmetic runs in plain PyTorch on chunks,
to the same bits.

How each optimizer family is stepped (``step_parameter``):

- ``torch.optim.AdamW`` and ``Adam`` (not amsgrad, capturable or differentiable): one pass per
  parameter (``_step_adam_fused``) reads the bf16 weight, gradient and moments, computes torch's update
  in fp32 registers and writes the weight and both moments stochastically rounded; no fp32 copy exists.
- ``bitsandbytes.optim`` Adam/AdamW (32-bit or 8-bit state, paged or not): one pass per parameter
  (``_fused_step.bnb_adam_step``) reads the bf16 weight and gradient and the state in place, computes
  bitsandbytes' update in fp32 registers and writes the state and the stochastically rounded weight.
- Other ``torch.optim`` and ``bitsandbytes.optim``: the parameter, its gradient and (torch) its bf16 state
  are swapped to fp32 copies for ``optimizer.step()``, one slice of a large parameter at a time (the
  fp32 copies exist for one slice, never for a whole parameter); the weight and the bf16 state go back
  stochastically rounded. Rounded to nearest, Adam's ``exp_avg_sq`` with beta2 = 0.999 would never
  decay in bf16 (0.999 v rounds back to v). bitsandbytes keeps its own state dtypes (fp32 or 8-bit),
  which the swap never touches.
- ``torchao.optim``: built without their own ``bf16_stochastic_round`` (``optimizer_kwargs``), whose bits
  come from the global generator: on the CPU optimizer worker that generator is shared with the main
  thread, where activation checkpointing forks and restores it during backward (a race: other weights on
  every repeat). They step an fp32 copy of the weight like the other families (their 8-bit state is left
  as it is) and this stream rounds the result; nothing here touches a global generator.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence

import torch
from torch.optim import Optimizer

from torchtune._errors import ConfigError, TuneError
from torchtune.config._instantiate import COMPONENT_KEY
from torchtune.modules import _native_kernels
from torchtune.training.distributed._dtensor import local_shard
from torchtune.training.estimate._launch_counter import kernel_region

log = logging.getLogger("torchtune")

__all__ = [
    "ShardedStochasticRounding",
    "StochasticRounding",
    "WeightChangeTracker",
    "build_stochastic_rounding",
    "check_stochastic_rounding",
    "rounding_for_run",
]

KEY = "bf16_stochastic_rounding"
# The optimizer families whose state handling is known (see the module docstring); any other
# optimizer may keep state in a layout the fp32 swap would get wrong, so it is refused.
# apollo_torch/galore_torch: plain torch ops on the weight (their low-rank state is not parameter-shaped, so the
# fp32 swap leaves it in the gradient's dtype, fp32 for a rounded step).
_SUPPORTED = (
    "torch.optim.",
    "bitsandbytes.optim.",
    "torchao.optim.",
    "apollo_torch.",
    "galore_torch.",
    "torchtune.training.CPUAdamW",
    "torchtune.training.CPUSGD",
)
# Optimizers that round bf16 weights and state themselves, keyed by (seed, step, parameter, element)
_SELF_ROUNDING = ("torchtune.training.CPUAdamW", "torchtune.training.CPUSGD")
# The torch optimizers a rank can step on its own shard (``_ELEMENTWISE`` below, by name for config checks).
_SHARDED_TORCH = ("torch.optim.AdamW", "torch.optim.Adam", "torch.optim.SGD")
# The rounding stream is seeded apart from the data order (seed + epoch) so the two never coincide.
_SEED_OFFSET = 0x5352


def check_stochastic_rounding(cfg: Any, sharded: bool = False) -> None:
    """``bf16_stochastic_rounding`` is a bool, for an optimizer it supports, and agrees with a torchao
    optimizer's ``bf16_stochastic_round`` where the config sets one (the run's stream does the rounding).
    With fp32 weights it is allowed and does nothing (fp32 updates are not lost to rounding), so
    ``dtype=fp32`` alone switches a bf16 config to fp32.
    ``sharded`` (FSDP2's parameters): a torch optimizer must be one whose update is elementwise (each
    rank steps its own shard in fp32 slices), or a torchao one (stepped on each rank's local shard).

    Raises:
        ConfigError: naming the key and the setting that works.
    """
    value = cfg[KEY]
    if not isinstance(value, bool):
        raise ConfigError(f"{KEY} must be True or False, got {value!r}.")
    component = str(cfg.optimizer.get(COMPONENT_KEY, ""))
    own = cfg.optimizer.get("bf16_stochastic_round")
    if own is not None and bool(own) != value:
        raise ConfigError(
            f"optimizer.bf16_stochastic_round={own} disagrees with {KEY}={value}. The recipe sets the torchao "
            f"option from {KEY}: remove optimizer.bf16_stochastic_round and set {KEY} alone."
        )
    if not value:
        if component in _SELF_ROUNDING and str(cfg.get("dtype", "")) in ("bf16", "bfloat16"):
            raise ConfigError(
                f"optimizer._component_={component} rounds bf16 weights and state stochastically itself (its bits "
                f"keyed by the run's seed), so {KEY}=False cannot hold with dtype=bf16. Set {KEY}=True, or use "
                "another optimizer (e.g. torch.optim.AdamW) for round-to-nearest updates."
            )
        return
    rest = cfg.optimizer.get("rest")  # a low-rank optimizer's optimizer for the other parameters
    if rest is not None and hasattr(rest, "get") and not str(rest.get("_component_", "")).startswith(_SUPPORTED):
        component = f"optimizer.rest._component_={rest.get('_component_')}"
    else:
        component = f"optimizer._component_={component}"
    if not component.split("=", 1)[1].startswith(_SUPPORTED):
        raise ConfigError(
            f"{KEY}=True supports the optimizers of torch.optim, bitsandbytes.optim and torchao.optim, whose "
            f"state layout it knows, and torchtune.training.CPUAdamW/CPUSGD; {component} is none of them. Set "
            f"{KEY}=False, or use e.g. optimizer._component_=torch.optim.AdamW."
        )
    name = component.split("=", 1)[1]
    if sharded and name.startswith("torch.optim.") and name not in _SHARDED_TORCH:
        raise ConfigError(
            f"{KEY}=True with sharded (FSDP2) parameters steps each rank's shard in fp32 slices, which needs an "
            f"optimizer whose update of an element reads only that element; {component} is not one. Use "
            f"{', '.join(_SHARDED_TORCH)} or a torchao.optim optimizer, or set {KEY}=False."
        )


class WeightChangeTracker:
    """The share of trainable weight elements whose stored value changed in a step, only on logged steps.

    ``arm(device)`` before a logged step; ``step_parameter`` then adds each parameter's count of changed
    elements (on the device) and its size; ``pop()`` reads the share (a host sync) and disarms. The counts
    are kept as 0-dim tensors and summed once (``total()``), so a step of N parameters launches no kernel
    per parameter for the sum. Unarmed, nothing is counted and nothing is copied.
    """

    def __init__(self) -> None:
        self._changed: Optional[list] = None  # device counts
        self._host = 0  # counts already on the host (the CPU kernels return them)
        self._total = 0
        self._device: Optional[torch.device] = None

    @property
    def armed(self) -> bool:
        return self._changed is not None

    def arm(self, device: torch.device) -> None:
        self._changed, self._host, self._total, self._device = [], 0, 0, torch.device(device)

    def add(self, changed: Any, numel: int) -> None:
        if self._changed is not None:
            if torch.is_tensor(changed):
                self._changed.append(changed)
            else:
                self._host += int(changed)
            self._total += numel

    def total(self) -> tuple:
        """``(changed elements as a 0-dim int64 device tensor, elements counted)`` since ``arm``; disarms.
        No host sync: a logged step reads it with its other values at once."""
        changed, total = self._changed, self._total
        self._changed = None
        if not changed:
            return torch.full((), self._host, dtype=torch.int64, device=self._device), total
        summed = torch.stack([c.to(torch.int64) for c in changed]).sum()
        return (summed + self._host if self._host else summed), total

    def pop(self) -> float:
        """The share since ``arm`` (a host sync); disarms. NaN if nothing was counted."""
        if self._changed is None:
            return float("nan")
        changed, total = self.total()
        return changed.item() / total if total else float("nan")


class StochasticRounding:
    """Rounds fp32 results to bf16 stochastically, with random bits from a counter-based stream.

    The 16 bits an element gets are a hash of (a per-call key, the element's index): no generator
    draws them one by one and no noise tensor holds them, so one compiled kernel computes them where it
    rounds (``_hash16``). Each call's key comes from SplitMix64 on the host over (seed, stream name, the
    stream's call counter); ``state_dict()`` is those counters, which a recipe saves with the recipe
    state: a resumed run draws the same bits the uninterrupted run would have drawn, on any device.
    """

    def __init__(self, seed: int, device: torch.device, fused: Optional[bool] = None) -> None:
        self.device = torch.device(device)
        # One kernel per call (``_apply``: C on a CPU, else compiled for tensors of ``_COMPILE_MIN``
        # elements or more); the same arithmetic in plain PyTorch on chunks when not ``fused`` or where
        # neither kernel can be built (the same bits either way). Under the memory estimator's fake tensors
        # ``fused`` says which the target device runs (the kernels allocate nothing but their result).
        self.fused = True if fused is None else bool(fused)
        self._seed = int(seed)
        # one stream per name: the weights' (None) and each optimizer-state key's (``exp_avg``, ...)
        self._counters: Dict[str, int] = {}

    def _stream_seed(self, name: str) -> int:
        return _splitmix64((self._seed + _SEED_OFFSET) ^ (zlib.crc32(name.encode()) << 32))

    def next_key(self, stream: Optional[str] = None) -> tuple:
        """The key of the next call on ``stream`` (None: the weights'), advancing its counter. A step that
        rounds one tensor in several slices takes one key and passes each slice's offset, so the bits an
        element gets do not depend on the slicing."""
        name = stream or ""
        count = self._counters.get(name, 0)
        self._counters[name] = count + 1
        key = _splitmix64((self._stream_seed(name) + count * _GOLDEN) & _M64)
        return key & _M32, key >> 32

    def state_dict(self) -> Dict[str, Any]:
        return {"kind": _STATE_KIND, "seed": self._seed, "counters": dict(self._counters)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("kind") == _STATE_KIND:
            self._seed = int(state["seed"])
            self._counters = {str(k): int(v) for k, v in state["counters"].items()}
            return
        if "generator" not in state:
            raise ValueError(
                f"{KEY}: the checkpoint's rounding state has neither counters nor a generator (keys "
                f"{sorted(state)}); it was not written by this library. Resume from another checkpoint, or "
                f"remove 'stochastic_rounding' from its recipe state to start a new stream."
            )
        # written before the counter-based stream: its generator position cannot be continued, so the
        # stream starts anew, keyed from it so it never repeats this run's first steps
        self._seed += _old_state_mix(state)
        self._counters = {}
        log.info(
            "%s: the checkpoint's rounding stream is an older generator state; the rounding bits start a new "
            "stream (the weights and optimizer state resume exactly).",
            KEY,
        )

    @torch.no_grad()
    def round_(
        self,
        dst: torch.Tensor,
        src: torch.Tensor,
        changes: Optional[WeightChangeTracker] = None,
        stream: Optional[str] = None,
        key: Optional[tuple] = None,
        offset: int = 0,
    ) -> None:
        """Write fp32 ``src`` into bf16 ``dst``, each element rounded up or down to a bf16 neighbour with
        probability given by its distance: unbiased, ``E[dst] == src``. ``stream``: the name of an
        optimizer-state key rounded with its own random stream (None: the weights'). ``key`` and
        ``offset``: a key from ``next_key`` and where ``dst`` starts in the tensor it was taken for
        (a slice of it); without ``key`` the stream's next key is taken.

        Adding 16 random bits below bf16's mantissa and truncating rounds away from zero with
        probability (the dropped bits) / 2^16: fp32 is sign and magnitude, so the integer view of the
        magnitude grows the same way for either sign, and a carry moves into the exponent as it should.
        """
        counting = changes is not None and changes.armed
        keys = _moved(key if key is not None else self.next_key(stream), offset)
        if src.dtype != torch.float32 or dst.dtype != torch.bfloat16:
            raise TypeError(f"round_ writes fp32 into bf16, got {src.dtype} into {dst.dtype}")
        if not (src.is_contiguous() and dst.is_contiguous()):
            src, target = src.contiguous(), dst.contiguous()
        else:
            target = dst
        flat_src, flat_dst = src.view(-1), target.view(-1)
        if self.fused and src.numel() >= _COMPILE_MIN and _is_abstract(src):
            # what the compiled kernel allocates (nothing but the count) and launches (one kernel, a second
            # for the count's reduction): the estimator and the launch counter count the same
            with kernel_region("rounding", launches=2 if counting else 1):
                if counting:
                    changes.add(torch.count_nonzero(src.to(dst.dtype) != dst), dst.numel())
                dst.copy_(src)
            return
        with kernel_region("rounding"):
            changed = _apply("round", self.fused, keys, (flat_src, flat_dst), (), counting)
        if target is not dst:
            dst.copy_(target)
        if counting:
            changes.add(changed, dst.numel())

    def optimizer_kwargs(self, component: str) -> Dict[str, Any]:
        """Constructor arguments for an optimizer stepped with this rounding: torchao's own stochastic rounding
        off (it draws from the global generator, which activation checkpointing forks on the main thread while
        a CPU worker steps; ``step_parameter`` steps it on an fp32 copy and this stream rounds the result);
        CPUAdamW/CPUSGD, which round themselves, this run's seed (and rank) for their stream."""
        if component.startswith("torchao.optim."):
            return {"bf16_stochastic_round": False}
        if component in _SELF_ROUNDING:
            return {"seed": self._stream_seed("cpu_optimizer")}
        return {}


# Each rank's stream is seeded apart (a large odd stride): ranks round different shards, and the same
# bits on every rank would tie the rounding of rows at the same offset of different shards together.
_RANK_STRIDE = 0x9E3779B1


class ShardedStochasticRounding(StochasticRounding):
    """The rounding of a run over several ranks, each rounding its own shards with its own stream.

    Its state dict holds every rank's stream (gathered when a checkpoint is saved, a collective), so a
    resume on the same number of ranks draws the bits the uninterrupted run would have drawn. On another
    number of ranks the shards differ and no saved stream fits them: each rank starts a new stream, seeded
    from the saved ones so it never repeats the run's first steps (said once in the log).
    """

    def __init__(self, seed: int, device: torch.device, rank: int, world_size: int) -> None:
        super().__init__(int(seed) + rank * _RANK_STRIDE, device)
        self.rank, self.world_size, self._run_seed = rank, world_size, int(seed)

    def state_dict(self) -> Dict[str, Any]:
        own = super().state_dict()
        if self.world_size == 1:
            return {"per_rank": [own]}
        import torch.distributed as dist

        states: list = [None] * self.world_size
        dist.all_gather_object(states, own)
        return {"per_rank": states}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        per_rank = state.get("per_rank") or [state]
        if len(per_rank) == self.world_size:
            super().load_state_dict(per_rank[self.rank])
            return
        saved = per_rank[0]
        mixed = _old_state_mix(saved) if "generator" in saved else zlib.crc32(repr(sorted(saved.items())).encode())
        StochasticRounding.__init__(self, self._run_seed + mixed + self.rank * _RANK_STRIDE, self.device, self.fused)
        if self.rank == 0:
            log.info(
                "%s: the checkpoint's rounding streams were saved on %d ranks and this run has %d; each rank's "
                "stream starts anew (the weights and optimizer state resume exactly; the rounding bits differ).",
                KEY,
                len(per_rank),
                self.world_size,
            )


# The counter-based stream. SplitMix64 (host, Python ints) turns (seed, stream, counter) into a call's
# 64-bit key; in the kernel each element's bits are a 32-bit avalanche hash of (its index + the key's low
# half) xor its high half, of which the top 16 bits are used. The hash is hash-prospector's low-bias
# [16 21f0aaad 15 735a2d97 15] in int32 arithmetic, which wraps mod 2^32 on every backend as the hash
# wants (right shifts are masked, so they act as logical shifts); the keys reach the kernel as an int32
# tensor, data rather than constants, so one compiled kernel serves every call.
_M32, _M64 = (1 << 32) - 1, (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
_MIX1, _MIX2 = 0x21F0AAAD, 0x735A2D97
_STATE_KIND = "counter_hash_v1"
# Tensors this large are rounded (and AdamW stepped) by one compiled kernel; smaller ones, and every
# tensor where compiling fails, by the same arithmetic in plain PyTorch on chunks, to the same bits. The
# floor keeps tiny models (tests, norms) from paying a compile.
_COMPILE_MIN = 1 << 20
_CHUNK = 1 << 18  # the plain path's chunk: its int32 and fp32 temporaries stay a few MB
_SPAN = 1 << 30  # the compiled kernel's largest call: element indices stay int32
_COMPILED: Dict[str, Any] = {}
# the plain path rounds a chunk in this many ops (hash, float bit tricks, copy) where the kernel launches one
_PLAIN_PASSES = 33  # launches of one chunk, counted by the launch counter (test_fused_step.py)
_FUSED_BROKEN: Optional[str] = None
_INF = float("inf")


def _splitmix64(x: int) -> int:
    z = (x + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def _old_state_mix(state: Mapping[str, Any]) -> int:
    saved = state["generator"]
    return zlib.crc32(saved.numpy().tobytes()) if torch.is_tensor(saved) else zlib.crc32(repr(saved).encode())


def _moved(keys: Sequence[int], offset: int) -> list:
    """``keys`` (pairs of 32-bit (base, salt)) for a slice starting ``offset`` elements in: each base moved
    on, so element ``i`` of the slice draws the bits of element ``offset + i`` of the whole tensor."""
    return [(k + offset) & _M32 if i % 2 == 0 else k for i, k in enumerate(keys)]


def _key_tensor(keys: Sequence[int], device: torch.device) -> torch.Tensor:
    """32-bit ``keys`` as the int32 (two's complement) tensor the kernels read."""
    values = torch.tensor([k - (1 << 32) if k >> 31 else k for k in keys], dtype=torch.int32)
    return values if device.type == "cpu" else values.pin_memory().to(device, non_blocking=True)


def _hash16(index: torch.Tensor, base: Any, salt: Any) -> torch.Tensor:
    """16 random bits (int32 in [0, 2^16)) for each element ``index`` (int32) of a call keyed (base, salt)."""
    x = (index + base) ^ salt
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _MIX1
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * _MIX2
    x = x ^ ((x >> 15) & 0x1FFFF)
    return (x >> 16) & 0xFFFF


def _rounded(src: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """fp32 ``src`` to bf16, each magnitude rounded up with probability (its 16 dropped bits) / 2^16 given
    ``noise`` uniform in [0, 2^16): exactly ``((bits(src) + noise) & 0xFFFF0000)`` read as a float, in
    float arithmetic only. (A compiled CPU kernel reinterprets float bits one element at a time; these
    operations vectorise, and each is exact: bf16's spacing at ``|src|`` is fp32's times 2^16, a power of
    two, so the quotient, the added noise and the product are exact and ``floor`` drops what truncating
    the bits drops. Infinities and NaN pass through.)"""
    magnitude = src.abs()
    fp32_step = (torch.nextafter(magnitude, torch.full_like(magnitude, _INF)) - magnitude).clamp(max=2.0**104)
    bf16_step = fp32_step * 65536.0
    up = torch.floor(magnitude / bf16_step + noise.to(torch.float32) * (1.0 / 65536.0)) * bf16_step
    return torch.where(magnitude < _INF, torch.copysign(up, src), src).to(torch.bfloat16)


def _round_into(src, dst, index, keys, count: bool):
    new = _rounded(src, _hash16(index, keys[0], keys[1]))
    changed = (new != dst).sum() if count else None
    dst.copy_(new)
    return changed


def _round_whole(src, dst, keys, count: bool):
    return _round_into(src, dst, torch.arange(src.numel(), device=src.device, dtype=torch.int32), keys, count)


def _chunked(fn, n: int, device: torch.device, count: bool, keys: Sequence[int], *tensors, args=()):
    changed = torch.zeros((), dtype=torch.int64, device=device) if count else None
    for start in range(0, n, _CHUNK):
        end = min(start + _CHUNK, n)
        index = torch.arange(end - start, device=device, dtype=torch.int32)
        keyed = _key_tensor(_moved(keys, start), device)
        part = fn(*(t[start:end] for t in tensors), index, keyed, *args, count)
        if count:
            changed += part
    return changed


def _adam_into(w, g, m, v, index, keys, s, decoupled: bool, maximize: bool, count: bool):
    """torch's single-tensor Adam/AdamW update of bf16 ``w``, ``m`` (exp_avg), ``v`` (exp_avg_sq) in fp32,
    each written back stochastically rounded with its own key (``keys``: int32 (base, salt) of w, m, v).
    ``s``: fp32 scalars (``_adam_scalars``)."""
    w32, g32 = w.float(), g.float()
    if maximize:
        g32 = -g32
    if decoupled:
        w32 = w32 * s[0]
    else:
        g32 = g32 + w32 * s[1]
    m32 = torch.lerp(m.float(), g32, s[2])
    v32 = v.float() * s[3] + s[4] * g32 * g32
    denom = v32.sqrt() / s[6] + s[7]
    w32 = w32 + s[5] * (m32 / denom)
    new = _rounded(w32, _hash16(index, keys[0], keys[1]))
    changed = (new != w).sum() if count else None
    w.copy_(new)
    m.copy_(_rounded(m32, _hash16(index, keys[2], keys[3])))
    v.copy_(_rounded(v32, _hash16(index, keys[4], keys[5])))
    return changed


def _adam_whole(w, g, m, v, keys, s, decoupled: bool, maximize: bool, count: bool):
    index = torch.arange(w.numel(), device=w.device, dtype=torch.int32)
    return _adam_into(w, g, m, v, index, keys, s, decoupled, maximize, count)


def _apply(name: str, fused: bool, keys: Sequence[int], tensors: tuple, args: tuple, count: bool):
    """Kernel ``name`` over flat ``tensors``. Where ``fused``: on a CPU the C kernels (``_native_kernels``),
    elsewhere the compiled kernel (on a CPU without a C compiler, for tensors of ``_COMPILE_MIN`` elements or
    more), in spans of at most ``_SPAN`` elements; otherwise, and wherever that cannot compile, the same arithmetic
    in plain PyTorch on chunks (``_KERNELS``: its whole-tensor and its per-chunk form). The same bits from
    all three (the Adam update's fp32 arithmetic may differ by an FMA contraction: one bf16 step, rarely).
    Returns the count of changed elements when ``count``."""
    n, device = tensors[0].numel(), tensors[0].device
    if fused and not _is_abstract(tensors[0]):
        native = (
            _native_kernels.round_into(*tensors, keys, count)
            if name == "round"
            else _native_kernels.adam(tensors, keys, *args, count)
        )
        if native is not None:
            return native if count else None
    whole, part = _KERNELS[name]
    changed = torch.zeros((), dtype=torch.int64, device=device) if count else None
    for start in range(0, n, _SPAN):
        end = min(start + _SPAN, n)
        span, moved = tuple(t[start:end] for t in tensors), _moved(keys, start)
        done, counted = False, None
        if fused and (n >= _COMPILE_MIN or device.type != "cpu"):
            done, counted = _run_compiled(name, whole, *span, _key_tensor(moved, device), *args, count)
        if not done:
            counted = _chunked(part, end - start, device, count, moved, *span, args=args)
        if count:
            changed += counted
    return changed


_KERNELS = {"round": (_round_whole, _round_into), "adam": (_adam_whole, _adam_into)}


def _run_compiled(name: str, fn, *args) -> tuple:
    """``(True, fn(*args))`` through one compiled kernel (compiled once per process with dynamic sizes).
    Where it cannot compile: on a GPU the run stops (``TuneError`` with the reason: the plain path would
    launch a few dozen kernels per tensor instead of one, and ``check_fused_kernels`` builds every kernel
    at set-up, so this is said before training); on a CPU ``(False, None)``, having done nothing, and the
    plain PyTorch path runs instead (said once, with what it costs)."""
    global _FUSED_BROKEN
    if _FUSED_BROKEN is not None:
        return False, None
    try:
        if name not in _COMPILED:
            _COMPILED[name] = torch.compile(fn, dynamic=True, fullgraph=True)
        return True, _COMPILED[name](*args)
    except Exception as error:  # noqa: BLE001 - a compiler missing on this machine
        reason = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), torch.device("cpu"))
        if device.type != "cpu":
            raise TuneError(
                f"{KEY}=True: the compiled kernel {name!r} could not be built on {device} ({reason}). Without "
                "it each parameter's step would run as a few dozen separate kernels instead of one "
                "(benchmarks/bench_step_launches.py counts them), so the run stops rather than slow down. "
                "Fix the compiler (a Triton matching this torch), or set "
                f"{KEY}=False."
            ) from error
        _FUSED_BROKEN = reason
        log.warning(
            "%s: the compiled kernel %r failed on the CPU (%s); the plain PyTorch path runs instead: the same "
            "bits, about %d separate passes over each chunk where the kernel makes one.",
            KEY,
            name,
            _FUSED_BROKEN,
            _PLAIN_PASSES,
        )
        return False, None


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def _is_abstract(t: torch.Tensor) -> bool:
    """A fake (memory estimator) or meta (launch counter) tensor: no data, no compiled kernel can run on it."""
    return t.device.type == "meta" or _is_fake(t)


def build_stochastic_rounding(
    enabled: bool,
    *,
    dtype: torch.dtype,
    seed: int,
    device: torch.device,
    state: Optional[Mapping[str, Any]] = None,
    info: Any = None,
) -> Optional[StochasticRounding]:
    """The rounding of a run, continuing the saved stream ``state`` of a resumed run; ``None`` when off,
    and when the weights are not bf16 (nothing to round: said once in the log). ``info`` (the
    distributed recipe's ``DistributedInfo``): one stream per rank, ``ShardedStochasticRounding``."""
    rank = info.rank if info is not None else 0
    if not enabled:
        return None
    if dtype != torch.bfloat16:
        if rank == 0:
            log.info("%s=True has no effect with %s weights: only bf16 updates are rounded.", KEY, dtype)
        return None
    if info is None:
        rounding = StochasticRounding(seed, device)
    else:
        rounding = ShardedStochasticRounding(seed, device, rank, info.world_size)
    if state is not None:
        rounding.load_state_dict(state)
    return rounding


def rounding_for_run(
    cfg: Any, resume: Any, *, seed: int, dtype: torch.dtype, device: torch.device, info: Any = None
) -> Optional[StochasticRounding]:
    """``build_stochastic_rounding`` for a recipe: ``cfg``'s setting, continuing the stream a resumed run
    (``resume``, a ``ResumePlan`` or None) saved; said once when its checkpoint was saved without one."""
    state = resume.stochastic_rounding_state if resume is not None else None
    rounding = build_stochastic_rounding(cfg[KEY], dtype=dtype, seed=seed, device=device, state=state, info=info)
    if rounding is not None and resume is not None and state is None and (info is None or info.rank == 0):
        log.info("The checkpoint was saved without %s: its rounding stream starts now.", KEY)
    return rounding


def _family(optimizer: Optimizer) -> str:
    module = type(optimizer).__module__
    if module.startswith("torchao."):
        return "torchao"
    if module.startswith("bitsandbytes."):
        return "bitsandbytes"
    return "torch"


def _param_shaped_low(value: Any, param: torch.Tensor, dtype: torch.dtype) -> bool:
    return type(value) is torch.Tensor and value.dtype == dtype and value.shape == param.shape


@contextlib.contextmanager
def _stepped_in_fp32(
    optimizer: Optimizer, param: torch.nn.Parameter, rounding: StochasticRounding
) -> Iterator[torch.Tensor]:
    """For one ``optimizer.step()``: ``param``, its gradient and its bf16 state as fp32 copies; yields
    the fp32 weight. Afterwards the parameter holds its bf16 storage again (the caller rounds into it),
    and state tensors in the parameter's dtype are back in that dtype, rounded stochastically (each key
    its own stream): rounded to nearest, Adam's ``exp_avg_sq`` with beta2 = 0.999 would never decay
    (0.999 v rounds back to v in bf16)."""
    w16, low = param.data, param.dtype
    state = optimizer.state[param]
    fresh = len(state) == 0
    swapped = {k: v for k, v in state.items() if _param_shaped_low(v, param, low)}
    grad = param.grad
    param.grad = None
    g32 = grad.float()
    del grad  # the bf16 gradient goes before the fp32 weight is made: the peak is 8 bytes an element
    w32 = w16.float()
    for key, value in swapped.items():
        state[key] = value.float()
    param.data = w32
    param.grad = g32
    del g32
    try:
        yield w32
    finally:
        param.grad = None
        param.data = w16
        for key, value in swapped.items():
            rounding.round_(value, state[key], stream=key)
            state[key] = value
        if fresh and _family(optimizer) in ("torch", "torchao"):
            # torch.optim (and torchao, for tensors too small to quantise) makes its state like the parameter
            # (zeros_like): in bf16, as a bf16 run has it.
            for key, value in list(state.items()):
                if _param_shaped_low(value, param, torch.float32):
                    state[key] = torch.empty_like(value, dtype=low)
                    rounding.round_(state[key], value, stream=key)


# torch.optim optimizers whose update of an element reads only that element (of the weight, the
# gradient and the state): their step may run on slices of a parameter, so the fp32 copies a step needs
# (weight, gradient and two Adam moments: 16 bytes an element) exist for one slice at a time, not for a
# whole 128256 x 3072 embedding (6.3 GB). Others (Adafactor's factored state, Muon's whole-matrix
# update) are stepped whole.
_ELEMENTWISE = (torch.optim.AdamW, torch.optim.Adam, torch.optim.SGD)
_SLICE = 1 << 24


def _step_in_fp32_slices(
    optimizer: Optimizer,
    param: torch.nn.Parameter,
    rounding: StochasticRounding,
    changes: Optional[WeightChangeTracker],
) -> None:
    """One ``optimizer.step()`` of ``param`` run slice by slice: each slice of the weight, gradient and
    bf16 state becomes an fp32 stand-in parameter for the step; the weight slice and the bf16 state
    slices are written back stochastically rounded (the state in a bf16 run's dtype, and still decaying:
    see ``_stepped_in_fp32``)."""
    low = param.dtype
    group = next(g for g in optimizer.param_groups if any(q is param for q in g["params"]))
    index = next(i for i, q in enumerate(group["params"]) if q is param)
    # FSDP2's sharded parameter (a DTensor): the update is elementwise, so a rank steps its own shard
    # of the weight, gradient and state; the state stays a DTensor for the sharded checkpoint.
    flat_w, flat_g = local_shard(param.data).view(-1), local_shard(param.grad).reshape(-1)
    n = flat_w.numel()
    param.grad = None
    state = optimizer.state[param]
    if not state and hasattr(optimizer, "init_state_for"):
        optimizer.init_state_for(param)  # state sized for the whole parameter, not for a slice
    before, saved = dict(state), dict(state)  # read slices from ``before``; ``saved`` collects the result
    # one key per tensor for the whole step, each slice at its offset: the bits do not depend on slicing
    weight_key, state_keys = rounding.next_key(), {}
    try:
        for start in range(0, n, _SLICE):
            end = min(start + _SLICE, n)
            part = torch.nn.Parameter(flat_w[start:end].float())
            part.grad = flat_g[start:end].float()
            part_state = {}
            for key, value in before.items():
                if torch.is_tensor(value) and value.shape == param.shape:
                    view = local_shard(value).view(-1)[start:end]  # state in another dtype is updated in place
                    part_state[key] = view.float() if view.dtype == low else view
                elif torch.is_tensor(value) and value.dim() == 0:  # the step count: each slice starts from it
                    part_state[key] = value.clone()
                else:
                    part_state[key] = value
            if part_state:
                optimizer.state[part] = part_state
            group["params"][index] = part
            optimizer.step()
            group["params"][index] = param
            part_state = optimizer.state.pop(part, {})
            part.grad = None
            rounding.round_(flat_w[start:end], part.data, changes, key=weight_key, offset=start)
            for key, value in part_state.items():
                old = before.get(key)
                sliced = torch.is_tensor(old) and old.shape == param.shape
                made_now = key not in before and torch.is_tensor(value) and value.shape == part.shape
                if sliced and old.dtype != low:
                    continue  # a view: already updated in place
                if sliced or made_now:
                    if key not in saved:  # the first step made it: as a bf16 run has it, like the parameter
                        dtype = low if value.is_floating_point() else value.dtype
                        saved[key] = torch.empty_like(param.data, dtype=dtype)  # sharded as the parameter is
                    target = local_shard(saved[key]).view(-1)[start:end]
                    if target.dtype == low and value.dtype == torch.float32:
                        if key not in state_keys:
                            state_keys[key] = rounding.next_key(key)
                        rounding.round_(target, value.reshape(-1), key=state_keys[key], offset=start)
                    else:
                        target.copy_(value)
                elif end == n:
                    saved[key] = value
            del part, part_state
    finally:
        group["params"][index] = param
        state.clear()
        state.update(saved)


_ADAM_STATE = {"step", "exp_avg", "exp_avg_sq"}


def _step_adam_fused(
    optimizer: Optimizer,
    param: torch.nn.Parameter,
    rounding: StochasticRounding,
    changes: Optional[WeightChangeTracker],
) -> bool:
    """torch's Adam/AdamW step of a bf16 ``param`` as one pass (``_adam_into``): the bf16 weight, gradient
    and moments are read, the update computed in fp32 registers, and the weight and moments written back
    stochastically rounded, with the keys the fp32-slice path would use (the same bits). No fp32 copy of
    any slice exists. False, having done nothing, for what it does not cover (amsgrad, capturable,
    differentiable, a tensor learning rate or betas on a device, another state layout): the slice path
    steps those."""
    if type(optimizer) not in (torch.optim.AdamW, torch.optim.Adam):
        return False
    group = next(g for g in optimizer.param_groups if any(q is param for q in g["params"]))
    if group.get("amsgrad") or group.get("capturable") or group.get("differentiable"):
        return False
    numbers = [group["lr"], *group["betas"], group["eps"], group["weight_decay"]]
    if any(torch.is_tensor(x) and x.device.type != "cpu" for x in numbers):
        return False
    local = local_shard(param.data)
    if not local.is_contiguous():
        return False
    state = optimizer.state[param]
    if state:
        # plain, DTensor (sharded) or fake (the estimator's) tensors shaped and typed as the parameter
        if set(state) != _ADAM_STATE or not all(
            torch.is_tensor(state[k]) and state[k].shape == param.shape and state[k].dtype == param.dtype
            for k in ("exp_avg", "exp_avg_sq")
        ):
            return False
        if not all(local_shard(state[k]).is_contiguous() for k in ("exp_avg", "exp_avg_sq")):
            return False
    with _as_optimizer_step(optimizer):
        _adam_one_pass(optimizer, param, group, rounding, changes)
    return True


@contextlib.contextmanager
def _as_optimizer_step(optimizer: Optimizer) -> Iterator[None]:
    """The one-pass step is ``optimizer``'s step: the hooks torch runs around ``Optimizer.step`` (global
    and the optimizer's own: the memory estimator's, which finds the optimizer state through them, a
    profiler's, a user's) run around it as well. torch keeps the global ones in a private dict."""
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    args: tuple = (optimizer,)
    for hook in (*_global_optimizer_pre_hooks.values(), *optimizer._optimizer_step_pre_hooks.values()):
        hook(optimizer, args, {})
    yield
    for hook in (*optimizer._optimizer_step_post_hooks.values(), *_global_optimizer_post_hooks.values()):
        hook(optimizer, args, {})


def _adam_one_pass(
    optimizer: Optimizer,
    param: torch.nn.Parameter,
    group: Mapping[str, Any],
    rounding: StochasticRounding,
    changes: Optional[WeightChangeTracker],
) -> None:
    """``_step_adam_fused``'s step, once it has checked what it covers."""
    local, grad = local_shard(param.data), local_shard(param.grad)
    state = optimizer.state[param]
    if not state:  # torch.optim's own initial state, in the bf16 run's dtype
        device = param.device if group.get("fused") else None
        # torch.tensor, as torch makes it: a constant under the estimator's fake tensors, so its value is known
        state["step"] = torch.tensor(0.0, dtype=torch.float32, device=device)
        state["exp_avg"] = torch.zeros_like(param, memory_format=torch.preserve_format)
        state["exp_avg_sq"] = torch.zeros_like(param, memory_format=torch.preserve_format)
    param.grad = None
    state["step"] += 1
    if local.numel() == 0:
        return
    w, g = local.view(-1), grad.reshape(-1)
    m, v = (local_shard(state[k]).view(-1) for k in ("exp_avg", "exp_avg_sq"))
    keys = (*rounding.next_key(), *rounding.next_key("exp_avg"), *rounding.next_key("exp_avg_sq"))
    decoupled = type(optimizer) is torch.optim.AdamW or bool(group.get("decoupled_weight_decay", False))
    count = changes is not None
    if rounding.fused and w.numel() >= _COMPILE_MIN and _is_abstract(w):
        # the compiled kernel writes in place and allocates nothing (a second kernel reduces the count)
        with kernel_region("optimizer", launches=2 if count else 1):
            return
    scalars = _adam_scalars(group, state["step"], w.device)
    args = (scalars, decoupled, bool(group.get("maximize", False)))
    changed = _apply("adam", rounding.fused, keys, (w, g, m, v), args, count)
    if count:
        changes.add(changed, w.numel())


def _adam_scalars(group: Mapping[str, Any], step: torch.Tensor, device: torch.device) -> torch.Tensor:
    """The fp32 scalars of ``_adam_into``, computed as torch's single-tensor Adam computes them (in double
    on the host from the step count, which stays on the host unless the optimizer is ``fused``)."""
    lr, (beta1, beta2), eps, wd = (
        float(group[k]) if k != "betas" else group[k] for k in ("lr", "betas", "eps", "weight_decay")
    )
    beta1, beta2 = float(beta1), float(beta2)
    if step.device.type == "cpu":
        n = float(step)
        bias1, bias2 = 1 - beta1**n, 1 - beta2**n
        values = [1 - lr * wd, wd, 1 - beta1, beta2, 1 - beta2, -lr / bias1, bias2**0.5, eps]
        scalars = torch.tensor(values, dtype=torch.float32)
        return scalars if device.type == "cpu" else scalars.pin_memory().to(device, non_blocking=True)
    n = step.to(torch.float64)  # on the device: no host sync
    fixed = torch.tensor([1 - lr * wd, wd, 1 - beta1, beta2, 1 - beta2, 0.0, 0.0, eps], dtype=torch.float64)
    fixed = fixed.pin_memory().to(device, non_blocking=True) if device.type != "cpu" else fixed
    bias1, bias2 = 1 - torch.pow(beta1, n), 1 - torch.pow(beta2, n)
    fixed[5], fixed[6] = -lr / bias1, bias2.sqrt()
    return fixed.float()


def _step_torchao_in_fp32(
    optimizer: Optimizer,
    param: torch.nn.Parameter,
    rounding: StochasticRounding,
    changes: Optional[WeightChangeTracker],
) -> None:
    """A torchao optimizer's step of bf16 ``param`` (of FSDP2's local shard where sharded): an fp32 copy of the
    weight and gradient stands in for the parameter, its state is the parameter's own (torchao's 8-bit buffers,
    or bf16 below torchao's quantisation size, updated in place), and the result is rounded into the bf16
    weight by this run's stream (torchao built without its own rounding, ``optimizer_kwargs``)."""
    from torchtune.training.optim._torchao_local_step import init_state, local_state

    group = next(g for g in optimizer.param_groups if any(q is param for q in g["params"]))
    index = next(i for i, q in enumerate(group["params"]) if q is param)
    if len(optimizer.state[param]) == 0:
        init_state(optimizer, param, group)  # made from the bf16 parameter, as a bf16 run has it
    weight = local_shard(param.data)
    part = torch.nn.Parameter(weight.float())
    part.grad = local_shard(param.grad).float()
    param.grad = None
    optimizer.state[part] = {k: local_state(v) for k, v in optimizer.state[param].items()}
    group["params"][index] = part
    try:
        type(optimizer).step(optimizer)  # the class's step (with torch's hooks), not a local-shard wrapper
    finally:
        group["params"][index] = param
        optimizer.state.pop(part, None)  # the parameter's own state tensors, updated in place
    rounding.round_(weight, part.data, changes)

"""Stochastic rounding of bf16 weight updates, and the share of weights a step changed.

A bf16 weight has 8 significant bits: an update smaller than half its spacing (an Adam step at lr 2e-5
on any |w| >= 2^-7, such as an RMSNorm scale near 1) rounds back to the old value, and the weight never
moves. Stochastic rounding keeps the update in expectation: the optimizer steps the parameter in fp32
(a transient fp32 copy of the one parameter being stepped, never a master copy of the model), and the
result is rounded up or down to a neighbouring bf16 value with probability proportional to how close
it is. The random bits come from a generator of this run's own, seeded from the run's seed and saved
in the recipe state, so runs are reproducible and a resume is bitwise exact.

The rounding itself (``StochasticRounding.round_``) is, on CUDA, one compiled kernel per slice that
reads the fp32 result and writes the bf16 weight, drawing its random bits (philox) inside the kernel:
no noise tensor and no scratch pass. Elsewhere (CPU) it is plain PyTorch on chunks of the slice.

How each optimizer family is stepped (``step_parameter``):

- ``torch.optim`` and ``bitsandbytes.optim``: the parameter, its gradient and (torch) its bf16 state
  are swapped to fp32 copies for ``optimizer.step()``, one slice of a large parameter at a time (the
  fp32 copies exist for one slice, never for a whole parameter); the weight and the bf16 state go back
  stochastically rounded. Rounded to nearest, Adam's ``exp_avg_sq`` with beta2 = 0.999 would never
  decay in bf16 (0.999 v rounds back to v). bitsandbytes keeps its own state dtypes (fp32 or 8-bit),
  which the swap never touches.
- ``torchao.optim``: its optimizers round stochastically themselves (``bf16_stochastic_round``, built
  in by ``optimizer_kwargs``), inside their compiled step. Its random bits come from the default
  generator, so for the step that generator is given this run's rounding stream and handed back.
"""

from __future__ import annotations

import contextlib
import logging
import zlib
from typing import Any, Dict, Iterator, Mapping, Optional

import torch
from torch.optim import Optimizer

from torchtune._errors import ConfigError
from torchtune.config._instantiate import COMPONENT_KEY
from torchtune.training._bnb_step import step_without_sync, supports_step_without_sync
from torchtune.training._dtensor import is_dtensor, local_shard

log = logging.getLogger("torchtune")

__all__ = [
    "ShardedStochasticRounding",
    "StochasticRounding",
    "WeightChangeTracker",
    "build_stochastic_rounding",
    "check_stochastic_rounding",
    "step_parameter",
]

KEY = "bf16_stochastic_rounding"
# The optimizer families whose state handling is known (see the module docstring); any other
# optimizer may keep state in a layout the fp32 swap would get wrong, so it is refused.
# apollo_torch/galore_torch: plain torch ops on the weight (their low-rank state is not parameter-shaped, so the
# fp32 swap leaves it in the gradient's dtype, fp32 for a rounded step).
_SUPPORTED = ("torch.optim.", "bitsandbytes.optim.", "torchao.optim.", "apollo_torch.", "galore_torch.")
# The torch optimizers a rank can step on its own shard (``_ELEMENTWISE`` below, by name for config checks).
_SHARDED_TORCH = ("torch.optim.AdamW", "torch.optim.Adam", "torch.optim.SGD")
# The rounding noise is drawn in chunks, so its buffer (4 bytes an element) stays small next to a
# large parameter; the chunk size is part of the random stream, so it never changes.
_CHUNK = 1 << 22
# The rounding stream is seeded apart from the data order (seed + epoch) so the two never coincide.
_SEED_OFFSET = 0x5352


def check_stochastic_rounding(cfg: Any, sharded: bool = False) -> None:
    """``bf16_stochastic_rounding`` is a bool, for an optimizer it supports, and agrees with a torchao
    optimizer's own ``bf16_stochastic_round``. With fp32 weights it is allowed and does nothing (fp32
    updates are not lost to rounding), so ``dtype=fp32`` alone switches a bf16 config to fp32.
    ``sharded`` (FSDP2's parameters): a torch optimizer must be one whose update is elementwise (each
    rank steps its own shard in fp32 slices), or a torchao one (it rounds itself).

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
        return
    rest = cfg.optimizer.get("rest")  # a low-rank optimizer's optimizer for the other parameters
    if rest is not None and hasattr(rest, "get") and not str(rest.get("_component_", "")).startswith(_SUPPORTED):
        component = f"optimizer.rest._component_={rest.get('_component_')}"
    else:
        component = f"optimizer._component_={component}"
    if not component.split("=", 1)[1].startswith(_SUPPORTED):
        raise ConfigError(
            f"{KEY}=True supports the optimizers of torch.optim, bitsandbytes.optim and torchao.optim, whose "
            f"state layout it knows; {component} is none of them. Set {KEY}=False, or "
            "use e.g. optimizer._component_=torch.optim.AdamW."
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
    elements (on the device) and its size; ``pop()`` reads the share (the one host sync) and disarms.
    Unarmed, nothing is counted and nothing is copied.
    """

    def __init__(self) -> None:
        self._changed: Optional[torch.Tensor] = None
        self._total = 0

    @property
    def armed(self) -> bool:
        return self._changed is not None

    def arm(self, device: torch.device) -> None:
        self._changed = torch.zeros((), dtype=torch.int64, device=device)
        self._total = 0

    def add(self, changed: torch.Tensor, numel: int) -> None:
        if self._changed is not None:
            self._changed += changed
            self._total += numel

    def pop(self) -> float:
        """The share since ``arm`` (a host sync); disarms. NaN if nothing was counted."""
        if self._changed is None or self._total == 0:
            self._changed = None
            return float("nan")
        value = self._changed.item() / self._total
        self._changed = None
        return value


class StochasticRounding:
    """Rounds fp32 results to bf16 stochastically, drawing from a generator of its own on ``device``.

    ``state_dict()`` / ``load_state_dict()`` carry the generator's position, which a recipe saves with
    the recipe state: a resumed run draws the same bits the uninterrupted run would have drawn.
    """

    def __init__(self, seed: int, device: torch.device, fused: Optional[bool] = None) -> None:
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(int(seed) + _SEED_OFFSET)
        # CUDA: one compiled kernel per slice (philox bits drawn inside it, see ``_fused_kernels``); the
        # plain PyTorch path elsewhere. Under the memory estimator's fake tensors ``fused`` says which
        # of the two the target device runs (the fused one allocates nothing but its result).
        self.fused = self.device.type == "cuda" if fused is None else bool(fused)
        self._seed = int(seed)
        # one stream per optimizer-state key (``exp_avg``, ``exp_avg_sq``): the bits an element gets do
        # not depend on how a parameter is sliced, as for the weights' own stream
        self._state_generators: Dict[str, torch.Generator] = {}

    def _generator(self, stream: Optional[str]) -> torch.Generator:
        if stream is None:
            return self.generator
        if stream not in self._state_generators:
            generator = torch.Generator(device=self.device)
            generator.manual_seed(self._seed + _SEED_OFFSET + 1 + zlib.crc32(stream.encode()))
            self._state_generators[stream] = generator
        return self._state_generators[stream]

    def state_dict(self) -> Dict[str, Any]:
        return {
            "generator": self.generator.get_state(),
            "state_generators": {k: g.get_state() for k, g in self._state_generators.items()},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.generator.set_state(state["generator"])
        for key, value in (state.get("state_generators") or {}).items():
            self._generator(key).set_state(value)

    @torch.no_grad()
    def round_(
        self,
        dst: torch.Tensor,
        src: torch.Tensor,
        changes: Optional[WeightChangeTracker] = None,
        stream: Optional[str] = None,
    ) -> None:
        """Write fp32 ``src`` into bf16 ``dst``, each element rounded up or down to a bf16 neighbour with
        probability given by its distance: unbiased, ``E[dst] == src``. ``src`` is used as scratch.
        ``stream``: the name of an optimizer-state key rounded with its own random stream (None: the
        weights' stream).

        Adding 16 random bits below bf16's mantissa and truncating rounds away from zero with
        probability (the dropped bits) / 2^16: fp32 is sign and magnitude, so the integer view of the
        magnitude grows the same way for either sign, and a carry moves into the exponent as it should.
        """
        counting = changes is not None and changes.armed
        fusable = src.dtype == torch.float32 and dst.dtype == torch.bfloat16
        if self.fused and fusable and src.is_contiguous() and dst.is_contiguous():
            if _is_fake(src):
                # what the kernel allocates (nothing but the count): the estimator counts the same
                if counting:
                    changes.add(torch.count_nonzero(src.to(dst.dtype) != dst), dst.numel())
                dst.copy_(src)
                return
            if self._round_fused(dst.view(-1), src.view(-1), changes if counting else None, stream):
                return
        bits = src.view(torch.int32)
        if bits.is_contiguous() and dst.is_contiguous():
            parts, olds = bits.view(-1).split(_CHUNK), dst.view(-1).split(_CHUNK)
        else:
            parts, olds = (bits,), (dst,)
        for part, old in zip(parts, olds):
            noise = torch.randint(
                0, 1 << 16, part.shape, dtype=torch.int32, device=part.device, generator=self._generator(stream)
            )
            part.add_(noise)  # finite values cannot overflow: the largest magnitude is 0x7F7FFFFF
            part.bitwise_and_(-65536)  # 0xFFFF0000: sign, exponent and bf16's 7 mantissa bits
            del noise
            if counting:
                changes.add(torch.count_nonzero(part.view(torch.float32) != old), part.numel())
        dst.copy_(src)  # exact: the dropped bits are zero

    def _round_fused(
        self, dst: torch.Tensor, src: torch.Tensor, changes: Optional[WeightChangeTracker], stream: Optional[str]
    ) -> bool:
        """``round_`` as one compiled kernel per call; False (nothing done) where it cannot compile."""
        global _FUSED_BROKEN
        if _FUSED_BROKEN is not None:
            return False
        try:
            kernel = _fused_kernels()[changes is not None]
            with self.as_default_generator(stream):
                changed = kernel(src, dst)
        except Exception as error:  # noqa: BLE001 - a compiler missing on this machine: fall back, say so once
            _FUSED_BROKEN = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            log.warning(
                "%s: the fused (compiled) rounding kernel failed (%s); rounding with the plain PyTorch path, "
                "which costs several extra passes over each parameter.",
                KEY,
                _FUSED_BROKEN,
            )
            return False
        if changes is not None:
            changes.add(changed, dst.numel())
        return True

    @contextlib.contextmanager
    def as_default_generator(self, stream: Optional[str] = None) -> Iterator[None]:
        """Make the device's default generator draw this rounding stream (for optimizers that draw from it)."""
        own = self._generator(stream)
        if self.device.type == "cuda":
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            default = torch.cuda.default_generators[index]
        else:
            default = torch.default_generator
        saved = default.get_state()
        default.set_state(own.get_state())
        try:
            yield
        finally:
            own.set_state(default.get_state())
            default.set_state(saved)

    @staticmethod
    def optimizer_kwargs(component: str) -> Dict[str, Any]:
        """Constructor arguments that switch on an optimizer's own stochastic rounding (torchao's)."""
        return {"bf16_stochastic_round": True} if component.startswith("torchao.optim.") else {}


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
        saved = per_rank[0]["generator"]
        mixed = zlib.crc32(saved.numpy().tobytes()) if torch.is_tensor(saved) else zlib.crc32(repr(saved).encode())
        StochasticRounding.__init__(self, self._run_seed + mixed + self.rank * _RANK_STRIDE, self.device)
        if self.rank == 0:
            log.info(
                "%s: the checkpoint's rounding streams were saved on %d ranks and this run has %d; each rank's "
                "stream starts anew (the weights and optimizer state resume exactly; the rounding bits differ).",
                KEY,
                len(per_rank),
                self.world_size,
            )


# The fused rounding: the same arithmetic as ``StochasticRounding.round_``'s plain path (16 random
# bits added below bf16's mantissa, then truncation), compiled into one kernel that reads the fp32
# result once and writes the bf16 weight once. Its random bits are philox draws made inside the kernel
# (Inductor's random lowering, seeded from the default generator, which ``as_default_generator`` points
# at the run's own stream), so no noise tensor and no fp32 scratch exist and the stream is still
# saved and restored with the generator. Compiled once per process, with dynamic sizes (one kernel for
# every slice length). A different stream from the plain path's: unbiased either way (tests).
_FUSED: Optional[tuple] = None
_FUSED_BROKEN: Optional[str] = None


def _sr_bits(src: torch.Tensor) -> torch.Tensor:
    noise = torch.randint(0, 1 << 16, src.shape, dtype=torch.int32, device=src.device)
    return ((src.view(torch.int32) + noise) & -65536).view(torch.float32).to(torch.bfloat16)


def _sr_write(src: torch.Tensor, dst: torch.Tensor) -> None:
    dst.copy_(_sr_bits(src))


def _sr_write_count(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    new = _sr_bits(src)
    changed = (new != dst).sum()
    dst.copy_(new)
    return changed


def _fused_kernels() -> tuple:
    global _FUSED
    if _FUSED is None:
        _FUSED = tuple(torch.compile(fn, dynamic=True, fullgraph=True) for fn in (_sr_write, _sr_write_count))
    return _FUSED


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def build_stochastic_rounding(
    enabled: bool,
    *,
    dtype: torch.dtype,
    seed: int,
    device: torch.device,
    state: Optional[Mapping[str, Any]] = None,
    rank: int = 0,
    world_size: Optional[int] = None,
) -> Optional[StochasticRounding]:
    """The rounding of a run, continuing the saved stream ``state`` of a resumed run; ``None`` when off,
    and when the weights are not bf16 (nothing to round: said once in the log). ``world_size`` (the
    distributed recipe): one stream per rank, ``ShardedStochasticRounding``."""
    if not enabled:
        return None
    if dtype != torch.bfloat16:
        if rank == 0:
            log.info("%s=True has no effect with %s weights: only bf16 updates are rounded.", KEY, dtype)
        return None
    if world_size is None:
        rounding = StochasticRounding(seed, device)
    else:
        rounding = ShardedStochasticRounding(seed, device, rank, world_size)
    if state is not None:
        rounding.load_state_dict(state)
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
        if fresh and _family(optimizer) == "torch":
            # torch.optim makes its state like the parameter (zeros_like): in bf16, as a bf16 run has it.
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
            rounding.round_(flat_w[start:end], part.data, changes)
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
                        rounding.round_(target, value.reshape(-1), stream=key)
                    else:
                        target.copy_(value)
                elif end == n:
                    saved[key] = value
            del part, part_state
    finally:
        group["params"][index] = param
        state.clear()
        state.update(saved)


_BNB_KEYS = {"step", "state1", "state2", "qmap1", "qmap2", "absmax1", "absmax2"}
_BNB_BLOCK = 256  # bitsandbytes' 8-bit blockwise state: one absmax per 256 elements


def _bnb_sliceable(optimizer: Optimizer, param: torch.nn.Parameter) -> bool:
    """A bitsandbytes Adam/AdamW (32-bit or 8-bit blockwise, paged or not) whose state is elementwise, so
    its update may run slice by slice with bitsandbytes' own ``update_step`` on views of that state."""
    return (
        supports_step_without_sync(optimizer)
        and getattr(optimizer, "optimizer_name", None) == "adam"
        and not getattr(getattr(optimizer, "args", None), "max_unorm", 0.0)
        and param.is_contiguous()
    )


def _step_bnb_in_fp32_slices(
    optimizer: Optimizer,
    param: torch.nn.Parameter,
    rounding: StochasticRounding,
    changes: Optional[WeightChangeTracker],
) -> bool:
    """bitsandbytes' update of ``param`` run on fp32 slices (its kernels want the weight and gradient in
    one dtype): each slice of the weight and gradient is an fp32 stand-in parameter whose state is views
    of the real state (written in place), stepped by ``update_step``; the weight slice is written back
    stochastically rounded. Returns False, having done nothing, for a state layout it does not know."""
    group = next(g for g in optimizer.param_groups if any(q is param for q in g["params"]))
    gindex = optimizer.param_groups.index(group)
    pindex = next(i for i, q in enumerate(group["params"]) if q is param)
    if not optimizer.initialized:
        optimizer.check_overrides()
        optimizer.to_gpu()
        optimizer.initialized = True
    state = optimizer.state[param]
    if len(state) == 0:
        optimizer.init_state(group, param, gindex, pindex)  # the layout a bf16 parameter gets
    if not set(state) <= _BNB_KEYS or state["state1"].shape != param.shape:
        return False
    optimizer.prefetch_state(param)
    n, flat_w = param.numel(), param.data.view(-1)
    flat_g = param.grad.reshape(-1)
    param.grad = None
    try:
        for start in range(0, n, _SLICE):  # _SLICE is a multiple of the 256-element block
            end = min(start + _SLICE, n)
            part = torch.nn.Parameter(flat_w[start:end].float())
            part.grad = flat_g[start:end].float()
            part_state = {}
            for key, value in state.items():
                if key in ("state1", "state2"):
                    value = _paged_like(value.view(-1)[start:end], value)
                elif key in ("absmax1", "absmax2"):
                    value = value[start // _BNB_BLOCK : -(-end // _BNB_BLOCK)]
                part_state[key] = value  # qmaps are shared; the step count is an int
            optimizer.state[part] = part_state
            group["params"][pindex] = part
            optimizer.update_step(group, part, gindex, pindex)
            group["params"][pindex] = param
            part_state = optimizer.state.pop(part)
            part.grad = None
            rounding.round_(flat_w[start:end], part.data, changes)
            if end == n:
                state["step"] = part_state["step"]
            del part, part_state
    finally:
        group["params"][pindex] = param
    return True


def _paged_like(view: torch.Tensor, base: torch.Tensor) -> torch.Tensor:
    # A paged buffer is a host-device tensor over CUDA managed memory that bitsandbytes recognises by
    # these attributes (its device check skips such tensors); a view of it is the same memory.
    if getattr(base, "is_paged", False):
        view.is_paged = True
        view.page_deviceid = base.page_deviceid
    return view


def _own_step(optimizer: Optimizer) -> None:
    optimizer.step()


def step_parameter(
    optimizer: Optimizer,
    param: torch.nn.Parameter,
    *,
    rounding: Optional[StochasticRounding] = None,
    changes: Optional[WeightChangeTracker] = None,
    in_backward: bool = False,
) -> None:
    """``optimizer.step()`` for ``param``, the one parameter with a gradient, then free that gradient.

    Rounded stochastically when ``rounding`` is given and the parameter is bf16; counted in ``changes``
    when that is armed (a copy of the weight is made for it only where the rounding does not count).
    ``in_backward``: called from a gradient hook, where a bitsandbytes optimizer is stepped without its
    device synchronisations (``_bnb_step``), so backward keeps running ahead of the GPU.
    """
    counting = changes is not None and changes.armed
    sr = rounding is not None and param.dtype == torch.bfloat16
    elementwise = type(optimizer) in _ELEMENTWISE or getattr(optimizer, "elementwise_step", False)
    local = local_shard(param.data)
    if sr and local.numel() == 0:
        sr = False  # this rank's shard is empty (a dimension smaller than the rank count): nothing to round
    if sr and elementwise and local.is_contiguous():
        _step_in_fp32_slices(optimizer, param, rounding, changes)
        return
    if sr and is_dtensor(param) and _family(optimizer) != "torchao":
        raise ConfigError(
            f"{KEY}=True steps a sharded (FSDP2) parameter slice by slice, which needs an optimizer whose update "
            f"of an element reads only that element (torch.optim.AdamW, Adam or SGD) or a torchao optimizer, "
            f"which rounds itself; {type(optimizer).__module__}.{type(optimizer).__name__} is neither. Use one of "
            f"those, or set {KEY}=False."
        )
    if sr and _bnb_sliceable(optimizer, param) and _step_bnb_in_fp32_slices(optimizer, param, rounding, changes):
        return
    step = step_without_sync if in_backward and supports_step_without_sync(optimizer) else _own_step
    if sr and _family(optimizer) != "torchao":
        with _stepped_in_fp32(optimizer, param, rounding) as w32:
            step(optimizer)
        rounding.round_(param.data, w32, changes)
        return  # the swap freed the gradient
    before = param.detach().clone() if counting else None
    with rounding.as_default_generator() if sr else contextlib.nullcontext():
        step(optimizer)
    param.grad = None
    if before is not None:
        changes.add(torch.count_nonzero(param.detach() != before), param.numel())

"""AdamW and SGD for weights and state in host memory: one vectorised pass a parameter, on the worker's cores.

``CPUAdamW`` and ``CPUSGD`` are ``torch.optim`` optimizers whose step is the C kernel of ``cpu_optimizer.c``
(``_native_kernels``): it reads the weight, the gradient and the state once, computes the update in fp32
registers and writes each tensor back in its own format, on torch's OpenMP threads (the CPU optimizer worker
sets them to its cores). They are what the offloaded configs step on the CPU: ``fsdp_cpu_offload`` (the 8B
16 GB configs) and the single-device ``cpu_optimizer`` path (weights on the GPU, optimizer on the CPU).

Formats: weights and gradients fp32 or bf16; the state (``state_dtype``) ``fp32``, ``bf16`` or ``8bit``:
8-bit blockwise dynamic quantisation, one fp32 scale (the largest magnitude) per block of 256 elements of a
row and a float-like code of 8 bits an element (the code map is in ``cpu_optimizer.c``), about 1.03 bytes a
moment; tensors with fewer than two dimensions or 4,096 elements keep bf16 state (bitsandbytes' and
torchao's rule). Every bf16 or 8-bit value written is rounded stochastically: a bf16 update smaller than
half a bf16 step still moves the weight in expectation, and Adam's ``exp_avg_sq`` decays as in fp32.

The maths (fp32, every product and sum rounded, no fused multiply-add):

- AdamW: ``w = w * (1 - lr wd)``; ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) (g g)``;
  ``w = w + (m / (sqrt(v) * (1 / sqrt(1 - b2^t)) + eps)) * (-lr / (1 - b1^t))``.
- SGD: ``g = g + wd w``; with momentum ``buf = mu buf + (1 - dampening) g`` (the first step ``buf = g``),
  ``d = g + mu buf`` (nesterov) or ``buf``; ``w = w + (-lr) d``.

The random stream: each step of each parameter has a key, SplitMix64 of (``seed``, the parameter's name,
the step number), and each element one 32-bit hash of (its index in the tensor, the key); the bf16 weight
takes its top 16 bits, the first state tensor bits 8-15, the second bits 0-7 (``cpu_optimizer.c`` says how
they round). So the bits depend on nothing but (seed, step, parameter, element): not on the thread count,
the order parameters are stepped in, or any generator (no global generator is read or moved), and a resumed
run (the step count is in the state) draws what the uninterrupted run would have drawn. Built by a recipe,
``seed`` comes from the run's seed (and rank) and the names are the model's parameter names.

Without the C kernels (no compiler, ``TUNE_NATIVE_KERNELS=0``, a tensor not on the CPU) the same maths runs
in PyTorch operations (``_adam_torch``, ``_sgd_torch``): the same bits, several times slower (said once).
"""

from __future__ import annotations

import logging
import zlib
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Sequence, Tuple

import torch
from torch.optim import Optimizer

from torchtune._errors import TuneError
from torchtune.modules import _native_kernels
from torchtune.training.distributed._dtensor import is_dtensor, local_shard

log = logging.getLogger("torchtune")

__all__ = ["CPUAdamW", "CPUSGD", "STATE_DTYPES", "state_bytes"]

BLOCK = 256  # elements of a row that share one 8-bit scale
STATE_DTYPES = ("fp32", "bf16", "8bit")
_FORMAT = {"fp32": 0, "bf16": 1, "8bit": 2}
_DTYPE = {0: torch.float32, 1: torch.bfloat16, 2: torch.uint8}
_Q8_MIN = 4096  # smaller tensors (and those of fewer than 2 dimensions) keep bf16 state
_M32, _M64 = (1 << 32) - 1, (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15
# the PyTorch path's rows per chunk: its int32 and fp32 temporaries stay a few MB
_CHUNK_ELEMENTS = 1 << 18
_SLOW_SAID = False


def _splitmix64(x: int) -> int:
    z = (x + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def rounding_key(seed: int, name: str, step: int) -> Tuple[int, int]:
    """The (base, salt) of one parameter's step: SplitMix64 over (seed, crc32 of the name, step)."""
    stream = _splitmix64((int(seed) & _M64) ^ (zlib.crc32(name.encode()) << 32))
    key = _splitmix64((stream + int(step) * _GOLDEN) & _M64)
    return key & _M32, key >> 32


def _layout(shape: Sequence[int]) -> Tuple[int, int]:
    """(rows, cols) of a tensor: its last dimension is a row (a 0-dim tensor: one row of one)."""
    cols = int(shape[-1]) if len(shape) else 1
    rows = 1
    for d in shape[:-1]:
        rows *= int(d)
    return rows, cols


def state_format(param: torch.Tensor, state_dtype: str) -> int:
    """The state format a parameter gets: ``8bit`` only for tensors of two or more dimensions and 4,096 or more
    elements (of this rank's shard), bf16 for the others."""
    fmt = _FORMAT[state_dtype]
    local = local_shard(param)
    if fmt == 2 and (param.dim() < 2 or local.numel() < _Q8_MIN):
        return 1
    return fmt


def state_bytes(shape: Sequence[int], state_dtype: str, tensors: int = 2) -> int:
    """Bytes of ``tensors`` state tensors (Adam: 2, SGD with momentum: 1) for a parameter of ``shape``."""
    n = 1
    for d in shape:
        n *= int(d)
    fmt = _FORMAT[state_dtype]
    if fmt == 2 and (len(shape) < 2 or n < _Q8_MIN):
        fmt = 1
    if fmt == 2:
        rows, cols = _layout(shape)
        return tensors * (n + 4 * rows * -(-cols // BLOCK))
    return tensors * n * (4 if fmt == 0 else 2)


def _weight_format(t: torch.Tensor) -> int:
    if t.dtype == torch.float32:
        return 0
    if t.dtype == torch.bfloat16:
        return 1
    raise TuneError(f"CPUAdamW and CPUSGD step fp32 or bf16 weights and gradients, got {t.dtype}.")


class _CPUOptimizer(Optimizer):
    """What CPUAdamW and CPUSGD share: the state formats, the rounding keys, sharded (DTensor) state, and a
    ``load_state_dict`` that keeps the state's own dtypes (torch's casts floating state to the parameter's)."""

    # build_optimizer passes (name, parameter) pairs: the names key the rounding stream
    takes_parameter_names = True
    _state_names: Tuple[str, ...] = ()

    def __init__(self, params: Iterable[Any], defaults: Dict[str, Any], state_dtype: str, seed: int) -> None:
        if state_dtype not in STATE_DTYPES:
            raise TuneError(
                f"{type(self).__name__}: state_dtype={state_dtype!r} is not one of {', '.join(STATE_DTYPES)}. Use "
                "8bit (about 1 byte a state element), bf16 (2) or fp32 (4)."
            )
        super().__init__(params, defaults)
        self.state_dtype = state_dtype
        self.seed = int(seed)
        self.changed = 0  # bf16 weights whose value the last step changed, when it was asked to count

    # ---- state ---------------------------------------------------------------------------------------------
    def _names(self) -> Dict[int, str]:
        names = {}
        for gi, group in enumerate(self.param_groups):
            given = group.get("param_names")
            for pi, p in enumerate(group["params"]):
                names[id(p)] = given[pi] if given is not None else f"{gi}.{pi}"
        return names

    def _new_state(self, param: torch.Tensor, fmt: int) -> Dict[str, torch.Tensor]:
        local = local_shard(param.detach())
        state: Dict[str, torch.Tensor] = {"step": torch.tensor(0.0, dtype=torch.float32)}
        for name in self._state_names:
            state[name] = _like(param, torch.zeros(local.shape, dtype=_DTYPE[fmt], device=local.device))
            if fmt == 2:
                rows_shape = tuple(local.shape[:-1]) + (-(-local.shape[-1] // BLOCK),)
                scale = torch.zeros(rows_shape, dtype=torch.float32, device=local.device)
                state[name + "_scale"] = _like(param, scale, last_dim=rows_shape[-1])
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """torch's ``load_state_dict`` for the groups and their checks; the state as saved (its dtypes: fp32
        scales and 8-bit codes are not cast to the parameter's dtype), on the parameter's device."""
        saved = state_dict["state"]
        super().load_state_dict({"state": {}, "param_groups": state_dict["param_groups"]})
        ids = [pid for group in state_dict["param_groups"] for pid in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for pid, param in zip(ids, params):
            if pid in saved:
                self.state[param] = {k: _on_device(v, param, k) for k, v in saved[pid].items()}

    # ---- the step ------------------------------------------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None, *, count_changes: bool = False) -> Optional[float]:
        """One step of every parameter with a gradient (the gradient is left as it is). ``count_changes``: count
        the bf16 weights whose value changed, in ``self.changed``."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        names = self._names()
        self.changed = 0
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state.update(self._new_state(p, state_format(p, self.state_dtype)))
                state["step"] += 1
                w, g = local_shard(p.detach()), local_shard(p.grad)
                if w.numel() == 0 or _is_fake(w):
                    continue  # an empty shard; the memory estimator's fake tensors: the state is all it allocates
                if is_dtensor(p) and not w.is_contiguous():
                    raise TuneError(f"{type(self).__name__}: a non-contiguous local shard of {names[id(p)]}.")
                key = rounding_key(self.seed, names[id(p)], int(state["step"].item()))
                self.changed += self._step_tensor(group, state, w, g, key, count_changes)
        return loss

    def _step_tensor(self, group: Mapping[str, Any], state: Dict[str, Any], w, g, key, count: bool) -> int:
        raise NotImplementedError


def _like(param: torch.Tensor, local: torch.Tensor, last_dim: Optional[int] = None) -> torch.Tensor:
    """``local`` as a DTensor sharded as ``param`` is (so a sharded checkpoint holds each rank's part), or itself.
    ``last_dim``: the global tensor's last dimension differs from the parameter's (the 8-bit scales)."""
    if not is_dtensor(param):
        return local
    from torch.distributed.tensor import DTensor, Shard

    if any(isinstance(pl, Shard) and pl.dim != 0 for pl in param.placements):
        raise TuneError(
            "CPUAdamW and CPUSGD keep sharded state for parameters sharded on their first dimension (FSDP2's "
            f"default); this one is placed {param.placements}."
        )
    shape = tuple(param.shape) if last_dim is None else tuple(param.shape[:-1]) + (last_dim,)
    stride = torch.empty(shape, device="meta").stride()
    return DTensor.from_local(local, param.device_mesh, param.placements, run_check=False, shape=shape, stride=stride)


def _on_device(value: Any, param: torch.Tensor, key: str) -> Any:
    if not torch.is_tensor(value) or key == "step":
        return value
    return value.to(device=param.device)


def _is_fake(t: torch.Tensor) -> bool:
    from torch._subclasses.fake_tensor import is_fake

    return is_fake(t)


def _say_slow_once(why: str) -> None:
    global _SLOW_SAID
    if not _SLOW_SAID:
        _SLOW_SAID = True
        log.warning(
            "CPUAdamW/CPUSGD: %s; stepping with the PyTorch form of the same maths (the same bits), about 40x slower "
            "on a CPU (36x with bf16 moments, 57x with 8-bit, one core; docs/speed.md).",
            why,
        )


def _flat_state(state: Mapping[str, Any], name: str) -> Tuple[torch.Tensor, Optional[torch.Tensor]]:
    values = local_shard(state[name])
    scale = state.get(name + "_scale")
    return values, (local_shard(scale) if scale is not None else None)


def _run(kernel: str, tensors: tuple, scales: tuple, cols: int, s: torch.Tensor, key, formats, flags) -> int:
    """The C kernel where it applies, else the PyTorch path (said once where that is for want of the kernels)."""
    on_cpu = all(t.device.type == "cpu" for t in tensors)
    if on_cpu:
        done = getattr(_native_kernels, kernel)(tensors, scales, cols, s, key, formats, flags)
        if done is not None:
            return done
        _say_slow_once("the C kernels are off or could not be built (said above)")
    torch_path = _adam_torch if kernel == "cpu_adam" else _sgd_torch
    return torch_path(tensors, scales, cols, s, key, formats, flags)


class CPUAdamW(_CPUOptimizer):
    """AdamW (decoupled weight decay) for host tensors, one pass a parameter (see the module docstring).

    Args:
        params: parameters, parameter groups, or (name, parameter) pairs (the names key the rounding).
        lr, betas, eps, weight_decay: as ``torch.optim.AdamW``.
        state_dtype: ``8bit``, ``bf16`` or ``fp32`` moments.
        maximize: ascend instead.
        seed: the rounding stream's seed (a recipe passes the run's).
    """

    _state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: Tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
        *,
        state_dtype: str = "bf16",
        maximize: bool = False,
        seed: int = 0,
    ) -> None:
        if not 0.0 <= float(lr) or not 0.0 <= float(eps) or not all(0.0 <= float(b) < 1.0 for b in betas):
            raise TuneError(f"CPUAdamW: lr, eps >= 0 and betas in [0, 1) needed, got lr={lr}, eps={eps}, {betas}.")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, maximize=maximize)
        super().__init__(params, defaults, state_dtype, seed)

    def _step_tensor(self, group, state, w, g, key, count: bool) -> int:
        s = adam_scalars(group, int(state["step"].item()))
        m, ms = _flat_state(state, "exp_avg")
        v, vs = _flat_state(state, "exp_avg_sq")
        formats = (_weight_format(w), _weight_format(g), _format_of(m))
        _, cols = _layout(w.shape)
        return _run("cpu_adam", (w, g, m, v), (ms, vs), cols, s, key, formats, (bool(group["maximize"]), count))


class CPUSGD(_CPUOptimizer):
    """SGD (momentum, dampening, nesterov, coupled weight decay as ``torch.optim.SGD``) for host tensors, one
    pass a parameter; the momentum buffer in ``state_dtype`` (none without momentum)."""

    _state_names = ("momentum_buffer",)

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        state_dtype: str = "bf16",
        maximize: bool = False,
        seed: int = 0,
    ) -> None:
        if nesterov and (momentum <= 0 or dampening != 0):
            raise TuneError("CPUSGD: nesterov needs momentum > 0 and dampening 0 (as torch.optim.SGD).")
        defaults = dict(
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            maximize=maximize,
        )
        super().__init__(params, defaults, state_dtype, seed)

    def _new_state(self, param: torch.Tensor, fmt: int) -> Dict[str, torch.Tensor]:
        group = next(g for g in self.param_groups if any(q is param for q in g["params"]))
        if not group["momentum"]:
            return {"step": torch.tensor(0.0, dtype=torch.float32)}
        return super()._new_state(param, fmt)

    def _step_tensor(self, group, state, w, g, key, count: bool) -> int:
        s = torch.tensor(
            [group["weight_decay"], group["momentum"], 1 - group["dampening"], -group["lr"]], dtype=torch.float32
        )
        if "momentum_buffer" in state:
            b, bs = _flat_state(state, "momentum_buffer")
            fmt = _format_of(b)
        else:
            b, bs, fmt = None, None, -1
        first = int(state["step"].item()) == 1
        formats = (_weight_format(w), _weight_format(g), fmt)
        flags = (bool(group["maximize"]), bool(group["nesterov"]), first, count)
        _, cols = _layout(w.shape)
        return _run("cpu_sgd", (w, g, b), (bs,), cols, s, key, formats, flags)


def _format_of(t: torch.Tensor) -> int:
    return {torch.float32: 0, torch.bfloat16: 1, torch.uint8: 2}[t.dtype]


def adam_scalars(group: Mapping[str, Any], step: int) -> torch.Tensor:
    """The fp32 scalars of the AdamW kernel at step ``step``, computed in double on the host: 1 - lr wd, 0 (no
    coupled decay), b1, 1 - b1, b2, 1 - b2, -lr / (1 - b1^t), 1 / sqrt(1 - b2^t), eps."""
    lr, wd, eps = float(group["lr"]), float(group["weight_decay"]), float(group["eps"])
    b1, b2 = (float(b) for b in group["betas"])
    values = [1 - lr * wd, 0.0, b1, 1 - b1, b2, 1 - b2, -lr / (1 - b1**step), 1 / (1 - b2**step) ** 0.5, eps]
    return torch.tensor(values, dtype=torch.float32)


# ---- the same maths in PyTorch operations (the fallback, and the tests' reference) ------------------------------
_MIX1, _MIX2 = 0x21F0AAAD, 0x735A2D97


def _i32(x: int) -> int:
    x &= _M32
    return x - (1 << 32) if x >> 31 else x


def hash32(index: torch.Tensor, base: int, salt: int) -> torch.Tensor:
    """The 32-bit hash of each element's index (int32 ``index``; the result's bits in int32)."""
    x = (index + _i32(base)) ^ _i32(salt)
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * _i32(_MIX1)
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * _i32(_MIX2)
    return x ^ ((x >> 15) & 0x1FFFF)


def _to_fp32(t: torch.Tensor, fmt: int) -> torch.Tensor:
    return t.float() if fmt != 0 else t


def _round_bf16(x: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """(bits(x) + noise) >> 16 as bf16: ``noise`` int32 in [0, 2^16)."""
    bits = (x.view(torch.int32) + noise) >> 16
    return (bits & 0xFFFF).to(torch.int16).view(torch.bfloat16)


def _noise8(h: torch.Tensor, shift: int) -> torch.Tensor:
    """The 8 bits of ``h`` at ``shift`` (8: bits 8-15, 0: bits 0-7)."""
    return (h >> shift) & 0xFF


def q8_decode(codes: torch.Tensor, scale: torch.Tensor, signed: bool) -> torch.Tensor:
    """fp32 values of 8-bit ``codes`` ([rows, cols] uint8) with one ``scale`` per block of 256 ([rows, nb])."""
    c = codes.to(torch.int32)
    mag = (c & 0x7F) if signed else c
    x = (mag << 20).view(torch.float32) * (2.0**112 if signed else 2.0**96)
    x = x * _per_element(scale, codes.shape[-1])
    return torch.where(c >= 0x80, -x, x) if signed else x


def q8_encode(x: torch.Tensor, noise8: torch.Tensor, signed: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of fp32 ``x`` ([rows, cols]) rounded with ``noise8`` (int32 in [0, 256)): each block's scale
    the largest magnitude in it, each code as ``cpu_optimizer.c`` defines it."""
    cols = x.shape[-1]
    nb = -(-cols // BLOCK)
    padded = torch.nn.functional.pad(x.abs(), (0, nb * BLOCK - cols))
    scale = padded.view(*x.shape[:-1], nb, BLOCK).amax(dim=-1)
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = (x.abs() * _per_element(inv, cols)) * (2.0**-112 if signed else 2.0**-96)
    code = (q.view(torch.int32) + ((noise8 << 12) | 0x800)) >> 20
    code = code.clamp(max=0x78 if signed else 0xF8)
    if signed:
        code = code | torch.where(x.view(torch.int32) < 0, 0x80, 0)
    return code.to(torch.uint8), scale


def _per_element(per_block: torch.Tensor, cols: int) -> torch.Tensor:
    return per_block.repeat_interleave(BLOCK, dim=-1)[..., :cols]


def _read_state(t: torch.Tensor, scale: Optional[torch.Tensor], fmt: int, signed: bool) -> torch.Tensor:
    return q8_decode(t, scale, signed) if fmt == 2 else _to_fp32(t, fmt)


def _write_state(t, scale, x: torch.Tensor, h: torch.Tensor, shift: int, fmt: int, signed: bool) -> None:
    noise = _noise8(h, shift)
    if fmt == 0:
        t.copy_(x)
    elif fmt == 1:
        t.copy_(_round_bf16(x, (noise << 8) | 0x80))
    else:
        codes, new_scale = q8_encode(x, noise, signed)
        t.copy_(codes)
        scale.copy_(new_scale)


def _rows_chunks(t: torch.Tensor, cols: int):
    rows = t.numel() // cols
    step = max(1, _CHUNK_ELEMENTS // max(cols, 1))
    for r0 in range(0, rows, step):
        yield r0, min(rows, r0 + step)


def _as_rows(t: Optional[torch.Tensor], cols: int) -> Optional[torch.Tensor]:
    return None if t is None else t.view(-1, cols)


def _scales_as_rows(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    return None if t is None else t.view(-1, t.shape[-1] if t.dim() else 1)


def _adam_torch(tensors, scales, cols, s, key, formats, flags) -> int:
    """The AdamW kernel's maths in PyTorch operations, chunks of rows at a time (its bits)."""
    w, g, m, v = (_as_rows(t, cols) for t in tensors)
    ms, vs = (_scales_as_rows(t) for t in scales)
    wf, gf, sf = formats
    maximize, count = flags
    decay, wd, b1, c1, b2, c2, step, bc2, eps = s.tolist()
    f = torch.float32
    scalar = {k: torch.tensor(val, dtype=f) for k, val in dict(decay=decay, wd=wd, b1=b1, c1=c1).items()}
    scalar.update({k: torch.tensor(val, dtype=f) for k, val in dict(b2=b2, c2=c2, step=step, bc2=bc2, eps=eps).items()})
    changed = 0
    for r0, r1 in _rows_chunks(w, cols):
        rw = w[r0:r1]
        w32 = _to_fp32(rw, wf)
        g32 = _to_fp32(g[r0:r1], gf) * (-1.0 if maximize else 1.0)
        part = slice(r0, r1)
        m32 = _read_state(m[part], ms[part] if ms is not None else None, sf, True)
        v32 = _read_state(v[part], vs[part] if vs is not None else None, sf, False)
        w32 = w32 * scalar["decay"]
        g32 = g32 + scalar["wd"] * w32
        m32 = scalar["b1"] * m32 + scalar["c1"] * g32
        v32 = scalar["b2"] * v32 + scalar["c2"] * (g32 * g32)
        # torch's fp32 sqrt on a CPU is MKL's, not always correctly rounded; the double one rounded to fp32 is
        denom = v32.double().sqrt().float() * scalar["bc2"] + scalar["eps"]
        w32 = w32 + (m32 / denom) * scalar["step"]
        index = _index(r0, r1, cols)
        h = hash32(index, *key)
        changed += _write_weight(rw, w32, h, wf, count)
        _write_state(m[part], ms[part] if ms is not None else None, m32, h, 8, sf, True)
        _write_state(v[part], vs[part] if vs is not None else None, v32, h, 0, sf, False)
    return changed


def _sgd_torch(tensors, scales, cols, s, key, formats, flags) -> int:
    """The SGD kernel's maths in PyTorch operations (its bits)."""
    w, g, b = (_as_rows(t, cols) for t in tensors)
    (bs,) = (_scales_as_rows(t) for t in scales)
    wf, gf, sf = formats
    maximize, nesterov, first, count = flags
    wd, mu, damp, neg_lr = (torch.tensor(x, dtype=torch.float32) for x in s.tolist())
    changed = 0
    for r0, r1 in _rows_chunks(w, cols):
        part = slice(r0, r1)
        w32 = _to_fp32(w[part], wf)
        g32 = _to_fp32(g[part], gf) * (-1.0 if maximize else 1.0)
        g32 = g32 + wd * w32
        d = g32
        h = hash32(_index(r0, r1, cols), *key)
        if sf >= 0:
            buf = (
                g32 if first else mu * _read_state(b[part], bs[part] if bs is not None else None, sf, True) + damp * g32
            )
            d = g32 + mu * buf if nesterov else buf
            _write_state(b[part], bs[part] if bs is not None else None, buf, h, 8, sf, True)
        w32 = w32 + neg_lr * d
        changed += _write_weight(w[part], w32, h, wf, count)
    return changed


def _index(r0: int, r1: int, cols: int) -> torch.Tensor:
    start = r0 * cols
    index = torch.arange(start, r1 * cols, dtype=torch.int64)
    return ((index & _M32) - ((index & (1 << 31)) << 1)).to(torch.int32).view(r1 - r0, cols)


def _write_weight(w: torch.Tensor, w32: torch.Tensor, h: torch.Tensor, fmt: int, count: bool) -> int:
    if fmt == 0:
        w.copy_(w32)
        return 0
    new = _round_bf16(w32, (h >> 16) & 0xFFFF)
    changed = int((new.float() != w.float()).sum()) if count else 0
    w.copy_(new)
    return changed

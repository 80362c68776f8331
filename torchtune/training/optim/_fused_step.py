"""bitsandbytes' Adam/AdamW step of a bf16 parameter in one pass, rounded stochastically, and the small
parameters of a backward stepped together in one multi-tensor call.

bitsandbytes' kernels read and write the weight in its own dtype, rounding to nearest, which loses bf16
updates below half a bf16 step; ``bf16_stochastic_rounding`` needs the update in fp32 and the weight
written rounded stochastically. ``bnb_adam_step`` does that in one kernel per parameter: it reads the bf16
weight and gradient and the optimizer state where bitsandbytes keeps it (32-bit moments, or 8-bit
blockwise-quantized ones with their per-block absmax and quantization maps; paged state is prefetched to
the device as bitsandbytes prefetches it, then read in place), computes bitsandbytes' update in fp32
registers and writes the moments (requantized for 8-bit state) and the stochastically rounded weight. No
fp32 copy of the weight, gradient or state exists.

The update is bitsandbytes' (its CPU backend's arithmetic, ``bitsandbytes/backends/cpu/ops.py``), for
``optimizer_name == "adam"`` (``Adam``, ``AdamW``, their paged and 8-bit forms) without ``max_unorm``:

- ``m = beta1 * m + (1 - beta1) * g``, ``v = beta2 * v + (1 - beta2) * g * g``;
- the weight, decayed by ``1 - lr * weight_decay`` when weight decay is set, moves by
  ``-lr * c2 / c1 * m / (sqrt(v) + eps * c2)`` (32-bit) or ``-lr / c1 * m / (sqrt(v) / c2 + eps)`` (8-bit),
  with ``c1 = 1 - beta1^t`` and ``c2 = sqrt(1 - beta2^t)`` at step ``t``;
- 8-bit state: each block of 256 elements is ``qmap[code] * absmax`` (``dequantize_blockwise``); after the
  update each block's absmax is its largest magnitude and each element's code is the nearest entry of the
  map to ``value / absmax`` (ties to the lower entry), which is what bitsandbytes' quantizer searches for
  (its CPU search lands on another entry for some values below ~1e-5 of the block's absmax);
- the weight is rounded as ``StochasticRounding.round_`` rounds, with the weights' stream's key for the call.

Where it runs: one kernel compiled by Inductor (Triton on a GPU), compiled once per process with dynamic
sizes; the keys and step scalars are kernel arguments (no host-to-device copy). On a CPU, tensors below
``_stochastic_rounding._COMPILE_MIN`` elements run the same arithmetic eagerly (no compile for tiny models),
in chunks.

Small parameters (norm scales: a few thousand elements, 65 of them in Llama2-7B) would each cost a launch
and a Python step for almost no work. In backward their steps are deferred to the end of backward
(``SmallParamSteps``) and taken together: their weights, gradients and states are concatenated (one launch
each), stepped by the same kernel over the concatenation with one key for the call (element ``i`` of the
concatenation draws the bits of index ``i``), and written back with one multi-tensor copy per tensor kind.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch.optim import Optimizer

from torchtune.training.distributed._dtensor import is_dtensor
from torchtune.training.estimate._launch_counter import kernel_region, optimizer_work
from torchtune.training.optim import _stochastic_rounding as _sr
from torchtune.training.optim._bnb_step import supports_step_without_sync
from torchtune.training.optim._stochastic_rounding import (
    StochasticRounding,
    WeightChangeTracker,
    _as_optimizer_step,
    _hash16,
    _is_abstract,
    _moved,
    _rounded,
    _run_compiled,
)

__all__ = ["SmallParamSteps", "bnb_adam_kind", "bnb_adam_step", "fused_component", "step_small_params"]

_BLOCK = 256  # bitsandbytes' 8-bit blockwise state: one absmax per 256 elements
# Parameters below this size are deferred to one multi-tensor step at the end of backward.
SMALL = 1 << 16
# Launches of each compiled kernel (Inductor fuses each into one kernel; the changed-weights count of a
# logged step adds a reduction). benchmarks/gpu_proof.py counts them on a GPU.
LAUNCHES = {"bnb32": 1, "bnb8": 1}


def _signed(k: int) -> int:
    """A 32-bit key as the int32 the kernel's arithmetic wraps in."""
    return k - (1 << 32) if k >> 31 else k


# --- the arithmetic (plain PyTorch: run eagerly, or compiled into one kernel) --------------------------------


def _bnb32_into(w, g, s1, s2, base: int, salt: int, beta1, beta2, decay, eps_c2, step_size, count: bool):
    """bitsandbytes' 32-bit Adam update of flat bf16 ``w`` with fp32 moments ``s1``, ``s2`` (in place); ``w``
    written stochastically rounded with key ``(base, salt)``. ``count`` (a logged step): also returns the
    count of changed weights and the gradient's fp32 sum of squares (the same kernel reads it)."""
    index = torch.arange(w.numel(), device=w.device, dtype=torch.int32)
    g32 = g.float()
    # bitsandbytes' CPU backend's arithmetic in its order; products and sums rather than its ``alpha=`` and
    # ``value=`` arguments, which a compiled kernel would bake in as constants (a recompile every step)
    m = s1 * beta1 + g32 * (1.0 - beta1)
    v = s2 * beta2 + g32 * g32 * (1.0 - beta2)
    p = w.float() * decay + m / (v.sqrt() + eps_c2) * step_size
    new = _rounded(p, _hash16(index, base, salt))
    logged = ((new != w).sum(), (g32 * g32).sum()) if count else None
    w.copy_(new)
    s1.copy_(m)
    s2.copy_(v)
    return logged


def _nearest_code(code: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Index of the entry of sorted 256-entry ``code`` nearest to each ``x`` (ties: the lower entry)."""
    lo = torch.zeros_like(x, dtype=torch.int64)
    for step in (128, 64, 32, 16, 8, 4, 2, 1):
        candidate = lo + step
        lo = torch.where(code[candidate] <= x, candidate, lo)
    hi = (lo + 1).clamp(max=255)
    return torch.where(x > (code[lo] + code[hi]) * 0.5, hi, lo)


def _quantized(x: torch.Tensor, code: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """Blocks ``x`` ([blocks, 256], fp32) as bitsandbytes' 8-bit state: (codes uint8, absmax fp32 [blocks])."""
    absmax = x.abs().amax(dim=1)
    scaled = (x * (1.0 / absmax)[:, None]).clamp(-1.0, 1.0)
    scaled = torch.where(absmax[:, None] > 0, scaled, 0.0)  # an all-zero block: any code dequantizes to 0
    return _nearest_code(code, scaled).to(torch.uint8), absmax


def _bnb8_into(
    w,
    g,
    q1,
    q2,
    a1,
    a2,
    code1,
    code2,
    base: int,
    salt: int,
    beta1,
    beta2,
    decay,
    c2,
    eps,
    step_size,
    count,
    width=_BLOCK,
):
    """bitsandbytes' 8-bit blockwise Adam update of flat bf16 ``w`` (blocks of ``width`` elements: 256, or a
    last partial block alone): the moments dequantized, updated, requantized in place; ``w`` written
    stochastically rounded."""
    blocks = a1.numel()
    index = torch.arange(w.numel(), device=w.device, dtype=torch.int32)
    g32 = g.float().view(blocks, width)
    m = code1[q1.long()].view(blocks, width) * a1[:, None] * beta1 + g32 * (1.0 - beta1)
    v = code2[q2.long()].view(blocks, width) * a2[:, None] * beta2 + g32 * g32 * (1.0 - beta2)
    p = w.float().view(blocks, width) * decay + m / (v.sqrt() / c2 + eps) * step_size
    new = _rounded(p.view(-1), _hash16(index, base, salt))
    logged = ((new != w).sum(), (g32 * g32).sum()) if count else None
    w.copy_(new)
    codes1, absmax1 = _quantized(m, code1)
    codes2, absmax2 = _quantized(v, code2)
    q1.copy_(codes1.view(-1))
    q2.copy_(codes2.view(-1))
    a1.copy_(absmax1)
    a2.copy_(absmax2)
    return logged


_KERNELS: Dict[str, Callable[..., Any]] = {"bnb32": _bnb32_into, "bnb8": _bnb8_into}


# --- running a kernel ------------------------------------------------------------------------------------------


def _slices(kind: str, tensors: Sequence[torch.Tensor], start: int, end: int) -> tuple:
    """Elements ``start:end`` of a kernel's tensors (8-bit: block-aligned; the absmax by block, maps whole)."""
    if kind == "bnb32":
        return tuple(t[start:end] for t in tensors)
    w, g, q1, q2, a1, a2, code1, code2 = tensors
    lo, hi = start // _BLOCK, -(-end // _BLOCK)
    return (w[start:end], g[start:end], q1[start:end], q2[start:end], a1[lo:hi], a2[lo:hi], code1, code2)


def _run(
    kind: str,
    tensors: Sequence[torch.Tensor],
    key: Tuple[int, int],
    scalars: Sequence[float],
    count: bool,
    fused: bool,
) -> Optional[Tuple[torch.Tensor, torch.Tensor]]:
    """Kernel ``kind`` over flat ``tensors`` (8-bit: a whole number of blocks), with the weights' ``key``
    (moved on for each span and chunk) and the step's ``scalars``. ``count`` (a logged step): returns the
    count of changed weights and the gradient's sum of squares (0-dim device tensors). On fake/meta
    tensors (the estimator, the launch counter) nothing runs: the kernel writes in place and allocates
    nothing, and counts as its launches (a logged step's reductions finish in one more)."""
    w = tensors[0]
    n = w.numel()
    if _is_abstract(w):
        with kernel_region("optimizer", launches=LAUNCHES[kind] + (1 if count else 0)):
            if count:
                return torch.zeros((), dtype=torch.int64, device=w.device), torch.zeros((), device=w.device)
            return None
    fn = _KERNELS[kind]
    # the rounding's knobs (``_stochastic_rounding``): the size from which a CPU compiles, spans, chunks
    compiled = fused and (n >= _sr._COMPILE_MIN or w.device.type != "cpu")
    parts: List[Tuple[torch.Tensor, torch.Tensor]] = []
    for start in range(0, n, _sr._SPAN):
        end = min(start + _sr._SPAN, n)
        base, salt = _moved(key, start)
        done, logged = False, None
        if compiled:
            args = (*_slices(kind, tensors, start, end), _signed(base), _signed(salt), *scalars, count)
            done, logged = _run_compiled(f"fused_{kind}", fn, *args)
            if done and count:
                parts.append(logged)
        if not done:
            for chunk in range(start, end, _sr._CHUNK):
                stop = min(chunk + _sr._CHUNK, end)
                chunk_base, chunk_salt = _moved(key, chunk)
                chunk_args = (*_slices(kind, tensors, chunk, stop), _signed(chunk_base), _signed(chunk_salt))
                logged = fn(*chunk_args, *scalars, count)
                if count:
                    parts.append(logged)
    if not count:
        return None
    if len(parts) == 1:
        return parts[0]
    return torch.stack([c for c, _ in parts]).sum(), torch.stack([g for _, g in parts]).sum()


# --- bitsandbytes' optimizers ----------------------------------------------------------------------------------


# bitsandbytes' Adam classes (``optimizer_name == "adam"``), by name, for configs that are not built (the
# memory estimator's stand-in steps these as the fused kernel does: in place, nothing allocated)
_BNB_ADAM = {f"{paged}Adam{w}{bits}" for paged in ("", "Paged") for w in ("", "W") for bits in ("", "8bit", "32bit")}


def fused_component(component: str) -> bool:
    """Whether a rounded step of ``component`` (a ``_component_`` path) runs as ``bnb_adam_step``'s one kernel."""
    module, _, name = component.rpartition(".")
    return module.startswith("bitsandbytes.optim") and name in _BNB_ADAM


def bnb_adam_kind(optimizer: Optimizer, param: torch.Tensor) -> Optional[str]:
    """``"bnb32"`` or ``"bnb8"`` for a bitsandbytes Adam/AdamW (paged or not) stepping bf16 ``param`` (a plain,
    contiguous tensor) with a state layout this module knows; None otherwise."""
    if not supports_step_without_sync(optimizer) or getattr(optimizer, "optimizer_name", None) != "adam":
        return None
    args = getattr(optimizer, "args", None)
    if getattr(args, "max_unorm", 0.0) or getattr(args, "skip_zeros", False):
        return None
    if param.dtype != torch.bfloat16 or is_dtensor(param) or not param.is_contiguous() or param.grad is None:
        return None
    state = optimizer.state[param]
    if state:
        if not set(state) <= {"step", "state1", "state2", "qmap1", "qmap2", "absmax1", "absmax2"}:
            return None
        dtype = state["state1"].dtype
    else:
        group, gindex, pindex = _indices(optimizer, param)
        config = optimizer.get_config(gindex, pindex, group)
        small = param.numel() < config["min_8bit_size"]
        dtype = torch.float32 if config["optim_bits"] == 32 or small else torch.uint8
    if dtype == torch.float32:
        return "bnb32"
    return "bnb8" if dtype == torch.uint8 else None


def _indices(optimizer: Optimizer, param: torch.Tensor) -> Tuple[Dict[str, Any], int, int]:
    for gindex, group in enumerate(optimizer.param_groups):
        for pindex, p in enumerate(group["params"]):
            if p is param:
                return group, gindex, pindex
    raise ValueError("the parameter is not in this optimizer")


def _prepare(optimizer: Optimizer, param: torch.Tensor) -> Tuple[Dict[str, Any], Dict[str, Any]]:
    """bitsandbytes' own set-up of ``param``'s step (lazy init, state, prefetch of paged state); returns
    its config and state, the step count advanced as ``update_step`` advances it."""
    group, gindex, pindex = _indices(optimizer, param)
    if not optimizer.initialized:
        optimizer.check_overrides()
        optimizer.to_gpu()
        optimizer.initialized = True
    state = optimizer.state[param]
    if len(state) == 0:
        optimizer.init_state(group, param, gindex, pindex)
    optimizer.prefetch_state(param)
    config = optimizer.get_config(gindex, pindex, group)
    state["step"] += 1
    return config, state


def _scalars(kind: str, config: Dict[str, Any], step: int) -> Tuple[float, ...]:
    """The step's scalars as bitsandbytes computes them (in double on the host)."""
    beta1, beta2 = config["betas"][0], config["betas"][1]
    lr, eps, wd = config["lr"], config["eps"], config["weight_decay"]
    c1, c2 = 1.0 - beta1**step, math.sqrt(1.0 - beta2**step)
    decay = 1.0 - lr * wd if wd > 0.0 else 1.0
    if kind == "bnb32":
        return (beta1, beta2, decay, eps * c2, -lr * c2 / c1)
    return (beta1, beta2, decay, c2, eps, -lr / c1)


def _tensors(kind: str, param: torch.Tensor, grad: torch.Tensor, state: Dict[str, Any]) -> tuple:
    w, g = param.data.view(-1), grad.reshape(-1)
    if kind == "bnb32":
        return (w, g, state["state1"].view(-1), state["state2"].view(-1))
    code1, code2 = state["qmap1"], state["qmap2"]
    return (w, g, state["state1"].view(-1), state["state2"].view(-1), state["absmax1"], state["absmax2"], code1, code2)


def bnb_adam_step(
    optimizer: Optimizer,
    param: torch.nn.Parameter,
    rounding: StochasticRounding,
    changes: Optional[WeightChangeTracker],
    grad_norm: Any = None,
) -> bool:
    """bitsandbytes' Adam step of bf16 ``param`` in one pass with stochastic rounding (see the module
    docstring); frees the gradient. On a logged step (``changes`` or ``grad_norm``, a ``GradNormTracker``,
    armed) the same kernel counts the changed weights and sums the gradient's squares. False, having done
    nothing, for what it does not cover."""
    kind = bnb_adam_kind(optimizer, param)
    if kind is None:
        return False
    logged = _logged(changes, grad_norm)
    with _as_optimizer_step(optimizer):
        config, state = _prepare(optimizer, param)
        grad = param.grad
        param.grad = None
        tensors = _tensors(kind, param, grad, state)
        scalars = _scalars(kind, config, state["step"])
        n = param.numel()
        whole = n - n % _BLOCK if kind == "bnb8" else n
        key = rounding.next_key()
        out = _run(kind, _slices(kind, tensors, 0, whole), key, scalars, logged, rounding.fused)
        if whole < n:  # a last partial block, alone: bitsandbytes' absmax covers only its elements
            base, salt = _moved(key, whole)
            tail = _slices(kind, tensors, whole, n)
            part = _bnb8_into(*tail, _signed(base), _signed(salt), *scalars, logged, width=n - whole)
            out = (out[0] + part[0], out[1] + part[1]) if logged else None
        del grad
    _record(out, n, changes, grad_norm)
    return True


def _logged(changes: Optional[WeightChangeTracker], grad_norm: Any) -> bool:
    return (changes is not None and changes.armed) or (grad_norm is not None and grad_norm.armed)


def _record(out: Any, n: int, changes: Optional[WeightChangeTracker], grad_norm: Any) -> None:
    if out is None:
        return
    changed, square = out
    if changes is not None:
        changes.add(changed, n)
    if grad_norm is not None:
        grad_norm.add_square(square)


# --- small parameters, stepped together ---------------------------------------------------------------------


def step_small_params(
    steps: List[Tuple[Optimizer, torch.nn.Parameter, Any]],
    rounding: StochasticRounding,
    changes: Optional[WeightChangeTracker],
) -> None:
    """bitsandbytes Adam steps of several small bf16 parameters, ``(optimizer, parameter, grad_norm)`` each
    (``grad_norm``: the ``GradNormTracker`` its gradient goes into, or None), in one kernel call per kind and
    step: their weights, gradients and states concatenated, one key for the call, written back by one
    multi-tensor copy each. Frees their gradients."""
    groups: Dict[tuple, List[Tuple[Optimizer, torch.nn.Parameter, Dict[str, Any]]]] = {}
    trackers: Dict[int, Any] = {}
    for optimizer, param, grad_norm in steps:
        kind = bnb_adam_kind(optimizer, param)
        with _as_optimizer_step(optimizer):
            config, state = _prepare(optimizer, param)
        scalars = _scalars(kind, config, state["step"])
        trackers[id(grad_norm)] = grad_norm
        groups.setdefault((kind, scalars, id(grad_norm)), []).append((optimizer, param, state))
    for (kind, scalars, tracker), members in groups.items():
        grad_norm = trackers[tracker]
        params = [p for _, p, _ in members]
        per_param = [_tensors(kind, p, p.grad, state) for _, p, state in members]
        for p in params:
            p.grad = None
        # one launch per tensor kind: weights, gradients, moments (8-bit: codes and absmax); the maps are shared
        ncat = 4 if kind == "bnb32" else 6
        flats = [torch.cat([t[i] for t in per_param]) for i in range(ncat)]
        if kind == "bnb8":
            flats += [per_param[0][6], per_param[0][7]]
        out = _run(kind, flats, rounding.next_key(), scalars, _logged(changes, grad_norm), rounding.fused)
        for i in (0, *range(2, ncat)):  # the gradients need no copy back
            sizes = [t[i].numel() for t in per_param]
            torch._foreach_copy_([t[i] for t in per_param], list(flats[i].split(sizes)))
        _record(out, sum(p.numel() for p in params), changes, grad_norm)


class SmallParamSteps:
    """Small parameters' bitsandbytes Adam steps deferred, in backward, to one multi-tensor call when backward
    ends (``step_small_params``, queued with the autograd engine's final callback, which runs on the stream
    backward's caller was on)."""

    def __init__(self, rounding: StochasticRounding, changes: Optional[WeightChangeTracker] = None) -> None:
        self.rounding = rounding
        self.changes = changes
        self._pending: List[Tuple[Optimizer, torch.nn.Parameter, Any]] = []

    def defer(self, optimizer: Optimizer, param: torch.nn.Parameter, grad_norm: Any = None) -> bool:
        """Take ``param``'s step (its gradient stays until then, and goes into ``grad_norm`` then) if it is
        small, a kind the multi-tensor call covers, and we are inside backward; False otherwise (the caller
        steps it)."""
        if param.numel() >= SMALL or torch._C._current_graph_task_id() == -1:
            return False
        kind = bnb_adam_kind(optimizer, param)
        if kind is None or (kind == "bnb8" and param.numel() % _BLOCK):
            return False
        if not self._pending:
            torch.autograd.Variable._execution_engine.queue_callback(self.flush)
        self._pending.append((optimizer, param, grad_norm))
        return True

    def flush(self) -> None:
        """Step what was deferred (the end of backward)."""
        pending, self._pending = self._pending, []
        if pending:
            with optimizer_work():
                step_small_params(pending, self.rounding, self.changes)


def check_fused_kernels(device: torch.device, component: str) -> None:
    """Build, at set-up, the compiled kernels a rounded step of ``component`` runs on ``device`` (a GPU), on
    a few elements, so one that cannot be built stops the run before training with the reason
    (``_run_compiled``) instead of at the first step. Nothing to build on a CPU (C kernels, or the plain
    path for small tensors) or on the estimator's and counter's devices."""
    if device.type in ("cpu", "meta"):
        return
    from torchtune.training.optim._stochastic_rounding import _adam_whole, _round_whole

    n = 4 * _BLOCK
    w = torch.ones(n, dtype=torch.bfloat16, device=device)
    f32 = torch.ones(n, dtype=torch.float32, device=device)
    keys = torch.zeros(2, dtype=torch.int32, device=device)
    _run_compiled("round", _round_whole, f32.clone(), w.clone(), keys, False)
    if component.startswith("torch.optim.Adam"):
        scalars = torch.ones(8, dtype=torch.float32, device=device)
        six = torch.zeros(6, dtype=torch.int32, device=device)
        _run_compiled("adam", _adam_whole, w.clone(), w.clone(), w.clone(), w.clone(), six, scalars, True, False, False)
    if not fused_component(component):
        return
    # 32-bit state; an 8-bit optimizer's too (its parameters below min_8bit_size keep 32-bit state)
    args32 = (w.clone(), w.clone(), f32.clone(), f32.clone(), 3, 5, 0.9, 0.999, 1.0, 1e-8, -1e-5, False)
    _run_compiled("fused_bnb32", _bnb32_into, *args32)
    if "8bit" in component:
        code = torch.linspace(-1.0, 1.0, 256, device=device)
        q = torch.zeros(n, dtype=torch.uint8, device=device)
        absmax = torch.ones(n // _BLOCK, dtype=torch.float32, device=device)
        codes_and_scales = (q.clone(), q.clone(), absmax.clone(), absmax.clone(), code, code)
        scalars8 = (0.9, 0.999, 1.0, 0.03, 1e-8, -1e-5)
        _run_compiled("fused_bnb8", _bnb8_into, w.clone(), w.clone(), *codes_and_scales, 3, 5, *scalars8, False)

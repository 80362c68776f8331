"""Optimizer-in-backward state handling.

With optimizer in backward there is one optimizer per parameter (or per decoder layer, with
``optimizer_in_bwd_group: layer``), stepped from the post-accumulate-grad hooks
(``torchtune.training.register_optim_in_bwd_hooks``).
``OptimInBackwardWrapper`` gives a recipe the one optimizer object it would hold in standard mode:
LR schedulers drive its ``param_groups`` (the inner optimizers' own group dicts), and its state dict
is keyed by parameter *name*, so a checkpoint does not depend on parameter order (nor on the grouping:
a layer's optimizer state is saved as the per-parameter states it is made of).
"""

from __future__ import annotations

import logging
import os
from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

import torch
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from torchtune._errors import TuneError, TuneRuntimeError

log = logging.getLogger("torchtune")

# A standard ``torch.optim`` state dict has exactly these two keys; a per-name one never does
# (parameter names always contain a dot or are model attribute names).
_STANDARD_KEYS = frozenset({"state", "param_groups"})


# Group entries that are not hyper-parameters a config sets: the parameters themselves, and the base LR
# an LR scheduler writes into each group (``initial_lr``; ``lr`` is then the scheduled LR of the step).
_NOT_HYPERPARAMETERS = frozenset({"params", "param_names", "initial_lr"})


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return torch.as_tensor(a).double().equal(torch.as_tensor(b).double())
    return a is b or (a is not None and b is not None and bool(a == b))


@contextmanager
def configured_hyperparameters_kept(optimizer: Optimizer) -> Iterator[Dict[str, Tuple[Any, Any]]]:
    """Load a saved optimizer state inside this block, and keep the hyper-parameters this run's config gave.

    ``Optimizer.load_state_dict`` replaces every group's hyper-parameters (``lr``, ``betas``, ``weight_decay``
    ...) with the saved run's: a resume with ``optimizer.lr=1e-4`` would go on at the old LR without a word.
    The groups as built from the config are read on entry; on exit each hyper-parameter that differs from the
    loaded one is put back (the moments, step counts and other state stay as loaded) and logged. The base LR
    of a run with an LR scheduler is the group's ``initial_lr`` (its ``lr`` is the LR of the saved step): a
    changed base LR scales the saved step's LR by new / old, and ``initial_lr`` becomes the new base, which
    ``build_lr_scheduler`` then schedules from. Yields ``{key: (saved, configured)}``, filled on exit.
    """
    configured = [{k: v for k, v in g.items() if k not in _NOT_HYPERPARAMETERS} for g in optimizer.param_groups]
    changed: Dict[str, Tuple[Any, Any]] = {}
    yield changed
    groups = optimizer.param_groups
    if len(groups) != len(configured):  # the load refuses this itself; nothing to pair the groups by
        return
    for want, group in zip(configured, groups):
        for key, value in want.items():
            saved_base = group.get("initial_lr") if key == "lr" else None
            saved = saved_base if saved_base is not None else group.get(key)
            if _same(saved, value):
                continue
            changed.setdefault(key, (saved, value))
            if saved_base is not None:
                group["lr"] = group["lr"] * value / saved_base  # the same point of the schedule, new base
                group["initial_lr"] = value
            else:
                group[key] = value
    for key, (saved, value) in changed.items():
        log.info(
            "Resuming with optimizer.%s=%s (the checkpoint's run had %s): the config's value is used, the "
            "optimizer's state (moments, step counts) is kept.",
            key,
            value,
            saved,
        )


def is_standard_optimizer_state(state_dict: Mapping[str, Any]) -> bool:
    """True if ``state_dict`` came from one ``torch.optim.Optimizer`` over all parameters."""
    return set(state_dict.keys()) == _STANDARD_KEYS


class OptimInBackwardWrapper(Optimizer):
    """Holds ``{parameter name: optimizer}`` for a model trained with optimizer in backward.

    It is a ``torch.optim.Optimizer`` whose ``param_groups`` are the inner optimizers' group dicts
    (the same dicts, not copies), so any ``torch.optim.lr_scheduler`` built on it writes the LR
    straight into every per-parameter optimizer, and the LR that is logged is the LR applied.

    ``step()`` has nothing to do in a normal step: each parameter is stepped, and its gradient
    freed, by the hooks during ``backward()``. A recipe calls it anyway, so the training loop reads
    the same in both modes (and LR schedulers see that an optimizer step happened). What it does do:
    step a layer's optimizer whose parameters still hold gradients -- it waits for all of them, and
    a parameter that got none this step would otherwise hold the others back to the next step.
    ``zero_grad()`` does nothing.

    Args:
        optim_map: the optimizer of every trainable parameter, keyed by the parameter's name in
            ``model.named_parameters()``; names stepped together share one optimizer object.
        step_group: steps what backward left of a layer's optimizer, ``step_group(optimizer, params)``
            (the parameters holding gradients), freeing their gradients; the hooks' own step, so a
            leftover step is rounded (bf16 stochastic rounding) and counted as theirs are. Default:
            ``optimizer.step()``, then the gradients set to None.
    """

    def __init__(
        self,
        optim_map: Mapping[str, Optimizer],
        step_group: Optional[Callable[[Optimizer, List[torch.Tensor]], None]] = None,
    ) -> None:
        if not optim_map:
            raise ValueError("OptimInBackwardWrapper needs at least one parameter's optimizer")
        self.optim_map: Dict[str, Optimizer] = dict(optim_map)
        self._step_group = step_group
        # each inner optimizer once, with the names of its parameters in its own order
        self._members: Dict[int, Tuple[Optimizer, List[str]]] = {}
        for name, opt in self.optim_map.items():
            self._members.setdefault(id(opt), (opt, []))[1].append(name)
        for opt, names in self._members.values():
            if len(names) != sum(len(group["params"]) for group in opt.param_groups):
                raise ValueError(
                    f"optim_map names {len(names)} parameters for an optimizer that holds a different number"
                )
        # Optimizer.__init__ appends the very dicts it is given to self.param_groups.
        super().__init__(self._inner_groups(), defaults={})
        self.lr_scheduler: Optional[LRScheduler] = None

    def _inner_groups(self) -> list:
        return [group for opt, _ in self._members.values() for group in opt.param_groups]

    # ---- the optimizer interface -----------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> None:  # type: ignore[override]
        """Step what backward left: a layer's optimizer whose parameters still hold gradients (a
        one-parameter optimizer is always stepped by its hook, so it is never stepped here)."""
        for opt, names in self._members.values():
            if len(names) == 1:
                continue
            params = [p for group in opt.param_groups for p in group["params"]]
            if any(p.grad is not None for p in params):
                if self._step_group is not None:
                    self._step_group(opt, [p for p in params if p.grad is not None])
                else:
                    opt.step()
                for p in params:
                    p.grad = None
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: each hook freed its parameter's gradient right after the step."""
        return None

    # ---- checkpointing -------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Dict[str, Any]]:  # type: ignore[override]
        """Per-parameter optimizer states keyed by parameter name (a layer's optimizer split into the
        state dicts one optimizer per parameter would have)."""
        out: Dict[str, Dict[str, Any]] = {}
        for opt, names in self._members.values():
            if len(names) == 1:
                out[names[0]] = opt.state_dict()
            else:
                out.update(zip(names, _split_state_dict(opt.state_dict())))
        return out

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:  # type: ignore[override]
        """Restore the states saved by :meth:`state_dict`; strict about parameter names.

        Raises:
            TuneError: if the checkpoint was written by a standard-optimizer run, or its
                parameter names differ from this model's.
        """
        if is_standard_optimizer_state(state_dict):
            raise TuneRuntimeError(
                "The optimizer state in the recipe checkpoint was written by a run with "
                "optimizer_in_bwd=False (one optimizer over all parameters), but this run has "
                "optimizer_in_bwd=True. Resume with optimizer_in_bwd=False, or start a new run "
                "without resume_from_checkpoint."
            )
        expected, found = set(self.optim_map), set(state_dict)
        missing, unexpected = sorted(expected - found), sorted(found - expected)
        if missing or unexpected:
            problems = []
            if missing:
                problems.append(f"Expected to load optimizer state for params {_names(missing)}")
            if unexpected:
                problems.append(f"found state for unexpected params {_names(unexpected)}")
            raise TuneRuntimeError(
                "The optimizer state in the recipe checkpoint does not match this model's parameters: "
                + "; ".join(problems)
                + ". The checkpoint was probably written for another model; resume with the model "
                "config it was made with, or start a new run without resume_from_checkpoint."
            )
        mapped = FileMappings()
        for opt, names in self._members.values():
            one = state_dict[names[0]] if len(names) == 1 else _merge_state_dicts([state_dict[n] for n in names])
            load_optimizer_state_dict(opt, one, mapped=mapped)
        self.follow_inner_param_groups()

    # ---- torchtune's OptimizerInBackwardWrapper interface ------------------------------------
    def get_optim_key(self, key: str) -> Any:
        """``key`` of the first parameter group (``"lr"``, ``"weight_decay"`` ...): every inner optimizer is
        built from one config, so they share it."""
        return self.param_groups[0][key]

    def set_lr_scheduler(self, lr_scheduler: LRScheduler) -> None:
        """Drive every inner optimizer's LR from ``lr_scheduler`` (torchtune builds it on one inner optimizer):
        after each of its steps the LR it computed is written into every parameter group. A scheduler built
        on this wrapper itself drives them all anyway (``param_groups`` are the inner groups)."""
        self.lr_scheduler = lr_scheduler
        original_step = lr_scheduler.step

        def step(epoch: Optional[int] = None) -> None:
            original_step() if epoch is None else original_step(epoch)
            lr = lr_scheduler.get_last_lr()[0]
            for group in self.param_groups:
                group["lr"] = lr

        lr_scheduler.step = step  # type: ignore[method-assign]

    def step_lr_scheduler(self, epoch: Optional[int] = None) -> None:
        """Step the scheduler given to :meth:`set_lr_scheduler`.

        Raises:
            RuntimeError: none was given.
        """
        self._scheduler().step(epoch)

    def get_last_lr(self) -> float:
        """The LR the scheduler given to :meth:`set_lr_scheduler` computed last.

        Raises:
            RuntimeError: none was given.
        """
        return self._scheduler().get_last_lr()[0]

    def _scheduler(self) -> LRScheduler:
        if self.lr_scheduler is None:
            raise TuneRuntimeError("LR scheduler has not been set. Call set_lr_scheduler first.")
        return self.lr_scheduler

    def follow_inner_param_groups(self) -> None:
        """Point ``param_groups`` at the inner optimizers' group dicts again, in the same list object.

        Loading state into an inner optimizer (here, or through ``torch.distributed.checkpoint``'s
        ``set_state_dict``) gives it new group dicts; an LR scheduler reads ``optimizer.param_groups``
        at every step, so it must see those.
        """
        self.param_groups[:] = self._inner_groups()


def _split_state_dict(state_dict: Mapping[str, Any]) -> List[Dict[str, Any]]:
    """One optimizer's state dict over parameters ``0..n-1`` as ``n`` one-parameter state dicts."""
    out = []
    for group in state_dict["param_groups"]:
        hyper = {k: v for k, v in group.items() if k != "params"}
        for index in group["params"]:
            state = {0: state_dict["state"][index]} if index in state_dict["state"] else {}
            out.append({"state": state, "param_groups": [{**hyper, "params": [0]}]})
    return out


def _merge_state_dicts(state_dicts: List[Mapping[str, Any]]) -> Dict[str, Any]:
    """The inverse of ``_split_state_dict``: one-parameter state dicts as one single-group optimizer's."""
    hyper = {k: v for k, v in state_dicts[0]["param_groups"][0].items() if k != "params"}
    for sd in state_dicts[1:]:
        other = {k: v for k, v in sd["param_groups"][0].items() if k != "params"}
        if other != hyper:
            raise TuneError(
                "The optimizer states of one decoder layer's parameters were saved with different "
                f"hyperparameters ({hyper} vs {other}), so they cannot be stepped by one optimizer. "
                "Resume with optimizer_in_bwd_group=param."
            )
    state = {i: sd["state"][0] for i, sd in enumerate(state_dicts) if 0 in sd["state"]}
    return {"state": state, "param_groups": [{**hyper, "params": list(range(len(state_dicts)))}]}


def load_optimizer_state_dict(
    optimizer: Optimizer, state_dict: Mapping[str, Any], *, mapped: Optional["FileMappings"] = None
) -> None:
    """``optimizer.load_state_dict(state_dict)``, one parameter at a time, releasing as it goes.

    A resume's optimizer state comes memory-mapped from ``recipe_state.pt``
    (``load_recipe_state``). Loading it in one call would hold the whole state twice: the optimizer
    casts/moves every tensor first (bitsandbytes even deep-copies the whole dict), then the mapping
    stays resident. Here each parameter's state goes through the optimizer's own
    ``load_state_dict`` on its own; a mapped tensor the optimizer would keep as it is (CPU, same
    dtype) is cloned, so training never writes into the file's pages; bitsandbytes' ``state1`` /
    ``state2`` skip its ``load_state_dict`` and are copied straight into the optimizer's own state
    buffers (paged where the optimizer pages); and the mapped pages of that parameter are handed
    back to the kernel before the next one. Host memory: the restored state once plus one
    parameter's worth. ``state_dict`` itself is not modified.

    Raises:
        ValueError: from the optimizer, if the parameter groups do not match.
    """
    mapped = FileMappings() if mapped is None else mapped
    saved = state_dict["state"]
    groups = state_dict["param_groups"]
    ids = [pid for group in groups for pid in group["params"]]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    bnb = _is_bitsandbytes(optimizer)
    if not saved or len(ids) != len(params):
        optimizer.load_state_dict({"state": dict(saved), "param_groups": groups})  # it checks the groups
        keep_optimizer_state_paged(optimizer)
        return
    loaded = {}
    for pid, param in zip(ids, params):
        if pid not in saved:
            continue
        small, large = _split_bitsandbytes_state(optimizer, saved[pid]) if bnb else (saved[pid], {})
        optimizer.load_state_dict({"state": {pid: small}, "param_groups": groups})
        state = optimizer.state[param]
        for key, value in large.items():
            state[key] = _state_buffer(optimizer, param, value, mapped)
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and mapped.holds(value):
                state[key] = mapped.copy(value)  # never train in the file's pages
        loaded[param] = state
        mapped.release(saved[pid])
    optimizer.state = defaultdict(dict, loaded)


def _is_bitsandbytes(optimizer: Optimizer) -> bool:
    # the memory estimator's LayoutOptimizer names the bitsandbytes class it stands in for, and loads like it
    module = getattr(optimizer, "optimizer_component", type(optimizer).__module__)
    return str(module).startswith("bitsandbytes.") and hasattr(optimizer, "get_state_buffer")


_BNB_LARGE_STATE = ("state1", "state2")


def _split_bitsandbytes_state(optimizer: Optimizer, saved: Mapping[str, Any]) -> tuple[dict, dict]:
    """One parameter's saved bitsandbytes state as (the rest, ``{state1/state2: tensor}``).

    bitsandbytes' ``state_dict`` nests its quantization state under one key (for FSDP); the two
    large tensors are taken out of either place, without changing ``saved``.
    """
    small = dict(saved)
    wrap_key = getattr(optimizer, "_FSDP_WRAPPED_QUANT_STATE_KEY", None)
    holder = small
    if wrap_key is not None and isinstance(small.get(wrap_key), Mapping):
        holder = small[wrap_key] = dict(small[wrap_key])
    large = {k: holder.pop(k) for k in _BNB_LARGE_STATE if isinstance(holder.get(k), torch.Tensor)}
    return small, large


def _state_buffer(
    optimizer: Optimizer, param: torch.Tensor, value: torch.Tensor, mapped: Optional["FileMappings"] = None
) -> torch.Tensor:
    """``value`` copied into a state buffer allocated as bitsandbytes allocates it for ``param``.

    ``get_state_buffer`` gives managed (paged) memory for a paged optimizer on CUDA (a host-side
    view of it: the copy is a host memcpy and nothing lands in GPU memory), device memory otherwise.
    """
    if value.shape == param.shape:
        buffer = optimizer.get_state_buffer(param, dtype=value.dtype)
    else:
        buffer = torch.empty(value.shape, dtype=value.dtype, device=param.device)
    if mapped is None:
        buffer.copy_(value)
    else:
        mapped.copy_into(buffer, value)
    return buffer


def _place_bitsandbytes_state(optimizer: Optimizer, param: torch.Tensor) -> None:
    """Move one parameter's restored bitsandbytes ``state1`` / ``state2`` into state buffers."""
    state = optimizer.state.get(param, {})
    for key in _BNB_LARGE_STATE:
        value = state.get(key)
        if isinstance(value, torch.Tensor) and value.shape == param.shape and not getattr(value, "is_paged", False):
            state[key] = _state_buffer(optimizer, param, value)


def keep_optimizer_state_paged(optimizer: Optimizer) -> None:
    """Move restored state of a paged bitsandbytes optimizer back into paged buffers.

    For state restored by the optimizer's own ``load_state_dict`` (``load_optimizer_state_dict``
    does this itself, without the detour through the device): bitsandbytes would otherwise copy it
    onto the GPU at the first step, and a resumed paged run would hold its whole optimizer state in
    GPU memory. Re-allocating through ``get_state_buffer`` keeps it in managed (paged) memory,
    exactly as a fresh run allocates it.
    """
    if not getattr(optimizer, "is_paged", False) or not hasattr(optimizer, "get_state_buffer"):
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            _place_bitsandbytes_state(optimizer, param)


class FileMappings:
    """The private file mappings of this process (``torch.load(mmap=True)``), read once from
    ``/proc/self/maps``; elsewhere than Linux it knows none, and ``release`` does nothing.

    ``copy`` makes a mapped tensor the caller's own by reading its bytes from the file into new
    memory (``preadv``, as a plain ``torch.load`` reads): the mapping's pages are never touched, which
    saves a page fault per page over copying through the mapping. ``release`` gives the pages of
    mapped tensors that were read through the mapping (e.g. moved to the GPU) back to the kernel
    (``madvise(MADV_DONTNEED)``): they were only read, so a later access reads the file again, and
    the resident memory of a resume stays at what the optimizer holds.
    """

    _MADV_DONTNEED = 4

    def __init__(self) -> None:
        # (first address, end address, offset in the file, path) of each mapping
        self._ranges: list[tuple[int, int, int, str]] = []
        try:
            with open("/proc/self/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        regular: dict[str, bool] = {}
        for line in lines:
            fields = line.split(None, 5)
            # address perms offset dev inode path. torch.load(mmap=True) maps read-write and private
            # ("rw-p") a regular file; device mappings (/dev/nvidia-uvm: managed memory) never count.
            if (
                len(fields) != 6
                or fields[1] != "rw-p"
                or not fields[5].startswith("/")
                or fields[5].startswith("/dev/")
            ):
                continue
            path = fields[5]
            if path not in regular:
                regular[path] = os.path.isfile(path)
            if regular[path]:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                offset = int(fields[2], 16)
                last = self._ranges[-1] if self._ranges else None
                if last is not None and last[1] == start and last[3] == path and last[2] + last[1] - last[0] == offset:
                    self._ranges[-1] = (last[0], end, last[2], path)  # one mapping the kernel lists in parts
                else:
                    self._ranges.append((start, end, offset, path))

    def _find(self, t: torch.Tensor) -> Optional[tuple[int, int, int, str]]:
        """(start, end, file offset of start, path) of ``t``'s bytes, if they lie in a file mapping."""
        if not self._ranges or t.device.type != "cpu" or type(t) not in (torch.Tensor, torch.nn.Parameter):
            return None  # fake tensors, device tensors and tensor subclasses have no host pages to give back
        if getattr(t, "is_paged", False):
            return None  # bitsandbytes' managed memory, seen through a host tensor
        try:
            start = t.data_ptr()
        except (RuntimeError, NotImplementedError):
            return None
        end = start + t.numel() * t.element_size()
        for lo, hi, offset, path in self._ranges:
            if lo <= start and end <= hi:
                return start, end, offset + (start - lo), path
        return None

    def _span(self, t: torch.Tensor) -> Optional[tuple[int, int]]:
        found = self._find(t)
        return None if found is None else found[:2]

    def holds(self, t: torch.Tensor) -> bool:
        """True if ``t``'s data lies in a file mapping."""
        return self._span(t) is not None

    def copy(self, t: torch.Tensor) -> torch.Tensor:
        """A copy of ``t`` in new host memory (read from the file when ``t`` is mapped)."""
        out = torch.empty_like(t, memory_format=torch.contiguous_format)
        self.copy_into(out, t)
        return out

    def copy_into(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        """``dst.copy_(src)``; read from the file straight into ``dst`` when ``src`` is mapped and both
        are contiguous host tensors of the same dtype (``dst`` may be bitsandbytes' managed memory)."""
        found = self._find(src)
        if (
            found is None
            or dst.device.type != "cpu"
            or dst.dtype != src.dtype
            or dst.shape != src.shape
            or not (src.is_contiguous() and dst.is_contiguous())
            or src.numel() == 0
        ):
            dst.copy_(src)
            return
        _, _, offset, path = found
        view = memoryview(dst.reshape(-1).view(torch.uint8).numpy())
        fd = os.open(path, os.O_RDONLY)
        try:
            done = 0
            while done < len(view):  # preadv may return less than asked (2 GB at most per call)
                n = os.preadv(fd, [view[done:]], offset + done)
                if n <= 0:
                    dst.copy_(src)  # the file is shorter than its mapping: copy what is mapped
                    return
                done += n
        finally:
            os.close(fd)

    def release(self, tree: Any) -> None:
        """Drop the resident pages of every mapped tensor in ``tree`` (nested dicts/lists).

        Only whole pages inside a tensor's bytes are dropped, so neighbouring tensors keep theirs.
        """
        if not self._ranges:
            return
        import ctypes
        import mmap

        from torch.utils._pytree import tree_leaves

        libc = ctypes.CDLL(None, use_errno=True)
        page = mmap.PAGESIZE
        for t in tree_leaves(tree):
            span = self._span(t) if isinstance(t, torch.Tensor) else None
            if span is None:
                continue
            lo, hi = -(-span[0] // page) * page, span[1] // page * page
            if hi > lo:
                libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), self._MADV_DONTNEED)


def _names(names: list, limit: int = 8) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")

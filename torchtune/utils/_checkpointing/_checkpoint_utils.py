"""Optimizer-in-backward state handling.

With optimizer in backward there is one optimizer per parameter, stepped from that parameter's
post-accumulate-grad hook (``torchtune.training.register_optim_in_bwd_hooks``).
``OptimInBackwardWrapper`` gives a recipe the one optimizer object it would hold in standard mode:
LR schedulers drive its ``param_groups`` (the inner optimizers' own group dicts), and its state dict
is keyed by parameter *name*, so a checkpoint does not depend on parameter order.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Dict, Mapping, Optional

import torch
from torch.optim import Optimizer

from torchtune._errors import TuneError

# A standard ``torch.optim`` state dict has exactly these two keys; a per-name one never does
# (parameter names always contain a dot or are model attribute names).
_STANDARD_KEYS = frozenset({"state", "param_groups"})


def is_standard_optimizer_state(state_dict: Mapping[str, Any]) -> bool:
    """True if ``state_dict`` came from one ``torch.optim.Optimizer`` over all parameters."""
    return set(state_dict.keys()) == _STANDARD_KEYS


class OptimInBackwardWrapper(Optimizer):
    """Holds ``{parameter name: optimizer}`` for a model trained with optimizer in backward.

    It is a ``torch.optim.Optimizer`` whose ``param_groups`` are the inner optimizers' group dicts
    (the same dicts, not copies), so any ``torch.optim.lr_scheduler`` built on it writes the LR
    straight into every per-parameter optimizer, and the LR that is logged is the LR applied.

    ``step()`` and ``zero_grad()`` do nothing: each parameter is stepped, and its gradient freed,
    by its own hook during ``backward()``. A recipe calls them anyway, so the training loop reads
    the same in both modes (and LR schedulers see that an optimizer step happened).

    Args:
        optim_map: one optimizer per trainable parameter, keyed by the parameter's name in
            ``model.named_parameters()``.
    """

    def __init__(self, optim_map: Mapping[str, Optimizer]) -> None:
        if not optim_map:
            raise ValueError("OptimInBackwardWrapper needs at least one parameter's optimizer")
        self.optim_map: Dict[str, Optimizer] = dict(optim_map)
        # Optimizer.__init__ appends the very dicts it is given to self.param_groups.
        super().__init__(self._inner_groups(), defaults={})

    def _inner_groups(self) -> list:
        return [group for opt in self.optim_map.values() for group in opt.param_groups]

    # ---- the optimizer interface -----------------------------------------------------------
    @torch.no_grad()
    def step(self, closure: Optional[Callable[[], float]] = None) -> None:  # type: ignore[override]
        """Nothing to do: every parameter was stepped in backward, by its gradient hook."""
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Nothing to do: each hook freed its parameter's gradient right after the step."""
        return None

    # ---- checkpointing -------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Dict[str, Any]]:  # type: ignore[override]
        """Per-parameter optimizer states keyed by parameter name."""
        return {name: opt.state_dict() for name, opt in self.optim_map.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:  # type: ignore[override]
        """Restore the states saved by :meth:`state_dict`; strict about parameter names.

        Raises:
            TuneError: if the checkpoint was written by a standard-optimizer run, or its
                parameter names differ from this model's.
        """
        if is_standard_optimizer_state(state_dict):
            raise TuneError(
                "The optimizer state in the recipe checkpoint was written by a run with "
                "optimizer_in_bwd=False (one optimizer over all parameters), but this run has "
                "optimizer_in_bwd=True. Resume with optimizer_in_bwd=False, or start a new run "
                "without resume_from_checkpoint."
            )
        expected, found = set(self.optim_map), set(state_dict)
        missing, unexpected = sorted(expected - found), sorted(found - expected)
        if missing or unexpected:
            raise TuneError(
                "The optimizer state in the recipe checkpoint does not match this model's "
                f"parameters. Missing: {_names(missing)}. Unexpected: {_names(unexpected)}. "
                "The checkpoint was probably written for another model; resume with the model "
                "config it was made with, or start a new run without resume_from_checkpoint."
            )
        mapped = FileMappings()
        for name, opt in self.optim_map.items():
            load_optimizer_state_dict(opt, state_dict[name], mapped=mapped)
        # Loading gives each inner optimizer new group dicts: follow them, in the same list object
        # (an LR scheduler reads ``optimizer.param_groups`` at every step).
        self.param_groups[:] = self._inner_groups()


def load_optimizer_state_dict(
    optimizer: Optimizer, state_dict: Mapping[str, Any], *, mapped: Optional["FileMappings"] = None
) -> None:
    """``optimizer.load_state_dict(state_dict)``, one parameter at a time, releasing as it goes.

    A resume's optimizer state comes memory-mapped from ``recipe_state.pt``
    (``load_recipe_state``). Loading it in one call would hold the whole state twice: the optimizer
    casts/moves every tensor first (bitsandbytes even deep-copies the whole dict), then the mapping
    stays resident. Here each parameter's state goes through the optimizer's own
    ``load_state_dict`` on its own, its tensors are made the optimizer's own (a mapped tensor the
    optimizer would keep as is, on the CPU, is cloned; bitsandbytes state goes straight into the
    optimizer's state buffers, paged where the optimizer pages), and the mapped pages it was read
    from are handed back to the kernel before the next parameter. Host memory: the state once plus
    one parameter's worth. ``state_dict`` itself is not modified.

    Raises:
        ValueError: from the optimizer, if the parameter groups do not match.
    """
    mapped = FileMappings() if mapped is None else mapped
    saved = state_dict["state"]
    groups = state_dict["param_groups"]
    ids = [pid for group in groups for pid in group["params"]]
    params = [p for group in optimizer.param_groups for p in group["params"]]
    bnb = _is_bitsandbytes(optimizer)
    kwargs = {"move_to_device": False} if bnb else {}  # placed by _place_bitsandbytes_state instead
    if not saved or len(ids) != len(params):
        optimizer.load_state_dict({"state": dict(saved), "param_groups": groups}, **kwargs)  # it checks the groups
        if bnb:
            for param in params:
                _place_bitsandbytes_state(optimizer, param)
        return
    loaded = {}
    for pid, param in zip(ids, params):
        if pid not in saved:
            continue
        one = saved[pid]
        optimizer.load_state_dict({"state": {pid: one}, "param_groups": groups}, **kwargs)
        state = optimizer.state[param]
        if bnb:
            _place_bitsandbytes_state(optimizer, param)
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and mapped.holds(value):
                state[key] = value.clone()  # never train in the file's pages (copy-on-write, or gone if pruned)
        loaded[param] = state
        mapped.release(one)
    optimizer.state = defaultdict(dict, loaded)


def _is_bitsandbytes(optimizer: Optimizer) -> bool:
    return type(optimizer).__module__.startswith("bitsandbytes.") and hasattr(optimizer, "get_state_buffer")


def _place_bitsandbytes_state(optimizer: Optimizer, param: torch.Tensor) -> None:
    """Put one parameter's restored bitsandbytes state where a fresh run allocates it.

    Loaded with ``move_to_device=False``, the state tensors are still on the host. ``state1`` /
    ``state2`` (the parameter's shape) are copied into buffers from the optimizer's own
    ``get_state_buffer``: managed (paged) memory for a paged optimizer on CUDA, so resuming moves
    nothing onto the GPU that a fresh run keeps paged. Quantization maps and scales go to the
    parameter's device, as ``load_state_dict(move_to_device=True)`` would put them.
    """
    state = optimizer.state.get(param, {})
    for key, value in list(state.items()):
        if not isinstance(value, torch.Tensor) or key not in getattr(optimizer, "non_castable_tensor_keys", ()):
            continue
        if key in ("state1", "state2") and value.shape == param.shape and not getattr(value, "is_paged", False):
            buffer = optimizer.get_state_buffer(param, dtype=value.dtype)
            buffer.copy_(value)
            state[key] = buffer
        elif value.device != param.device:
            state[key] = value.to(param.device)


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

    ``release`` gives the pages of tensors read from such a mapping back to the kernel
    (``madvise(MADV_DONTNEED)``): they were only read, so a later access reads the file again, and
    the resident memory of a resume stays at what the optimizer holds.
    """

    _MADV_DONTNEED = 4

    def __init__(self) -> None:
        self._ranges: list[tuple[int, int]] = []
        try:
            with open("/proc/self/maps") as f:
                lines = f.read().splitlines()
        except OSError:
            return
        for line in lines:
            fields = line.split(None, 5)
            # address perms offset dev inode path; private ("p") mappings of a file only
            if len(fields) == 6 and fields[1].endswith("p") and fields[5].startswith("/"):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                self._ranges.append((start, end))

    def _span(self, t: torch.Tensor) -> Optional[tuple[int, int]]:
        if not self._ranges or t.device.type != "cpu" or type(t) not in (torch.Tensor, torch.nn.Parameter):
            return None  # fake tensors, device tensors and tensor subclasses have no host pages to give back
        try:
            start = t.data_ptr()
        except (RuntimeError, NotImplementedError):
            return None
        end = start + t.numel() * t.element_size()
        return (start, end) if any(lo <= start and end <= hi for lo, hi in self._ranges) else None

    def holds(self, t: torch.Tensor) -> bool:
        """True if ``t``'s data lies in a file mapping."""
        return self._span(t) is not None

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

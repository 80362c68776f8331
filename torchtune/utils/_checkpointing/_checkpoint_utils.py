"""Optimizer-in-backward state handling.

With optimizer in backward there is one optimizer per parameter, stepped from that parameter's
post-accumulate-grad hook. ``OptimInBackwardWrapper`` gives the recipe a single object to
checkpoint, restore and schedule: states are keyed by parameter *name*, so a checkpoint does not
depend on parameter order, and an LR scheduler drives every inner optimizer.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, Mapping, Optional

import torch
from torch.optim import Optimizer

from torchtune._errors import TuneError

# A standard ``torch.optim`` state dict has exactly these two keys; a per-name one never does
# (parameter names always contain a dot or are model attribute names).
_STANDARD_KEYS = frozenset({"state", "param_groups"})


def is_standard_optimizer_state(state_dict: Mapping[str, Any]) -> bool:
    """True if ``state_dict`` came from one ``torch.optim.Optimizer`` over all parameters."""
    return set(state_dict.keys()) == _STANDARD_KEYS


class _ParamGroupsView(Optimizer):
    """An ``Optimizer`` whose ``param_groups`` *are* the inner optimizers' groups.

    Torch LR schedulers only accept an ``Optimizer`` and write ``group["lr"]`` into each of its
    groups. Sharing the group dicts (not copies) means a scheduler step sets the LR on every
    per-parameter optimizer directly, so the LR that is logged is the LR that is applied.
    """

    def __init__(self, optimizers: Iterable[Optimizer]) -> None:
        # Optimizer.__init__ would copy the groups into new dicts; we want the same dicts.
        self._optimizers = list(optimizers)
        self.defaults: Dict[str, Any] = {}
        self.state: Dict[Any, Any] = {}
        self._optimizer_step_pre_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_step_post_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_state_dict_pre_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_state_dict_post_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_load_state_dict_pre_hooks: Dict[int, Callable] = OrderedDict()
        self._optimizer_load_state_dict_post_hooks: Dict[int, Callable] = OrderedDict()

    @property
    def param_groups(self) -> list:  # type: ignore[override]
        # Looked up on every access: ``load_state_dict`` gives each inner optimizer new group
        # dicts, and a list captured earlier would keep scheduling the discarded ones.
        return [group for opt in self._optimizers for group in opt.param_groups]

    def step(self, closure: Optional[Callable] = None) -> None:  # noqa: D401
        """The real steps happen in the backward hooks; this exists for the scheduler's bookkeeping."""
        return None

    def zero_grad(self, set_to_none: bool = True) -> None:
        return None


class OptimInBackwardWrapper:
    """Holds ``{parameter name: optimizer}`` for a model trained with optimizer in backward.

    Args:
        optim_map: one optimizer per trainable parameter, keyed by the parameter's name in
            ``model.named_parameters()``.
    """

    def __init__(self, optim_map: Mapping[str, Optimizer]) -> None:
        if not optim_map:
            raise ValueError("OptimInBackwardWrapper needs at least one parameter's optimizer")
        self.optim_map: Dict[str, Optimizer] = dict(optim_map)
        self.lr_scheduler: Optional[torch.optim.lr_scheduler.LRScheduler] = None
        self._view = _ParamGroupsView(self.optim_map.values())

    # ---- checkpointing -------------------------------------------------------------------
    def state_dict(self) -> Dict[str, Dict[str, Any]]:
        """Per-parameter optimizer states keyed by parameter name."""
        return {name: opt.state_dict() for name, opt in self.optim_map.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
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
        for name, opt in self.optim_map.items():
            opt.load_state_dict(state_dict[name])
            keep_optimizer_state_paged(opt)

    # ---- learning rate ---------------------------------------------------------------------
    def get_optim_key(self, key: str) -> Any:
        """A hyper-parameter (e.g. ``"lr"``) as the inner optimizers currently apply it."""
        return self._view.param_groups[0][key]

    @property
    def param_groups(self) -> list:
        """Every inner optimizer's param groups (the same dicts, so writes apply)."""
        return self._view.param_groups

    @property
    def scheduler_optimizer(self) -> Optimizer:
        """Pass this to a ``torch.optim.lr_scheduler`` to schedule every inner optimizer."""
        return self._view

    def set_lr_scheduler(self, lr_scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        """Attach a scheduler built on :attr:`scheduler_optimizer`."""
        if lr_scheduler.optimizer is not self._view:
            raise ValueError("build the scheduler on OptimInBackwardWrapper.scheduler_optimizer")
        self.lr_scheduler = lr_scheduler

    def step_lr_scheduler(self) -> None:
        """Advance the attached scheduler; the new LR lands in every inner optimizer."""
        if self.lr_scheduler is not None:
            # The view's no-op step tells the scheduler an optimizer step happened (the real ones
            # ran inside backward), which keeps torch from warning about the call order.
            self._view.step()
            self.lr_scheduler.step()


def keep_optimizer_state_paged(optimizer: Optimizer) -> None:
    """Move restored state of a paged bitsandbytes optimizer back into paged buffers.

    ``load_state_dict`` leaves loaded state as ordinary tensors, which bitsandbytes then copies
    onto the GPU at the first step: a resumed paged run would hold its whole optimizer state in
    GPU memory. Re-allocating through the optimizer's own ``get_state_buffer`` keeps it in
    managed (paged) memory, exactly as a fresh run allocates it.
    """
    if not getattr(optimizer, "is_paged", False) or not hasattr(optimizer, "get_state_buffer"):
        return
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            for key in ("state1", "state2"):
                value = state.get(key)
                if not isinstance(value, torch.Tensor) or getattr(value, "is_paged", False):
                    continue
                if value.shape != param.shape:
                    continue
                buffer = optimizer.get_state_buffer(param, dtype=value.dtype)
                buffer.copy_(value)
                state[key] = buffer


def _names(names: list, limit: int = 8) -> str:
    if not names:
        return "none"
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")

"""Optimizer-in-backward state handling.

With optimizer in backward there is one optimizer per parameter, stepped from that parameter's
post-accumulate-grad hook (``torchtune.training.register_optim_in_bwd_hooks``).
``OptimInBackwardWrapper`` gives a recipe the one optimizer object it would hold in standard mode:
LR schedulers drive its ``param_groups`` (the inner optimizers' own group dicts), and its state dict
is keyed by parameter *name*, so a checkpoint does not depend on parameter order.
"""

from __future__ import annotations

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
        for name, opt in self.optim_map.items():
            opt.load_state_dict(state_dict[name])
            keep_optimizer_state_paged(opt)
        self.follow_inner_param_groups()

    def follow_inner_param_groups(self) -> None:
        """Point ``param_groups`` at the inner optimizers' group dicts again, in the same list object.

        Loading state into an inner optimizer (here, or through ``torch.distributed.checkpoint``'s
        ``set_state_dict``) gives it new group dicts; an LR scheduler reads ``optimizer.param_groups``
        at every step, so it must see those.
        """
        self.param_groups[:] = self._inner_groups()


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

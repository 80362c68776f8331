"""``step_parameter``: one parameter's optimizer step, dispatched to the path its optimizer family takes.

The paths themselves live beside what they need: stochastic rounding's swaps and slices in
``_stochastic_rounding``, the one-pass bitsandbytes kernel in ``_fused_step`` (which builds on the rounding
stream), the sync-free bitsandbytes step in ``_bnb_step``. Keeping the dispatcher in its own module lets
``_fused_step`` import the rounding primitives without a cycle back through the dispatcher.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch.optim import Optimizer

from torchtune._errors import ConfigError
from torchtune.training.distributed._dtensor import is_dtensor, local_shard
from torchtune.training.optim import _stochastic_rounding as _sr  # by attribute: a patch there applies here
from torchtune.training.optim._bnb_step import step_without_sync, supports_step_without_sync
from torchtune.training.optim._fused_step import bnb_adam_step
from torchtune.training.optim._stochastic_rounding import KEY, StochasticRounding, WeightChangeTracker

__all__ = ["step_parameter"]


def _own_step(optimizer: Optimizer) -> None:
    optimizer.step()


def step_parameter(
    optimizer: Optimizer,
    param: torch.nn.Parameter,
    *,
    rounding: Optional[StochasticRounding] = None,
    changes: Optional[WeightChangeTracker] = None,
    in_backward: bool = False,
    grad_norm: Any = None,
) -> None:
    """``optimizer.step()`` for ``param``, the one parameter with a gradient, then free that gradient.

    Rounded stochastically when ``rounding`` is given and the parameter is bf16; counted in ``changes``
    when that is armed (a copy of the weight is made for it only where the rounding does not count).
    ``in_backward``: called from a gradient hook, where a bitsandbytes optimizer is stepped without its
    device synchronisations (``_bnb_step``), so backward keeps running ahead of the GPU. ``grad_norm`` (a
    ``GradNormTracker``): the gradient is added to it first; a fused bitsandbytes step adds it from its
    own kernel, which reads the gradient anyway.
    """
    counting = changes is not None and changes.armed
    if getattr(optimizer, "takes_parameter_names", False):  # CPUAdamW, CPUSGD: they round bf16 themselves
        optimizer.step(count_changes=counting)
        param.grad = None
        if counting:
            changes.add(optimizer.changed, local_shard(param.data).numel())
        return
    sr = rounding is not None and param.dtype == torch.bfloat16
    elementwise = type(optimizer) in _sr._ELEMENTWISE or getattr(optimizer, "elementwise_step", False)
    local = local_shard(param.data)
    if sr and local.numel() == 0:
        sr = False  # this rank's shard is empty (a dimension smaller than the rank count): nothing to round
    if sr and _sr._family(optimizer) == "bitsandbytes":
        if bnb_adam_step(optimizer, param, rounding, changes if counting else None, grad_norm):
            return
    if grad_norm is not None:
        grad_norm.add(param.grad)
    if sr and getattr(optimizer, "steps_fused", False):
        # the memory estimator's stand-in of a fused bitsandbytes step: in place, as the kernel is
        optimizer.step()
        param.grad = None
        return
    if sr and _sr._step_adam_fused(optimizer, param, rounding, changes if counting else None):
        return
    if sr and elementwise and local.is_contiguous():
        _sr._step_in_fp32_slices(optimizer, param, rounding, changes)
        return
    if sr and is_dtensor(param) and _sr._family(optimizer) != "torchao":
        raise ConfigError(
            f"{KEY}=True steps a sharded (FSDP2) parameter slice by slice, which needs an optimizer whose update "
            f"of an element reads only that element (torch.optim.AdamW, Adam or SGD) or a torchao optimizer "
            f"(stepped on each rank's local shard); {type(optimizer).__module__}.{type(optimizer).__name__} is "
            f"neither. Use one of those, or set {KEY}=False."
        )
    step = step_without_sync if in_backward and supports_step_without_sync(optimizer) else _own_step
    if sr and _sr._family(optimizer) == "torchao":
        _sr._step_torchao_in_fp32(optimizer, param, rounding, changes)
        return
    if sr:
        with _sr._stepped_in_fp32(optimizer, param, rounding) as w32:
            step(optimizer)
        rounding.round_(param.data, w32, changes)
        return  # the swap freed the gradient
    before = param.detach().clone() if counting else None
    step(optimizer)
    param.grad = None
    if before is not None:
        changes.add(torch.count_nonzero(param.detach() != before), param.numel())

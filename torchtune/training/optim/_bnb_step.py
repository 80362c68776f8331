"""A bitsandbytes optimizer step without its per-parameter device synchronisations.

bitsandbytes (0.43 to 0.50 at least) ends every parameter's update in ``Optimizer8bit.step`` with
``sync_gpu(p)`` (``torch.cuda.synchronize()``), and a paged optimizer synchronises once more at the end
of ``step()``. With optimizer in backward each parameter has its own optimizer, stepped inside
``backward()``: for Llama2-7B that is 291 parameters, so 582 full device synchronisations per training
step, each one stopping the host until the GPU has drained everything queued, so the host cannot run
ahead and the GPU idles while the next kernels are launched.

Nothing in a step needs them: the update kernels and the paged-state prefetches
(``cudaMemPrefetchAsync``) are queued on the current stream in order, and managed memory is coherent
for the device. The host reads optimizer state only when a checkpoint is saved, and that copy to the
host is itself ordered after the queued kernels. So ``step_without_sync`` runs the same calls as
bitsandbytes' ``step()`` (lazy set-up, state init, prefetch, update) minus the synchronisations; an
optimizer that lacks these methods (another bitsandbytes version) is stepped by its own ``step()``.
"""

from __future__ import annotations

import torch
from torch.optim import Optimizer

__all__ = ["step_without_sync", "supports_step_without_sync"]

_METHODS = ("check_overrides", "to_gpu", "init_state", "prefetch_state", "update_step")


def supports_step_without_sync(optimizer: Optimizer) -> bool:
    """A bitsandbytes ``Optimizer8bit`` with the methods its ``step()`` is made of."""
    return type(optimizer).__module__.startswith("bitsandbytes.") and all(
        callable(getattr(optimizer, name, None)) for name in _METHODS
    )


@torch.no_grad()
def step_without_sync(optimizer: Optimizer) -> None:
    """``optimizer.step()`` of a bitsandbytes optimizer, without ``torch.cuda.synchronize()`` calls."""
    if not supports_step_without_sync(optimizer):
        optimizer.step()
        return
    if not optimizer.initialized:
        optimizer.check_overrides()
        optimizer.to_gpu()
        optimizer.initialized = True
    for gindex, group in enumerate(optimizer.param_groups):
        for pindex, p in enumerate(group["params"]):
            if p.grad is None:
                continue
            state = optimizer.state[p]
            if len(state) == 0:
                optimizer.init_state(group, p, gindex, pindex)
            optimizer.prefetch_state(p)
            optimizer.update_step(group, p, gindex, pindex)

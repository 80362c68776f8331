"""The optimizer a recipe holds: one over all parameters, or one per parameter stepped in backward.

Either way the recipe gets a ``torch.optim.Optimizer`` and calls ``step()`` / ``zero_grad()`` on it
after each step; in backward mode that object is an ``OptimInBackwardWrapper`` whose ``step`` has
nothing left to do, because the hooks already stepped every parameter during ``backward()``.

In backward, ``optimizer_in_bwd_group`` says how many parameters one inner optimizer holds:
``param``, one each (each gradient is freed as soon as it is complete); ``layer``, all the
parameters of one decoder layer (``model.layers[i]``), stepped together when the layer's last gradient
arrives (torch's foreach/fused optimizers in one call; with bf16 stochastic rounding one fused kernel per
weight), so at most one layer's gradients exist at a time. With rounding, small parameters (norm scales)
of either grouping are stepped together in one multi-tensor call when backward ends (``_fused_step``).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Union

import torch
from torch import nn
from torch.optim import Optimizer

from torchtune import config
from torchtune._errors import ConfigError, TuneError, TuneValueError
from torchtune.training.distributed._dtensor import is_dtensor
from torchtune.training.optim._cpu_optimizer_worker import CPUOptimizerWorker, WorkerOptimInBackward, grad_bytes
from torchtune.training.optim._fused_step import SmallParamSteps, check_fused_kernels
from torchtune.training.optim._low_rank import StepAfterBackward, build_low_rank_optimizers, is_low_rank
from torchtune.training.optim._parameter_step import step_parameter
from torchtune.training.optim._stochastic_rounding import StochasticRounding, WeightChangeTracker
from torchtune.training.optim._torchao_local_step import needs_local_step, step_on_local_shards
from torchtune.training.setup._checks import IN_BWD_GROUPS
from torchtune.utils._checkpointing._checkpoint_utils import (
    OptimInBackwardWrapper,
    configured_hyperparameters_kept,
    is_standard_optimizer_state,
    load_optimizer_state_dict,
)

__all__ = [
    "GradNormTracker",
    "build_optimizer",
    "create_optim_in_bwd_wrapper",
    "in_bwd_groups",
    "load_optimizer_state",
    "register_optim_in_bwd_hooks",
    "scale_grads",
    "step_optimizer",
]


class GradNormTracker:
    """The global gradient norm of a step, summed on the device, only on steps that are logged.

    ``arm(device)`` before a logged step; the in-backward hooks then ``add`` each gradient before it
    is freed (a fused optimizer kernel that reads the gradient anyway ``add_square``s its squared sum
    instead; ``step_optimizer`` records the total of a standard step); ``pop()`` reads the norm (a host
    sync) and disarms; ``total_square()`` gives the squared norm on the device without a sync, for a
    logged step that reads all its values at once. Unarmed, every call is a no-op, so steps that are not
    logged spend nothing on it. Each ``add`` is one reduction kernel; the norms are kept as 0-dim tensors
    and summed once, so a step of N parameters launches N reductions, not 3N ops.

    Sharded gradients (FSDP2's DTensors) add only this rank's shard; the total then sums the shards'
    squares over the ranks, so every rank must take it (it is a collective there).
    """

    def __init__(self) -> None:
        self._norms: Optional[List[torch.Tensor]] = None  # fp32 norms of whole gradients (or totals)
        self._squares: List[torch.Tensor] = []  # fp32 squared sums of whole gradients
        self._local: List[torch.Tensor] = []  # fp32 norms of this rank's shards: summed over ranks
        self._device: Optional[torch.device] = None

    @property
    def armed(self) -> bool:
        return self._norms is not None

    def arm(self, device: torch.device) -> None:
        self._norms, self._squares, self._local, self._device = [], [], [], torch.device(device)

    def add(self, grad: torch.Tensor) -> None:
        """Add one gradient's norm (taken in fp32); of a sharded gradient, this rank's shard."""
        if self._norms is None:
            return
        if is_dtensor(grad):
            self._local.append(torch.linalg.vector_norm(grad.to_local(), dtype=torch.float32))
        else:
            self._norms.append(torch.linalg.vector_norm(grad, dtype=torch.float32))

    def add_square(self, square: torch.Tensor) -> None:
        """Add the fp32 sum of squares of one whole gradient (or of several: a multi-tensor step's)."""
        if self._norms is not None:
            self._squares.append(square)

    def add_total(self, norm: torch.Tensor) -> None:
        """Add a norm already taken over many gradients, over all ranks (``clip_grad_norm_``'s result)."""
        if self._norms is not None:
            self._norms.append(norm.detach().float())

    def total_square(self) -> torch.Tensor:
        """The squared norm since ``arm`` as a 0-dim fp32 device tensor (with sharded gradients a collective,
        no host sync); disarms. NaN if it was not armed."""
        if self._norms is None:
            return torch.full((), float("nan"), device=self._device)
        total = _sum_of_squares(self._norms, self._device)
        if self._squares:
            total = total + torch.stack([s.float() for s in self._squares]).sum()
        if self._local:
            import torch.distributed as dist

            local = _sum_of_squares(self._local, self._device)
            if dist.is_initialized():
                dist.all_reduce(local)
            total = total + local
        self._norms, self._squares, self._local = None, [], []
        return total

    def pop(self) -> float:
        """The norm since ``arm`` (a host sync; with sharded gradients a collective); disarms. NaN if
        it was not armed."""
        if self._norms is None:
            return float("nan")
        return math.sqrt(max(self.total_square().item(), 0.0))


def _sum_of_squares(norms: List[torch.Tensor], device: Optional[torch.device]) -> torch.Tensor:
    if not norms:
        return torch.zeros((), dtype=torch.float32, device=device)
    # a CPU-offloaded shard's norm lies on the CPU: gathered next to the others before stacking
    return torch.stack([n.to(device, non_blocking=True) for n in norms]).square().sum()


def trainable_parameters(model: nn.Module) -> Dict[str, nn.Parameter]:
    """``{name: parameter}`` of every parameter that trains (shared parameters listed once)."""
    return {name: p for name, p in model.named_parameters() if p.requires_grad}


def in_bwd_groups(model: nn.Module, group: str) -> List[List[str]]:
    """The parameter names each in-backward optimizer holds, in ``named_parameters`` order.

    ``param``: one name per group. ``layer``: one group per ``model.layers[i]`` with every trainable
    parameter of that layer; parameters outside the layers (embedding, final norm, output) one each.

    Raises:
        ConfigError: ``group`` is not one of ``IN_BWD_GROUPS``, or ``layer`` for a model without
            ``.layers``.
    """
    if group not in IN_BWD_GROUPS:
        raise ConfigError(
            f"optimizer_in_bwd_group={group!r} is not a grouping: use 'param' (one optimizer per parameter) or "
            "'layer' (one per decoder layer, stepped when the layer's last gradient arrives)."
        )
    names = list(trainable_parameters(model))
    if group == "param":
        return [[name] for name in names]
    layers = getattr(model, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise ConfigError(
            f"optimizer_in_bwd_group=layer needs a model whose decoder layers are model.layers (an nn.ModuleList); "
            f"{type(model).__name__} has none. Set optimizer_in_bwd_group=param."
        )
    layer_of = {id(p): index for index, layer in enumerate(layers) for p in layer.parameters() if p.requires_grad}
    params = trainable_parameters(model)
    by_layer: Dict[int, List[str]] = {}
    groups: List[List[str]] = []
    for name in names:
        index = layer_of.get(id(params[name]))
        if index is None:
            groups.append([name])
        elif index in by_layer:
            by_layer[index].append(name)
        else:
            by_layer[index] = [name]
            groups.append(by_layer[index])
    return groups


def register_optim_in_bwd_hooks(
    model: nn.Module,
    optim_dict: Mapping[Union[str, nn.Parameter], Optimizer],
    grad_norm: Optional[GradNormTracker] = None,
    *,
    rounding: Optional[StochasticRounding] = None,
    weight_changes: Optional[WeightChangeTracker] = None,
    worker: Optional[CPUOptimizerWorker] = None,
) -> List[Any]:
    """Step each parameter's optimizer as soon as its gradients are complete, then free them.

    Uses ``Tensor.register_post_accumulate_grad_hook``: the hook runs once the gradient of a
    parameter has been fully accumulated in ``backward()`` (also for a parameter used twice, such as
    tied embeddings). Names that share one optimizer (``optimizer_in_bwd_group: layer``) are stepped
    together when the last of their gradients is complete; with one optimizer per parameter, at most
    the gradients of the layer being back-propagated exist at a time. With ``rounding``, bf16 updates
    are rounded stochastically (``step_parameter``). With ``worker`` (CPU-offloaded parameters), the hook
    hands the step to that thread and returns at once (see ``_cpu_optimizer_worker``). Returns the hook
    handles (``handle.remove()`` detaches them).

    ``optim_dict`` is keyed by parameter name, or (torchtune's form) by the parameters themselves.
    """
    params = trainable_parameters(model)
    optim_map = _by_name(model, optim_dict)
    missing = sorted(set(optim_map) - set(params))
    if missing:
        raise ValueError(f"optimizers given for parameters the model does not train: {missing[:5]}")
    members: Dict[int, List[torch.Tensor]] = {}
    for name, opt in optim_map.items():
        members.setdefault(id(opt), []).append(params[name])
    # small bf16 parameters (norm scales) are stepped together at the end of backward (``_fused_step``)
    small = SmallParamSteps(rounding, weight_changes) if rounding is not None and worker is None else None
    return [
        params[name].register_post_accumulate_grad_hook(
            _step_and_free(opt, members[id(opt)], grad_norm, rounding, weight_changes, worker, small)
        )
        for name, opt in optim_map.items()
    ]


def _by_name(model: nn.Module, optim_dict: Mapping[Any, Optimizer]) -> Dict[str, Optimizer]:
    """``optim_dict`` keyed by parameter name; torchtune keys it by the parameters themselves."""
    if all(isinstance(key, str) for key in optim_dict):
        return dict(optim_dict)
    by_id = {id(key): opt for key, opt in optim_dict.items() if isinstance(key, torch.Tensor)}
    named = {name: by_id[id(p)] for name, p in model.named_parameters() if id(p) in by_id}
    if len(named) != len(optim_dict):
        raise TuneValueError(
            f"optim_dict has {len(optim_dict)} entries, {len(named)} of them parameters of the model: key it by "
            "the model's parameters (or their names in model.named_parameters())."
        )
    return named


def create_optim_in_bwd_wrapper(
    model: nn.Module, optim_dict: Mapping[Union[str, nn.Parameter], Optimizer]
) -> OptimInBackwardWrapper:
    """torchtune's way to hold the optimizers of :func:`register_optim_in_bwd_hooks`: an
    ``OptimInBackwardWrapper`` (torchtune's ``OptimizerInBackwardWrapper``) keyed by parameter name."""
    return OptimInBackwardWrapper(_by_name(model, optim_dict))


def _step_and_free(
    optimizer: Optimizer,
    group: List[torch.Tensor],
    grad_norm: Optional[GradNormTracker],
    rounding: Optional[StochasticRounding] = None,
    weight_changes: Optional[WeightChangeTracker] = None,
    worker: Optional[CPUOptimizerWorker] = None,
    small: Optional[SmallParamSteps] = None,
) -> Callable[[torch.Tensor], None]:
    if len(group) == 1:

        def step(param: torch.Tensor) -> None:
            if small is not None and small.defer(optimizer, param, grad_norm):
                return  # stepped with the other small parameters when backward ends
            # The optimizer holds only this parameter: step_parameter dropping its grad is all zero_grad
            # would do, without zero_grad's ~25 us of Python per parameter per step. It adds the gradient
            # to grad_norm (when armed) first, or from its fused kernel.
            step_parameter(
                optimizer, param, rounding=rounding, changes=weight_changes, in_backward=True, grad_norm=grad_norm
            )

        if worker is None:
            return step

        def hook(param: torch.Tensor) -> None:
            worker.submit(lambda: step(param), grad_bytes([param]))

        return hook

    del group  # read from the optimizer at each call: a list held here would tie the parameters to their own
    # hooks, a cycle through autograd's C++ hook table that the garbage collector cannot see (the memory
    # estimator's resume phase found the previous model's layers alive); clearing the optimizer's
    # param_groups breaks it instead

    def step_group(group: List[torch.Tensor]) -> None:
        if rounding is None and not (weight_changes is not None and weight_changes.armed):
            optimizer.step()
            for p in group:
                p.grad = None
        else:  # rounded (or counted) one parameter at a time: one fused kernel each, small ones deferred
            step_each_parameter(
                optimizer, group, rounding=rounding, changes=weight_changes, in_backward=True, small=small
            )

    def group_hook(param: torch.Tensor) -> None:
        group = [p for g in optimizer.param_groups for p in g["params"]]
        # Stateless on purpose: the group is complete when every member holds a gradient (a member
        # that gets none this step leaves the group to OptimInBackwardWrapper.step(), which steps
        # what is left after backward), so no counter can drift from one step to the next. Decided
        # here, in backward's thread, even with a worker: a member whose gradient is still being
        # accumulated (a tied weight) must not be stepped early.
        complete = all(p.grad is not None for p in group)
        if worker is None:
            if grad_norm is not None:
                grad_norm.add(param.grad)
            if complete:
                step_group(group)
            return

        def job() -> None:
            if grad_norm is not None:
                grad_norm.add(param.grad)
            if complete:
                step_group(group)

        worker.submit(job, grad_bytes(group if complete else []))

    return group_hook


def build_optimizer(
    cfg_optimizer: Any,
    model: nn.Module,
    *,
    optimizer_in_bwd: bool,
    grad_norm: Optional[GradNormTracker] = None,
    in_bwd_group: str = "param",
    rounding: Optional[StochasticRounding] = None,
    weight_changes: Optional[WeightChangeTracker] = None,
    cpu_worker: bool = False,
    host_step: bool = False,
) -> Optimizer:
    """The optimizer of ``cfg_optimizer`` over ``model``'s trainable parameters.

    ``optimizer_in_bwd=False``: one optimizer over all of them. ``True``: one optimizer per group of
    ``in_bwd_groups(model, in_bwd_group)`` (per parameter, or per decoder layer), stepped from the
    post-accumulate-grad hooks (which also add the gradients to ``grad_norm`` when it is armed),
    held in an ``OptimInBackwardWrapper`` keyed by parameter name either way, so a checkpoint of one
    grouping resumes with the other. The hooks add the changed weights to ``weight_changes`` when it
    is armed. ``rounding``: bf16 updates are rounded stochastically (pass it to ``step_optimizer`` too
    in standard mode); torchao optimizers are built without their own ``bf16_stochastic_round`` (the run's
    stream rounds them).

    ``cpu_worker`` (the distributed recipe's ``fsdp_cpu_offload``; in backward only): the hooks hand
    each step to a ``CPUOptimizerWorker`` thread, so the CPU steps of the host-resident shards overlap
    the rest of backward; the returned ``WorkerOptimInBackward`` waits for it in ``step()``.

    ``host_step`` (the single-device recipe's ``optimizer_on_cpu``; in backward, one optimizer per parameter):
    the optimizers step host copies of the weights on a ``CPUOptimizerWorker``, each gradient copied to the
    host as backward produces it and each updated weight copied back (``training.optim._host_optimizer``); the
    returned ``HostStepOptimInBackward`` waits for both in ``step()``.

    A low-rank optimizer (``apollo_torch``/``galore_torch``, see ``training.optim._low_rank``) is built per
    parameter in both modes, with ``optimizer.rest`` for the parameters outside
    ``optimizer.target_modules``; standard mode returns a ``StepAfterBackward`` that steps them after
    backward.
    """
    params = trainable_parameters(model)
    if host_step:
        return _build_host_step(
            cfg_optimizer, model, optimizer_in_bwd, in_bwd_group, grad_norm, rounding, weight_changes
        )
    worker = CPUOptimizerWorker() if cpu_worker and optimizer_in_bwd else None
    hooks = dict(rounding=rounding, weight_changes=weight_changes, worker=worker)
    if is_low_rank(cfg_optimizer):
        # one low-rank optimizer per group's target matrices, one of optimizer.rest per group's others
        groups = in_bwd_groups(model, in_bwd_group) if optimizer_in_bwd else [[name] for name in params]
        rest = str(cfg_optimizer.rest.get(config.COMPONENT_KEY, "")) if cfg_optimizer.get("rest") is not None else ""
        rest_kwargs = rounding.optimizer_kwargs(rest) if rounding is not None else {}
        optim_map = build_low_rank_optimizers(cfg_optimizer, model, groups, rest_kwargs=rest_kwargs)
        if not optimizer_in_bwd:
            return StepAfterBackward(optim_map)
        register_optim_in_bwd_hooks(model, optim_map, grad_norm, **hooks)
        return _in_bwd_wrapper(optim_map, worker)
    component = str(cfg_optimizer.get(config.COMPONENT_KEY, ""))
    extra = rounding.optimizer_kwargs(component) if rounding is not None else {}
    if rounding is not None:
        check_fused_kernels(rounding.device, component)  # a kernel that cannot be built stops the run here
    if not optimizer_in_bwd:
        return _instantiate(cfg_optimizer, params, **extra)
    optim_map: Dict[str, Optimizer] = {}
    for names in in_bwd_groups(model, in_bwd_group):
        opt = _instantiate(cfg_optimizer, {name: params[name] for name in names}, **extra)
        optim_map.update({name: opt for name in names})
    register_optim_in_bwd_hooks(model, optim_map, grad_norm, **hooks)
    if rounding is None and weight_changes is None:
        return _in_bwd_wrapper(optim_map, worker)

    def step_group(optimizer: Optimizer, group: List[torch.Tensor]) -> None:
        # what backward left of a layer's group: rounded and counted as the hooks' own steps
        step_each_parameter(optimizer, group, rounding=rounding, changes=weight_changes)

    return _in_bwd_wrapper(optim_map, worker, step_group)


def _build_host_step(
    cfg_optimizer: Any,
    model: nn.Module,
    optimizer_in_bwd: bool,
    in_bwd_group: str,
    grad_norm: Optional[GradNormTracker],
    rounding: Optional[StochasticRounding],
    weight_changes: Optional[WeightChangeTracker],
) -> Optimizer:
    from torchtune.training.optim._host_optimizer import host_parameters, register_host_step_hooks

    if not optimizer_in_bwd or in_bwd_group != "param" or is_low_rank(cfg_optimizer):
        raise ConfigError(
            "optimizer_on_cpu=True steps each parameter on the host as soon as its gradient is there: it needs "
            "optimizer_in_bwd=True, optimizer_in_bwd_group=param and an optimizer that is not low-rank (got "
            f"optimizer_in_bwd={optimizer_in_bwd}, optimizer_in_bwd_group={in_bwd_group}). Set those, or "
            "optimizer_on_cpu=False."
        )
    params = trainable_parameters(model)
    cuda = next(iter(params.values())).device.type == "cuda"
    host = host_parameters(model, list(params), pin=cuda)
    extra = rounding.optimizer_kwargs(str(cfg_optimizer.get(config.COMPONENT_KEY, ""))) if rounding is not None else {}
    optim_map = {name: _instantiate(cfg_optimizer, {name: host[name]}, **extra) for name in params}

    def step(optimizer: Optimizer, param: torch.Tensor) -> None:
        step_parameter(optimizer, param, rounding=rounding, changes=weight_changes, in_backward=True)

    return register_host_step_hooks(model, host, optim_map, step=step, grad_norm=grad_norm)


def _instantiate(cfg_optimizer: Any, params: Mapping[str, torch.Tensor], **extra: Any) -> Optimizer:
    component = config.import_component(str(cfg_optimizer.get(config.COMPONENT_KEY, "")), "optimizer._component_")
    # CPUAdamW/CPUSGD key their rounding stream by parameter name: torch.optim's (name, parameter) pairs
    given = list(params.items()) if getattr(component, "takes_parameter_names", False) else list(params.values())
    optimizer = config.instantiate(cfg_optimizer, given, **extra)
    if needs_local_step(optimizer):  # torchao on FSDP2's shards: stepped on the local tensors
        step_on_local_shards(optimizer)
    return optimizer


def _in_bwd_wrapper(
    optim_map: Mapping[str, Optimizer],
    worker: Optional[CPUOptimizerWorker],
    step_group: Optional[Callable[[Optimizer, List[torch.Tensor]], None]] = None,
) -> OptimInBackwardWrapper:
    if worker is None:
        return OptimInBackwardWrapper(optim_map, step_group=step_group)
    return WorkerOptimInBackward(optim_map, worker, step_group=step_group)


def load_optimizer_state(optimizer: Optimizer, state_dict: Mapping[str, Any]) -> None:
    """Restore a saved optimizer state, refusing one written in the other optimizer mode. The hyper-parameters
    this run's config gives (``optimizer.lr`` ...) are kept, a change logged (``configured_hyperparameters_kept``).

    One parameter at a time (``load_optimizer_state_dict``): with the state memory-mapped from
    ``recipe_state.pt``, host memory holds the restored state once plus one parameter's worth, and
    a paged bitsandbytes optimizer gets its state copied straight into its paged buffers.

    Raises:
        TuneError: the state was written with the other ``optimizer_in_bwd`` setting, or (in
            backward) for other parameter names.
    """
    if isinstance(optimizer, OptimInBackwardWrapper):
        with configured_hyperparameters_kept(optimizer):
            optimizer.load_state_dict(state_dict)  # checks the mode and the names itself
        return
    if not is_standard_optimizer_state(state_dict):
        raise TuneError(
            "The optimizer state in the recipe checkpoint was written by a run with "
            "optimizer_in_bwd=True (one optimizer per parameter), but this run has "
            "optimizer_in_bwd=False. Resume with optimizer_in_bwd=True, or start a new "
            "run without resume_from_checkpoint."
        )
    with configured_hyperparameters_kept(optimizer):
        load_optimizer_state_dict(optimizer, state_dict)


def step_optimizer(
    optimizer: Optimizer,
    params: Iterable[torch.Tensor],
    *,
    clip_grad_norm: Optional[float] = None,
    grad_norm: Optional[GradNormTracker] = None,
    rounding: Optional[StochasticRounding] = None,
    weight_changes: Optional[WeightChangeTracker] = None,
) -> None:
    """Finish an optimizer step: clip, record the gradient norm, ``step()``, ``zero_grad()``.

    In standard mode this is the step; with FSDP2's sharded gradients the norm (to clip with and to
    log) is that of the whole gradient over all ranks. With optimizer in backward the gradients were consumed and
    freed in backward: no gradient is left here, and ``step``/``zero_grad`` are no-ops.

    With ``rounding``, or ``weight_changes`` armed, a standard optimizer is stepped one parameter at a
    time (``step_each_parameter``).
    """
    if isinstance(optimizer, WorkerOptimInBackward):
        optimizer.wait()  # the CPU steps still running from backward; it also frees their gradients
    with_grad = [p for p in params if p.grad is not None]
    if with_grad and (clip_grad_norm is not None or (grad_norm is not None and grad_norm.armed)):
        norm = torch.nn.utils.get_total_norm([p.grad for p in with_grad])
        if is_dtensor(norm):
            # sharded gradients: the norm of each rank's shards is a partial result; full_tensor sums
            # the squares over the ranks, so every rank clips with the global norm
            norm = norm.full_tensor()
        if clip_grad_norm is not None:
            torch.nn.utils.clip_grads_with_norm_(with_grad, max_norm=clip_grad_norm, total_norm=norm)
        if grad_norm is not None:
            grad_norm.add_total(norm)
    if with_grad and isinstance(optimizer, StepAfterBackward):
        # per-parameter optimizers (low-rank): each parameter stepped by its own, rounded if asked
        for p in with_grad:
            step_parameter(optimizer.optimizer_of(p), p, rounding=rounding, changes=weight_changes)
        optimizer._opt_called = True  # type: ignore[attr-defined]
    elif with_grad and (rounding is not None or (weight_changes is not None and weight_changes.armed)):
        step_each_parameter(optimizer, with_grad, rounding=rounding, changes=weight_changes)
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def step_each_parameter(
    optimizer: Optimizer,
    params: List[torch.Tensor],
    *,
    rounding: Optional[StochasticRounding] = None,
    changes: Optional[WeightChangeTracker] = None,
    in_backward: bool = False,
    small: Optional[SmallParamSteps] = None,
) -> None:
    """One optimizer step of several parameters, taken one parameter at a time (``step_parameter``): the
    others' gradients are set aside, so only one parameter's fp32 copy (or weight copy) exists at once.
    Each parameter's update depends only on that parameter, so the result is that of one step. ``small``:
    inside backward, small parameters are left to its multi-tensor step at the end of backward."""
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None  # optimizers skip parameters without a gradient
    for i, p in enumerate(params):
        p.grad, grads[i] = grads[i], None  # each gradient goes with its step
        if small is not None and small.defer(optimizer, p):
            continue
        step_parameter(optimizer, p, rounding=rounding, changes=changes, in_backward=in_backward)
    # A bitsandbytes update may have run through its update_step, not step(): tell LR schedulers
    # (torch's flag for "optimizer.step() was called") that the step happened.
    optimizer._opt_called = True  # type: ignore[attr-defined]


def scale_grads(model: nn.Module, scaler: torch.Tensor) -> None:
    """Multiply every gradient of ``model`` by ``scaler`` in place (moved to the parameters' device once), e.g.
    to normalise accumulated gradients by the number of tokens they were summed over."""
    scaler = scaler.to(next(model.parameters()).device) if isinstance(scaler, torch.Tensor) else scaler
    for p in model.parameters():
        if p.grad is not None:
            p.grad *= scaler

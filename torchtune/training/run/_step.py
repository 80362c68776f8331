"""One forward and backward pass of a training step: the part every recipe, benchmark and estimate shares."""

from __future__ import annotations

import contextlib
from typing import Any, ContextManager, Dict, Optional

import torch
import torch.nn.functional as F
from torch import nn

from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX

__all__ = ["TrainStep", "forward_backward", "forward_loss", "label_positions", "num_label_tokens", "shift_labels"]


def shift_labels(labels: torch.Tensor) -> torch.Tensor:
    """``labels[:, t]`` becomes the target of position ``t`` (the next token); the last position has none."""
    return F.pad(labels[:, 1:], (0, 1), value=CROSS_ENTROPY_IGNORE_IDX)


def num_label_tokens(batch: Dict[str, torch.Tensor]) -> int:
    """The tokens the loss of ``batch`` averages over (shifted labels that are not ignored), counted on
    the host before the batch moves: no device sync. Gradient accumulation weights micro-batches by it."""
    return int(shift_labels(batch["labels"]).ne(CROSS_ENTROPY_IGNORE_IDX).sum())


def label_positions(labels: torch.Tensor, ignore_index: int = CROSS_ENTROPY_IGNORE_IDX) -> Optional[torch.Tensor]:
    """Flat indices (row-major over ``labels``) of the positions whose label is not ``ignore_index``,
    or ``None`` when every position has one (nothing to leave out).

    Meant for the host copy of the (shifted) labels, before the batch moves to the device: there the
    count is known for free, so the gather that uses these indices needs no device-to-host read.
    """
    flat = labels.reshape(-1)
    positions = flat.ne(ignore_index).nonzero().squeeze(1)
    return None if positions.numel() == flat.numel() else positions


def forward_loss(
    model: nn.Module,
    loss_fn: nn.Module,
    batch: Dict[str, torch.Tensor],
    *,
    device: torch.device,
    select_label_positions: bool = True,
) -> torch.Tensor:
    """The loss of one batch (forward only; the graph stays attached for ``backward()``).

    ``loss_fn(model.output, hidden, labels)`` takes the final hidden states rather than logits, so a
    chunked loss never holds the full fp32 logits. With ``select_label_positions`` (the default) only
    the positions that have a label reach the final norm, the output projection and the loss: with
    ``train_on_input: False``, padding or packing the prompt tokens cost nothing there. The loss and
    the gradients are those of the full computation (the left-out positions contribute exactly zero
    to both), up to float summation order. The positions are found on the host copy of the labels,
    so nothing is read back from the device. A packed batch on a GPU attends through FlexAttention with its
    segments' block mask (``torchtune.modules.attention_flex``) instead of its dense mask.
    """
    from torchtune.modules.attention_flex import block_causal_block_mask, document_ids, uses_flex_attention

    # what is derived on the host from a batch the loader pinned (on CUDA) is pinned too, so every copy
    # below is queued on the stream without waiting for it (a pageable one would)
    pinned = batch["tokens"].is_pinned()

    def to_device(t: torch.Tensor) -> torch.Tensor:
        if pinned and not t.is_pinned():
            t = t.pin_memory()
        return t.to(device, non_blocking=True)

    labels = shift_labels(batch["labels"])
    positions = label_positions(labels) if select_label_positions else None
    mask = batch.get("mask")
    input_pos = batch.get("input_pos")
    tokens = to_device(batch["tokens"])
    if mask is not None and input_pos is not None and uses_flex_attention(device, model):
        # a packed batch on a GPU: FlexAttention with the block mask of its segments (no s x s mask moves)
        mask = block_causal_block_mask(to_device(document_ids(input_pos)))
    elif mask is not None:
        mask = to_device(mask)
    if input_pos is not None:
        input_pos = to_device(input_pos)
    if positions is not None:
        labels = labels.reshape(-1)[positions]
        positions = to_device(positions)
    labels = to_device(labels)
    hidden = model(tokens, mask=mask, input_pos=input_pos, output_hidden_states=True, output_positions=positions)
    return loss_fn(model.output, hidden, labels)


def forward_backward(
    model: nn.Module,
    loss_fn: nn.Module,
    batch: Dict[str, torch.Tensor],
    *,
    device: torch.device,
    activations_ctx: Optional[ContextManager[Any]] = None,
    loss_scale: float = 1.0,
    select_label_positions: bool = True,
) -> torch.Tensor:
    """Forward, loss and ``backward()`` of one (micro-)batch; returns the detached, unscaled loss.

    The loss is :func:`forward_loss` (``select_label_positions`` as there). ``loss_scale`` multiplies
    the loss before ``backward()``: the recipes pass the micro-batch's share of the step's label tokens
    (:func:`~torchtune.training.label_token_shares`), so the gradients add up to those of the token mean
    of the whole step. With optimizer in backward the parameters are updated inside ``backward()``.
    ``activations_ctx`` (activation offloading) wraps forward and backward. Nothing here reads a value
    back to the host.
    """
    with activations_ctx if activations_ctx is not None else contextlib.nullcontext():
        loss = forward_loss(model, loss_fn, batch, device=device, select_label_positions=select_label_positions)
        (loss * loss_scale if loss_scale != 1.0 else loss).backward()
    return loss.detach()


class TrainStep:
    """A whole optimizer step (forward, loss, backward, optimizer) built from a recipe config.

    For code that runs steps outside a recipe's loop -- the memory estimator, the benchmarks, the GPU
    memory check -- so that what they measure is the step a recipe runs: the same model set-up,
    in-backward hooks, loss and label shift. ``step(batch)`` returns the detached loss.
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        loss_fn: nn.Module,
        *,
        device: torch.device,
        activations_ctx: Optional[ContextManager[Any]] = None,
        clip_grad_norm: Optional[float] = None,
        select_label_positions: bool = True,
        rounding: Optional[Any] = None,
        grad_norm: Optional[Any] = None,
        weight_changes: Optional[Any] = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.loss_fn = loss_fn
        self.device = device
        self.activations_ctx = activations_ctx
        self.clip_grad_norm = clip_grad_norm
        self.select_label_positions = select_label_positions
        self.rounding = rounding  # the StochasticRounding that build_optimizer was given, if any
        # the GradNormTracker / WeightChangeTracker build_optimizer was given: a standard step feeds them too
        self.grad_norm = grad_norm
        self.weight_changes = weight_changes

    @classmethod
    def from_config(
        cls,
        cfg: Any,
        *,
        device: torch.device,
        dtype: torch.dtype,
        state_dict: Optional[Dict[str, torch.Tensor]] = None,
        compile_model: Optional[bool] = None,
        grad_norm: Optional[Any] = None,
        weight_changes: Optional[Any] = None,
    ) -> "TrainStep":
        """The step of a finetune config (``model``, ``optimizer``, ``optimizer_in_bwd``,
        ``optimizer_in_bwd_group``, ``optimizer_on_cpu``, ``loss``, ``clip_grad_norm``,
        ``bf16_stochastic_rounding`` (seeded from ``seed``, 0 when null), activation checkpointing/offloading,
        ``compile`` and ``liger_kernels`` keys); random weights unless ``state_dict`` is given; ``compile_model``
        overrides the config's ``compile``; a ``GradNormTracker`` as ``grad_norm`` and a ``WeightChangeTracker``
        as ``weight_changes`` are fed by the step (the in-backward hooks, or the standard step) when armed, as in
        the recipe."""
        from torchtune import config
        from torchtune.training.activations import get_act_offloading_ctx_manager
        from torchtune.training.optim._optimizer import build_optimizer
        from torchtune.training.optim._stochastic_rounding import build_stochastic_rounding
        from torchtune.training.setup._model import build_model

        model = build_model(
            cfg.model,
            device=device,
            dtype=dtype,
            state_dict=state_dict,
            enable_activation_checkpointing=bool(cfg.enable_activation_checkpointing),
            compile_model=bool(cfg.compile if compile_model is None else compile_model),
            # the distributed recipe's configs have no such key
            liger_kernels=bool(cfg.get("liger_kernels", False)),
        )
        seed = cfg.seed if cfg.seed is not None else 0
        # the distributed recipe's configs have no such key: that recipe does not round
        enabled = bool(cfg.get("bf16_stochastic_rounding", False))
        rounding = build_stochastic_rounding(enabled, dtype=dtype, seed=seed, device=device)

        return cls(
            model,
            build_optimizer(
                cfg.optimizer,
                model,
                optimizer_in_bwd=bool(cfg.optimizer_in_bwd),
                in_bwd_group=cfg.optimizer_in_bwd_group,
                grad_norm=grad_norm,
                rounding=rounding,
                weight_changes=weight_changes,
                # the distributed recipe's configs have no such key
                host_step=bool(cfg.get("optimizer_on_cpu", False)),
            ),
            config.instantiate(cfg.loss),
            device=device,
            activations_ctx=get_act_offloading_ctx_manager(model, bool(cfg.enable_activation_offloading)),
            clip_grad_norm=cfg.clip_grad_norm,
            rounding=rounding,
            grad_norm=grad_norm,
            weight_changes=weight_changes,
        )

    def __call__(self, batch: Dict[str, torch.Tensor]) -> torch.Tensor:
        from torchtune.training.optim._optimizer import step_optimizer

        loss = forward_backward(
            self.model,
            self.loss_fn,
            batch,
            device=self.device,
            activations_ctx=self.activations_ctx,
            select_label_positions=self.select_label_positions,
        )
        step_optimizer(
            self.optimizer,
            self.model.parameters(),
            clip_grad_norm=self.clip_grad_norm,
            grad_norm=self.grad_norm,
            rounding=self.rounding,
            weight_changes=self.weight_changes,
        )
        return loss

"""``torch.compile`` of the model (each decoder layer in place) and of the loss, as torchtune does it."""

from __future__ import annotations

import logging
import os

import torch
from torch import nn

log = logging.getLogger("torchtune")

__all__ = ["compile_loss", "compile_model"]


def _backend() -> str:
    return os.environ.get("TORCH_COMPILE_BACKEND", "inductor")


def compile_model(model: nn.Module, verbose: bool = True) -> None:
    """Compile each decoder layer of ``model`` in place (``model.layers``; a fusion model's ``decoder.layers``)
    with the backend of ``TORCH_COMPILE_BACKEND`` (default inductor). Per layer, so compiling is quick and
    parameter names (checkpoints, optimizer state, in-backward hooks) stay the same."""
    decoder = getattr(model, "decoder", model) if not hasattr(model, "layers") else model
    if verbose:
        log.info("Compiling model layers with torch.compile...")
    for layer in decoder.layers:
        layer.compile(backend=_backend())


def compile_loss(loss: nn.Module, verbose: bool = True) -> nn.Module:
    """``loss`` compiled: a chunked loss with torchtune's ``compute_cross_entropy`` gets only that compiled (the
    chunking stays eager), anything else as a whole. Returns the loss to use."""
    if verbose:
        log.info("Compiling loss with torch.compile...")
    if hasattr(loss, "compute_cross_entropy"):
        loss.compute_cross_entropy = torch.compile(loss.compute_cross_entropy, backend=_backend())
        return loss
    return torch.compile(loss, backend=_backend())

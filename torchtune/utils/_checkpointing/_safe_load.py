"""Loading checkpoint files without running pickled code and without copying weights into RAM first."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from torchtune._errors import TuneError


def load_torch_weights(path: Path) -> dict[str, torch.Tensor]:
    """Load a ``.bin`` / ``.pth`` state dict memory-mapped with ``weights_only=True``.

    mmap means a 14 GB checkpoint is paged in as the model takes its tensors instead of being read
    whole into RAM. Files in torch's pre-1.6 (non-zip) format cannot be mapped; they are read normally.
    """
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError as exc:
            if zipfile.is_zipfile(path):
                raise
            del exc  # legacy (non-zip) serialization: mmap is not possible
            return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise TuneError(
            f"{path} holds Python objects other than tensors, so it is not loaded (weights_only=True "
            f"refuses to run pickled code). Point checkpointer.checkpoint_files at a plain state-dict "
            f"checkpoint. Details: {exc}"
        ) from exc
    except (RuntimeError, EOFError) as exc:
        raise TuneError(
            f"{path} could not be read as a PyTorch checkpoint (truncated or not a checkpoint?): "
            f"{exc}. Check checkpointer.checkpoint_files."
        ) from exc


def load_safetensors_weights(path: Path) -> dict[str, torch.Tensor]:
    """Load a ``.safetensors`` file (safetensors maps the file; no pickle is involved)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError) as exc:
        raise TuneError(
            f"{path} could not be read as a safetensors file (truncated or corrupt?): {exc}. "
            f"Check checkpointer.checkpoint_files."
        ) from exc


def load_recipe_state(path: Path) -> dict[str, Any]:
    """Load ``recipe_state.pt`` memory-mapped, with ``weights_only=True``.

    Memory-mapped (privately: the file is never written) so that a resume does not read the whole
    optimizer state into host memory before the optimizer allocates its own: the state is copied
    into the optimizer one parameter at a time and the mapped pages are released as it goes
    (``load_optimizer_state_dict``), which also keeps training from ever writing into the mapping.
    """
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except pickle.UnpicklingError as exc:
        raise TuneError(
            f"{path} holds Python objects that weights_only=True refuses to load: {exc}. "
            f"Check checkpointer.recipe_checkpoint."
        ) from exc
    except (RuntimeError, EOFError) as exc:
        raise TuneError(
            f"{path} could not be read as a recipe state (truncated?): {exc}. "
            f"Check checkpointer.recipe_checkpoint, or resume from the previous checkpoint."
        ) from exc
    if not isinstance(state, dict):
        raise TuneError(
            f"{path} does not hold a dict of recipe state (found {type(state).__name__}). "
            f"Check checkpointer.recipe_checkpoint."
        )
    return state

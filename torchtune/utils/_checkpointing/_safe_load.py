"""Loading checkpoint files without running pickled code and without copying weights into RAM first."""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Any

import torch

from torchtune._errors import TuneError


def load_torch_weights(path: Path, *, weights_only: bool = True, mmap: bool = True) -> dict[str, torch.Tensor]:
    """Load a ``.bin`` / ``.pth`` state dict, memory-mapped, with ``weights_only=True`` (both by default).

    mmap means a 14 GB checkpoint is paged in as the model takes its tensors instead of being read
    whole into RAM. Files in torch's pre-1.6 (non-zip) format cannot be mapped; they are read normally.
    ``weights_only=False`` runs the file's pickled code: only for files the caller trusts.
    """
    try:
        try:
            return torch.load(path, map_location="cpu", weights_only=weights_only, mmap=mmap)
        except RuntimeError as exc:
            if not mmap or zipfile.is_zipfile(path):
                raise
            del exc  # legacy (non-zip) serialization: mmap is not possible
            return torch.load(path, map_location="cpu", weights_only=weights_only)
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


# safetensors' dtype names of the floating-point weights a model loads (loading casts between them).
_SAFETENSORS_FLOAT_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def safetensors_skeleton(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a ``.safetensors`` file as meta-device tensors (name, shape, dtype), from its header
    alone: no byte of tensor data is read, so a 13 GB checkpoint is checked against the model in
    milliseconds. safetensors checks that the header's offsets cover the file (a truncated file fails here).

    Raises:
        TuneError: the file is not safetensors, is truncated, or holds a tensor that is not floating point
            (a quantized checkpoint: int8, fp8, ...), which loading would silently cast into the weights.
    """
    from torchtune.utils._checkpointing._weight_reader import open_safetensors

    with open_safetensors(path) as f:
        specs = {name: (f.get_slice(name).get_dtype(), f.get_slice(name).get_shape()) for name in f.keys()}
    other = {name: dtype for name, (dtype, _) in specs.items() if dtype not in _SAFETENSORS_FLOAT_DTYPES}
    if other:
        shown = ", ".join(f"{name} ({dtype})" for name, dtype in list(other.items())[:5])
        raise TuneError(
            f"{path} holds tensors that are not floating-point weights: {shown}"
            f"{f' and {len(other) - 5} more' if len(other) > 5 else ''}. A quantized checkpoint (int8, fp8) cannot "
            "be finetuned in full: point checkpointer.checkpoint_dir at the model's bf16/fp16/fp32 weights."
        )
    return {
        name: torch.empty(shape, dtype=_SAFETENSORS_FLOAT_DTYPES[dtype], device="meta")
        for name, (dtype, shape) in specs.items()
    }


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

"""KV-cache context managers and small helpers of torchtune's ``torchtune.modules.common_utils``."""

from __future__ import annotations

import contextlib
import warnings
from typing import Any, Dict, Iterator, List, Optional

import torch
from torch import nn

__all__ = [
    "delete_kv_caches",
    "disable_kv_cache",
    "local_kv_cache",
    "reparametrize_as_dtype_state_dict_post_hook",
    "slice_str_to_array",
]


def _attention_modules(model: nn.Module) -> Iterator[nn.Module]:
    """Modules that own a KV cache slot (``kv_cache`` attribute, set or ``None``)."""
    return (m for m in model.modules() if hasattr(m, "kv_cache") and hasattr(m, "cache_enabled"))


@contextlib.contextmanager
def disable_kv_cache(model: nn.Module) -> Iterator[None]:
    """Inside, forward passes neither read nor write the model's KV caches, which keep their contents;
    they are enabled again on exit.

    Raises:
        ValueError: the model has no caches set up.
    """
    if not model.caches_are_setup():
        raise ValueError(
            "Model caches must be setup before calling disable_kv_cache! "
            "Please use model.setup_caches() to setup model caches."
        )
    if not model.caches_are_enabled():
        warnings.warn(
            "You are using disable_kv_cache with a model that has caches setup but already disabled.", stacklevel=3
        )
    modules = [m for m in _attention_modules(model) if m.kv_cache is not None]
    for module in modules:
        module.cache_enabled = False
    try:
        yield
    finally:
        for module in modules:
            module.cache_enabled = True


@contextlib.contextmanager
def local_kv_cache(
    model: nn.Module,
    *,
    batch_size: int,
    device: torch.device,
    dtype: torch.dtype,
    encoder_max_seq_len: Optional[int] = None,
    decoder_max_seq_len: Optional[int] = None,
) -> Iterator[None]:
    """KV caches for the duration of the block (set up on ``device`` on entry, deleted on exit), for a
    model that has none.

    Raises:
        ValueError: the model already has caches (:func:`delete_kv_caches` removes them).
    """
    if model.caches_are_setup():
        raise ValueError(
            "Model caches must be not setup prior to entering this context manager! "
            "Please use delete_kv_caches(model) to delete model caches."
        )
    model.setup_caches(
        batch_size,
        dtype,
        encoder_max_seq_len=encoder_max_seq_len,
        decoder_max_seq_len=decoder_max_seq_len,
        device=torch.device(device),
    )
    try:
        yield
    finally:
        delete_kv_caches(model)


def delete_kv_caches(model: nn.Module) -> None:
    """Remove every KV cache of ``model`` (and switch caching off): its forward is a training forward again.

    Raises:
        ValueError: the model has no caches set up.
    """
    if not model.caches_are_setup():
        raise ValueError(
            "You have tried to delete model caches, but model.caches_are_setup() "
            "is False! Please setup caches on the model first."
        )
    for module in _attention_modules(model):
        module.cache_enabled = False
        module.kv_cache = None


def slice_str_to_array(slice_str: str, length: int) -> List[bool]:
    """Which of ``length`` indices a Python slice or index list written as a string selects:
    ``"1:3"`` -> ``[False, True, True, False, False]`` for 5; ``"0,4"`` picks those indices.

    Raises:
        AssertionError: a malformed string, commas mixed with colons, or an index out of range.
    """
    assert "," not in slice_str or ":" not in slice_str, "Cannot mix commas and colons"
    if "," in slice_str:
        indices = [int(i) for i in slice_str.split(",")]
        assert all(0 <= i < length for i in indices), "Index out of range"
        return [i in set(indices) for i in range(length)]
    parts = slice_str.split(":")
    assert len(parts) <= 3, "Invalid slice format"
    if parts == [""]:
        return [True] * length
    if len(parts) == 1:
        start = int(parts[0])
        assert 0 <= start < length, "Start index out of range"
        return [i == start for i in range(length)]
    values = [int(p) if p != "" else None for p in parts]
    start, end = values[0], values[1]
    step = values[2] if len(values) == 3 else None
    assert start is None or 0 <= start < length, "Start index out of range"
    assert end is None or 0 <= end < length, "End index out of range"
    assert step is None or step != 0, "Step cannot be zero"
    chosen = set(range(length)[slice(start, end, step)])
    return [i in chosen for i in range(length)]


def reparametrize_as_dtype_state_dict_post_hook(
    model: nn.Module,
    state_dict: Dict[str, Any],
    *args: Any,
    dtype: torch.dtype = torch.bfloat16,
    offload_to_cpu: bool = True,
    **kwargs: Any,
) -> None:
    """A state-dict post-hook that turns torchao's NF4 tensors (QLoRA's frozen base weights) into ``dtype``
    tensors, moved to the host with ``offload_to_cpu``. A no-op without torchao or NF4 tensors (no model
    here quantizes its base weights)."""
    try:
        from torchao.dtypes.nf4tensor import NF4Tensor
    except ImportError:
        return
    for key, value in state_dict.items():
        if isinstance(value, NF4Tensor):
            state_dict[key] = value.to(dtype).cpu() if offload_to_cpu else value.to(dtype)

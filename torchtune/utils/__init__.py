"""Leaf helpers: checkpointers and OptimInBackwardWrapper, devices and dtypes, seeds, metric loggers."""

from torchtune.utils._checkpointing import FullModelHFCheckpointer, FullModelMetaCheckpointer
from torchtune.utils._checkpointing._checkpoint_utils import (
    OptimInBackwardWrapper,
    is_standard_optimizer_state,
    keep_optimizer_state_paged,
    load_optimizer_state_dict,
)
from torchtune.utils._device import dtype_name, get_device, get_dtype, parse_device, set_default_dtype
from torchtune.utils._seed import draw_seed, get_rng_state, set_rng_state, set_seed

__all__ = [
    "FullModelHFCheckpointer",
    "FullModelMetaCheckpointer",
    "OptimInBackwardWrapper",
    "dtype_name",
    "get_device",
    "get_dtype",
    "parse_device",
    "set_default_dtype",
    "get_rng_state",
    "is_standard_optimizer_state",
    "keep_optimizer_state_paged",
    "load_optimizer_state_dict",
    "set_rng_state",
    "set_seed",
    "draw_seed",
]

"""Leaf helpers: devices and dtypes, seeds, logging, and the optimizer-in-backward state
(``OptimInBackwardWrapper``). torchtune 0.6.1's ``torchtune.utils`` names are all here."""

from typing import Any

from torchtune.utils._checkpointing._checkpoint_utils import (
    OptimInBackwardWrapper,
    is_standard_optimizer_state,
    keep_optimizer_state_paged,
    load_optimizer_state_dict,
)
from torchtune.utils._device import (
    DeviceSupport,
    batch_to_device,
    dtype_name,
    get_device,
    get_device_support,
    get_dtype,
    get_torch_device_namespace,
    get_world_size_and_rank,
    parse_device,
    set_default_dtype,
)
from torchtune.utils._logging import get_logger, log_rank_zero
from torchtune.utils._seed import draw_seed, get_rng_state, set_deterministic_mode, set_rng_state, set_seed
from torchtune.utils._version import torch_version_ge

# Earlier releases of this library exported the checkpointers here; configs that still name
# torchtune.utils.FullModelHFCheckpointer keep working. They live in torchtune.training (torchtune's path).
_MOVED = {"FullModelHFCheckpointer", "FullModelMetaCheckpointer"}


def __getattr__(name: str) -> Any:
    if name in _MOVED:
        from torchtune.training import checkpointing

        return getattr(checkpointing, name)
    raise AttributeError(f"module 'torchtune.utils' has no attribute {name!r}")


__all__ = [
    "DeviceSupport",
    "OptimInBackwardWrapper",
    "batch_to_device",
    "draw_seed",
    "dtype_name",
    "get_device",
    "get_device_support",
    "get_dtype",
    "get_logger",
    "get_rng_state",
    "get_torch_device_namespace",
    "get_world_size_and_rank",
    "is_standard_optimizer_state",
    "keep_optimizer_state_paged",
    "load_optimizer_state_dict",
    "log_rank_zero",
    "parse_device",
    "set_default_dtype",
    "set_deterministic_mode",
    "set_rng_state",
    "set_seed",
    "torch_version_ge",
]

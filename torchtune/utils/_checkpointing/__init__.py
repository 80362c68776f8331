"""Checkpointers for full-model finetuning: format conversion, atomic saves, manifests."""

from torchtune.utils._checkpointing._atomic import write_folder_atomically
from torchtune.utils._checkpointing._checkpointer import (
    FullModelHFCheckpointer,
    FullModelMetaCheckpointer,
    validate_state_dict,
)
from torchtune.utils._checkpointing._manifest import (
    RECIPE_STATE_NAME,
    find_latest_checkpoint,
    previous_checkpoint,
    verify_manifest,
)
from torchtune.utils._checkpointing._safe_load import load_recipe_state

__all__ = [
    "RECIPE_STATE_NAME",
    "FullModelHFCheckpointer",
    "FullModelMetaCheckpointer",
    "find_latest_checkpoint",
    "load_recipe_state",
    "previous_checkpoint",
    "validate_state_dict",
    "verify_manifest",
    "write_folder_atomically",
]

"""Checkpointers for full-model finetuning: format conversion, atomic saves, manifests."""

from torchtune.utils._checkpointing._atomic import write_folder_atomically
from torchtune.utils._checkpointing._checkpointer import (
    FullModelHFCheckpointer,
    FullModelMetaCheckpointer,
    validate_state_dict,
)
from torchtune.utils._checkpointing._manifest import find_latest_checkpoint, previous_checkpoint, verify_manifest

__all__ = [
    "FullModelHFCheckpointer",
    "FullModelMetaCheckpointer",
    "find_latest_checkpoint",
    "previous_checkpoint",
    "validate_state_dict",
    "verify_manifest",
    "write_folder_atomically",
]

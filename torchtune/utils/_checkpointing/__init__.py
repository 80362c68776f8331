"""Checkpoint files, format-free: atomic folders, manifests and checksums, streaming writes, safe loads,
per-tensor reads, and the optimizer-in-backward state (``OptimInBackwardWrapper``). The checkpointers that
convert model formats are in ``torchtune.training.checkpointing``."""

from torchtune.utils._checkpointing._atomic import write_folder_atomically
from torchtune.utils._checkpointing._manifest import (
    RECIPE_STATE_NAME,
    find_latest_checkpoint,
    previous_checkpoint,
    verify_manifest,
)
from torchtune.utils._checkpointing._safe_load import load_recipe_state

__all__ = [
    "RECIPE_STATE_NAME",
    "find_latest_checkpoint",
    "load_recipe_state",
    "previous_checkpoint",
    "verify_manifest",
    "write_folder_atomically",
]

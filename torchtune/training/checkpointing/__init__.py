"""Checkpointers: read a model in its published format (Hugging Face, Meta, torchtune's own), hand out this
library's parameter names, and write it back the same way; torchtune's checkpoint keys, file names and
model types; ``tune export``'s conversion of any checkpoint folder to a Hugging Face model folder."""

from torchtune.training.checkpointing._checkpointer import (
    Checkpointer,
    FullModelHFCheckpointer,
    FullModelMetaCheckpointer,
    FullModelTorchTuneCheckpointer,
    validate_state_dict,
)
from torchtune.training.checkpointing._utils import (
    ADAPTER_CONFIG,
    ADAPTER_KEY,
    DATALOADER_KEY,
    EPOCHS_KEY,
    MAX_STEPS_KEY,
    MODEL_KEY,
    OPT_KEY,
    RNG_KEY,
    SEED_KEY,
    STEPS_KEY,
    TOTAL_EPOCHS_KEY,
    FormattedCheckpointFiles,
    ModelType,
    get_largest_iter_folder,
    update_state_dict_for_classifier,
)

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_KEY",
    "Checkpointer",
    "DATALOADER_KEY",
    "EPOCHS_KEY",
    "FormattedCheckpointFiles",
    "FullModelHFCheckpointer",
    "FullModelMetaCheckpointer",
    "FullModelTorchTuneCheckpointer",
    "MAX_STEPS_KEY",
    "MODEL_KEY",
    "ModelType",
    "OPT_KEY",
    "RNG_KEY",
    "SEED_KEY",
    "STEPS_KEY",
    "TOTAL_EPOCHS_KEY",
    "get_largest_iter_folder",
    "update_state_dict_for_classifier",
    "validate_state_dict",
]

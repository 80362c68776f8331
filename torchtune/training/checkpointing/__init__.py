"""Checkpointers: read a model in its published format (Hugging Face, Meta), hand out this library's parameter
names, and write it back the same way; ``tune export``'s conversion of any checkpoint folder to a Hugging Face
model folder."""

from torchtune.training.checkpointing._checkpointer import (
    FullModelHFCheckpointer,
    FullModelMetaCheckpointer,
    validate_state_dict,
)

__all__ = ["FullModelHFCheckpointer", "FullModelMetaCheckpointer", "validate_state_dict"]

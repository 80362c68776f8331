"""Instruction and chat datasets on Hugging Face ``datasets``, packing, and collate functions.

Importing this package does not import ``datasets`` (that happens when a dataset is built).
"""

from torchtune.datasets._alpaca import alpaca_dataset
from torchtune.datasets._chat import ChatDataset, chat_dataset
from torchtune.datasets._collate import block_causal_mask, packed_collate, padded_collate
from torchtune.datasets._instruct import InstructDataset, instruct_dataset
from torchtune.datasets._loading import load_hf_dataset
from torchtune.datasets._packed import PackedDataset, collate_for
from torchtune.datasets._templates import (
    AlpacaInstructTemplate,
    FormatInstructTemplate,
    InstructTemplate,
    resolve_template,
)
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX  # re-exported: the label losses leave out

__all__ = [
    "AlpacaInstructTemplate",
    "CROSS_ENTROPY_IGNORE_IDX",
    "ChatDataset",
    "FormatInstructTemplate",
    "InstructDataset",
    "InstructTemplate",
    "PackedDataset",
    "alpaca_dataset",
    "block_causal_mask",
    "chat_dataset",
    "collate_for",
    "instruct_dataset",
    "load_hf_dataset",
    "packed_collate",
    "padded_collate",
    "resolve_template",
]

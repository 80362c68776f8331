"""The constants the message layer shares with the losses and the datasets."""

from typing import Dict, List, Union

import torch

# Defined once, beside the losses that skip it; torchtune's import path is this module.
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX

# One packed sequence as ``PackedDataset`` yields it: tokens, labels, input_pos and seq_lens.
PACK_TYPE = Dict[str, Union[torch.Tensor, List[int]]]

__all__ = ["CROSS_ENTROPY_IGNORE_IDX", "PACK_TYPE"]

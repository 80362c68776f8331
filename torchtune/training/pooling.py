"""torchtune's pooling helper: where each sequence of a padded batch ends."""

import torch

__all__ = ["get_unmasked_sequence_lengths"]


def get_unmasked_sequence_lengths(mask: torch.Tensor) -> torch.Tensor:
    """The index of the last unmasked position of each row of ``mask`` (``[b, s]``, True where masked, e.g. at
    padding), as a ``[b]`` long tensor; 0 for a row masked throughout."""
    last = (~mask).cumsum(dim=-1).argmax(dim=-1).to(dtype=torch.long)
    return last.clip(0, mask.shape[1] - 1)

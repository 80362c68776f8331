"""Packing: several examples per fixed-length sequence, so no compute goes to padding; ``collate_for``
picks the collate function that fits a dataset, packed or not."""

from __future__ import annotations

import sys
from functools import partial
from typing import Any, Callable, Dict, List, Mapping

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from torchtune._errors import TuneError
from torchtune.datasets._collate import packed_collate, padded_collate
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX


class PackedDataset(Dataset):
    """Greedily packs the examples of ``ds`` (items ``{"tokens", "labels"}``) into sequences of
    exactly ``max_seq_len`` tokens, once, at construction (each example is tokenized once; a tqdm bar
    shows progress on a terminal).

    Each pack is ``{"tokens", "labels", "input_pos": Long[max_seq_len], "seq_lens": Long[n]}``:

    - examples are added in order while they fit; the next one starts a new pack. With
      ``split_across_pack=True`` a pack is filled to the brim and the rest of the example continues in
      the next pack (as a new segment, positions from 0). Otherwise an example longer than
      ``max_seq_len`` is cut to it, keeping its final token (the EOS) and that token's label;
    - the tail is padded with ``padding_idx`` (labels -100). Padding is a segment of its own:
      ``seq_lens`` lists every example's length and then the padding length (if any), and
      ``input_pos`` restarts at 0 for every segment, padding included, so that the causal block of the
      padding attends only to itself;
    - the label of each segment's first token (the BOS) is -100. The recipe shifts labels
      (``labels[:, 1:]``, -100 appended), making ``labels[t + 1]`` the target of position ``t``; with
      the first label of every segment ignored, the last token of one example never gets the first
      token of the next as its target, so no target crosses an example boundary.

    ``packed_collate`` turns ``seq_lens`` into the block-diagonal causal attention mask.
    """

    def __init__(self, ds: Any, max_seq_len: int, padding_idx: int = 0, split_across_pack: bool = False) -> None:
        if max_seq_len is None or int(max_seq_len) < 2:
            raise TuneError(f"Packing needs dataset.max_seq_len of at least 2, got {max_seq_len}.")
        self.max_seq_len = int(max_seq_len)
        self.padding_idx = int(padding_idx)
        self.split_across_pack = split_across_pack
        self.packs: List[Dict[str, torch.Tensor]] = []
        self._pack(ds)
        if not self.packs:
            raise TuneError("The dataset to pack has no examples; check dataset.source / dataset.data_files.")

    def _pack(self, ds: Any) -> None:
        tokens: List[int] = []
        labels: List[int] = []
        seq_lens: List[int] = []
        progress = tqdm(range(len(ds)), desc="Packing dataset", unit="example", disable=not sys.stderr.isatty())
        for index in progress:
            item = ds[index]
            ex_tokens, ex_labels = list(item["tokens"]), list(item["labels"])
            if len(ex_tokens) != len(ex_labels):
                raise ValueError(f"example {index}: tokens and labels differ in length")
            if not ex_tokens:
                continue
            if not self.split_across_pack and len(ex_tokens) > self.max_seq_len:
                ex_tokens = ex_tokens[: self.max_seq_len - 1] + ex_tokens[-1:]
                ex_labels = ex_labels[: self.max_seq_len - 1] + ex_labels[-1:]
            while ex_tokens:
                room = self.max_seq_len - len(tokens)
                if len(ex_tokens) > room and not self.split_across_pack:
                    self._close(tokens, labels, seq_lens)
                    tokens, labels, seq_lens = [], [], []
                    room = self.max_seq_len
                take = min(room, len(ex_tokens))
                segment_labels = [CROSS_ENTROPY_IGNORE_IDX] + ex_labels[1:take]
                tokens += ex_tokens[:take]
                labels += segment_labels
                seq_lens.append(take)
                ex_tokens, ex_labels = ex_tokens[take:], ex_labels[take:]
                if len(tokens) == self.max_seq_len:
                    self._close(tokens, labels, seq_lens)
                    tokens, labels, seq_lens = [], [], []
        if tokens:
            self._close(tokens, labels, seq_lens)

    def _close(self, tokens: List[int], labels: List[int], seq_lens: List[int]) -> None:
        pad = self.max_seq_len - len(tokens)
        if pad:
            seq_lens = seq_lens + [pad]
        input_pos = torch.cat([torch.arange(n) for n in seq_lens])
        self.packs.append(
            {
                "tokens": torch.tensor(tokens + [self.padding_idx] * pad, dtype=torch.long),
                "labels": torch.tensor(labels + [CROSS_ENTROPY_IGNORE_IDX] * pad, dtype=torch.long),
                "input_pos": input_pos.to(torch.long),
                "seq_lens": torch.tensor(seq_lens, dtype=torch.long),
            }
        )

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        return self.packs[index]


def collate_for(
    dataset: Any,
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
) -> Callable[[List[Mapping[str, Any]]], Dict[str, torch.Tensor]]:
    """The collate function for ``dataset``: ``packed_collate`` for a ``PackedDataset`` (already
    padded to its length), else ``padded_collate`` with these padding values."""
    if isinstance(dataset, PackedDataset):
        return packed_collate
    return partial(padded_collate, padding_idx=padding_idx, ignore_idx=ignore_idx)

"""Packing: several examples per fixed-length sequence, so no compute goes to padding; ``collate_for``
picks the collate function that fits a dataset, packed or not."""

from __future__ import annotations

import bisect
import logging
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from torchtune._errors import TuneError
from torchtune.datasets._collate import packed_collate, padded_collate
from torchtune.datasets._pack_cache import load_packs, save_packs
from torchtune.datasets._rows import has_targets, truncate
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX

log = logging.getLogger("torchtune")


class PackedDataset(Dataset):
    """Packs the examples of ``ds`` (items ``{"tokens", "labels"}``) into sequences of exactly
    ``max_seq_len`` tokens, once, at construction (each example is tokenized once; a tqdm bar shows
    progress on a terminal).

    Each pack is ``{"tokens", "labels", "input_pos": Long[max_seq_len], "seq_lens": Long[n]}``:

    - examples are taken in order, each into the pack it fits best: the open pack with the least room
      that still holds it, else a new pack ("best fit"). Instruction examples of mixed lengths then
      leave a few percent of padding where filling one pack at a time ("next fit") leaves a large
      share (every example that does not fit closes a pack with its room unused). Packs keep the order
      they were opened in; inside a pack, examples keep their order. An example longer than
      ``max_seq_len`` is cut to it, keeping its final token (the EOS) and that token's label. With
      ``split_across_pack=True`` packs are filled one at a time to the brim instead, and the rest of an
      example continues in the next pack (as a new segment, positions from 0);
    - the tail is padded with ``padding_idx`` (labels -100). Padding is a segment of its own:
      ``seq_lens`` lists every example's length and then the padding length (if any), and
      ``input_pos`` restarts at 0 for every segment, padding included, so that the causal block of the
      padding attends only to itself;
    - the label of each segment's first token (the BOS) is -100. The recipe shifts labels
      (``labels[:, 1:]``, -100 appended), making ``labels[t + 1]`` the target of position ``t``; with
      the first label of every segment ignored, the last token of one example never gets the first
      token of the next as its target, so no target crosses an example boundary.

    ``packed_collate`` turns ``seq_lens`` into the block-diagonal causal attention mask.

    With ``cache_file`` (the dataset builders pass the one ``torchtune.datasets._pack_cache`` names,
    keyed by data, tokenizer and max_seq_len) the packs are read from that file when it exists and
    written to it after packing otherwise: the examples are tokenized and packed once, not per run.
    ``padding_share`` is the fraction of all pack positions that are padding; ``num_examples`` how
    many examples went in; ``num_dropped`` how many were left out for having nothing to learn (no label
    after their first: an empty reply, or a reply ``max_seq_len`` cut away), which the log line counts.
    """

    def __init__(
        self,
        ds: Any,
        max_seq_len: int,
        padding_idx: int = 0,
        split_across_pack: bool = False,
        cache_file: Optional[Path] = None,
    ) -> None:
        if max_seq_len is None or int(max_seq_len) < 2:
            raise TuneError(f"Packing needs dataset.max_seq_len of at least 2, got {max_seq_len}.")
        self.max_seq_len = int(max_seq_len)
        self.padding_idx = int(padding_idx)
        self.split_across_pack = split_across_pack
        self.cache_file = cache_file
        start = time.perf_counter()
        cached = load_packs(cache_file) if cache_file is not None else None
        if cached is not None:
            self._tokens, self._labels = cached["tokens"], cached["labels"]
            self._seq_lens, self._padding = cached["seq_lens"], cached["padding"]
            self.num_examples, self.num_dropped = cached["num_examples"], cached["num_dropped"]
            how = f"read from the cache {cache_file}"
        else:
            self._build(ds)
            how = f"packed in {time.perf_counter() - start:.1f}s"
            if cache_file is not None:
                save_packs(
                    cache_file,
                    self._tokens,
                    self._labels,
                    self._seq_lens,
                    self._padding,
                    self.num_examples,
                    self.num_dropped,
                )
                how += f", cached in {cache_file}"
            else:
                how += " (not cached: the data was not loaded from cache files, or the tokenizer has no model file)"
        self.padding_share = float(self._padding.sum()) / self._tokens.numel()
        log.info(
            "Packed dataset: %d examples in %d packs of %d tokens, %.1f%% padding (%s)",
            self.num_examples,
            len(self),
            self.max_seq_len,
            100 * self.padding_share,
            how,
        )
        if self.num_dropped:
            log.warning(
                "Packed dataset: %d examples have nothing to learn and are left out (an empty reply, or a reply "
                "that max_seq_len=%d cuts away; a larger dataset.max_seq_len keeps the cut ones).",
                self.num_dropped,
                self.max_seq_len,
            )

    @property
    def dropped(self) -> Dict[str, int]:
        """Examples left out for having nothing to learn."""
        return {"with nothing to learn": self.num_dropped} if self.num_dropped else {}

    def _build(self, ds: Any) -> None:
        self._rows: Dict[str, List[Any]] = {"tokens": [], "labels": [], "seq_lens": [], "padding": []}
        self.num_examples = self.num_dropped = 0
        self._pack(ds)
        if not self._rows["tokens"]:
            more = f" ({self.num_dropped} had nothing to learn)" if self.num_dropped else ""
            raise TuneError(
                f"The dataset to pack has no examples{more}; check dataset.source / dataset.data_files"
                + (", and raise dataset.max_seq_len if the replies were cut away." if more else ".")
            )
        self._tokens = torch.tensor(self._rows["tokens"], dtype=torch.long)
        self._labels = torch.tensor(self._rows["labels"], dtype=torch.long)
        self._seq_lens = [torch.tensor(n, dtype=torch.long) for n in self._rows["seq_lens"]]
        self._padding = torch.tensor(self._rows["padding"], dtype=torch.long)
        del self._rows

    def _pack(self, ds: Any) -> None:
        progress = tqdm(range(len(ds)), desc="Packing dataset", unit="example", disable=not sys.stderr.isatty())
        examples = (self._example(ds, index) for index in progress)
        if self.split_across_pack:
            self._pack_splitting(examples)
        else:
            self._pack_best_fit(examples)

    def _example(self, ds: Any, index: int) -> Optional[tuple]:
        item = ds[index]
        tokens, labels = list(item["tokens"]), list(item["labels"])
        if len(tokens) != len(labels):
            raise ValueError(f"example {index}: tokens and labels differ in length")
        if not tokens:
            return None
        if not self.split_across_pack:
            tokens, labels = truncate(tokens, labels, self.max_seq_len)
        if not has_targets(labels):
            self.num_dropped += 1
            return None
        self.num_examples += 1
        return tokens, labels

    def _pack_best_fit(self, examples: Any) -> None:
        packs: List[tuple] = []  # (tokens, labels, seq_lens) in the order they were opened
        rooms: List[tuple] = []  # sorted (room, pack index) of the packs that are not full
        for example in examples:
            if example is None:
                continue
            tokens, labels = example
            n = len(tokens)
            at = bisect.bisect_left(rooms, (n, -1))  # the least room that still holds n tokens
            if at < len(rooms):
                room, index = rooms.pop(at)
            else:
                room, index = self.max_seq_len, len(packs)
                packs.append(([], [], []))
            pack_tokens, pack_labels, seq_lens = packs[index]
            pack_tokens += tokens
            pack_labels += [CROSS_ENTROPY_IGNORE_IDX] + labels[1:]
            seq_lens.append(n)
            if room > n:
                bisect.insort(rooms, (room - n, index))
        for pack in packs:
            self._close(*pack)

    def _pack_splitting(self, examples: Any) -> None:
        tokens: List[int] = []
        labels: List[int] = []
        seq_lens: List[int] = []
        for example in examples:
            if example is None:
                continue
            ex_tokens, ex_labels = example
            while ex_tokens:
                take = min(self.max_seq_len - len(tokens), len(ex_tokens))
                tokens += ex_tokens[:take]
                labels += [CROSS_ENTROPY_IGNORE_IDX] + ex_labels[1:take]
                seq_lens.append(take)
                ex_tokens, ex_labels = ex_tokens[take:], ex_labels[take:]
                if len(tokens) == self.max_seq_len:
                    self._close(tokens, labels, seq_lens)
                    tokens, labels, seq_lens = [], [], []
        if tokens:
            self._close(tokens, labels, seq_lens)

    def _close(self, tokens: List[int], labels: List[int], seq_lens: List[int]) -> None:
        pad = self.max_seq_len - len(tokens)
        self._rows["tokens"].append(tokens + [self.padding_idx] * pad)
        self._rows["labels"].append(labels + [CROSS_ENTROPY_IGNORE_IDX] * pad)
        self._rows["seq_lens"].append(seq_lens + [pad] if pad else list(seq_lens))
        self._rows["padding"].append(pad)

    def __len__(self) -> int:
        return self._tokens.size(0)

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        seq_lens = self._seq_lens[index]
        return {
            "tokens": self._tokens[index],
            "labels": self._labels[index],
            "input_pos": torch.cat([torch.arange(int(n)) for n in seq_lens]),
            "seq_lens": seq_lens,
        }


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

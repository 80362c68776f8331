"""Packing: several examples per fixed-length sequence, so no compute goes to padding; ``collate_for``
picks the collate function that fits a dataset, packed or not."""

from __future__ import annotations

import bisect
import logging
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from torchtune._errors import TuneValueError
from torchtune.datasets._collate import packed_collate, padded_collate
from torchtune.datasets._pack_cache import load_packs, save_packs
from torchtune.datasets._rows import has_targets, truncate
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX

log = logging.getLogger("torchtune")


class PackedDataset(Dataset):
    """Packs the examples of ``ds`` (items with ``tokens`` and ``labels``) into sequences of exactly
    ``max_seq_len`` tokens, once, at construction (each example is read once; a tqdm bar shows progress on
    a terminal). Each pack is ``{"tokens", "labels", "input_pos": Long[max_seq_len], "seq_lens": Long[n]}``;
    the rest of a pack is padding (``padding_idx``, labels -100), a segment of its own in ``seq_lens``, so
    ``padded_collate_packed`` / ``packed_collate`` give it its own causal block.

    By default torchtune's packing (its arguments give its packs, positions and labels):

    - greedy: examples fill the current pack in order; one that does not fit starts the next pack, or,
      with ``split_across_pack=True``, fills the current pack to the brim and continues in the next;
      packing stops after ``max_packs`` packs;
    - ``input_pos`` counts from 0 in each example (modulo ``max_seq_len``; the part of a split example in the
      next pack goes on counting), and on through the padding, held at ``max_seq_len - 1``;
    - labels are the examples' own: the first label of an example is its first token's, so after the
      recipe's shift the last token of one example is trained to predict the first of the next;
    - an example longer than ``max_seq_len`` without ``split_across_pack`` is an error.

    ``best_fit=True`` packs this library's way: each example goes into the open pack with the least room
    that still holds it, else a new one (Alpaca-like data of mixed lengths then leaves a few percent of
    padding where greedy packing leaves a large share); the first label of every example is -100, so no
    target crosses an example boundary; ``input_pos`` restarts at 0 for every segment, padding included;
    an example longer than ``max_seq_len`` is cut to it, keeping its last token and that token's label.
    Packs keep the order they were opened in, and the examples inside a pack keep theirs.

    Either way an example without a label after its first (nothing to learn) is left out and counted
    (``num_dropped``, the log). With ``cache_file`` (the dataset builders pass the one
    ``torchtune.datasets._pack_cache`` names, keyed by data, tokenizer and settings) the packs are read
    from that file when it exists and written to it after packing otherwise. ``padding_share`` is the
    fraction of all pack positions that are padding; ``num_examples`` how many examples went in.

    Args:
        ds: the examples (a dataset of ``{"tokens", "labels"}``).
        max_seq_len: the length of every pack.
        padding_idx: the token id of the padding.
        max_packs: the most packs to make (None: as many as the examples fill).
        split_across_pack: continue an example that does not fit in the next pack (torchtune's packing only).
        best_fit: this library's packing (above).
        cache_file: where the packs are kept between runs (None: packed every time).

    Raises:
        TuneValueError: ``max_seq_len`` below 2, ``best_fit`` with ``split_across_pack``, an example longer
            than ``max_seq_len`` (torchtune's packing without ``split_across_pack``), or no example to pack.
    """

    def __init__(
        self,
        ds: Any,
        *,
        max_seq_len: int,
        padding_idx: int = 0,
        max_packs: Optional[int] = None,
        split_across_pack: bool = False,
        best_fit: bool = False,
        cache_file: Optional[Path] = None,
    ) -> None:
        if max_seq_len is None or int(max_seq_len) < 2:
            raise TuneValueError(f"Packing needs dataset.max_seq_len of at least 2, got {max_seq_len}.")
        if best_fit and split_across_pack:
            raise TuneValueError(
                "best_fit packs whole examples; split_across_pack=True (an example continued in the next pack) "
                "is torchtune's greedy packing. Set one of them."
            )
        self.ds = ds
        self.max_seq_len = int(max_seq_len)
        self.padding_idx = int(padding_idx)
        self.max_packs = max_packs
        self.split_across_pack = split_across_pack
        self.best_fit = best_fit
        self.cache_file = cache_file
        start = time.perf_counter()
        cached = load_packs(cache_file) if cache_file is not None else None
        if cached is not None:
            self._packs = {key: cached[key] for key in _STORED}
            self.num_examples, self.num_dropped = cached["num_examples"], cached["num_dropped"]
            how = f"read from the cache {cache_file}"
        else:
            self._build(ds)
            how = f"packed in {time.perf_counter() - start:.1f}s"
            if cache_file is not None:
                save_packs(cache_file, self._packs, self.num_examples, self.num_dropped)
                how += f", cached in {cache_file}"
            else:
                how += " (not cached: the data was not loaded from cache files, or the tokenizer has no model file)"
        self.padding_share = float(self._packs["padding"].sum()) / max(self._packs["tokens"].numel(), 1)
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
        """Examples left out for having nothing to learn: by the dataset packed (per reason), and here."""
        dropped = dict(getattr(self.ds, "dropped", None) or {})
        if self.num_dropped:
            dropped["with nothing to learn"] = dropped.get("with nothing to learn", 0) + self.num_dropped
        return dropped

    # --- building ------------------------------------------------------------------------------------
    def _build(self, ds: Any) -> None:
        self._rows: Dict[str, List[torch.Tensor]] = {key: [] for key in _STORED}
        self.num_examples = self.num_dropped = 0
        progress = tqdm(range(len(ds)), desc="Packing dataset", unit="example", disable=not sys.stderr.isatty())
        examples = (example for example in (self._example(ds[index]) for index in progress) if example is not None)
        if self.best_fit:
            self._pack_best_fit(examples)
        else:
            self._pack_greedy(examples)
        if not self._rows["tokens"]:
            more = f" ({self.num_dropped} had nothing to learn)" if self.num_dropped else ""
            raise TuneValueError(
                f"The dataset to pack has no examples{more}; check dataset.source / dataset.data_files"
                + (", and raise dataset.max_seq_len if the replies were cut away." if more else ".")
            )
        self._packs = {key: torch.stack(values) for key, values in self._rows.items() if key != "seq_lens"}
        self._packs["seq_lens"] = self._rows["seq_lens"]
        del self._rows

    def _example(self, item: Mapping[str, Any]) -> Optional[Tuple[List[int], List[int]]]:
        """An example's tokens and labels (cut to ``max_seq_len`` for best fit), None when it has nothing to
        learn (counted)."""
        tokens, labels = [int(t) for t in item["tokens"]], [int(t) for t in item["labels"]]
        if len(tokens) != len(labels):
            raise TuneValueError(f"An example has {len(tokens)} tokens but {len(labels)} labels.")
        if not tokens:
            return None
        if self.best_fit:
            tokens, labels = truncate(tokens, labels, self.max_seq_len)
        if not has_targets(labels):
            self.num_dropped += 1
            return None
        return tokens, labels

    def _full(self) -> bool:
        return self.max_packs is not None and len(self._rows["tokens"]) >= self.max_packs

    def _pack_greedy(self, examples: Iterable[Tuple[List[int], List[int]]]) -> None:
        """torchtune's packing (class docstring)."""
        current: Dict[str, List[int]] = {"tokens": [], "labels": [], "input_pos": [], "seq_lens": []}
        whole = 0  # where the last whole example ends in the current pack
        starts: List[int] = []  # where each example starts in the stream of all examples' tokens
        fed = 0
        for tokens, labels in examples:
            n = len(tokens)
            starts.append(fed)
            fed += n
            if n > self.max_seq_len and not self.split_across_pack:
                raise TuneValueError(
                    f"Dataset sample is too long ({n} > {self.max_seq_len}). Please set `split_across_pack=True` "
                    "or increase `max_seq_len` (dataset.max_seq_len cuts each example to the pack length)."
                )
            current["tokens"] += tokens
            current["labels"] += labels
            current["input_pos"] += [x % self.max_seq_len for x in range(n)]
            current["seq_lens"].append(n)
            while len(current["tokens"]) > self.max_seq_len and not self._full():
                current = self._split_and_add_pack(current, whole)
            whole = len(current["tokens"])
            if self._full():
                break
        if current["tokens"] and not self._full():
            self._add_pack(current)
        # the packs hold a prefix of that stream: an example is in them when its start is
        packed = sum(self.max_seq_len - int(pad) for pad in self._rows["padding"])
        self.num_examples = bisect.bisect_left(starts, packed)

    def _split_and_add_pack(self, current: Dict[str, List[int]], whole: int) -> Dict[str, List[int]]:
        """Close a pack at ``max_seq_len`` (splitting) or after the last whole example; return the rest."""
        if self.split_across_pack:
            cut = self.max_seq_len
            head = self.max_seq_len - sum(current["seq_lens"][:-1])  # the part of the last example that fits
            head_lens = [head] if head > 0 else []
            rest_len = len(current["tokens"]) - cut
        else:
            cut, head_lens, rest_len = whole, [], current["seq_lens"][-1]
        self._add_pack(
            {key: current[key][:cut] for key in ("tokens", "labels", "input_pos")}
            | {"seq_lens": current["seq_lens"][:-1] + head_lens}
        )
        return {key: current[key][cut:] for key in ("tokens", "labels", "input_pos")} | {"seq_lens": [rest_len]}

    def _pack_best_fit(self, examples: Iterable[Tuple[List[int], List[int]]]) -> None:
        """This library's packing (class docstring)."""
        packs: List[Tuple[List[int], List[int], List[int]]] = []  # tokens, labels, seq_lens; in opening order
        rooms: List[Tuple[int, int]] = []  # sorted (room, pack index) of the packs that are not full
        for tokens, labels in examples:
            n = len(tokens)
            at = bisect.bisect_left(rooms, (n, -1))  # the least room that still holds n tokens
            if at < len(rooms):
                room, index = rooms.pop(at)
            elif self.max_packs is not None and len(packs) >= self.max_packs:
                break
            else:
                room, index = self.max_seq_len, len(packs)
                packs.append(([], [], []))
            pack_tokens, pack_labels, seq_lens = packs[index]
            self.num_examples += 1
            pack_tokens += tokens
            pack_labels += [CROSS_ENTROPY_IGNORE_IDX] + labels[1:]
            seq_lens.append(n)
            if room > n:
                bisect.insort(rooms, (room - n, index))
        for pack_tokens, pack_labels, seq_lens in packs:
            pad = self.max_seq_len - len(pack_tokens)
            lens = seq_lens + [pad] if pad else list(seq_lens)
            positions = [p for length in lens for p in range(length)]
            self._store(
                torch.tensor(pack_tokens + [self.padding_idx] * pad, dtype=torch.long),
                torch.tensor(pack_labels + [CROSS_ENTROPY_IGNORE_IDX] * pad, dtype=torch.long),
                torch.tensor(positions, dtype=torch.long),
                torch.tensor(lens, dtype=torch.long),
                pad,
            )

    # --- torchtune's pack helpers --------------------------------------------------------------------
    def _add_pack(self, pack: Mapping[str, List[int]]) -> None:
        """Pad a pack of lists (``_convert_to_tensors``, ``_pad_pack``) and keep it."""
        padded = self._pad_pack(self._convert_to_tensors(pack), padding_idx=self.padding_idx)
        self._store(
            padded["tokens"],
            padded["labels"],
            padded["input_pos"],
            padded["seq_lens"],
            self.max_seq_len - len(pack["tokens"]),
        )

    def _convert_to_tensors(self, pack: Mapping[str, List[int]]) -> Dict[str, torch.Tensor]:
        """A pack of lists as long tensors."""
        return {key: torch.tensor(pack[key], dtype=torch.long) for key in ("tokens", "labels", "input_pos", "seq_lens")}

    def _pad_pack(self, pack: Mapping[str, torch.Tensor], padding_idx: int) -> Dict[str, torch.Tensor]:
        """A pack padded to ``max_seq_len`` as torchtune pads: ``padding_idx`` tokens, -100 labels, the padding
        as one more ``seq_lens`` entry, and positions going on from the last one, held at ``max_seq_len - 1``."""
        pad = self.max_seq_len - len(pack["tokens"])
        last = int(pack["input_pos"][-1])
        positions = torch.clamp(torch.arange(last + 1, last + 1 + pad), 0, self.max_seq_len - 1)
        return {
            "tokens": F.pad(pack["tokens"], (0, pad), value=padding_idx),
            "labels": F.pad(
                pack["labels"], (0, self.max_seq_len - len(pack["labels"])), value=CROSS_ENTROPY_IGNORE_IDX
            ),
            "input_pos": torch.cat([pack["input_pos"], positions.to(pack["input_pos"].dtype)]),
            "seq_lens": torch.cat([pack["seq_lens"], torch.tensor([pad])]) if pad > 0 else pack["seq_lens"],
        }

    def _store(
        self, tokens: torch.Tensor, labels: torch.Tensor, input_pos: torch.Tensor, seq_lens: torch.Tensor, pad: int
    ) -> None:
        self._rows["tokens"].append(tokens)
        self._rows["labels"].append(labels)
        self._rows["input_pos"].append(input_pos.to(torch.int32))  # half the memory; positions fit
        self._rows["seq_lens"].append(seq_lens)
        self._rows["padding"].append(torch.tensor(pad, dtype=torch.long))

    # --- access --------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self._packs["tokens"].size(0)

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        return {
            "tokens": self._packs["tokens"][index],
            "labels": self._packs["labels"][index],
            "input_pos": self._packs["input_pos"][index].long(),
            "seq_lens": self._packs["seq_lens"][index],
        }


# What a packed dataset keeps per pack (and its cache file holds).
_STORED = ("tokens", "labels", "input_pos", "seq_lens", "padding")


def collate_for(
    dataset: Any,
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
) -> Callable[[List[Mapping[str, Any]]], Dict[str, torch.Tensor]]:
    """The collate function for ``dataset``: ``packed_collate`` for packs (a ``PackedDataset``, or a
    ``ConcatDataset`` of them: ``packed``), already padded to their length, else ``padded_collate`` with these
    padding values."""
    if isinstance(dataset, PackedDataset) or getattr(dataset, "packed", False) is True:
        return packed_collate
    return partial(padded_collate, padding_idx=padding_idx, ignore_idx=ignore_idx)

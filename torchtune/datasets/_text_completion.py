"""Free text (a corpus, articles, wiki pages) for continued pretraining: every token is learnt."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Union

from torch.utils.data import Dataset

from torchtune._errors import TuneError
from torchtune.config._types import checked_by
from torchtune.data._utils import truncate as truncate_ids
from torchtune.datasets._build import check_dataset_args, maybe_pack
from torchtune.datasets._loading import describe_source, filter_rows, load_dataset
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._rows import check_text_columns, data_columns, truncate

__all__ = ["TextCompletionDataset", "text_completion_dataset"]


class TextCompletionDataset(Dataset):
    """Each row's ``column`` encoded with BOS (and EOS with ``add_eos``) as ``{"tokens", "labels"}``, labels
    equal to the tokens. Rows are tokenized on access.

    Every value of ``column`` is checked when the dataset is built (a null would otherwise be the text
    "None"). Length: with ``max_seq_len`` (this library's argument, not passed to ``load_dataset``) a text is
    cut to that many tokens keeping its last one (the EOS); without it, as torchtune, to the tokenizer's
    ``max_seq_len`` minus one, the cut end without EOS.

    Args:
        tokenizer: encodes text (``encode(text, add_bos, add_eos)``).
        source: dataset name, file builder (``text``, ``json`` with ``data_files=...``) or the path of one
            data file (a ``.txt`` file: one row per line, column ``text``).
        column: the column with the text.
        add_eos: end each text with EOS.
        filter_fn: keeps the rows for which it returns True, before anything else.
        max_seq_len: see above.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``split``, ``data_files``, ``name`` ...).

    Raises:
        TuneError: the data cannot be loaded, has no ``column``, or holds a null or non-text value in it.
    """

    def __init__(
        self,
        tokenizer: Any,
        source: str,
        column: str = "text",
        add_eos: bool = True,
        filter_fn: Optional[Callable] = None,
        *,
        max_seq_len: Optional[int] = None,
        **load_dataset_kwargs: Any,
    ) -> None:
        if max_seq_len is not None and max_seq_len < 2:
            raise TuneError(f"dataset.max_seq_len must be at least 2 (BOS and EOS), got {max_seq_len}.")
        self._tokenizer = tokenizer
        self._column = column
        self.add_eos = add_eos
        self.max_seq_len = max_seq_len
        described = describe_source(source, load_dataset_kwargs.get("data_files"))
        self._data = load_dataset(source, **load_dataset_kwargs)
        if filter_fn is not None:
            self._data = filter_rows(self._data, filter_fn)
        available = data_columns(self._data)
        if available and column not in available:
            raise TuneError(
                f"{described} has no column '{column}' (config key dataset.column); its columns are "
                f"{', '.join(repr(c) for c in available)}."
            )
        check_text_columns(self._data, [column], [], described)

    def __len__(self) -> int:
        return len(self._data)

    def __getitem__(self, index: int) -> Dict[str, List[int]]:
        return self._prepare_sample(self._data[index])

    def _prepare_sample(self, sample: Mapping[str, Any]) -> Dict[str, List[int]]:
        tokens = self._tokenizer.encode(text=sample[self._column], add_bos=True, add_eos=self.add_eos)
        if self.max_seq_len is not None:
            tokens, labels = truncate(tokens, list(tokens), self.max_seq_len)
            return {"tokens": tokens, "labels": labels}
        limit = getattr(self._tokenizer, "max_seq_len", None)
        if limit is not None:
            tokens = truncate_ids(tokens, limit - 1)
        return {"tokens": tokens, "labels": list(tokens)}


@checked_by(check_dataset_args)
def text_completion_dataset(
    tokenizer: Any,
    source: str,
    column: str = "text",
    add_eos: bool = True,
    packed: bool = False,
    split_across_pack: bool = True,
    split: str = "train",
    filter_fn: Optional[Callable] = None,
    *,
    max_seq_len: Optional[int] = None,
    **load_dataset_kwargs: Any,
) -> Union[TextCompletionDataset, PackedDataset]:
    """Config builder: a ``TextCompletionDataset``, or with ``packed`` a ``PackedDataset`` of it (packs of
    ``max_seq_len`` tokens, else the tokenizer's; ``split_across_pack=True``, the default here as in
    torchtune, continues a text in the next pack rather than leaving the rest of a pack empty).

    ``max_seq_len`` is this library's argument (not passed to ``load_dataset``); the others are torchtune's.

    Raises:
        TuneError: as ``TextCompletionDataset``, or ``packed`` without a ``max_seq_len``.
    """
    ds = TextCompletionDataset(
        tokenizer,
        source,
        column=column,
        add_eos=add_eos,
        filter_fn=filter_fn,
        max_seq_len=max_seq_len,
        split=split,
        **load_dataset_kwargs,
    )
    settings = {"dataset": "text_completion", "column": column, "add_eos": add_eos}
    return maybe_pack(ds, tokenizer, packed=packed, settings=settings, split_across_pack=split_across_pack)

"""torchtune's dataset for supervised finetuning: each row -> messages (``message_transform``) -> tokens
and a mask (``model_transform``, a model tokenizer) -> labels, -100 where the mask is True."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

from torch.utils.data import Dataset

from torchtune._errors import TuneError, TuneValueError
from torchtune.data._messages import validate_messages
from torchtune.datasets._loading import describe_source, filter_rows, load_dataset
from torchtune.datasets._rows import (
    CUT_AWAY,
    EMPTY_REPLY,
    KeptRows,
    RowCheck,
    check_text_columns,
    column_batches,
    data_columns,
    has_targets,
    truncate,
)
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX
from torchtune.modules.transforms import Transform

__all__ = ["SFTDataset", "SFTTransform"]


class SFTDataset(Dataset):
    """Rows of ``load_dataset(source, split=split, **load_dataset_kwargs)`` as training examples, built on
    access: the row goes through ``message_transform`` (a ``torchtune.data`` transform such as
    ``AlpacaToMessages``: ``{"messages": [Message, ...]}``), whose messages must form a conversation
    (``validate_messages``), then through ``model_transform`` (a model tokenizer: ``tokens`` and ``mask``);
    ``labels`` are the tokens with -100 where the mask is True. The item is what the model transform
    returned plus ``labels``.

    ``source`` is a Hugging Face dataset name, a file builder (``json``, ``csv``, ``parquet``, ``text``)
    with ``data_files``, or the path of one data file; a source that cannot be read is one ``TuneError``
    naming the config key to change, and CSV columns are read as text.

    Beyond torchtune's arguments (keyword arguments that are not passed to ``load_dataset``):

    - ``max_seq_len``: cut each example to this many tokens, keeping its last token, and that token's label
      when a label survives the cut (``_rows.truncate``); default the model transform's ``max_seq_len``
      (a model tokenizer has then cut its output already, its own way).
    - ``check_rows``: check every row when the dataset is built, not when training reaches it (the
      dataset builders of this module pass one; ``None``, the default, is torchtune's lazy behaviour):
      the columns the message transform reads exist and hold text in every row (no null becomes the text
      "None"), every row's messages form a conversation, and a row with nothing to learn (every unmasked
      message blank, or, with ``max_seq_len``, every label cut away) is left out and counted in the log;
      ``len`` is then the number of rows trained on, ``dropped`` the rows left out per reason.

    Args:
        source: dataset name, file builder or file path (config key ``dataset.source``).
        message_transform: row -> ``{"messages": [Message, ...]}``.
        model_transform: ``{"messages": ...}`` -> at least ``{"tokens", "mask"}`` (a model tokenizer).
        filter_fn: keeps the rows for which it returns True (``datasets.Dataset.filter``), before anything
            else.
        split: the split to load (``train``, ``train[:10%]`` ...).
        max_seq_len: see above.
        check_rows: see above.
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``data_files``, ``name``, ``cache_dir`` ...).

    Raises:
        TuneError: the data cannot be loaded; with ``check_rows``, missing columns, null or non-text fields,
            rows that are not conversations (naming the rows), or no row with anything to learn.
        ValueError: (on access) messages that are not a conversation, or a model transform that returns no
            ``tokens`` or ``mask``.
    """

    def __init__(
        self,
        *,
        source: str,
        message_transform: Transform,
        model_transform: Transform,
        filter_fn: Optional[Callable] = None,
        split: str = "train",
        max_seq_len: Optional[int] = None,
        check_rows: Optional[RowCheck] = None,
        **load_dataset_kwargs: Any,
    ) -> None:
        self._message_transform = message_transform
        self._model_transform = model_transform
        if max_seq_len is None:
            max_seq_len = getattr(model_transform, "max_seq_len", None)
        if max_seq_len is not None and max_seq_len < 2:
            raise TuneError(f"dataset.max_seq_len must be at least 2 (BOS and EOS), got {max_seq_len}.")
        self.max_seq_len: Optional[int] = max_seq_len
        self.source = source
        self._described = describe_source(source, load_dataset_kwargs.get("data_files"))
        self._data = load_dataset(source, split=split, **load_dataset_kwargs)
        if filter_fn is not None:
            self._data = filter_rows(self._data, filter_fn)
        self._prepare_sample = SFTTransform(message_transform=message_transform, model_transform=model_transform)
        self._kept = KeptRows(len(self._data))
        if check_rows is not None:
            self._kept = self._check_rows(check_rows)

    @property
    def dropped(self) -> Dict[str, int]:
        """Rows left out for having nothing to learn, per reason (only with ``check_rows``)."""
        return self._kept.dropped

    def __len__(self) -> int:
        return len(self._kept)

    def __getitem__(self, index: int) -> Dict[str, Any]:
        # a copy: a list of rows (data built in memory) hands out the same dict each time
        return self._cut(self._prepare_sample(dict(self._data[self._kept.row(index)])))

    def _cut(self, item: Dict[str, Any]) -> Dict[str, Any]:
        """``item`` with ``tokens``, ``labels`` and ``mask`` cut to ``max_seq_len`` (``_rows.truncate``)."""
        if self.max_seq_len is None or "labels" not in item or len(item["tokens"]) <= self.max_seq_len:
            return item
        tokens, labels = truncate(list(item["tokens"]), list(item["labels"]), self.max_seq_len)
        item["tokens"], item["labels"] = tokens, labels
        if "mask" in item:
            item["mask"] = [label == CROSS_ENTROPY_IGNORE_IDX for label in labels]
        return item

    def _check_rows(self, check: RowCheck) -> KeptRows:
        columns = check.columns(data_columns(self._data), self._described)
        check_text_columns(self._data, list(columns.required), list(columns.optional), self._described)
        find_cut_rows = check.find_cut_rows and self.max_seq_len is not None
        transform = self._prepare_sample

        def nothing_to_learn(row: Mapping[str, Any]) -> Optional[str]:
            sample = transform.to_messages(row)
            messages = sample.get("messages")
            if messages is None:
                return None  # not a conversation: the model transform decides, checked on access
            if not any(not m.masked and m.text_content.strip() for m in messages):
                return EMPTY_REPLY
            if find_cut_rows and any(m.masked for m in messages):
                if not has_targets(self._cut(transform.tokenize(sample))["labels"]):
                    return CUT_AWAY
            return None

        return KeptRows.scan(
            column_batches(self._data), len(self._data), nothing_to_learn, self._described, advice=check.advice
        )


class SFTTransform(Transform):
    """A row -> messages (``message_transform``, checked by ``validate_messages``) -> ``tokens`` and
    ``mask`` (``model_transform``) -> ``labels``; either transform may be left out.

    Raises:
        TuneValueError: neither transform given; (on a sample) a model transform that returns no ``tokens``
            or no ``mask``, or messages that are not a conversation.
    """

    def __init__(self, message_transform: Optional[Transform] = None, model_transform: Optional[Transform] = None):
        if message_transform is None and model_transform is None:
            raise TuneValueError("At least one of message_transform or model_transform must be provided.")
        self._message_transform = message_transform
        self._model_transform = model_transform

    def to_messages(self, sample: Mapping[str, Any]) -> Mapping[str, Any]:
        """The message transform's output for ``sample`` (the sample itself without one)."""
        if self._message_transform is None:
            return sample
        transformed = self._message_transform(sample)
        if "messages" in transformed:
            validate_messages(transformed["messages"])
        return transformed

    def tokenize(self, transformed: Mapping[str, Any]) -> Dict[str, Any]:
        """The model transform's output for a message transform's output, with ``labels``."""
        if self._model_transform is None:
            return dict(transformed)
        tokenized = self._model_transform(dict(transformed))
        if not ("tokens" in tokenized and "mask" in tokenized):
            raise TuneValueError(
                f"model_transform returned the following keys: {', '.join(tokenized.keys())}. Must return "
                "'tokens' and 'mask' as keys."
            )
        tokenized = dict(tokenized)
        tokens: List[int] = [int(t) for t in tokenized["tokens"]]
        if len(tokenized["mask"]) != len(tokens):
            raise TuneValueError(
                f"model_transform returned {len(tokens)} tokens but a mask of {len(tokenized['mask'])}: the two must "
                "have one entry per token."
            )
        tokenized["labels"] = [CROSS_ENTROPY_IGNORE_IDX if m else t for t, m in zip(tokens, tokenized["mask"])]
        return tokenized

    def __call__(self, sample: Mapping[str, Any]) -> Dict[str, Any]:
        return self.tokenize(self.to_messages(sample))

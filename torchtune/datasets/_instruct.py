"""Instruction datasets on Hugging Face ``datasets``: prompt + response -> tokens and labels."""

from __future__ import annotations

import difflib
from typing import Any, Dict, List, Mapping, Optional, Protocol

from torch.utils.data import Dataset

from torchtune._errors import ConfigError, TuneError
from torchtune.config._types import checked_by, whole_number
from torchtune.datasets._loading import describe_source, load_text_dataset
from torchtune.datasets._pack_cache import pack_cache_file
from torchtune.datasets._packed import PackedDataset
from torchtune.datasets._rows import (
    CUT_AWAY,
    EMPTY_REPLY,
    KeptRows,
    check_text_columns,
    column_batches,
    has_targets,
    truncate,
)
from torchtune.datasets._templates import InstructTemplate, TemplateLike, resolve_template
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX


class Tokenizer(Protocol):
    """What the datasets need from a tokenizer (``SentencePieceTokenizer`` and ``Llama3Tokenizer`` have it)."""

    eos_id: int
    pad_id: int

    def encode(
        self, text: str, add_bos: bool = True, add_eos: bool = True, trim_leading_whitespace: bool = False
    ) -> List[int]: ...


class InstructDataset(Dataset):
    """Rows of ``datasets.load_dataset(source, split=split, **load_dataset_kwargs)`` as
    ``{"tokens": list[int], "labels": list[int]}``.

    ``source`` is a Hub name (``tatsu-lab/alpaca``), a builder for local files (``json``, ``csv``,
    ``parquet`` with ``data_files=...``), or the path of one data file. Each row's prompt is
    ``template.format(row)`` encoded with BOS and without EOS; its response column is encoded without
    the dummy-prefix space (``trim_leading_whitespace=True``) and with EOS, so the joined ids equal
    those of the joined text. ``labels`` equal ``tokens``, except that the prompt's are -100 when
    ``train_on_input=False``. Past ``max_seq_len`` (default: ``tokenizer.max_seq_len`` if set) tokens
    and labels are cut and the last one set to EOS, so a truncated example still teaches the model to
    stop. Rows are tokenized on access; ``len`` is the number of rows trained on.

    Every row is checked when the dataset is built: a field the template reads that is null (an optional
    one, Alpaca's ``input``, may be null: it is left out) or not text is an error naming the column and
    rows. With ``train_on_input=False`` a row with nothing to learn is left out and counted in the log:
    an empty (or blank) response, or, with ``max_seq_len``, a prompt so long that no response token is
    left (finding those tokenizes every row once at build time).

    Args:
        tokenizer: encodes text (``SentencePieceTokenizer``).
        source: dataset name or builder (config key ``dataset.source``).
        template: an ``InstructTemplate`` (instance, class, dotted path) or a format string.
        column_map: ``{template field: dataset column}``, e.g. ``{"instruction": "prompt",
            "output": "answer"}`` when the dataset names its columns differently.
        train_on_input: also compute the loss on prompt tokens.
        max_seq_len: longest example in tokens (None: no limit).
        split: the split to load.
        drop_unlabelled: leave out rows with nothing to learn (``PackedDataset`` does it itself, so the
            packed builders pass False).
        **load_dataset_kwargs: passed to ``datasets.load_dataset`` (``data_files``, ``cache_dir``, ...).

    Raises:
        TuneError: a missing, empty or malformed data file, an unreachable hub dataset, columns the
            template needs that the dataset lacks (the message shows the ``column_map`` to set), a null or
            non-text field, or no row with anything to learn.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        source: str,
        template: TemplateLike,
        column_map: Optional[Mapping[str, str]] = None,
        train_on_input: bool = True,
        max_seq_len: Optional[int] = None,
        split: str = "train",
        drop_unlabelled: bool = True,
        **load_dataset_kwargs: Any,
    ) -> None:
        self._tokenizer = tokenizer
        self.template: InstructTemplate = resolve_template(template)
        self.column_map: Dict[str, str] = _as_column_map(column_map)
        self.train_on_input = train_on_input
        if max_seq_len is None:
            max_seq_len = getattr(tokenizer, "max_seq_len", None)
        if max_seq_len is not None and max_seq_len < 2:
            raise TuneError(f"dataset.max_seq_len must be at least 2 (BOS and EOS), got {max_seq_len}.")
        self.max_seq_len = max_seq_len
        self.source = source
        self._described = describe_source(source, load_dataset_kwargs.get("data_files"))
        self._data = load_text_dataset(source, split=split, **load_dataset_kwargs)
        self._check_columns(list(self._data.column_names))
        required = [self._column(f) for f in (*self.template.columns, self.template.response_column)]
        optional = [self._column(f) for f in self.template.optional_columns]
        check_text_columns(self._data, required, optional, self._described)
        self._kept = KeptRows(len(self._data))
        if drop_unlabelled and not train_on_input:
            used = [c for c in dict.fromkeys([*required, *optional]) if c in self._data.column_names]
            rows = column_batches(self._data, used)
            self._kept = KeptRows.scan(rows, len(self._data), self._why_unlabelled, self._described)

    @property
    def dropped(self) -> Dict[str, int]:
        """Rows left out for having nothing to learn, per reason."""
        return self._kept.dropped

    def _why_unlabelled(self, row: Mapping[str, Any]) -> Optional[str]:
        if not row[self._column(self.template.response_column)].strip():
            return EMPTY_REPLY
        if self.max_seq_len is not None and not has_targets(self.tokenize_row(row)["labels"]):
            return CUT_AWAY
        return None

    def _column(self, field: str) -> str:
        return self.column_map.get(field, field)

    def _check_columns(self, available: List[str]) -> None:
        needed = [*self.template.columns, self.template.response_column]
        missing = [field for field in needed if self._column(field) not in available]
        unknown_keys = [k for k in self.column_map if k not in needed and k not in self.template.optional_columns]
        if not missing and not unknown_keys:
            return
        if unknown_keys:
            raise TuneError(
                f"dataset.column_map has key(s) {_names(unknown_keys)} that template {self.template!r} "
                f"does not use; its fields are {_names(needed + list(self.template.optional_columns))}. "
                "column_map maps a template field to a dataset column: {field: column}."
            )
        # Suggest a column of the file for each missing field, among those no field reads yet (an
        # optional field such as Alpaca's input reads its column when the file has it).
        fields = needed + list(self.template.optional_columns)
        used = {self._column(f) for f in fields if f not in missing and self._column(f) in available}
        spare = [c for c in available if c not in used]
        pairs = {**self.column_map}
        for field in missing:
            pairs[field] = _likely_column(field, spare)
            if pairs[field] in spare:
                spare.remove(pairs[field])
        example = "{" + ", ".join(f"{k}: {v}" for k, v in pairs.items()) + "}"
        missing_cols = [self._column(f) for f in missing]
        raise TuneError(
            f"{self._described} has no column(s) {_names(missing_cols)}, which template "
            f"{self.template!r} needs (its fields: {_names(needed)}). The dataset's columns are "
            f"{_names(available)}. Map each template field to one of your columns with dataset.column_map, "
            f"e.g. in YAML `dataset: {{column_map: {example}}}` or on the command line "
            f"+dataset.column_map='{example}' (the + adds the key when the config has none)."
        )

    def __len__(self) -> int:
        return len(self._kept)

    def __getitem__(self, index: int) -> Dict[str, List[int]]:
        return self.tokenize_row(self._data[self._kept.row(index)])

    def tokenize_row(self, row: Mapping[str, Any]) -> Dict[str, List[int]]:
        """Tokens and labels of one dataset row (see the class docstring)."""
        fields = [*self.template.columns, *self.template.optional_columns]
        sample = {f: row[self._column(f)] for f in fields if self._column(f) in row}
        prompt = self.template.format(sample)
        response = row[self._column(self.template.response_column)]
        prompt_ids = self._tokenizer.encode(prompt, add_bos=True, add_eos=False)
        response_ids = self._tokenizer.encode(response, add_bos=False, add_eos=True, trim_leading_whitespace=True)
        tokens = prompt_ids + response_ids
        if self.train_on_input:
            labels = list(tokens)
        elif response.strip():
            labels = [CROSS_ENTROPY_IGNORE_IDX] * len(prompt_ids) + response_ids
        else:  # an empty reply teaches nothing, not even to stop
            labels = [CROSS_ENTROPY_IGNORE_IDX] * len(tokens)
        return dict(zip(("tokens", "labels"), truncate(tokens, labels, self.max_seq_len)))


# Column names datasets commonly use for a template field, best first.
_COLUMN_SYNONYMS = {
    "instruction": ("prompt", "question", "query", "instruct"),
    "input": ("context", "inputs"),
    "output": ("response", "answer", "completion", "target", "outputs", "label"),
}


def _likely_column(field: str, spare: List[str]) -> str:
    """The spare column most likely meant for ``field``: a common synonym, a close spelling, else the first."""
    lowered = {c.lower(): c for c in spare}
    for name in _COLUMN_SYNONYMS.get(field, ()):
        if name in lowered:
            return lowered[name]
    close = difflib.get_close_matches(field, spare, n=1, cutoff=0.6)
    if close:
        return close[0]
    return spare[0] if spare else "<your_column>"


def _as_column_map(column_map: Any) -> Dict[str, str]:
    if column_map is None:
        return {}
    if isinstance(column_map, str):
        import yaml  # a CLI override may arrive as the text '{instruction: prompt}'

        try:
            column_map = yaml.safe_load(column_map)
        except yaml.YAMLError as err:
            raise TuneError(
                f"dataset.column_map {column_map!r} is not a mapping such as '{{instruction: prompt, output: answer}}'."
            ) from err
    if not hasattr(column_map, "items"):
        raise TuneError(
            f"dataset.column_map must map template fields to dataset columns, such as "
            f"{{instruction: prompt, output: answer}}; got {column_map!r}."
        )
    return {str(k): str(v) for k, v in column_map.items()}


def _names(names: List[str]) -> str:
    return ", ".join(f"'{n}'" for n in names) if names else "(none)"


def check_dataset_args(key: str, fields: Mapping[str, Any]) -> None:
    """The value checks of the dataset builders' arguments (``config.validate`` runs them before anything
    is built): ``max_seq_len`` holds BOS and EOS, a source is named."""
    whole_number(f"{key}.max_seq_len", fields.get("max_seq_len"), minimum=2, allow_none=True, why=" (BOS and EOS)")
    source = fields.get("source", "?")
    if isinstance(source, str) and not source.strip():
        raise ConfigError(
            f"{key}.source is empty: name a Hugging Face dataset (tatsu-lab/alpaca) or a file format with "
            f"its files ({key}.source=json {key}.data_files=/path/data.json)."
        )


@checked_by(check_dataset_args)
def instruct_dataset(
    tokenizer: Tokenizer,
    source: str,
    template: TemplateLike,
    column_map: Optional[Mapping[str, str]] = None,
    train_on_input: bool = True,
    max_seq_len: Optional[int] = None,
    packed: bool = False,
    split: str = "train",
    **load_dataset_kwargs: Any,
) -> Dataset:
    """Config builder: an ``InstructDataset``, or, with ``packed=True``, a ``PackedDataset`` of it
    (then ``max_seq_len`` is required: it is the length of every pack). The packs are cached next to
    the dataset's cache files, keyed by data, tokenizer and settings (``torchtune.datasets._pack_cache``)."""
    if packed and max_seq_len is None and getattr(tokenizer, "max_seq_len", None) is None:
        raise TuneError("dataset.packed=True needs dataset.max_seq_len (the length of each packed sequence).")
    ds = InstructDataset(
        tokenizer,
        source,
        template,
        column_map=column_map,
        train_on_input=train_on_input,
        max_seq_len=max_seq_len,
        split=split,
        drop_unlabelled=not packed,  # packing tokenizes every row anyway and leaves those rows out itself
        **load_dataset_kwargs,
    )
    if packed:
        padding_idx = _padding_idx(tokenizer)
        cache_file = pack_cache_file(
            ds._data,
            {
                "template": repr(ds.template),
                "column_map": ds.column_map,
                "train_on_input": ds.train_on_input,
                "max_seq_len": ds.max_seq_len,
            },
            [ds, ds.template],
            tokenizer,
            max_seq_len=ds.max_seq_len,
            padding_idx=padding_idx,
            split_across_pack=False,
        )
        return PackedDataset(ds, max_seq_len=ds.max_seq_len, padding_idx=padding_idx, cache_file=cache_file)
    return ds


def _padding_idx(tokenizer: Tokenizer) -> int:
    pad = getattr(tokenizer, "pad_id", 0)
    return pad if pad is not None and pad >= 0 else 0

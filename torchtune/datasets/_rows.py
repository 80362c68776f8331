"""What every dataset does to its rows before training: text fields checked in every row, examples cut to
``max_seq_len``, and rows with nothing to learn left out and counted.

A row has nothing to learn when none of its labels is a target. The recipe shifts labels by one (the label
of position t is the target of position t - 1), so the label of the first token is never a target: an
example learns something when a label after its first is not -100. With ``train_on_input=False`` a row
has nothing to learn when its reply is empty, or when ``max_seq_len`` cuts it away entirely; such a row
would cost a step's share of compute and teach nothing, or, with its end token kept, teach the model to
stop in the middle of a prompt. So those rows are left out, and the log says how many and why.
"""

from __future__ import annotations

import dataclasses
import logging
from array import array
from typing import Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence, Tuple

from torchtune._errors import TuneError
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX

log = logging.getLogger("torchtune")

EMPTY_REPLY = "empty reply"
CUT_AWAY = "cut away by max_seq_len"
_SHOWN_ROWS = 5
_BATCH = 1000


def has_targets(labels: Sequence[int]) -> bool:
    """Whether an example teaches anything: a label after its first that is not -100."""
    return any(label != CROSS_ENTROPY_IGNORE_IDX for label in labels[1:])


def truncate(tokens: List[int], labels: List[int], max_seq_len: Optional[int]) -> Tuple[List[int], List[int]]:
    """``tokens``/``labels`` cut to ``max_seq_len``, keeping the final token (EOS, or the conversation's
    last token) so that a cut example still ends like one. The final token keeps its label only when a
    target survives the cut: a row whose labels were all cut away stays without any (and is left out)."""
    if max_seq_len is None or len(tokens) <= max_seq_len:
        return tokens, labels
    kept = labels[: max_seq_len - 1]
    last = labels[-1] if has_targets(kept) else CROSS_ENTROPY_IGNORE_IDX
    return tokens[: max_seq_len - 1] + tokens[-1:], kept + [last]


class TextColumns(NamedTuple):
    """The columns whose every value must be text (``required``), or text or null (``optional``)."""

    required: Tuple[str, ...] = ()
    optional: Tuple[str, ...] = ()


def _no_text_columns(available: List[str], described: str) -> TextColumns:
    return TextColumns()


@dataclasses.dataclass(frozen=True)
class RowCheck:
    """What a dataset builder has ``SFTDataset`` check in every row when it is built (``check_rows``).

    Attributes:
        columns: called with the data's column names and its description; checks that the columns the
            message transform reads are there (a ``TuneError`` that says which ``column_map`` to set) and
            returns those whose values must be text.
        find_cut_rows: tokenize the rows whose prompt is not learnt, to leave out those that ``max_seq_len``
            cuts down to no label (a packed dataset's packer finds them itself, so packed builders say False).
        advice: what the error about malformed rows ends with (what the rows must look like).
    """

    columns: Callable[[List[str], str], TextColumns] = _no_text_columns
    find_cut_rows: bool = True
    advice: str = ""


class KeptRows:
    """The rows a dataset trains on: every row, or those left after rows with nothing to learn are taken
    out. ``dropped`` counts the rows left out per reason."""

    def __init__(self, total: int, dropped_rows: Optional[List[int]] = None, dropped: Optional[Dict[str, int]] = None):
        self.total = total
        self.dropped: Dict[str, int] = dict(dropped or {})
        gone = set(dropped_rows or ())
        # 8 bytes a row, only when rows were left out
        self._rows: Optional[array] = array("q", (i for i in range(total) if i not in gone)) if gone else None

    def __len__(self) -> int:
        return self.total if self._rows is None else len(self._rows)

    def row(self, index: int) -> int:
        """The data row of example ``index``."""
        if not 0 <= index < len(self):
            raise IndexError(f"example {index} of a dataset of {len(self)}")
        return index if self._rows is None else self._rows[index]

    @classmethod
    def scan(
        cls,
        rows: Iterable[Tuple[int, Mapping[str, Any]]],
        total: int,
        reason: Callable[[Mapping[str, Any]], Optional[str]],
        described: str,
        key: str = "dataset",
        advice: str = "",
    ) -> "KeptRows":
        """Keep the rows for which ``reason(row)`` is None; log how many were left out and why. A row for
        which ``reason`` raises (a ``TuneError``, ``ValueError``, ``KeyError`` or ``TypeError``: the row
        cannot be made into an example) is an error; every row is scanned first, so the error lists the
        first few rows at fault and counts the rest.

        Raises:
            TuneError: a row that cannot be made into an example (``advice`` ends the message), or no row left.
        """
        dropped_rows: List[int] = []
        dropped: Dict[str, int] = {}
        problems: List[str] = []
        bad = 0
        for index, row in rows:
            try:
                why = reason(row)
            except (TuneError, ValueError, KeyError, TypeError) as err:
                bad += 1
                if len(problems) < _SHOWN_ROWS:
                    problems.append(f"row {index}: {_reason(err)}")
                continue
            if why is not None:
                dropped_rows.append(index)
                dropped[why] = dropped.get(why, 0) + 1
        if problems:
            more = f" (and {bad - len(problems)} more rows)" if bad > len(problems) else ""
            raise TuneError(
                f"{described} has rows that cannot be trained on: "
                + "; ".join(problems)
                + f"{more}. "
                + (advice or "Fix or drop those rows.")
            )
        kept = cls(total, dropped_rows, dropped)
        if dropped_rows:
            why = ", ".join(f"{n} {r}" for r, n in sorted(dropped.items()))
            if len(kept) == 0:
                raise TuneError(
                    f"{described} has nothing to learn in any row ({why}): with {key}.train_on_input=False the "
                    f"loss is on the replies only. Raise {key}.max_seq_len, or check the data's reply column."
                )
            more = len(dropped_rows) - _SHOWN_ROWS
            log.warning(
                "%s: %d of %d rows have nothing to learn and are left out (%s): rows %s%s.%s",
                key,
                len(dropped_rows),
                total,
                why,
                ", ".join(str(i) for i in dropped_rows[:_SHOWN_ROWS]),
                f" and {more} more" if more > 0 else "",
                f" A larger {key}.max_seq_len keeps the cut ones." if CUT_AWAY in dropped else "",
            )
        return kept


def _reason(err: BaseException) -> str:
    """How a row's error reads in a list of rows: the message of a ``TuneError`` or ``ValueError``, the
    kind and message of anything else (a ``KeyError`` alone would read as a bare column name)."""
    if isinstance(err, (TuneError, ValueError)) and str(err):
        return str(err)
    return f"{type(err).__name__}: {err}"


def is_hf_dataset(data: Any) -> bool:
    """Whether ``data`` is a Hugging Face ``datasets.Dataset`` (an Arrow table), not a list of rows."""
    return hasattr(data, "column_names") and hasattr(data, "select_columns")


def data_columns(data: Any) -> List[str]:
    """The column names of ``data``: a ``datasets.Dataset``'s, or the keys of a list's first row."""
    if is_hf_dataset(data):
        return list(data.column_names)
    first = next(iter(data), None) if len(data) else None
    return list(first) if isinstance(first, Mapping) else []


def column_batches(data: Any, columns: Optional[List[str]] = None) -> Iterable[Tuple[int, Dict[str, Any]]]:
    """``(index, row)`` of ``columns`` (None: every column); a ``datasets.Dataset`` is read a thousand rows at
    a time (bounded memory for any size), a list of rows as it is."""
    if not is_hf_dataset(data):
        for index, row in enumerate(data):
            yield index, (dict(row) if columns is None else {c: row.get(c) for c in columns})
        return
    columns = list(data.column_names) if columns is None else columns
    if not columns:
        for index in range(len(data)):
            yield index, {}
        return
    view = data.select_columns(columns)
    for start in range(0, len(view), _BATCH):
        batch = view[start : start + _BATCH]
        for offset in range(len(batch[columns[0]])):
            yield start + offset, {c: batch[c][offset] for c in columns}


def check_text_columns(data: Any, required: List[str], optional: List[str], described: str) -> None:
    """Every value of the ``required`` columns is text, and every non-null value of the ``optional`` ones,
    in every row; a string column's nulls are counted by Arrow without reading the rows.

    Raises:
        TuneError: one paragraph naming each column at fault, how many rows and the first of them.
    """
    problems: List[str] = []
    arrow = is_hf_dataset(data)
    available = data_columns(data)
    for column in dict.fromkeys([*required, *optional]):
        if column not in available:
            continue
        may_be_null = column not in required
        dtype = _arrow_dtype(data, column) if arrow else None
        if dtype == "null":
            if not may_be_null:
                problems.append(f"column '{column}' is null in every row")
            continue
        if dtype in ("string", "large_string"):
            if may_be_null:
                continue
            import pyarrow.compute as pc

            nulls = pc.is_null(data.data.column(column)).combine_chunks()
            if nulls.true_count:
                rows = pc.indices_nonzero(nulls).to_pylist()
                problems.append(_rows_message(column, rows, "is null"))
            continue
        bad: List[int] = []
        first: Any = None
        for index, row in column_batches(data, [column]):
            value = row[column]
            if not isinstance(value, str) and not (may_be_null and value is None):
                bad.append(index)
                first = value if first is None else first
        if bad:
            problems.append(_rows_message(column, bad, f"is not text (row {bad[0]}: {first!r})"))
    if problems:
        raise TuneError(
            f"{described} has fields that are not text: "
            + "; ".join(problems)
            + ". Training would turn a null into the text 'None' and a number into its digits: fill those "
            "fields, drop those rows, or map the template field to another column (dataset.column_map)."
        )


def _arrow_dtype(data: Any, column: str) -> Optional[str]:
    """The Arrow type of a plain column (``string``, ``null``, ``int64`` ...), None for nested ones."""
    import datasets

    feature = data.features[column]
    return feature.dtype if isinstance(feature, datasets.Value) else None


def _rows_message(column: str, rows: List[int], what: str) -> str:
    shown = ", ".join(str(r) for r in rows[:_SHOWN_ROWS]) + (" ..." if len(rows) > _SHOWN_ROWS else "")
    return f"column '{column}' {what} in {len(rows)} row(s) (row {shown})"

"""The columns a message transform reads, checked against the data's: a missing column or a ``column_map``
key that no field uses is one error that shows the ``column_map`` to set, with a column of the data for
each missing field."""

from __future__ import annotations

import difflib
from typing import Any, Dict, List, Mapping, Optional, Sequence

from torchtune._errors import TuneError
from torchtune.datasets._rows import TextColumns

# Column names datasets commonly use for a field, best first.
_COLUMN_SYNONYMS = {
    "instruction": ("prompt", "question", "query", "instruct"),
    "input": ("context", "inputs", "prompt", "question"),
    "output": ("response", "answer", "completion", "target", "outputs", "label"),
}


class FieldColumns:
    """A ``RowCheck.columns`` for a message transform that reads named fields of a row: each field is the
    column of that name, or the one ``column_map`` maps it to.

    Args:
        fields: the fields every row needs (text).
        optional: the fields a row may lack or hold null in (Alpaca's ``input``).
        column_map: ``{field: column}``.
        reader: how errors name what reads the fields (``"template 'AlpacaInstructTemplate'"``).
    """

    def __init__(
        self,
        fields: Sequence[str],
        optional: Sequence[str] = (),
        column_map: Optional[Mapping[str, str]] = None,
        reader: str = "the dataset",
    ) -> None:
        self.fields = list(fields)
        self.optional = list(optional)
        self.column_map = dict(column_map or {})
        self.reader = reader

    def column(self, field: str) -> str:
        """The data's column of ``field``."""
        return self.column_map.get(field, field)

    def __call__(self, available: List[str], described: str) -> TextColumns:
        self.check(available, described)
        return TextColumns(tuple(self.column(f) for f in self.fields), tuple(self.column(f) for f in self.optional))

    def check(self, available: List[str], described: str) -> None:
        """Raise a ``TuneError`` when a field's column is missing or ``column_map`` names an unknown field."""
        missing = [f for f in self.fields if self.column(f) not in available]
        known = self.fields + self.optional
        unknown_keys = [k for k in self.column_map if k not in known]
        if unknown_keys:
            raise TuneError(
                f"dataset.column_map has key(s) {_names(unknown_keys)} that {self.reader} does not use; its fields "
                f"are {_names(known)}. column_map maps a field to a dataset column: {{field: column}}."
            )
        if not missing:
            return
        # Suggest a column of the data for each missing field, among those no field reads yet (an optional
        # field such as Alpaca's input reads its column when the data has it).
        used = {self.column(f) for f in known if f not in missing and self.column(f) in available}
        spare = [c for c in available if c not in used]
        pairs = dict(self.column_map)
        for field in missing:
            pairs[field] = _likely_column(field, spare)
            if pairs[field] in spare:
                spare.remove(pairs[field])
        example = "{" + ", ".join(f"{k}: {v}" for k, v in pairs.items()) + "}"
        raise TuneError(
            f"{described} has no column(s) {_names([self.column(f) for f in missing])}, which {self.reader} "
            f"needs (its fields: {_names(self.fields)}). The dataset's columns are {_names(available)}. Map each "
            f"field to one of your columns with dataset.column_map, e.g. in YAML `dataset: {{column_map: "
            f"{example}}}` or on the command line +dataset.column_map='{example}' (the + adds the key when the "
            "config has none)."
        )


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


def as_column_map(column_map: Any) -> Optional[Dict[str, str]]:
    """``column_map`` as a dict (None stays None); the command line's spelling arrives as the text
    ``'{instruction: prompt}'``, which is read as YAML.

    Raises:
        TuneError: text that is not a mapping, or a value that is not one.
    """
    if column_map is None:
        return None
    if isinstance(column_map, str):
        import yaml

        try:
            column_map = yaml.safe_load(column_map)
        except yaml.YAMLError as err:
            raise TuneError(
                f"dataset.column_map {column_map!r} is not a mapping such as '{{instruction: prompt, output: answer}}'."
            ) from err
    if not hasattr(column_map, "items"):
        raise TuneError(
            f"dataset.column_map must map fields to dataset columns, such as {{instruction: prompt, output: "
            f"answer}}; got {column_map!r}."
        )
    return {str(k): str(v) for k, v in column_map.items()}


def _names(names: Sequence[str]) -> str:
    return ", ".join(f"'{n}'" for n in names) if names else "(none)"

"""``datasets.load_dataset`` with user-facing errors.

The checks run before (missing files, empty files) and around (parse errors, hub access) the call,
because ``datasets`` reports these as ``StopIteration``, ``DatasetGenerationError`` or a retrying
``ConnectionError`` that do not say which config key to change.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any, Callable, List, Optional

from torchtune._assets import missing_path_hint
from torchtune._errors import TuneError
from torchtune._quiet import quiet_datasets

# Builders that read local files given as data_files.
_FILE_BUILDERS = {"json", "csv", "parquet", "text", "arrow"}
_SUFFIX_TO_BUILDER = {
    ".json": "json",
    ".jsonl": "json",
    ".csv": "csv",
    ".parquet": "parquet",
    ".txt": "text",
    ".arrow": "arrow",
}
_LOCAL_HINT = "To use local files, set dataset.source=json (or csv, parquet) and dataset.data_files=/path/to/data.json."


def load_hf_dataset(source: str, split: str = "train", **load_dataset_kwargs: Any):
    """``datasets.load_dataset(source, split=split, **load_dataset_kwargs)`` that raises ``TuneError``
    naming the file or config key at fault. A path to a single data file as ``source`` is read with
    the matching builder (``data/train.jsonl`` -> ``json`` with ``data_files``)."""
    source = os.fspath(source)
    suffix = Path(source).suffix.lower()
    if suffix in _SUFFIX_TO_BUILDER and load_dataset_kwargs.get("data_files") is not None:
        exists = "" if Path(source).expanduser().is_file() else f" ('{source}' does not exist either)"
        raise TuneError(
            f"dataset.source='{source}' names a data file, and dataset.data_files="
            f"{load_dataset_kwargs['data_files']!r} names data too: which to read is unclear{exists}. Name the file "
            f"once: dataset.source={source} with ~dataset.data_files (deletes the key), or "
            f"dataset.source={_SUFFIX_TO_BUILDER[suffix]} dataset.data_files={source}."
        )
    if suffix in _SUFFIX_TO_BUILDER and "data_files" not in load_dataset_kwargs:
        if not Path(source).expanduser().is_file():
            raise TuneError(
                f"The dataset file '{source}' (config key dataset.source) does not exist.{missing_path_hint(source)} "
                f"Fix the path, or name a Hugging Face Hub dataset. {_LOCAL_HINT}"
            )
        load_dataset_kwargs["data_files"] = str(Path(source).expanduser())
        source = _SUFFIX_TO_BUILDER[suffix]

    files = _check_data_files(load_dataset_kwargs.get("data_files"))
    if source in _FILE_BUILDERS and not files and not load_dataset_kwargs.get("data_dir"):
        raise TuneError(
            f"dataset.source={source} reads local files, but dataset.data_files is not set. "
            f"Set it: +dataset.data_files=/path/to/data.{source} (the + adds the key the config lacks)."
        )

    import datasets  # deferred: importing `datasets` takes seconds and isn't needed to import torchtune

    where = (
        f"the data file(s) {', '.join(repr(f) for f in files)} (config key dataset.data_files)"
        if files
        else f"dataset.source='{source}'"
    )
    try:
        with quiet_datasets():
            dataset = datasets.load_dataset(source, split=split, **load_dataset_kwargs)
    except TuneError:
        raise
    except (ConnectionError, TimeoutError) as err:
        raise TuneError(
            f"Could not load dataset '{source}' (config key dataset.source) from the Hugging Face Hub: "
            f"{_describe(err)}. This machine seems to have no network or Hub access (or offline mode is "
            f"on: HF_HUB_OFFLINE / HF_DATASETS_OFFLINE). Download the dataset where there is network, "
            f"or use local files. {_LOCAL_HINT}"
        ) from err
    except FileNotFoundError as err:
        if files:
            raise TuneError(f"Could not read {where}: {_describe(err)}.") from err
        raise TuneError(
            f"Dataset '{source}' (config key dataset.source) was not found locally or on the Hugging "
            f"Face Hub: {_describe(err)}. Check the name (e.g. tatsu-lab/alpaca). {_LOCAL_HINT}"
        ) from err
    except ValueError as err:
        if "corresponds to no data" in str(err):
            raise TuneError(
                f"{where[0].upper() + where[1:]} gave 0 rows for split '{split}'. Point it at "
                "a file with data (JSON: a list of objects, or one object per line)."
            ) from err
        if "split" in str(err).lower() or "Unknown split" in str(err):
            raise TuneError(
                f"Dataset '{source}' has no split '{split}' (config key dataset.split): {_describe(err)}."
            ) from err
        raise TuneError(f"Could not load {where}: {_describe(err)}.") from err
    except Exception as err:  # datasets wraps parse errors in DatasetGenerationError, StopIteration, ...
        if isinstance(err, datasets.exceptions.DatasetNotFoundError):
            raise TuneError(
                f"Dataset '{source}' (config key dataset.source) was not found on the Hugging Face Hub or "
                f"could not be reached: {_describe(err)}. Check the name, and network access. "
                f"{_LOCAL_HINT}"
            ) from err
        raise TuneError(
            f"Could not load {where}: it is malformed or not in the format of dataset.source='{source}' "
            f"({_describe(err)}). Fix the file, or set dataset.source to its format (json, csv, parquet)."
        ) from err
    if isinstance(dataset, (datasets.DatasetDict, datasets.IterableDatasetDict)):
        raise TuneError(
            f"Loading {where} returned several splits ({', '.join(dataset)}); set dataset.split to one of them."
        )
    if isinstance(dataset, datasets.IterableDataset):
        raise TuneError(
            f"{where} was loaded as a streaming dataset; remove dataset.streaming, a dataset here needs its length."
        )
    if len(dataset) == 0:
        raise TuneError(
            f"{where[0].upper() + where[1:]} gave 0 rows for split '{split}'. "
            "Point it at a file with data (JSON: a list of objects, or one object per line)."
        )
    return dataset


def load_dataset(source: str, split: str = "train", **load_dataset_kwargs: Any):
    """What the datasets of this package load their data with: ``load_hf_dataset``, with every column of a
    CSV file read as text. CSV has no types, but the CSV reader guesses them, so an answer column of ``4``
    and ``3`` would arrive as numbers (and an answer ``3.50`` as ``3.5``). Other formats keep their types
    (a JSON number is a number)."""
    data = load_hf_dataset(source, split=split, **load_dataset_kwargs)
    if getattr(data.info, "builder_name", None) != "csv" or "features" in load_dataset_kwargs:
        return data
    import datasets

    if all(getattr(f, "dtype", None) in ("string", "large_string") for f in data.features.values()):
        return data
    text = datasets.Features({column: datasets.Value("string") for column in data.column_names})
    return load_hf_dataset(source, split=split, features=text, **load_dataset_kwargs)


def filter_rows(data: Any, filter_fn: Callable[[Any], bool]) -> Any:
    """The rows of ``data`` that ``filter_fn`` keeps: ``datasets.Dataset.filter`` (cached as ``datasets``
    caches a map), or a list of the rows of data built in memory."""
    if hasattr(data, "filter"):
        with quiet_datasets():
            return data.filter(filter_fn)
    return [row for row in data if filter_fn(row)]


def describe_source(source: str, data_files: Any = None) -> str:
    """How errors name a dataset: its local files if any, else its source."""
    if data_files is not None:
        files = (
            [data_files]
            if isinstance(data_files, (str, os.PathLike))
            else (
                [f for v in data_files.values() for f in ([v] if isinstance(v, (str, os.PathLike)) else v)]
                if hasattr(data_files, "items")
                else list(data_files)
            )
        )
        return f"The data in {', '.join(repr(os.fspath(f)) for f in files)}"
    if Path(os.fspath(source)).suffix.lower() in _SUFFIX_TO_BUILDER:
        return f"The data in '{os.fspath(source)}'"
    return f"Dataset '{source}'"


def _check_data_files(data_files: Any) -> List[str]:
    """Every local path in ``data_files`` (a string, list, or {split: files}) that matches no file, or
    an empty file, is an error naming it; returns the local paths."""
    if data_files is None:
        return []
    if isinstance(data_files, (str, os.PathLike)):
        entries = [os.fspath(data_files)]
    elif isinstance(data_files, dict) or hasattr(data_files, "items"):
        entries = []
        for value in data_files.values():
            entries += [os.fspath(value)] if isinstance(value, (str, os.PathLike)) else [os.fspath(v) for v in value]
    else:
        entries = [os.fspath(v) for v in data_files]
    local = []
    for entry in entries:
        if "://" in entry or entry.startswith("hf:"):
            continue  # remote: datasets reports it
        pattern = os.path.expanduser(entry)
        matches = glob.glob(pattern) if glob.has_magic(pattern) else [pattern]
        existing = [m for m in matches if os.path.isfile(m)]
        if not existing:
            raise TuneError(
                f"The data file '{entry}' (config key dataset.data_files) does not exist."
                f"{missing_path_hint(entry) or ''} Fix the path."
            )
        for m in existing:
            if _is_blank(m):
                raise TuneError(
                    f"The data file '{m}' (config key dataset.data_files) is empty. "
                    "Point dataset.data_files at a file with data."
                )
        local += existing
    return local


def _is_blank(path: str) -> bool:
    size = os.path.getsize(path)
    if size == 0:
        return True
    if size > 4096:
        return False
    with open(path, "rb") as f:
        return f.read().strip() == b""


def _describe(err: BaseException) -> str:
    """The messages of ``err`` and its causes, which carry the parser's detail (line, column)."""
    parts: List[str] = []
    seen = set()
    current: Optional[BaseException] = err
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        text = str(current).strip() or type(current).__name__
        if text not in parts:
            parts.append(text if str(current).strip() else f"{type(current).__name__} (no message)")
        current = current.__cause__ or current.__context__
    return "; ".join(parts)

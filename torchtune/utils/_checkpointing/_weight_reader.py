"""Reading a checkpoint's weights one tensor (or one row range of a tensor) at a time.

A sharded load must not hold the whole model in any process: each rank asks for the rows of its
shards, tensor after tensor. A :class:`WeightReader` knows every tensor's torchtune name and full
shape before reading any of them (from the files' headers), and ``read`` returns only the rows asked
for, already in torchtune's layout. Safetensors files are memory-mapped for one read at a time, so
the pages of a tensor leave the process once its rows are copied out.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, Mapping, Optional, Protocol, Tuple

import torch

from torchtune._errors import TuneError
from torchtune.models.llama2._convert_weights import RowSource


class WeightReader(Protocol):
    """What a sharded load needs from a checkpoint."""

    shapes: Dict[str, torch.Size]  # torchtune name -> full shape, known before any weight is read

    def read(self, key: str, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        """Rows ``start:stop`` of tensor ``key`` on the host (possibly a view of a mapped file: copy it)."""


class StateDictReader:
    """A :class:`WeightReader` over a state dict already in torchtune names (in memory or memory-mapped)."""

    def __init__(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        self._state_dict = state_dict
        self.shapes = {k: v.shape for k, v in state_dict.items()}

    def read(self, key: str, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        tensor = self._state_dict[key]
        return tensor if tensor.dim() == 0 else tensor[start:stop]


@contextlib.contextmanager
def open_safetensors(path: Path) -> Iterator[Any]:
    """``safetensors.safe_open(path)`` (a memory map, unmapped on exit) with damaged files as ``TuneError``."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt", device="cpu") as f:
            yield f
    except (SafetensorError, OSError) as exc:
        raise TuneError(
            f"{path} could not be read as a safetensors file (truncated or corrupt?): {exc}. "
            f"Check checkpointer.checkpoint_files."
        ) from exc


def safetensors_shapes(path: Path) -> Dict[str, torch.Size]:
    """``{name: shape}`` of a safetensors file, from its header alone."""
    with open_safetensors(path) as f:
        return {key: torch.Size(f.get_slice(key).get_shape()) for key in f.keys()}


class FileReader:
    """A :class:`WeightReader` over the weight files of a folder.

    Args:
        folder: the checkpoint folder.
        sources: ``{torchtune name: (file name, RowSource)}``.
        hf_shapes: ``{stored name: shape}`` of the tensors the sources point at.
        load_file: for files that are not safetensors, ``path -> {stored name: tensor}`` (memory-mapped;
            each such file is loaded once and kept while the reader lives).
        on_error: called with the ``TuneError`` of a damaged file before it is raised (checksums).
    """

    def __init__(
        self,
        folder: Path,
        sources: Dict[str, Tuple[str, RowSource]],
        hf_shapes: Mapping[str, torch.Size],
        load_file: Optional[Callable[[Path], Dict[str, torch.Tensor]]] = None,
        on_error: Optional[Callable[[TuneError], None]] = None,
    ) -> None:
        self._folder = folder
        self._sources = sources
        self._load_file = load_file
        self._on_error = on_error
        self._loaded: Dict[str, Dict[str, torch.Tensor]] = {}
        self.shapes = {
            key: torch.Size((source.rows, *hf_shapes[source.hf_key][1:]))
            if len(hf_shapes[source.hf_key])
            else hf_shapes[source.hf_key]
            for key, (_, source) in sources.items()
        }

    def read(self, key: str, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        name, source = self._sources[key]
        path = self._folder / name
        try:
            if self._load_file is None:
                with open_safetensors(path) as f:
                    return source.read(f.get_slice(source.hf_key), start, stop)
            if name not in self._loaded:
                self._loaded[name] = self._load_file(path)
            return source.read(self._loaded[name][source.hf_key], start, stop)
        except TuneError as exc:
            if self._on_error is not None:
                self._on_error(exc)
            raise

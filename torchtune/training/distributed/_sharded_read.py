"""The model weights of a distributed ``step_N`` folder, read on one process without a process group.

``full_finetune_distributed`` writes its step checkpoints with torch.distributed.checkpoint (DCP):
every rank's shards of the weights and of the optimizer state, in ``sharded_state/``, keyed by
torchtune parameter names (``model.layers.0.attn.q_proj.weight``). DCP stores each tensor with its
global shape, so one process can read whole tensors back (``dcp.load(..., no_dist=True)``); a read
touches only the byte ranges of the tensors asked for, never the optimizer state beside them.
``ShardedModelReader`` reads any subset of the weights at a time (``tune export`` reads one tensor
at a time, so a 70B export needs host memory for a few tensors, not the model); ``load_sharded_model``
reads them all (``eleuther_eval``, which needs the whole model anyway).

The files are checked against the folder's ``manifest.json`` (sizes and checksums) before anything
is read: a damaged shard is named, never loaded.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Tuple

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from torchtune._errors import TuneError
from torchtune.training.distributed._checkpoint import SHARDED_STATE_DIR, _cause
from torchtune.utils._checkpointing._manifest import (
    _CORRUPTED,
    MANIFEST_NAME,
    _matches,
    _size_problem,
    previous_checkpoint,
    read_manifest,
)

__all__ = ["ShardedModelReader", "check_checkpoint_files", "holds_only_sharded_weights", "load_sharded_model"]

# The model's entries in the DCP folder: the recipe saves {"model": ..., "optimizer": ...}, flattened.
MODEL_PREFIX = "model."
# Weight files a folder may hold beside its sharded state (an epoch_N of the distributed recipe).
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pth")


def holds_only_sharded_weights(folder: Path) -> bool:
    """Whether ``folder`` is a distributed ``step_N``: sharded state and no weight files (an ``epoch_N``
    of the distributed recipe has both, and its weight files are read as any other folder's)."""
    folder = Path(folder)
    if not (folder / SHARDED_STATE_DIR / ".metadata").is_file():
        return False
    return not any(p.is_file() and p.name.endswith(_WEIGHT_SUFFIXES) for p in folder.iterdir())


def _other_checkpoint_hint(folder: Path) -> str:
    previous = previous_checkpoint(folder)
    if previous is not None:
        return f"Use the checkpoint saved before it, {previous}, or another step_N / epoch_N folder of the run."
    return "Use another step_N / epoch_N folder of the run (a later save, or the final epoch_N)."


def check_checkpoint_files(folder: Path, wanted: Callable[[str], bool]) -> Dict[str, Any]:
    """Check the sizes and checksums of the files of ``folder``'s manifest that ``wanted`` selects (the
    ones about to be read); returns the manifest.

    Raises:
        TuneError: no manifest (an unfinished save or an incomplete copy), or a file missing, truncated or
            corrupted; naming the file and the checkpoint to use instead.
    """
    manifest = read_manifest(folder)
    if manifest is None:
        raise TuneError(
            f"{folder} has no {MANIFEST_NAME}, which every checkpoint folder of this library ends with: it is an "
            "unfinished save or an incomplete copy, so its files cannot be checked. " + _other_checkpoint_hint(folder)
        )
    for name, entry in sorted(manifest["files"].items()):
        if not wanted(name):
            continue
        path = folder / name
        problem = _size_problem(path, entry)
        if problem is None and not _matches(path, entry):
            problem = _CORRUPTED
        if problem is not None:
            raise TuneError(
                f"Checkpoint file {path} {problem}, so {folder} cannot be read. " + _other_checkpoint_hint(folder)
            )
    return manifest


class _MetadataOnceReader(FileSystemReader):
    """A ``FileSystemReader`` that unpickles ``.metadata`` once: a read per tensor would otherwise parse
    the metadata of every tensor and optimizer state entry again for each one."""

    def __init__(self, path: Path) -> None:
        super().__init__(str(path))
        self._metadata = None

    def read_metadata(self, *args: Any, **kwargs: Any):
        if self._metadata is None:
            self._metadata = super().read_metadata(*args, **kwargs)
        return self._metadata


class ShardedModelReader:
    """Reads the model weights of a distributed ``step_N`` folder on this one process.

    Args:
        folder: the ``step_N`` folder (the one holding ``sharded_state/`` and ``manifest.json``).

    Raises:
        TuneError: the folder has no sharded state or no manifest, a shard is missing, truncated or
            corrupted (checked against ``manifest.json``), or the metadata holds no model weights;
            each names the folder and what to use instead.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        sharded = self.folder / SHARDED_STATE_DIR
        if not (sharded / ".metadata").is_file():
            raise TuneError(
                f"{self.folder} has no sharded model state ({SHARDED_STATE_DIR}/.metadata), so it is not a step "
                "checkpoint of full_finetune_distributed. Pass a step_N or epoch_N folder that a run wrote."
            )
        check_checkpoint_files(self.folder, lambda name: name.startswith(f"{SHARDED_STATE_DIR}/"))
        self._reader = _MetadataOnceReader(sharded)
        try:
            metadata = self._reader.read_metadata()
        except Exception as exc:  # noqa: BLE001 - a damaged pickle raises anything; the files matched the manifest
            raise TuneError(
                f"{sharded / '.metadata'} could not be read ({type(exc).__name__}: {exc}). "
                + _other_checkpoint_hint(self.folder)
            ) from exc
        self.specs: Dict[str, Tuple[torch.dtype, torch.Size]] = {
            fqn[len(MODEL_PREFIX) :]: (meta.properties.dtype, meta.size)
            for fqn, meta in metadata.state_dict_metadata.items()
            if fqn.startswith(MODEL_PREFIX) and isinstance(meta, TensorStorageMetadata)
        }
        if not self.specs:
            raise TuneError(
                f"{sharded} holds no model weights (no '{MODEL_PREFIX}*' entries), so it was not written by "
                "full_finetune_distributed. " + _other_checkpoint_hint(self.folder)
            )

    def read(self, names: Iterable[str]) -> Dict[str, torch.Tensor]:
        """The full tensors ``names`` (torchtune names, as in :attr:`specs`), on the host in their saved dtype."""
        state = {f"{MODEL_PREFIX}{n}": torch.empty(self.specs[n][1], dtype=self.specs[n][0]) for n in names}
        try:
            with warnings.catch_warnings():
                # DCP warns that it loads in one process, which is what no_dist asks for
                warnings.filterwarnings("ignore", message="torch.distributed is disabled")
                dcp.load(state, storage_reader=self._reader, no_dist=True)
        except (Exception, CheckpointException) as exc:  # DCP's own errors are BaseExceptions
            raise TuneError(
                f"Reading the model weights from {self.folder / SHARDED_STATE_DIR} failed ({_cause(exc)}). "
                + _other_checkpoint_hint(self.folder)
            ) from exc
        return {name[len(MODEL_PREFIX) :]: tensor for name, tensor in state.items()}


def load_sharded_model(folder: Path) -> Dict[str, torch.Tensor]:
    """Every model weight of the distributed ``step_N`` folder ``folder`` (torchtune names), on the host.

    Raises:
        TuneError: as :class:`ShardedModelReader`.
    """
    reader = ShardedModelReader(folder)
    return reader.read(reader.specs)

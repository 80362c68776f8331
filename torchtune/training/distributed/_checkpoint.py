"""Resumable checkpoints of a sharded run: torch.distributed.checkpoint (DCP), written atomically.

Every rank writes its own shards of the weights and of the optimizer state in parallel
(``dcp.save``), so a 70B save does not funnel through one process; the optimizer state is keyed by
parameter name (``torch.distributed.checkpoint.state_dict``), in both optimizer modes. DCP stores
each tensor with its global shape, so a checkpoint saved by N processes loads into M: resume on
another world size reshards on load.

A folder becomes visible only when complete, as the single-device saves do
(``torchtune/utils/_checkpointing/_atomic.py``): rank 0 creates ``.tmp-<name>-<pid>`` next to the
destination, all ranks write into it, each hashes its own files for the manifest, rank 0 adds
``recipe_state.pt`` (and, for epoch checkpoints, the full HF weights) and the manifest, and renames
the folder into place. A process killed at any point leaves the previous checkpoint as it was.
``ShardedCheckpointWriter`` can write step checkpoints in the background (``dcp.async_save``).
"""

from __future__ import annotations

import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor
from torch.optim import Optimizer

from torchtune._errors import TuneError
from torchtune.training.distributed._fsdp import DistributedInfo, raise_if_any_rank_failed
from torchtune.utils._checkpointing._atomic import (
    TMP_PREFIX,
    clean_leftovers,
    fsync_dir,
    fsync_file,
    move_into_place,
)
from torchtune.utils._checkpointing._checkpoint_utils import OptimInBackwardWrapper, configured_hyperparameters_kept
from torchtune.utils._checkpointing._manifest import (
    HASH_NAME,
    MANIFEST_FORMAT_VERSION,
    MANIFEST_NAME,
    RECIPE_STATE_NAME,
    file_digest,
    previous_checkpoint,
    read_manifest,
    verify_manifest,
)

__all__ = [
    "SHARDED_STATE_DIR",
    "SHARDED_STATE_MARKER",
    "ShardedCheckpointWriter",
    "load_sharded_checkpoint",
    "save_sharded_checkpoint",
]

# The DCP folder inside a checkpoint folder, and what recipe_state.pt holds instead of the optimizer state.
SHARDED_STATE_DIR = "sharded_state"
SHARDED_STATE_MARKER = {"saved_with": "torch.distributed.checkpoint", "folder": SHARDED_STATE_DIR}


# What a failed DCP call raises: its own errors come as CheckpointException, a BaseException (it
# escapes ``except Exception``), raised on every rank with the failures of all ranks.
_SAVE_LOAD_ERRORS = (Exception, CheckpointException)


def _cause(exc: BaseException) -> str:
    """One line per distinct cause: CheckpointException's text is a traceback per rank."""
    if isinstance(exc, CheckpointException):
        causes = {f"{type(e).__name__}: {e}" for e, _ in exc.failures.values()}
        return "; ".join(sorted(causes))
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, TuneError) else str(exc)


def _resume_hint(folder: Path) -> str:
    """What to point ``checkpointer.recipe_checkpoint`` at instead of ``folder``."""
    previous = previous_checkpoint(folder)
    if previous is not None and (previous / RECIPE_STATE_NAME).is_file():
        return f"Point checkpointer.recipe_checkpoint at {previous / RECIPE_STATE_NAME} (the checkpoint before)."
    return (
        f"Point checkpointer.recipe_checkpoint at the {RECIPE_STATE_NAME} of another step_N or epoch_N folder of "
        "this distributed run, or start from the base weights with resume_from_checkpoint=False."
    )


def _optimizers(optimizer: Optimizer) -> List[Optimizer]:
    if isinstance(optimizer, OptimInBackwardWrapper):
        # one optimizer may hold several parameters (optimizer_in_bwd_group: layer): each once
        return list({id(opt): opt for opt in optimizer.optim_map.values()}.values())
    return [optimizer]


def _state(model: nn.Module, optimizer: Optimizer) -> Dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, _optimizers(optimizer))
    return {"model": model_sd, "optimizer": optim_sd}


def _own_files(folder: Path, rank: int) -> Dict[str, Dict[str, Any]]:
    """Size and checksum of the files this rank wrote (DCP names them ``__<rank>_<n>.distcp``; rank 0
    also writes ``.metadata``), each fsynced."""
    entries = {}
    for path in sorted((folder / SHARDED_STATE_DIR).iterdir()):
        if path.name.startswith(f"__{rank}_") or (rank == 0 and not path.name.startswith("__")):
            fsync_file(path)
            entries[path.relative_to(folder).as_posix()] = {"size": path.stat().st_size, HASH_NAME: file_digest(path)}
    return entries


def _to_host(value: Any) -> Any:
    """A copy of a state dict with every tensor copied to host memory; DTensors stay DTensors of the
    same mesh and placements (what DCP's own staging does), so the save keeps the sharding metadata."""
    if isinstance(value, DTensor):
        local = value.to_local().detach().to("cpu", copy=True)
        # the constructor, not from_local: from_local would move the copy back to the mesh's device
        return DTensor(local, value._spec, requires_grad=False)
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: _to_host(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_to_host(v) for v in value]
    return value


def _broadcast(value: Any, info: DistributedInfo) -> Any:
    if info.world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, group=info.cpu_group)
    return box[0]


@dataclass
class _Publish:
    """What rank 0 needs to finish a save once every rank's shards are written."""

    tmp: Path
    destination: Path
    recipe_state: Dict[str, Any]
    step: int
    epoch: int
    intermediate: bool
    hashed: Optional[Mapping[str, str]] = None  # checksums of files written while hashing (rank 0)
    future: Optional[Future] = None  # an async save's background write


class ShardedCheckpointWriter:
    """Writes sharded checkpoints (:func:`save_sharded_checkpoint`), also in the background.

    With ``async_save=True`` a step save returns once this rank's shards are copied to host memory;
    ``dcp.save`` writes them from a background thread while training goes on, on a gloo group of
    their own (the training's collectives never interleave with the save's). The
    folder is published -- hashed, manifest written, renamed into place -- by :meth:`finish`, which
    the next save, the end of training and a stop call first: at most one save is in flight, and it
    costs host memory for one copy of this rank's shards of the weights and optimizer state.
    Created on every rank at the same point of the run (creating the group is a collective).
    """

    def __init__(self, info: DistributedInfo, *, async_save: bool = False) -> None:
        self.info = info
        self.async_save = async_save
        self._group = dist.new_group(backend="gloo") if async_save else None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint") if async_save else None
        self._pending: Optional[_Publish] = None

    @property
    def pending(self) -> Optional[Path]:
        """The folder of the save in flight (not yet loadable), if any."""
        return None if self._pending is None else self._pending.destination

    def save(
        self,
        destination: Path,
        *,
        model: nn.Module,
        optimizer: Optimizer,
        recipe_state: Dict[str, Any],
        step: int,
        epoch: int,
        intermediate: bool,
        write_weights: Optional[Callable[[Path], Optional[Mapping[str, str]]]] = None,
        background: bool = False,
    ) -> Path:
        """Save into ``destination``, published now, or by :meth:`finish` when ``background`` (and the
        writer was made with ``async_save``). Arguments as :func:`save_sharded_checkpoint`."""
        self.finish()
        info = self.info
        destination = Path(destination)
        tmp: Optional[Path] = None
        error: Optional[BaseException] = None
        if info.is_rank_zero:
            try:
                destination.parent.mkdir(parents=True, exist_ok=True)
                clean_leftovers(destination.parent)
                tmp = destination.parent / f"{TMP_PREFIX}{destination.name}-{os.getpid()}"
                tmp.mkdir()
            except OSError as exc:
                error = exc
        raise_if_any_rank_failed(error, info, f"Creating the checkpoint folder {destination}")
        job = _Publish(Path(_broadcast(str(tmp), info)), destination, recipe_state, step, epoch, intermediate)
        sharded = str(job.tmp / SHARDED_STATE_DIR)
        try:
            if background and self.async_save:
                # a host copy of this rank's shards, taken now (training changes them in place next),
                # written by a thread on the checkpoint group
                staged = _to_host(_state(model, optimizer))
                job.future = self._executor.submit(dcp.save, staged, checkpoint_id=sharded, process_group=self._group)
            else:
                dcp.save(_state(model, optimizer), checkpoint_id=sharded)
        except _SAVE_LOAD_ERRORS as exc:  # every rank must learn of it, or the others wait forever
            error = TuneError(_cause(exc))
        raise_if_any_rank_failed(error, info, f"Writing the sharded checkpoint {destination}")
        if write_weights is not None:
            job.hashed = write_weights(job.tmp)  # every rank: the full tensors are gathered one at a time
        self._pending = job
        if job.future is None:
            self.finish()
        return destination

    def finish(self) -> Optional[Path]:
        """Wait for the save in flight (if any) and publish it; a collective. Returns its folder.

        Raises:
            TuneError (``RankErrors``): on every rank when any rank failed; the previous checkpoint is kept.
        """
        job, self._pending = self._pending, None
        if job is None:
            return None
        info = self.info
        error: Optional[BaseException] = None
        try:
            if job.future is not None:
                job.future.result()
            entries = _own_files(job.tmp, info.rank)
        except _SAVE_LOAD_ERRORS as exc:  # every rank must learn of it
            error, entries = TuneError(_cause(exc)), {}
        raise_if_any_rank_failed(error, info, f"Writing the sharded checkpoint {job.destination}")
        gathered: List[Any] = [entries]
        if info.world_size > 1:
            gathered = [None] * info.world_size
            dist.gather_object(entries, gathered if info.is_rank_zero else None, dst=0, group=info.cpu_group)
        if info.is_rank_zero:
            try:
                _publish(job, gathered, info.world_size)
            except (OSError, TuneError) as exc:
                error = exc
        raise_if_any_rank_failed(error, info, f"Publishing the checkpoint {job.destination}")
        return job.destination


def _publish(job: _Publish, gathered: List[Dict[str, Any]], world_size: int) -> None:
    """Rank 0: recipe state and its own files into the folder, the manifest last, then the rename."""
    tmp = job.tmp
    torch.save(job.recipe_state, tmp / RECIPE_STATE_NAME)
    hashed = dict(job.hashed or {})
    files: Dict[str, Any] = {}
    for part in gathered:
        files.update(part)
    for path in sorted(p for p in tmp.rglob("*") if p.is_file()):
        name = path.relative_to(tmp).as_posix()
        if name not in files:
            fsync_file(path)
            files[name] = {"size": path.stat().st_size, HASH_NAME: hashed.get(name) or file_digest(path)}
    manifest = {
        "format_version": MANIFEST_FORMAT_VERSION,
        "step": job.step,
        "epoch": job.epoch,
        "intermediate": job.intermediate,
        "world_size": world_size,
        "files": dict(sorted(files.items())),
    }
    with open(tmp / MANIFEST_NAME, "w") as f:
        json.dump(manifest, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(tmp / SHARDED_STATE_DIR)
    fsync_dir(tmp)
    move_into_place(tmp, job.destination)


def save_sharded_checkpoint(
    destination: Path,
    *,
    model: nn.Module,
    optimizer: Optimizer,
    recipe_state: Dict[str, Any],
    info: DistributedInfo,
    step: int,
    epoch: int,
    intermediate: bool,
    write_weights: Optional[Callable[[Path], Optional[Mapping[str, str]]]] = None,
) -> Path:
    """Save the sharded model and optimizer state (all ranks, in parallel) with ``recipe_state`` into
    ``destination`` atomically; a collective. Returns ``destination``.

    Args:
        recipe_state: written by rank 0 as ``recipe_state.pt`` (its ``optimizer`` entry should be
            ``SHARDED_STATE_MARKER``: the state itself is in the DCP folder).
        write_weights: called on every rank with the folder being assembled, after the sharded
            state is written (``training.full_weights_writer``: the full HF weights of an epoch
            checkpoint, gathered one tensor at a time and written by rank 0); it may return (on rank
            0) ``{name: checksum}`` of the files it hashed while writing, which are then not read again.

    Raises:
        TuneError (``RankErrors``): on every rank when any rank failed; the previous checkpoint is kept.
    """
    return ShardedCheckpointWriter(info).save(
        destination,
        model=model,
        optimizer=optimizer,
        recipe_state=recipe_state,
        step=step,
        epoch=epoch,
        intermediate=intermediate,
        write_weights=write_weights,
    )


def load_sharded_checkpoint(folder: Path, *, model: nn.Module, optimizer: Optimizer, info: DistributedInfo) -> None:
    """Load the model and optimizer state saved by :func:`save_sharded_checkpoint` (on any number of
    processes) into this run's sharded model and optimizer; a collective.

    The files are checked against the manifest first, each rank a share of them in parallel.

    Raises:
        TuneError (``RankErrors``): the folder has no sharded state, a file is missing or damaged, or
            the state does not fit the model/optimizer; on every rank, naming the folder.
    """
    folder = Path(folder)
    error: Optional[BaseException] = None
    try:
        if not (folder / SHARDED_STATE_DIR / ".metadata").is_file():
            raise TuneError(
                f"{folder} has no sharded training state ({SHARDED_STATE_DIR}/.metadata): it was not written by "
                "full_finetune_distributed (a single-device checkpoint, or final weights). " + _resume_hint(folder)
            )
        manifest = read_manifest(folder)
        if manifest is None:
            # A folder is published with its manifest written last: without one it is an unfinished
            # save or a partial copy, and nothing says whether every rank's shards are there and intact.
            raise TuneError(
                f"{folder} has no {MANIFEST_NAME}, which every checkpoint this recipe publishes ends with: it is "
                "an unfinished save or an incomplete copy, so its shards cannot be checked. " + _resume_hint(folder)
            )
        names = sorted(n for n in manifest["files"] if n.startswith(f"{SHARDED_STATE_DIR}/"))
        # Each rank checks a share of the files, in parallel.
        verify_manifest(folder, only=names[info.rank :: info.world_size])
    except TuneError as exc:
        error = TuneError(f"{exc} {_resume_hint(folder)}") if "recipe_checkpoint" not in str(exc) else exc
    raise_if_any_rank_failed(error, info, f"Checking the checkpoint {folder}")

    try:
        state = _state(model, optimizer)
        dcp.load(state, checkpoint_id=str(folder / SHARDED_STATE_DIR))
        with configured_hyperparameters_kept(optimizer):  # optimizer.lr=... given on resume is used
            set_state_dict(
                model,
                _optimizers(optimizer),
                model_state_dict=state["model"],
                optim_state_dict=state["optimizer"],
            )
            if isinstance(optimizer, OptimInBackwardWrapper):
                optimizer.follow_inner_param_groups()
    except _SAVE_LOAD_ERRORS as exc:  # every rank must learn of it (DCP raises on all of them)
        cause = _cause(exc)
        what = (
            f"this run's optimizer ({type(_optimizers(optimizer)[0]).__name__}) keeps other state than the one "
            "that saved it"
            if "optimizer." in cause
            else "it was written for another model"
        )
        error = TuneError(
            f"Loading the sharded training state from {folder / SHARDED_STATE_DIR} failed ({cause}): {what}. Resume "
            "with the saved run's model, optimizer, optimizer_in_bwd and optimizer_in_bwd_group settings. "
            + _resume_hint(folder)
        )
    raise_if_any_rank_failed(error, info, f"Loading the checkpoint {folder}")

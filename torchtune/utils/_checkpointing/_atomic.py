"""Atomic checkpoint folders: write into a temporary sibling, fsync, add the manifest, rename into place.

A crash or a full disk at any point leaves either the previous complete folder or the new complete
one, never a half-written folder under the final name. Leftover ``.tmp-*`` / ``.old-*`` folders of a
crashed save are never loaded and are removed by the next save into the same output folder.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path
from typing import Callable, Mapping, Optional

from torchtune._errors import TuneError
from torchtune.utils._checkpointing._manifest import (
    MANIFEST_NAME,
    RECIPE_STATE_NAME,
    build_manifest,
    find_latest_checkpoint,
)

TMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"


def fsync_file(path: Path) -> None:
    """Flush ``path``'s data to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Flush a folder's entries (new names, renames) to the disk; a no-op where folders cannot be opened."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return  # e.g. Windows
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def clean_leftovers(parent: Path, name: Optional[str] = None) -> None:
    """Remove ``.tmp-*`` and ``.old-*`` folders that a crashed save left in ``parent``; with ``name``,
    only those of a folder of that name (``.tmp-<name>-<pid>``: a folder shared with other things)."""
    if not parent.is_dir():
        return
    for path in parent.iterdir():
        if not (path.is_dir() and path.name.startswith((TMP_PREFIX, OLD_PREFIX))):
            continue
        stem, _, pid = path.name.rpartition("-")
        if name is None or (stem in (f"{TMP_PREFIX}{name}", f"{OLD_PREFIX}{name}") and pid.isdigit()):
            shutil.rmtree(path, ignore_errors=True)


def write_folder_atomically(
    destination: Path,
    write_contents: Callable[[Path], Optional[Mapping[str, str]]],
    *,
    step: int,
    epoch: int,
    intermediate: bool,
    own_leftovers_only: bool = False,
    failure: Optional[Callable[[OSError, Path], str]] = None,
) -> Path:
    """Create ``destination`` with the files ``write_contents(tmp_folder)`` writes, atomically.

    Order: clean leftovers, write into ``.tmp-<name>-<pid>``, fsync each file, write and fsync
    ``manifest.json`` last, fsync the folder, then rename. An existing ``destination`` (a re-save of
    the same step) is renamed aside first and deleted only once the new folder is in place.
    ``write_contents`` may return ``{name: checksum}`` of the files it hashed while writing them; the
    manifest takes those sums instead of reading the files again. ``own_leftovers_only``: clean only
    the leftovers of a folder of this name (``tune export`` into a folder of other things).
    ``failure(exc, tmp)``: the message of a write that failed (default: a checkpoint's, naming
    ``checkpointer.output_dir``). On any error the temporary folder is removed.

    Raises:
        TuneError: on any ``OSError`` (full disk, permissions); the temporary folder is removed and
            the previous checkpoint is kept.
    """
    destination = Path(destination)
    parent = destination.parent
    tmp = parent / f"{TMP_PREFIX}{destination.name}-{os.getpid()}"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        clean_leftovers(parent, destination.name if own_leftovers_only else None)
        tmp.mkdir()
        hashed = write_contents(tmp)
        for path in tmp.rglob("*"):
            if path.is_file():
                fsync_file(path)
        manifest = build_manifest(tmp, step=step, epoch=epoch, intermediate=intermediate, hashed=hashed)
        manifest_path = tmp / MANIFEST_NAME
        with open(manifest_path, "w") as f:
            json.dump(manifest, f, indent=2)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if failure is not None:
            raise TuneError(failure(exc, tmp)) from exc
        reason = (
            "the disk is full"
            if exc.errno in (errno.ENOSPC, errno.EDQUOT)
            else f"{exc.strerror or exc} ({exc.filename or tmp})"
        )
        latest = find_latest_checkpoint(parent)
        kept = (
            f"the previous checkpoint {latest} is kept"
            if latest is not None
            else f"nothing else in {parent} was changed"
        )
        resume = (
            f" and resume from {latest / RECIPE_STATE_NAME} (checkpointer.recipe_checkpoint)"
            if latest is not None and (latest / RECIPE_STATE_NAME).is_file()
            else ""
        )
        raise TuneError(
            f"Saving the checkpoint {destination} failed: {reason}. The partial files were removed and "
            f"{kept}. Free space (or fix the problem) in checkpointer.output_dir={parent}, or point "
            f"checkpointer.output_dir at another disk{resume}."
        ) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    return move_into_place(tmp, destination)


def move_into_place(tmp: Path, destination: Path) -> Path:
    """Rename the complete folder ``tmp`` (manifest written, fsynced) to ``destination``, its sibling.

    An existing ``destination`` (a re-save of the same step) is renamed aside first and deleted only
    once the new folder is in place.

    Raises:
        TuneError: the rename failed; ``tmp`` is removed and the previous checkpoint kept.
    """
    parent = destination.parent
    old = parent / f"{OLD_PREFIX}{destination.name}-{os.getpid()}"
    try:
        if destination.exists():
            os.rename(destination, old)
        try:
            os.rename(tmp, destination)
        except OSError:
            if old.exists() and not destination.exists():
                os.rename(old, destination)  # put the previous checkpoint back
            raise
        fsync_dir(parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise TuneError(
            f"Moving the new checkpoint into {destination} failed: {exc}. The previous checkpoint "
            f"is kept. Check permissions of checkpointer.output_dir={parent}."
        ) from exc
    shutil.rmtree(old, ignore_errors=True)
    return destination

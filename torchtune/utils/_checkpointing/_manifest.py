"""manifest.json: the list of files, sizes and checksums that marks a checkpoint folder complete.

Checksums are XXH3-128 (format version 2): they are there to catch truncated and corrupted files,
not forgery (a file that would run code is refused by ``weights_only`` loading), and at about
20 GB/s per core, against about 1.5 GB/s for SHA-256 with SHA-NI, computing them while a
checkpoint is written costs a few percent of the write instead of as much again. Manifests of
format version 1 (SHA-256) are still verified with SHA-256.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Optional

import xxhash

from torchtune._errors import TuneError

MANIFEST_NAME = "manifest.json"
# The one name of the file that makes a checkpoint folder resumable (optimizer, schedule, progress, RNG).
RECIPE_STATE_NAME = "recipe_state.pt"
MANIFEST_FORMAT_VERSION = 2
HASH_NAME = "xxh3_128"  # the checksum this version writes; an entry names its algorithm by its key
_HASHES: dict[str, Callable[[], Any]] = {"xxh3_128": xxhash.xxh3_128, "sha256": hashlib.sha256}
_CHUNK = 1 << 20  # 1 MB reads: full hashing speed without holding a shard in memory
_CHECKPOINT_FOLDER = re.compile(r"^(step|epoch)_(\d+)$")


def new_hash() -> Any:
    """A fresh hash object (``update`` / ``hexdigest``) of the algorithm manifests are written with."""
    return _HASHES[HASH_NAME]()


def file_digest(path: Path, algorithm: str = HASH_NAME) -> str:
    """Hex digest of the file at ``path``, read in 1 MB chunks."""
    digest = _HASHES[algorithm]()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _algorithm(entry: dict[str, Any]) -> str:
    for name in _HASHES:
        if name in entry:
            return name
    raise KeyError(f"no checksum ({' or '.join(_HASHES)}) in {entry}")


def build_manifest(
    folder: Path, *, step: int, epoch: int, intermediate: bool, hashed: Optional[Mapping[str, str]] = None
) -> dict[str, Any]:
    """Describe every file under ``folder`` (except the manifest itself).

    ``hashed`` maps names (relative to ``folder``) to the checksum computed while the file was
    written (``HashingFile``): those files are not read again. Only the rest (small side files: config,
    tokenizer, index) are hashed here.
    """
    hashed = dict(hashed or {})
    files = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder).as_posix()
        if name == MANIFEST_NAME:
            continue
        files[name] = {"size": path.stat().st_size, HASH_NAME: hashed.pop(name, None) or file_digest(path)}
    if hashed:
        raise ValueError(f"hashed while writing but not in {folder}: {sorted(hashed)}")
    return {
        "format_version": MANIFEST_FORMAT_VERSION,
        "step": step,
        "epoch": epoch,
        "intermediate": intermediate,
        "files": files,
    }


def read_manifest(folder: Path) -> Optional[dict[str, Any]]:
    """The manifest of ``folder``, or ``None`` when it has none (e.g. a downloaded checkpoint)."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text())
        for entry in manifest["files"].values():
            int(entry["size"]), _algorithm(entry)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TuneError(
            f"{path} is damaged ({exc}), so the checkpoint in {folder} cannot be trusted. "
            f"{_previous_hint(Path(folder))}"
        ) from exc
    return manifest


def previous_checkpoint(folder: Path) -> Optional[Path]:
    """The complete sibling checkpoint folder saved before ``folder`` (by step/epoch number), if any."""
    folder = Path(folder)
    match = _CHECKPOINT_FOLDER.match(folder.name)
    if match is None or not folder.parent.is_dir():
        return None
    kind, number = match.group(1), int(match.group(2))
    # Compare by the saved global step where the manifests tell it, so that step_N and epoch_N folders
    # are ordered together (epoch_0 at step 6 comes after step_4); else by the number of the same kind.
    own_step = _saved_step(folder)
    candidates = []
    for sibling in folder.parent.iterdir():
        m = _CHECKPOINT_FOLDER.match(sibling.name)
        if not m or sibling.name == folder.name or not (sibling / MANIFEST_NAME).is_file():
            continue
        if own_step is not None:
            step = _saved_step(sibling)
            if step is not None and step < own_step:
                candidates.append((step, sibling))
        elif m.group(1) == kind and int(m.group(2)) < number:
            candidates.append((int(m.group(2)), sibling))
    return max(candidates)[1] if candidates else None


def _saved_step(folder: Path) -> Optional[int]:
    """The global step in ``folder``'s manifest, or None if it has no readable one."""
    try:
        return int(json.loads((Path(folder) / MANIFEST_NAME).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def find_latest_checkpoint(output_dir: Path) -> Optional[Path]:
    """The complete checkpoint folder in ``output_dir`` with the highest step (``.tmp-*`` leftovers ignored)."""
    best = None
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return None
    for folder in output_dir.iterdir():
        if not _CHECKPOINT_FOLDER.match(folder.name):
            continue
        try:
            manifest = read_manifest(folder)
        except TuneError:
            continue
        if manifest is not None:
            key = (int(manifest.get("step", 0)), int(manifest.get("epoch", 0)), folder.stat().st_mtime)
            if best is None or key > best[0]:
                best = (key, folder)
    return None if best is None else best[1]


def _previous_hint(folder: Path) -> str:
    previous = previous_checkpoint(folder)
    if previous is not None and (previous / RECIPE_STATE_NAME).is_file():
        # A resume takes its weights from the recipe_checkpoint's folder, so that is the key to change.
        return (
            f"Fall back to the previous checkpoint {previous}: to resume from it, set "
            f"checkpointer.recipe_checkpoint={previous / RECIPE_STATE_NAME} (its weights are loaded from "
            f"the same folder); to start from its weights, set checkpointer.checkpoint_dir={previous}."
        )
    if previous is not None:
        return f"Fall back to the previous checkpoint {previous}: set checkpointer.checkpoint_dir={previous}."
    if _CHECKPOINT_FOLDER.match(folder.name):
        # a run's own step_N / epoch_N with nothing saved before it: the resume key is the one to change
        return (
            f"No earlier checkpoint of this run is in {folder.parent} to fall back to. Point "
            f"checkpointer.recipe_checkpoint at the {RECIPE_STATE_NAME} of another intact step_N folder, or "
            "start the run anew from the original weights (resume_from_checkpoint=False, "
            "checkpointer.recipe_checkpoint=null)."
        )
    return (
        "Load an intact copy of these weights (checkpointer.checkpoint_dir), or resume from an earlier "
        f"checkpoint (checkpointer.recipe_checkpoint=.../step_N/{RECIPE_STATE_NAME})."
    )


# How a load checks the checksums of a checkpoint written by this library (sizes are always
# checked first): before reading the files, or in a background thread while training starts.
CHECKSUM_MODES = ("before_load", "background")


def check_checksum_mode(value: str, key: str = "checkpointer.verify_checksums") -> str:
    """``value`` if it is one of :data:`CHECKSUM_MODES`; else a ``TuneError`` naming ``key``."""
    if value not in CHECKSUM_MODES:
        raise TuneError(
            f"{key}={value!r} is not a way to verify checkpoint checksums; use before_load (hash the files "
            "before reading them) or background (check sizes before, sums in a background thread; the run "
            "stops before it saves anything if a sum differs)."
        )
    return value


def _damaged(folder: Path, path: Path, problem: str) -> TuneError:
    return TuneError(f"Checkpoint file {path} {problem}, so this checkpoint cannot be loaded. {_previous_hint(folder)}")


def _size_problem(path: Path, entry: dict[str, Any]) -> Optional[str]:
    if not path.is_file():
        return "is missing"
    size = path.stat().st_size
    if size != entry["size"]:
        return f"has {size} bytes but was saved with {entry['size']} (truncated?)"
    return None


_CORRUPTED = "does not match the checksum it was saved with (corrupted)"


def verify_manifest(folder: Path, only: Optional[Iterable[str]] = None) -> Optional[dict[str, Any]]:
    """Check the sizes and checksums of the files in ``folder``'s manifest.

    Args:
        folder: a checkpoint folder written by this library.
        only: names (relative to ``folder``) to check; default every file in the manifest. Names the
            manifest does not list are skipped.

    Returns:
        The manifest, or ``None`` when ``folder`` has no manifest (nothing to verify).

    Raises:
        TuneError: naming the missing, truncated or corrupted file and suggesting the previous checkpoint.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return None
    for name, entry in _entries(manifest, only).items():
        path = folder / name
        problem = _size_problem(path, entry)
        if problem is None and not _matches(path, entry):
            problem = _CORRUPTED
        if problem is not None:
            raise _damaged(folder, path, problem)
    return manifest


def _matches(path: Path, entry: dict[str, Any]) -> bool:
    algorithm = _algorithm(entry)
    return file_digest(path, algorithm) == entry[algorithm]


def _entries(manifest: dict[str, Any], only: Optional[Iterable[str]]) -> dict[str, dict[str, Any]]:
    files = manifest["files"]
    return dict(files) if only is None else {n: files[n] for n in only if n in files}


class ChecksumJob:
    """Checksums of a checkpoint's files compared in a background thread (at the lowest CPU
    priority, so that where cores are scarce set-up and training go first).

    ``check()`` raises the ``TuneError`` of the first mismatch once it is known (``wait=True``:
    after waiting for the thread). A recipe calls ``check()`` at every logged step and
    ``check(wait=True)`` before it saves, so a damaged checkpoint stops the run before anything
    trained from it is written.
    """

    def __init__(self, folder: Path, entries: dict[str, dict[str, Any]]) -> None:
        self.folder = Path(folder)
        self._entries = entries
        self._error: Optional[TuneError] = None
        self._thread = threading.Thread(target=self._run, name="checkpoint-checksums", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:  # the lowest CPU priority, for this thread only (Linux): training never waits for it
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except (AttributeError, OSError):
            pass
        for name, entry in self._entries.items():
            path = self.folder / name
            try:
                matches = _matches(path, entry)
            except OSError as exc:
                self._error = _damaged(self.folder, path, f"could not be read again ({exc})")
                return
            if not matches:
                self._error = _damaged(self.folder, path, _CORRUPTED + "; found in the background after loading")
                return

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def check(self, wait: bool = False) -> None:
        """Raise the mismatch found so far (all of them, after waiting, with ``wait=True``)."""
        if wait:
            self._thread.join()
        if self._error is not None:
            raise self._error


def verify_checkpoint_files(
    folder: Path, names: Iterable[str], checksums: str = "before_load"
) -> Optional[ChecksumJob]:
    """Verify the files ``names`` of ``folder`` (one written by this library) before they are read.

    Sizes are always checked here. ``checksums="before_load"``: the checksums too, now.
    ``"background"``: the sums in a thread; the returned ``ChecksumJob`` must be ``check``-ed.
    Folders without a manifest (downloaded weights) have nothing to verify: ``None``.

    Raises:
        TuneError: a file is missing, has another size, or (before_load) another sum.
    """
    check_checksum_mode(checksums)
    entries = check_file_sizes(folder, names)
    if not entries:
        return None
    folder = Path(folder)
    if checksums == "before_load":
        for name, entry in entries.items():
            if not _matches(folder / name, entry):
                raise _damaged(folder, folder / name, _CORRUPTED)
        return None
    return ChecksumJob(folder, entries)


def check_file_sizes(folder: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Check the sizes of the files ``names`` of ``folder`` against its manifest, reading none of them
    (``tune validate``; the first step of ``verify_checkpoint_files``). Returns their manifest entries
    (none for a folder without a manifest).

    Raises:
        TuneError: a file is missing or has another size than it was saved with.
    """
    folder = Path(folder)
    manifest = read_manifest(folder)
    if manifest is None:
        return {}
    entries = _entries(manifest, names)
    for name, entry in entries.items():
        problem = _size_problem(folder / name, entry)
        if problem is not None:
            raise _damaged(folder, folder / name, problem)
    return entries


def check_checksums(*jobs: Optional[ChecksumJob], wait: bool = False) -> None:
    """``check`` each background ``ChecksumJob`` (``None``s are skipped)."""
    for job in jobs:
        if job is not None:
            job.check(wait=wait)

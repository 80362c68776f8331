"""What a run's ``output_dir`` already holds, and what a new run may do with it.

A second run into the ``output_dir`` of a finished one would replace its ``epoch_N`` folders and
append a second series of steps to its ``logs/metrics.jsonl``: a finetune lost without a word.
``prepare_output_dir(cfg)`` runs first in a recipe's ``setup()`` (before any weight is read) and

- stops a new run whose output folders hold checkpoints or metrics, with one message offering the
  three choices: resume that run, pick another ``output_dir``, or ``overwrite=True``;
- with ``overwrite=True``, deletes that run's ``step_N`` / ``epoch_N`` folders and metrics first;
- for a resumed run, changes nothing: the resume may still be refused (another batch size, another model,
  a damaged checkpoint), and a refused resume leaves every file as it was. Once the resume is accepted
  (every check passed, the weights and states loaded), ``drop_metrics_after`` drops the metric lines of
  the steps after the resumed checkpoint (the run logs them again), so ``metrics.jsonl`` continues
  without duplicate steps.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any, List, Optional, Tuple

from torchtune._errors import ConfigError, TuneError
from torchtune.training.run._metrics import metrics_path
from torchtune.utils._checkpointing import RECIPE_STATE_NAME, find_latest_checkpoint
from torchtune.utils._checkpointing._atomic import clean_leftovers, fsync_dir
from torchtune.utils._checkpointing._manifest import _CHECKPOINT_FOLDER, _saved_step

log = logging.getLogger("torchtune")

__all__ = ["check_output_dir", "check_overwrite", "drop_metrics_after", "prepare_output_dir"]


def check_overwrite(cfg: Any) -> None:
    """``overwrite`` is a bool and not combined with a resume (which continues the run it would delete).
    Reads no file, so ``tune validate`` runs it too.

    Raises:
        ConfigError: naming ``overwrite`` and what to set instead.
    """
    if not isinstance(cfg.overwrite, bool):
        raise ConfigError(
            f"overwrite={cfg.overwrite!r} must be True (a new run deletes the checkpoints and metrics another run "
            "left in output_dir) or False (it stops instead)."
        )
    if cfg.overwrite and cfg.resume_from_checkpoint:
        raise ConfigError(
            "overwrite=True and resume_from_checkpoint=True contradict each other: overwrite deletes the run in "
            "output_dir, a resume continues one. Set overwrite=False to resume, or resume_from_checkpoint=False "
            "and checkpointer.recipe_checkpoint=null to start anew."
        )


def _checkpoint_folders(folder: Path) -> List[Path]:
    """Published ``step_N`` / ``epoch_N`` folders (not ``.tmp-*`` leftovers), in step order."""
    if not folder.is_dir():
        return []
    found = [p for p in folder.iterdir() if p.is_dir() and _CHECKPOINT_FOLDER.match(p.name)]
    return sorted(found, key=lambda p: (_saved_step(p) or 0, p.name))


def _metric_steps(path: Path) -> Optional[Tuple[int, int]]:
    """First and last step of the metrics file, or None when it is missing or holds no line."""
    steps = []
    if path.is_file():
        with open(path, encoding="utf-8") as f:
            for line in f:
                try:
                    steps.append(int(json.loads(line)["step"]))
                except (ValueError, KeyError, TypeError):
                    continue  # a torn last line after a crash, or a line without a step
    return (min(steps), max(steps)) if steps else None


def _resumed_folder(cfg: Any) -> Path:
    """The checkpoint folder ``checkpointer.recipe_checkpoint`` points into (resolved as resume does)."""
    path = Path(str(cfg.checkpointer.recipe_checkpoint)).expanduser()
    if not path.is_absolute() and not path.exists():
        path = Path(str(cfg.checkpointer.checkpoint_dir)) / path
    return path.resolve().parent


def prepare_output_dir(cfg: Any, info: Any = None) -> None:
    """Make ``cfg``'s output folders ready for this run, or stop it (see the module docstring).

    ``info``: the distributed recipe's ``DistributedInfo``; rank 0 looks and changes files, and every
    rank stops with its message (``raise_if_any_rank_failed``), before any of them loads weights.

    Raises:
        TuneError: ``output_dir`` holds another run and neither a resume of it nor ``overwrite=True``
            was asked for.
    """
    if info is None:
        _prepare(cfg)
        return
    from torchtune.training.distributed._fsdp import raise_if_any_rank_failed

    error: Optional[BaseException] = None
    if info.is_rank_zero:
        try:
            _prepare(cfg)
        except Exception as exc:  # noqa: BLE001 - reported on every rank below
            error = exc
    raise_if_any_rank_failed(error, info, "Checking output_dir")


def check_output_dir(cfg: Any) -> str:
    """What ``prepare_output_dir`` would decide, changing nothing (``tune validate``): the same errors, no
    deletion for ``overwrite=True``. Returns the decision, in words.

    Raises:
        TuneError: as ``prepare_output_dir``.
    """
    return _prepare(cfg, change=False)


def _check_folders(cfg: Any) -> None:
    """``output_dir`` and ``checkpointer.output_dir`` are folders or do not exist yet."""
    for key, value in (("output_dir", cfg.output_dir), ("checkpointer.output_dir", cfg.checkpointer.output_dir)):
        path = Path(str(value)).expanduser()
        if path.exists() and not path.is_dir():
            raise ConfigError(
                f"{key}={value} is a file, not a folder: the run writes its checkpoints and logs/metrics.jsonl "
                f"into that folder. Set {key} to a folder (a new one is made), e.g. {key}={path.with_suffix('')}_run."
            )
        for parent in path.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise ConfigError(
                        f"{key}={value} lies under {parent}, which is a file, not a folder: the run cannot make "
                        f"{path} there. Set {key} to a folder elsewhere."
                    )
                break


def _prepare(cfg: Any, change: bool = True) -> str:
    check_overwrite(cfg)
    _check_folders(cfg)
    checkpoints_dir = Path(str(cfg.checkpointer.output_dir)).expanduser()
    metrics = metrics_path(cfg.output_dir)
    folders = _checkpoint_folders(checkpoints_dir)
    steps = _metric_steps(metrics)
    if cfg.resume_from_checkpoint:
        # A resume continues a run: its own folder, or an output_dir without checkpoints (metrics there, e.g.
        # of an earlier attempt at this resume, are cut back to the resumed step once the resume is accepted).
        resumed = _resumed_folder(cfg)
        if resumed.parent == checkpoints_dir.resolve() or not folders:
            later = _saved_step(resumed)
            if steps and later is not None and steps[1] > later:
                return (
                    f"the resumed run continues there (once the resume is accepted, its metric lines of steps "
                    f"after {later} are dropped: they are logged again)"
                )
            return "the resumed run continues there"
    elif not (folders or steps):
        return "free for this run"
    if cfg.overwrite:
        source = Path(str(cfg.checkpointer.checkpoint_dir)).expanduser().resolve()
        if any(source == f.resolve() or f.resolve() in source.parents for f in folders):
            raise ConfigError(
                f"overwrite=True would delete checkpointer.checkpoint_dir={source}, the weights this run starts "
                f"from (a checkpoint of the earlier run in {checkpoints_dir}). Keep overwrite=False and set "
                "output_dir to another folder."
            )
        if not change:
            return "another run's checkpoints and metrics there would be deleted first (overwrite=True)"
        for folder in folders:
            shutil.rmtree(folder)
        clean_leftovers(checkpoints_dir)
        if metrics.exists():
            metrics.unlink()
        log.info(
            "overwrite=True: deleted the earlier run's %s in %s",
            " and ".join(filter(None, [", ".join(f.name for f in folders), "logs/metrics.jsonl" if steps else ""])),
            checkpoints_dir,
        )
        return "another run's checkpoints and metrics were deleted (overwrite=True)"
    raise TuneError(_occupied_message(cfg, checkpoints_dir, folders, metrics, steps))


def _occupied_message(
    cfg: Any, checkpoints_dir: Path, folders: List[Path], metrics: Path, steps: Optional[Tuple[int, int]]
) -> str:
    held = []
    if folders:
        held.append("the checkpoints " + ", ".join(f.name for f in folders))
    if steps:
        held.append(f"{metrics} (steps {steps[0]} to {steps[1]})")
    where = f"output_dir={cfg.output_dir}"
    if checkpoints_dir.resolve() != metrics.parent.parent.resolve():
        where += f" (checkpointer.output_dir={checkpoints_dir})"
    latest = find_latest_checkpoint(checkpoints_dir)
    if latest is not None and (latest / RECIPE_STATE_NAME).is_file():
        resume = (
            f"  - resume that run: resume_from_checkpoint=True "
            f"checkpointer.recipe_checkpoint={latest / RECIPE_STATE_NAME}"
        )
    elif latest is not None:
        resume = (
            f"  - (nothing to resume: that run finished, {latest.name} is its final checkpoint; to train on from "
            f"its weights, start a new run in another output_dir with checkpointer.checkpoint_dir={latest})"
        )
    else:
        resume = "  - (nothing to resume: that run saved no complete checkpoint)"
    verb = "resumes another run's checkpoint into it" if cfg.resume_from_checkpoint else "would overwrite it"
    return (
        f"{where} already holds another run: {' and '.join(held)}. This run {verb}; nothing was loaded or "
        "changed. Choose one:\n\n"
        f"{resume}\n"
        "  - keep it and write this run elsewhere: output_dir=ANOTHER_FOLDER\n"
        "  - replace it: overwrite=True (deletes those checkpoints and metrics before this run starts)"
    )


def drop_metrics_after(output_dir: Any, step: int) -> None:
    """Keep the lines of ``output_dir``'s ``metrics.jsonl`` of steps up to ``step`` (the resumed checkpoint's);
    the resumed run logs the rest again. Called once a resume is accepted (``StepMetrics.open``), never before:
    a refused resume leaves the file as it was."""
    metrics = metrics_path(output_dir)
    if not metrics.is_file():
        return
    kept, dropped = [], 0
    with open(metrics, encoding="utf-8") as f:
        for line in f:
            try:
                keep = int(json.loads(line)["step"]) <= step
            except (ValueError, KeyError, TypeError):
                keep = False  # a torn line of the crash that stopped the run
            if keep:
                kept.append(line if line.endswith("\n") else line + "\n")
            else:
                dropped += 1
    if not dropped:
        return
    # Written beside and renamed: a crash now leaves either file whole, never a truncated one.
    tmp = metrics.with_name(f".{metrics.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(kept)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, metrics)
    fsync_dir(metrics.parent)
    log.info(
        "Resuming at step %d: dropped %d line(s) of later steps from %s; they are logged again.", step, dropped, metrics
    )

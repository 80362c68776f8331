"""When a run saves, how it stops: step checkpoints, SIGINT/SIGTERM, and the NaN guard."""

from __future__ import annotations

import shutil
import signal
import sys
from pathlib import Path
from typing import Any, Dict, Optional

import torch

from torchtune._errors import TuneError

__all__ = ["CheckpointPolicy", "NonFiniteLossGuard", "StopSignals", "report_stop", "stop_message"]


class CheckpointPolicy:
    """Resumable ``step_N`` checkpoints every ``save_every_n_steps``, keeping the newest ``keep_last_n``.

    Args:
        save_every_n_steps: ``None``: only the epoch-end checkpoints.
        keep_last_n: ``None``: keep every step checkpoint. Epoch checkpoints are never pruned.
    """

    def __init__(self, save_every_n_steps: Optional[int], keep_last_n: Optional[int]) -> None:
        self.save_every_n_steps = save_every_n_steps
        self.keep_last_n = keep_last_n
        self.last_folder: Optional[Path] = None  # the newest checkpoint this run wrote
        self.last_step: Optional[int] = None  # the global step it holds

    @classmethod
    def from_config(cls, cfg: Any) -> "CheckpointPolicy":
        """From a recipe config's ``save_every_n_steps`` and ``keep_last_n_checkpoints``."""
        from torchtune.training.setup._checks import positive_int

        return cls(
            positive_int(cfg, "save_every_n_steps", allow_none=True),
            positive_int(cfg, "keep_last_n_checkpoints", allow_none=True),
        )

    def step_checkpoint_due(self, progress: Any, steps_per_epoch: int) -> bool:
        """True after a step (``progress``: the run's ``TrainingProgress``) that ends a ``save_every_n_steps``
        interval, unless the epoch ends there too (the epoch checkpoint is about to be written)."""
        return (
            bool(self.save_every_n_steps)
            and progress.global_step % self.save_every_n_steps == 0
            and progress.steps_run_in_epoch < steps_per_epoch
        )

    def saved(
        self, folder: Path, step: int, *, step_checkpoint: bool, protected: Optional[Path], prune: bool = True
    ) -> None:
        """Record a save of ``step`` into ``folder``; after a step checkpoint, ``prune`` the older ones
        (never ``protected``, the folder the run resumed from)."""
        self.last_folder, self.last_step = Path(folder), step
        if step_checkpoint and prune:
            self.prune(self.last_folder.parent, protected=protected)

    def saved_at(self, step: int) -> Optional[Path]:
        """The folder of the checkpoint of ``step`` if it was just written (no second save on a stop)."""
        return self.last_folder if self.last_step == step else None

    def prune(self, output_dir: Path, protected: Optional[Path] = None) -> None:
        """Delete all but the newest ``keep_last_n`` ``step_N`` folders; never ``protected`` (the resumed one)."""
        if self.keep_last_n is None:
            return
        folders = sorted(
            (p for p in Path(output_dir).glob("step_*") if p.is_dir() and p.name[5:].isdigit()),
            key=lambda p: int(p.name[5:]),
        )
        keep = {protected.resolve()} if protected is not None else set()
        for old in folders[: max(0, len(folders) - self.keep_last_n)]:
            if old.resolve() not in keep:
                shutil.rmtree(old, ignore_errors=True)


class StopSignals:
    """Inside ``with StopSignals():``, SIGINT/SIGTERM ask the run to stop after the current step.

    ``signum`` is set by the first signal; the loop checks it after each step, saves and exits. A
    second signal raises ``KeyboardInterrupt`` at once, as the user insists. Outside the main thread
    (where handlers cannot be installed) the context does nothing.
    """

    def __init__(self, announce: bool = True) -> None:
        self.signum: Optional[int] = None
        self.announce = announce  # print what the signal does (one process of several says it, or the launcher)
        self._previous: Dict[int, Any] = {}

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    @property
    def exit_code(self) -> int:
        """The exit status of a stopped run: 128 + the signal's number (SIGTERM's on a rank that
        stopped because another rank got the signal)."""
        return 128 + int(self.signum if self.signum is not None else signal.SIGTERM)

    def requested(self, info: Any = None) -> bool:
        """Whether the run is to stop now; with ``info`` (several processes), agreed by all ranks (a
        host-side collective), so a signal that reached one rank stops every rank at the same step."""
        if info is None or info.world_size == 1:
            return self.signum is not None
        from torchtune.training.distributed._fsdp import any_rank

        stop = any_rank(self.signum is not None, info)
        if stop and self.signum is None:
            self.signum = int(signal.SIGTERM)  # stopped for another rank's signal
        return stop

    def _request_stop(self, signum: int, frame: Any) -> None:  # noqa: ARG002
        if self.signum is not None:
            raise KeyboardInterrupt
        self.signum = signum
        if self.announce:
            print(
                f"\nReceived {signal.Signals(signum).name}: finishing this step, then saving a checkpoint (send it "
                "again to stop at once, without saving).",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> "StopSignals":
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._previous[sig] = signal.signal(sig, self._request_stop)
            except ValueError:  # not the main thread (e.g. run from a notebook worker)
                pass
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


class NonFiniteLossGuard:
    """Remembers, on the device, the first step whose loss was NaN or infinite.

    ``record`` costs no host sync, so steps that are not logged stay sync-free; ``check`` reads the
    result (one sync) before anything is saved, so bad weights never reach a checkpoint. A logged step
    reads the guard with its other values in one read (``StepMetrics.log_step``, which calls ``note``):
    its ``check`` then reads nothing more.
    """

    def __init__(self, device: torch.device) -> None:
        self._bad_step = torch.full((), -1, dtype=torch.long, device=device)
        self._read: Optional[int] = None  # the value read since the last record, if any

    def record(self, loss: torch.Tensor, step: int) -> None:
        self._bad_step = torch.where((self._bad_step < 0) & ~torch.isfinite(loss), step, self._bad_step)
        self._read = None

    @property
    def bad_step(self) -> torch.Tensor:
        """The first bad step (-1: none), a 0-dim device tensor: read it with other values, then ``note`` it."""
        return self._bad_step

    def note(self, bad_step: int) -> None:
        """``bad_step`` was read on the host (with a logged step's other values): ``check`` uses it."""
        self._read = int(bad_step)

    def check(self, epoch: int, last_checkpoint: Optional[Path]) -> None:
        """Raise if a NaN/inf loss was recorded.

        Raises:
            TuneError: naming the step, the last good checkpoint and what to change.
        """
        step = self._read if self._read is not None else int(self._bad_step.item())
        self._read = step
        if step >= 0:
            last = f" The last good checkpoint is {last_checkpoint}." if last_checkpoint else ""
            raise TuneError(
                f"The loss became NaN or infinite at step {step} (epoch {epoch}); training stopped and the weights "
                f"after that step were not saved.{last} Lower optimizer.lr, raise the LR warm-up "
                "(lr_scheduler.num_warmup_steps), use dtype=bf16 rather than a lower precision, and check the "
                "dataset for empty or broken examples; a resume from that checkpoint with a new optimizer.lr "
                "trains at the new LR."
            )


def report_stop(signal_name: str, global_step: int, folder: Path, recipe_name: str) -> None:
    """Print, on stderr, where a run stopped by ``signal_name`` left its checkpoint and how to resume it
    (or, when training had finished, where the final weights are). In a process started by
    ``tune run --nproc_per_node``, tell the launcher instead: it prints this with its torchrun options."""
    from torchtune.training.distributed._launch_report import report_to_launcher
    from torchtune.training.run._resume import resume_command
    from torchtune.utils._checkpointing._manifest import RECIPE_STATE_NAME

    recipe_ckpt = Path(folder) / RECIPE_STATE_NAME
    resumable = recipe_ckpt.exists()
    if report_to_launcher("stopped", 0, signal=signal_name, step=global_step, folder=str(folder), resumable=resumable):
        return
    command = resume_command(recipe_name, recipe_ckpt) if resumable else None
    print(stop_message(signal_name, global_step, Path(folder), command), file=sys.stderr, flush=True)


def stop_message(signal_name: str, global_step: int, folder: Path, resume: Optional[str]) -> str:
    """What a run stopped by ``signal_name`` after ``global_step`` says: the checkpoint and the ``resume``
    command, or (``resume=None``, training had finished) where the final weights are."""
    if resume is None:
        return f"\nStopped by {signal_name}; training had finished. Final weights in {folder}."
    return (
        f"\nStopped by {signal_name} after step {global_step}; checkpoint saved to {folder}.\nResume with:\n  {resume}"
    )

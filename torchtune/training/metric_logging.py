"""Metric loggers. A recipe always writes ``DiskLogger``'s JSONL file and, at the same time, the loggers
listed in its config's ``metric_logger`` (``torchtune.training.build_metric_logger``).

Every logger has ``log_dict(payload, step)`` and ``close()`` (and optionally ``log_config(dict)``).
``DiskLogger`` writes one JSON object per line, so a run's metrics can be read back with a
line-by-line parser even after a crash.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

from torchtune._errors import TuneError

Scalar = Union[int, float]


def _clean(payload: Mapping[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in payload.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)  # JSON has no NaN/inf; keep the fact visible
        out[key] = value
    return out


class DiskLogger:
    """Appends ``{"step": ..., **metrics}`` lines to ``log_dir/metrics.jsonl``.

    Args:
        log_dir: folder for ``metrics.jsonl``; created if missing.
        filename: the file's name inside ``log_dir``.
    """

    def __init__(self, log_dir: str, filename: str = "metrics.jsonl", **_: Any) -> None:
        self.path = Path(log_dir) / filename
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            # Line-buffered: each metric line reaches the file when it is written.
            self._file = open(self.path, "a", buffering=1, encoding="utf-8")
        except OSError as exc:
            raise TuneError(
                f"Cannot write metrics to {self.path}: {exc.strerror}. Set metric_logger.log_dir "
                "(or output_dir) to a writable folder."
            ) from exc

    def log_dict(self, payload: Mapping[str, Any], step: int) -> None:
        self._file.write(json.dumps({"step": step, **_clean(payload)}) + "\n")

    def log(self, name: str, value: Scalar, step: int) -> None:
        self.log_dict({name: value}, step)

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()


class StdoutLogger:
    """Prints ``Step N | key:value ...`` lines to stdout.

    Lines go through ``tqdm.write``, which clears a progress bar on the terminal, prints the line and
    draws the bar again below it, so log lines and the recipe's bar do not break each other.
    """

    def __init__(self, **_: Any) -> None:
        pass

    def log_dict(self, payload: Mapping[str, Any], step: int) -> None:
        from tqdm import tqdm

        parts = " ".join(f"{k}:{v:.6g}" if isinstance(v, float) else f"{k}:{v}" for k, v in _clean(payload).items())
        tqdm.write(f"Step {step} | {parts}", file=sys.stdout)
        sys.stdout.flush()

    def log(self, name: str, value: Scalar, step: int) -> None:
        self.log_dict({name: value}, step)

    def close(self) -> None:
        sys.stdout.flush()


class TensorBoardLogger:
    """Writes scalars for TensorBoard into ``log_dir`` (needs ``pip install tensorboard``).

    Args:
        log_dir: folder of the event files; ``tensorboard --logdir LOG_DIR`` shows them.
    """

    def __init__(self, log_dir: str, **_: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # tensorboard is an optional extra
            raise TuneError(
                "metric_logger lists TensorBoardLogger but tensorboard is not installed: pip install tensorboard "
                "(or remove that logger from metric_logger)."
            ) from exc
        self._writer = SummaryWriter(log_dir=log_dir)

    def log_dict(self, payload: Mapping[str, Any], step: int) -> None:
        for name, value in _clean(payload).items():
            if isinstance(value, (int, float)):
                self._writer.add_scalar(name, value, global_step=step)

    def log(self, name: str, value: Scalar, step: int) -> None:
        self.log_dict({name: value}, step)

    def close(self) -> None:
        self._writer.close()


class WandBLogger:
    """Logs metrics to a Weights & Biases run (needs ``pip install wandb``).

    Without ``wandb login`` (or ``WANDB_API_KEY``) set ``mode: offline``, or ``WANDB_MODE=offline`` in
    the environment: the run is written under ``log_dir`` and ``wandb sync`` uploads it later.

    Args:
        project: the W&B project.
        log_dir: folder for W&B's local files (``wandb.init(dir=...)``); None: the current directory.
        mode: ``online``, ``offline`` or ``disabled``; None: W&B's default (``WANDB_MODE``).
        **init_kwargs: passed on to ``wandb.init`` (``entity``, ``name``, ``group``, ``tags`` ...).
    """

    def __init__(
        self, project: str, log_dir: Optional[str] = None, mode: Optional[str] = None, **init_kwargs: Any
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise TuneError(
                "metric_logger lists WandBLogger but wandb is not installed: pip install wandb "
                "(or remove that logger from metric_logger)."
            ) from exc
        if log_dir is not None:
            Path(log_dir).mkdir(parents=True, exist_ok=True)
        self._wandb = wandb
        self._run = wandb.init(project=project, dir=log_dir, mode=mode, **init_kwargs)

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Store the run's resolved config with the W&B run."""
        self._run.config.update(dict(config), allow_val_change=True)

    def log_dict(self, payload: Mapping[str, Any], step: int) -> None:
        self._run.log({k: v for k, v in _clean(payload).items() if isinstance(v, (int, float))}, step=step)

    def log(self, name: str, value: Scalar, step: int) -> None:
        self.log_dict({name: value}, step)

    def close(self) -> None:
        self._run.finish()


def read_metrics(path: Union[str, Path]) -> list:
    """Read ``metrics.jsonl`` back as a list of dicts (skips a torn last line after a crash)."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows

"""Metric loggers, chosen in YAML with ``metric_logger._component_``.

Every logger has ``log_dict(payload, step)`` and ``close()``. ``DiskLogger`` writes one JSON object
per line, so a run's metrics can be read back with a line-by-line parser even after a crash.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Dict, Mapping, Union

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
    """Prints ``Step N | key:value ...`` lines."""

    def __init__(self, **_: Any) -> None:
        pass

    def log_dict(self, payload: Mapping[str, Any], step: int) -> None:
        parts = " ".join(f"{k}:{v:.6g}" if isinstance(v, float) else f"{k}:{v}" for k, v in _clean(payload).items())
        print(f"Step {step} | {parts}", file=sys.stdout, flush=True)

    def log(self, name: str, value: Scalar, step: int) -> None:
        self.log_dict({name: value}, step)

    def close(self) -> None:
        sys.stdout.flush()


class TensorBoardLogger:
    """Writes scalars for TensorBoard (needs ``pip install 'torchtune[tensorboard]'``)."""

    def __init__(self, log_dir: str, **_: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # tensorboard is an optional extra
            raise TuneError(
                "metric_logger is TensorBoardLogger but tensorboard is not installed. Install it "
                "with `pip install 'torchtune[tensorboard]'`, or set "
                "metric_logger._component_=torchtune.utils.metric_logging.DiskLogger."
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

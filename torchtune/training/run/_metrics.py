"""Where a run's metrics go, and the summary printed when it ends.

``build_metric_logger(cfg)`` returns one ``MetricLoggers`` object that writes every payload to
``output_dir/logs/metrics.jsonl`` (always: ``tune plot`` and the summary read it) and to each logger
listed in ``cfg.metric_logger`` (stdout, TensorBoard, Weights & Biases ...) at the same time. It also
feeds a ``RunSummary``, whose ``report`` is the paragraph a recipe prints at the end.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch
from omegaconf import DictConfig, ListConfig, OmegaConf

from torchtune import config
from torchtune._errors import ConfigError
from torchtune.config._instantiate import COMPONENT_KEY
from torchtune.training import memory
from torchtune.training.metric_logging import DiskLogger, JsonlLogger, StdoutLogger

__all__ = [
    "epoch_progress_bar",
    "MetricLoggers",
    "ProgressBarLogHandler",
    "RunSummary",
    "build_metric_logger",
    "check_metric_logger",
    "metrics_path",
]

METRICS_FILE = "metrics.jsonl"


def metrics_path(output_dir: Union[str, Path]) -> Path:
    """The JSONL file every run writes: ``output_dir/logs/metrics.jsonl``."""
    return Path(str(output_dir)).expanduser() / "logs" / METRICS_FILE


def _logger_nodes(node: Any) -> List[Any]:
    if node is None:
        return []
    if isinstance(node, (ListConfig, list, tuple)):
        return list(node)
    return [node]


def check_metric_logger(cfg: Any) -> None:
    """``cfg.metric_logger`` is null, one logger node or a list of them, each with a ``_component_``.

    Raises:
        ConfigError: naming the entry that is not a logger node.
    """
    for i, node in enumerate(_logger_nodes(cfg.metric_logger)):
        if not isinstance(node, (DictConfig, dict)) or COMPONENT_KEY not in node:
            where = "metric_logger" if not isinstance(cfg.metric_logger, ListConfig) else f"metric_logger.{i}"
            raise ConfigError(
                f"{where} is {node!r}, not a logger: each entry of metric_logger is a mapping with a _component_, "
                "e.g. metric_logger=[{_component_: torchtune.training.metric_logging.StdoutLogger}]. The JSONL file "
                "in output_dir/logs is written in any case; metric_logger=[] adds nothing to it."
            )


def _writes_metrics_file(node: Any, path: Path) -> bool:
    """True for a node of ``DiskLogger`` / ``JsonlLogger`` (or a subclass) whose JSONL file is ``path``, the run's:
    ``DiskLogger`` writes ``metrics.jsonl`` beside its text log (or the ``.jsonl`` its ``filename`` names)."""
    try:
        target = config.import_component(node[COMPONENT_KEY])
    except ConfigError:
        return False
    if not (isinstance(target, type) and issubclass(target, (DiskLogger, JsonlLogger))) or node.get("log_dir") is None:
        return False
    filename = node.get("filename")
    if filename is None or (issubclass(target, DiskLogger) and not str(filename).endswith(".jsonl")):
        filename = METRICS_FILE
    own = Path(str(node.log_dir)).expanduser() / str(filename)
    return own.resolve() == path.resolve()


def build_metric_logger(cfg: Any) -> "MetricLoggers":
    """The run's metric loggers: ``metrics.jsonl`` in ``cfg.output_dir/logs`` plus every logger of
    ``cfg.metric_logger`` (null, one node, or a list). A listed ``DiskLogger`` (or subclass) of that same
    file writes it instead of the default one, so no line is written twice. Loggers with ``log_config``
    receive the resolved config (W&B and MLflow store it with the run; each writes
    ``output_dir/torchtune_config.yaml``, as torchtune's loggers do).
    """
    check_metric_logger(cfg)
    path = metrics_path(cfg.output_dir)
    nodes = _logger_nodes(cfg.metric_logger)
    loggers: List[Any] = []
    if not any(_writes_metrics_file(node, path) for node in nodes):
        loggers.append(JsonlLogger(log_dir=str(path.parent), filename=path.name))
    loggers += [config.instantiate(node) for node in nodes]
    wants_config = [logger for logger in loggers if hasattr(logger, "log_config")]
    if wants_config:
        resolved = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
        for logger in wants_config:
            logger.log_config(resolved)
    return MetricLoggers(loggers, path)


class MetricLoggers:
    """Sends each ``log_dict`` to every logger and to the run's ``RunSummary`` (``self.summary``)."""

    def __init__(self, loggers: List[Any], path: Path) -> None:
        self.loggers = loggers
        self.path = path
        self.summary = RunSummary(path)

    def log_dict(self, payload: Mapping[str, Any], step: int) -> None:
        self.summary.observe(payload, step)
        for logger in self.loggers:
            logger.log_dict(payload, step=step)

    def log(self, name: str, value: float, step: int) -> None:
        self.log_dict({name: value}, step)

    def log_validation(self, val_loss: float, step: int) -> None:
        """Log ``val_loss`` to every logger, and show it once: a listed ``StdoutLogger`` prints it; without
        one, a ``Step N | validation loss X`` line goes to stderr above the progress bar."""
        self.log_dict({"val_loss": val_loss}, step)
        if not any(isinstance(logger, StdoutLogger) for logger in self.loggers):
            from tqdm import tqdm

            tqdm.write(f"Step {step} | validation loss {val_loss:.4f}", file=sys.stderr)

    def close(self) -> None:
        for logger in self.loggers:
            logger.close()


class ProgressBarLogHandler(logging.StreamHandler):
    """A log handler that prints each record (its bare message) with ``tqdm.write``, which clears a
    progress bar, prints the line and redraws the bar below it, so log lines never split the bar."""

    def __init__(self, stream: Any = None) -> None:
        super().__init__(stream)
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        from tqdm import tqdm

        try:
            tqdm.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:
            self.handleError(record)


def epoch_progress_bar(total: int, initial: int, enabled: bool = True) -> Any:
    """The progress bar of one epoch of ``total`` steps, ``initial`` of them done (a resumed epoch), on
    stderr; ``enabled=False`` (ranks other than 0) draws nothing."""
    from tqdm import tqdm

    return tqdm(total=total, initial=initial, dynamic_ncols=True, file=sys.stderr, mininterval=0.5, disable=not enabled)


def _number(value: Any) -> Optional[float]:
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


class RunSummary:
    """What a run did, from the payloads it logged: steps, losses, throughput; plus memory and time.

    ``tokens_per_second`` is all tokens of the logged steps over the time those steps took (each
    payload's ``tokens`` over its ``tokens_per_second``), so it does not depend on how often a run logs.
    """

    def __init__(self, path: Path) -> None:
        self.metrics_path = path
        self.started = time.perf_counter()
        self.first_step: Optional[int] = None
        self.last_step: Optional[int] = None
        self.losses: Dict[str, Tuple[Tuple[float, int], Tuple[float, int]]] = {}  # key -> (final, best)
        self.tokens = 0.0
        self.token_seconds = 0.0

    def observe(self, payload: Mapping[str, Any], step: int) -> None:
        """Record one logged payload."""
        for key in ("loss", "val_loss"):
            value = _number(payload.get(key))
            if value is not None:
                best = self.losses.get(key, (None, (math.inf, step)))[1]
                self.losses[key] = ((value, step), (value, step) if value < best[0] else best)
        if "loss" in payload:
            self.first_step = step if self.first_step is None else self.first_step
            self.last_step = step
        tokens, rate = _number(payload.get("tokens")), _number(payload.get("tokens_per_second"))
        if tokens and rate:
            self.tokens += tokens
            self.token_seconds += tokens / rate

    @property
    def tokens_per_second(self) -> Optional[float]:
        return self.tokens / self.token_seconds if self.token_seconds > 0 else None

    def report(self, *, checkpoint: Optional[Path], device: torch.device) -> str:
        """The end-of-run paragraph: steps, final and best loss, tokens/s, peak memory, wall time, and where
        the checkpoints and metrics are."""
        lines = ["Run summary"]
        if self.last_step is None:
            lines.append("  steps            none logged in this session")
        else:
            lines.append(f"  steps            {self.first_step} to {self.last_step} logged in this session")
        for key, label in (("loss", "loss"), ("val_loss", "validation loss")):
            if key in self.losses:
                (final, final_step), (best, best_step) = self.losses[key]
                lines.append(f"  {label:<16} final {final:.4f} (step {final_step}), best {best:.4f} (step {best_step})")
        if self.tokens_per_second is not None:
            lines.append(f"  throughput       {self.tokens_per_second:,.0f} tokens/s ({self.tokens:,.0f} tokens)")
        lines.append(f"  peak memory      {_peak_memory(device)}")
        lines.append(f"  wall time        {_duration(time.perf_counter() - self.started)} (set-up and training)")
        if checkpoint is not None:
            lines.append(f"  checkpoint       {checkpoint}")
        output_dir = self.metrics_path.parent.parent
        lines.append(f"  metrics          {self.metrics_path} (plot: tune plot {output_dir})")
        return "\n".join(lines)


def _peak_memory(device: torch.device) -> str:
    stats = memory.get_memory_stats(device, reset_stats=False)
    host = f"host peak RSS {stats['host_peak_rss']:.2f} GB"
    if "peak_memory_alloc" in stats:
        return (
            f"{stats['peak_memory_alloc']:.2f} GB allocated, {stats['peak_memory_reserved']:.2f} GB reserved "
            f"on {device} (torch's peaks); {host}"
        )
    return host


def _duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"

"""Metric loggers, with torchtune's constructors and ``log`` / ``log_dict`` / ``log_config`` / ``close``.

A recipe always writes ``output_dir/logs/metrics.jsonl`` (``JsonlLogger``: one JSON object per line, readable
line by line even after a crash; ``tune plot`` and the run summary read it) and, at the same time, the loggers
its config's ``metric_logger`` lists (``torchtune.training.build_metric_logger``). ``DiskLogger`` writes
torchtune's text log and that JSONL file beside it.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Protocol, Union

from torchtune._errors import TuneError
from torchtune.utils._device import get_world_size_and_rank

log = logging.getLogger("torchtune")

Scalar = Any  # a number, a 0-d tensor or a NumPy scalar
JSONL_NAME = "metrics.jsonl"
CONFIG_NAME = "torchtune_config.yaml"

__all__ = [
    "CometLogger",
    "DiskLogger",
    "JsonlLogger",
    "MLFlowLogger",
    "MetricLoggerInterface",
    "StdoutLogger",
    "TensorBoardLogger",
    "WandBLogger",
    "flatten_dict",
    "read_metrics",
    "save_config",
]


def _clean(payload: Mapping[str, Any]) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in payload.items():
        if hasattr(value, "item"):
            value = value.item()
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)  # JSON has no NaN/inf; keep the fact visible
        out[key] = value
    return out


def _numbers(payload: Mapping[str, Any]) -> Dict[str, Union[int, float]]:
    return {k: v for k, v in _clean(payload).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def _text(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else f"{value}"


def save_config(config: Any) -> Optional[Path]:
    """Write the resolved ``config`` (a ``DictConfig`` or a mapping with ``output_dir``) to
    ``output_dir/torchtune_config.yaml``; returns the path (None, with a warning, when it cannot be written)."""
    from omegaconf import OmegaConf

    try:
        output_dir = Path(str(config["output_dir"]))
        output_dir.mkdir(parents=True, exist_ok=True)
        path = output_dir / CONFIG_NAME
        OmegaConf.save(config, path, resolve=True)
        return path
    except Exception as exc:  # noqa: BLE001 - losing the config copy must not stop a run
        log.warning("Could not save the config to %s: %s", CONFIG_NAME, exc)
        return None


def flatten_dict(d: Dict[str, Any], *, sep: str = ".", parent_key: str = "") -> Dict[str, Any]:
    """``{"a": {"b": 1}, "c": 2}`` -> ``{"a.b": 1, "c": 2}`` (lists are kept as they are)."""
    items: Dict[str, Any] = {}
    for key, value in d.items():
        name = f"{parent_key}{sep}{key}" if parent_key else key
        if isinstance(value, dict):
            items.update(flatten_dict(value, sep=sep, parent_key=name))
        else:
            items[name] = value
    return items


def _container(config: Any) -> Dict[str, Any]:
    from omegaconf import DictConfig, OmegaConf

    return OmegaConf.to_container(config, resolve=True) if isinstance(config, DictConfig) else dict(config)


class MetricLoggerInterface(Protocol):
    """What a metric logger has: ``log`` of one scalar, ``log_dict`` of several, ``log_config``, ``close``."""

    def log(self, name: str, data: Scalar, step: int) -> None: ...

    def log_config(self, config: Any) -> None: ...

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None: ...

    def close(self) -> None: ...


class JsonlLogger:
    """Appends ``{"step": ..., **metrics}`` lines to ``log_dir/filename``: the file every run writes.

    Args:
        log_dir: folder of the file; created if missing.
        filename: the file's name inside ``log_dir``.
    """

    def __init__(self, log_dir: Union[str, Path], filename: str = JSONL_NAME) -> None:
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

    def log(self, name: str, data: Scalar, step: int) -> None:
        self.log_dict({name: data}, step)

    def close(self) -> None:
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()


class DiskLogger:
    """torchtune's text log, ``Step N | name:value ...`` lines in ``log_dir/filename`` (default
    ``log_<unix time>.txt``), and this library's ``metrics.jsonl`` beside it.

    A ``filename`` ending in ``.jsonl`` names the JSONL file instead, and no text log is written.

    Args:
        log_dir: folder of the files; created if missing.
        filename: the text log's name (None: ``log_<unix time>.txt``).
    """

    def __init__(self, log_dir: str, filename: Optional[str] = None, **kwargs: Any) -> None:
        self.log_dir = Path(log_dir)
        jsonl = filename if filename is not None and filename.endswith(".jsonl") else JSONL_NAME
        self._jsonl = JsonlLogger(self.log_dir, jsonl)
        self._file = None
        if filename is None or not filename.endswith(".jsonl"):
            self._file_name = self.log_dir / (filename or f"log_{int(time.time())}.txt")
            self._file = open(self._file_name, "a", encoding="utf-8")
        else:
            self._file_name = self._jsonl.path

    @property
    def jsonl_path(self) -> Path:
        """The JSONL file this logger writes."""
        return self._jsonl.path

    def path_to_log_file(self) -> Path:
        """The text log (or, with a ``.jsonl`` filename, the JSONL file)."""
        return self._file_name

    def log(self, name: str, data: Scalar, step: int) -> None:
        if self._file is not None:
            self._file.write(f"Step {step} | {name}:{data}\n")
            self._file.flush()
        self._jsonl.log(name, data, step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        if self._file is not None:
            self._file.write(f"Step {step} | " + "".join(f"{name}:{data} " for name, data in payload.items()) + "\n")
            self._file.flush()
        self._jsonl.log_dict(payload, step)

    def log_config(self, config: Any) -> None:
        save_config(config)

    def close(self) -> None:
        if self._file is not None and not self._file.closed:
            self._file.close()
        self._jsonl.close()


class StdoutLogger:
    """Prints ``Step N | name:value ...`` lines to stdout (floats with 6 significant digits).

    Lines go through ``tqdm.write``, which clears a progress bar on the terminal, prints the line and
    draws the bar again below it, so log lines and the recipe's bar do not break each other.
    """

    def __init__(self, **_: Any) -> None:
        pass

    @staticmethod
    def _write(line: str) -> None:
        from tqdm import tqdm

        tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()

    def log(self, name: str, data: Scalar, step: int) -> None:
        self._write(f"Step {step} | {name}:{_text(_clean({name: data})[name])}")

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        self._write(f"Step {step} | " + "".join(f"{k}:{_text(v)} " for k, v in _clean(payload).items()))

    def log_config(self, config: Any) -> None:
        save_config(config)

    def close(self) -> None:
        sys.stdout.flush()


class TensorBoardLogger:
    """Writes scalars for TensorBoard (needs ``pip install tensorboard``); rank 0 only.

    Args:
        log_dir: folder of the event files; ``tensorboard --logdir LOG_DIR`` shows them.
        organize_logs: write into a sub-folder ``run_<rank>_<time>`` of ``log_dir`` (torchtune's default), so
            runs into one ``log_dir`` show as separate runs.
    """

    def __init__(self, log_dir: str, organize_logs: bool = True, **kwargs: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:  # tensorboard is an optional extra
            raise TuneError(
                "metric_logger lists TensorBoardLogger but tensorboard is not installed: pip install tensorboard "
                "(or remove that logger from metric_logger)."
            ) from exc
        _, self._rank = get_world_size_and_rank()
        self.log_dir = os.path.join(log_dir, f"run_{self._rank}_{time.time()}") if organize_logs else log_dir
        self._writer = SummaryWriter(log_dir=self.log_dir) if self._rank == 0 else None

    def log(self, name: str, data: Scalar, step: int) -> None:
        self.log_dict({name: data}, step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        if self._writer is not None:
            for name, value in _numbers(payload).items():
                self._writer.add_scalar(name, value, global_step=step, new_style=True)

    def log_config(self, config: Any) -> None:
        save_config(config)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class WandBLogger:
    """Logs metrics to a Weights & Biases run (needs ``pip install wandb``); rank 0 only.

    Without ``wandb login`` (or ``WANDB_API_KEY``) set ``mode: offline``, or ``WANDB_MODE=offline`` in
    the environment: the run is written under ``log_dir`` and ``wandb sync`` uploads it later.

    Args:
        project: the W&B project.
        entity: the W&B entity (user or team); None: your default.
        group: a group to put the run in.
        log_dir: folder for W&B's local files (``wandb.init(dir=...)``; ``dir`` in ``kwargs`` wins); None:
            the current directory.
        **kwargs: passed on to ``wandb.init`` (``mode``, ``name``, ``tags`` ...).
    """

    def __init__(
        self,
        project: str = "torchtune",
        entity: Optional[str] = None,
        group: Optional[str] = None,
        log_dir: Optional[str] = None,
        **kwargs: Any,
    ) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise TuneError(
                "metric_logger lists WandBLogger but wandb is not installed: pip install wandb "
                "(or remove that logger from metric_logger)."
            ) from exc
        self._wandb = wandb
        self.log_dir = kwargs.pop("dir", log_dir)
        if self.log_dir is not None:
            Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        _, self.rank = get_world_size_and_rank()
        self.config_allow_val_change = kwargs.get("allow_val_change", False)
        self._run = None
        if self.rank == 0:
            # a run started by the caller (wandb.init before the recipe) is logged into
            self._run = wandb.run or wandb.init(project=project, entity=entity, group=group, dir=self.log_dir, **kwargs)

    def log_config(self, config: Any) -> None:
        """Store the run's resolved config with the W&B run (and ``torchtune_config.yaml`` as a file)."""
        if self._run is None:
            return
        self._run.config.update(_container(config), allow_val_change=True)
        path = save_config(config)
        if path is not None:
            try:
                self._wandb.save(str(path), base_path=str(path.parent))
            except Exception as exc:  # noqa: BLE001 - the config is stored with the run anyway
                log.warning("Could not upload %s to W&B: %s", path, exc)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        if self._run is not None:
            self._run.log(_numbers(payload), step=step)

    def log(self, name: str, data: Scalar, step: int) -> None:
        self.log_dict({name: data}, step)

    def close(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None


class CometLogger:
    """Logs metrics to a Comet experiment (needs ``pip install comet_ml``); rank 0 only.

    Arguments as torchtune's (passed to ``comet_ml.start``): ``api_key`` (better: ``comet login``), ``workspace``,
    ``project``, ``experiment_key`` (continue or name an experiment), ``mode`` (``get_or_create``, ``get``,
    ``create``), ``online`` (False: an offline experiment), ``experiment_name``, ``tags``, ``log_code``;
    ``kwargs`` go to ``comet_ml.ExperimentConfig`` (``log_dir`` is dropped).
    """

    def __init__(
        self,
        api_key: Optional[str] = None,
        workspace: Optional[str] = None,
        project: Optional[str] = None,
        experiment_key: Optional[str] = None,
        mode: Optional[str] = None,
        online: Optional[bool] = None,
        experiment_name: Optional[str] = None,
        tags: Optional[List[str]] = None,
        log_code: bool = True,
        **kwargs: Any,
    ) -> None:
        try:
            import comet_ml
        except ImportError as exc:
            raise TuneError(
                "metric_logger lists CometLogger but comet_ml is not installed: pip install comet_ml "
                "(or remove that logger from metric_logger)."
            ) from exc
        kwargs.pop("log_dir", None)
        _, self.rank = get_world_size_and_rank()
        self.experiment = None
        if self.rank == 0:
            self.experiment = comet_ml.start(
                api_key=api_key,
                workspace=workspace,
                project=project,
                experiment_key=experiment_key,
                mode=mode,
                online=online,
                experiment_config=comet_ml.ExperimentConfig(
                    log_code=log_code, tags=tags, name=experiment_name, **kwargs
                ),
            )

    def log(self, name: str, data: Scalar, step: int) -> None:
        if self.experiment is not None:
            self.experiment.log_metric(name, data, step=step)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        if self.experiment is not None:
            self.experiment.log_metrics(payload, step=step)

    def log_config(self, config: Any) -> None:
        if self.experiment is None:
            return
        from omegaconf import DictConfig

        self.experiment.log_parameters(config if isinstance(config, DictConfig) else _container(config))
        path = save_config(config)
        if path is not None:
            try:
                self.experiment.log_asset(path, file_name=path.name)
            except Exception as exc:  # noqa: BLE001 - the parameters are logged anyway
                log.warning("Could not upload %s to Comet: %s", path, exc)

    def close(self) -> None:
        if self.experiment is not None:
            self.experiment.end()
            self.experiment = None


class MLFlowLogger:
    """Logs metrics to an MLflow run (needs ``pip install mlflow-skinny``, or ``mlflow``); rank 0 only.

    Args:
        experiment_name: the MLflow experiment (created if missing); default ``MLFLOW_EXPERIMENT_NAME``.
        tracking_uri: where MLflow stores runs; default ``MLFLOW_TRACKING_URI`` (used only when no tracking URI
            is set yet).
        run_id: an existing run to log into; default ``MLFLOW_RUN_ID``.
        run_name: the new run's name.
    """

    def __init__(
        self,
        experiment_name: Optional[str] = None,
        tracking_uri: Optional[str] = None,
        run_id: Optional[str] = None,
        run_name: Optional[str] = None,
    ) -> None:
        try:
            import mlflow
        except ImportError as exc:
            raise TuneError(
                "metric_logger lists MLFlowLogger but mlflow is not installed: pip install mlflow-skinny "
                "(or remove that logger from metric_logger)."
            ) from exc
        self._mlflow = mlflow
        _, self.rank = get_world_size_and_rank()
        self._tracking_uri = tracking_uri or os.getenv("MLFLOW_TRACKING_URI")
        self._experiment_name = experiment_name or os.getenv("MLFLOW_EXPERIMENT_NAME")
        self._run_id = run_id or os.getenv("MLFLOW_RUN_ID")
        if self.rank != 0:
            return
        if not mlflow.is_tracking_uri_set() and self._tracking_uri is not None:
            mlflow.set_tracking_uri(self._tracking_uri)
        if mlflow.active_run() is None or self._run_id:
            if self._experiment_name is not None:
                mlflow.set_experiment(self._experiment_name)
            run = mlflow.start_run(run_id=self._run_id, run_name=run_name)
            self._run_id = run.info.run_id

    def log_config(self, config: Any) -> None:
        """The resolved config as the run's parameters (flattened: ``optimizer.lr``) and
        ``torchtune_config.yaml`` as an artifact."""
        if self.rank != 0:
            return
        self._mlflow.log_params(flatten_dict(_container(config)), run_id=self._run_id)
        path = save_config(config)
        if path is not None:
            # an absolute output_dir becomes a relative artifact path
            self._mlflow.log_artifact(str(path), artifact_path=str(path.parent).lstrip("/"), run_id=self._run_id)

    def log(self, name: str, data: Scalar, step: int) -> None:
        if self.rank == 0:
            self._mlflow.log_metric(name, data, step=step, run_id=self._run_id)

    def log_dict(self, payload: Mapping[str, Scalar], step: int) -> None:
        if self.rank == 0:
            self._mlflow.log_metrics(_numbers(payload), step=step, run_id=self._run_id)

    def close(self) -> None:
        if self.rank == 0 and self._mlflow.active_run():
            self._mlflow.end_run()


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

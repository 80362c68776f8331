"""The metric loggers with torchtune's constructors and output, and this library's JSONL file beside them."""

import pytest
import torch
from omegaconf import OmegaConf

from torchtune.training.metric_logging import (
    DiskLogger,
    JsonlLogger,
    MLFlowLogger,
    StdoutLogger,
    TensorBoardLogger,
    flatten_dict,
    read_metrics,
)


def test_disk_logger_writes_torchtunes_text_log_and_the_jsonl_beside(tmp_path):
    logger = DiskLogger(log_dir=str(tmp_path))
    logger.log("loss", 1.5, 0)
    logger.log_dict({"loss": torch.tensor(0.25), "lr": 1e-5}, step=1)
    logger.close()
    text = logger.path_to_log_file()
    assert text.parent == tmp_path and text.name.startswith("log_") and text.suffix == ".txt"
    assert text.read_text().splitlines() == ["Step 0 | loss:1.5", "Step 1 | loss:0.25 lr:1e-05 "]
    assert read_metrics(tmp_path / "metrics.jsonl") == [
        {"step": 0, "loss": 1.5},
        {"step": 1, "loss": 0.25, "lr": 1e-5},
    ]


def test_disk_logger_with_a_jsonl_filename_writes_only_that(tmp_path):
    logger = DiskLogger(log_dir=str(tmp_path), filename="run.jsonl")
    logger.log_dict({"loss": 2.0}, step=3)
    logger.close()
    assert [p.name for p in tmp_path.iterdir()] == ["run.jsonl"]
    assert read_metrics(tmp_path / "run.jsonl") == [{"step": 3, "loss": 2.0}]


def test_log_config_saves_the_resolved_config(tmp_path):
    cfg = OmegaConf.create({"output_dir": str(tmp_path), "lr": "${x}", "x": 2})
    DiskLogger(log_dir=str(tmp_path / "logs")).log_config(cfg)
    assert OmegaConf.load(tmp_path / "torchtune_config.yaml") == {"output_dir": str(tmp_path), "lr": 2, "x": 2}


def test_stdout_logger_lines(capsys):
    logger = StdoutLogger()
    logger.log("loss", 1.1, step=0)
    logger.log_dict({"loss": 1.23456789, "tokens": 7}, step=1)
    assert capsys.readouterr().out == "Step 0 | loss:1.1\nStep 1 | loss:1.23457 tokens:7 \n"


def test_tensorboard_logger_organizes_runs(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logger = TensorBoardLogger(log_dir=str(tmp_path))
    logger.log_dict({"loss": 0.5, "note": "text"}, step=2)  # numbers only
    logger.close()
    assert logger.log_dir.startswith(str(tmp_path / "run_0_"))
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert [(e.step, e.tensor_proto.float_val[0]) for e in events.Tensors("loss")] == [(2, 0.5)]
    assert TensorBoardLogger(log_dir=str(tmp_path / "flat"), organize_logs=False).log_dir == str(tmp_path / "flat")


def test_mlflow_logger(tmp_path, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 refuses a file store without it
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(f"file:{tmp_path / 'mlruns'}")
    try:
        logger = MLFlowLogger(experiment_name="exp", run_name="run")
        logger.log_dict({"loss": 0.5, "note": "text"}, step=1)
        logger.log_config(OmegaConf.create({"output_dir": str(tmp_path / "out"), "optimizer": {"lr": 0.1}}))
        run_id = logger._run_id
        logger.close()
        run = mlflow.get_run(run_id)
        assert run.data.metrics == {"loss": 0.5}
        assert run.data.params == {"output_dir": str(tmp_path / "out"), "optimizer.lr": "0.1"}
    finally:
        mlflow.set_tracking_uri(previous)


def test_flatten_dict_and_the_jsonl_logger(tmp_path):
    assert flatten_dict({"a": {"b": 1}, "c": [2]}) == {"a.b": 1, "c": [2]}
    logger = JsonlLogger(tmp_path)
    logger.log("loss", float("nan"), 1)
    logger.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "loss": "nan"}]

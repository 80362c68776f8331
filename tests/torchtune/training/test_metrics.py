"""MetricLoggers: every payload to every logger, the validation loss shown once."""

from omegaconf import OmegaConf

from torchtune import training
from torchtune.training.metric_logging import read_metrics

STDOUT = {"_component_": "torchtune.training.metric_logging.StdoutLogger"}


def _loggers(tmp_path, metric_logger):
    return training.build_metric_logger(OmegaConf.create({"output_dir": str(tmp_path), "metric_logger": metric_logger}))


def test_validation_loss_is_shown_once_with_or_without_a_stdout_logger(tmp_path, capsys):
    loggers = _loggers(tmp_path / "a", [STDOUT])
    loggers.log_validation(1.25, step=3)
    loggers.close()
    out, err = capsys.readouterr()
    assert out.splitlines() == ["Step 3 | val_loss:1.25 "] and "validation loss" not in err

    loggers = _loggers(tmp_path / "b", [])  # only metrics.jsonl: the line goes to stderr instead
    loggers.log_validation(1.25, step=3)
    loggers.close()
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == ["Step 3 | validation loss 1.2500"]
    assert read_metrics(training.metrics_path(tmp_path / "b")) == [{"step": 3, "val_loss": 1.25}]

"""torchtune 0.6.1's torchtune.utils names: devices, batches, logging, versions."""

import logging
import warnings

import pytest
import torch

from torchtune import utils
from torchtune.utils._logging import deprecated, log_rank_zero


def test_get_device_picks_the_best_device_and_accepts_meta(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert utils.get_device() == torch.device("cpu")
    assert utils.get_device("meta") == torch.device("meta")
    assert utils.get_device_support() is utils.DeviceSupport.CPU
    assert utils.DeviceSupport.from_type("cuda").communication_backend == "nccl"
    assert utils.get_torch_device_namespace() is torch.cpu
    assert utils.get_world_size_and_rank() == (1, 0)
    with pytest.raises(ValueError, match="Unknown device type"):
        utils.DeviceSupport.from_type("tpu")


def test_batch_to_device_moves_nested_tensors_and_refuses_others():
    batch = {"tokens": torch.ones(2), "nested": {"labels": torch.zeros(2)}}
    utils.batch_to_device(batch, torch.device("meta"))
    assert batch["tokens"].is_meta and batch["nested"]["labels"].is_meta
    with pytest.raises(ValueError, match="must be a dict or Tensor"):
        utils.batch_to_device({"n": 1}, torch.device("cpu"))


def test_torch_version_ge_compares_versions():
    assert utils.torch_version_ge("2.4") and utils.torch_version_ge(torch.__version__.split("+")[0])
    assert not utils.torch_version_ge("99.0")


def test_logging_helpers(caplog):
    logger = utils.get_logger("DEBUG")
    assert logger.name.startswith("torchtune") and logger.level == logging.DEBUG
    with caplog.at_level(logging.INFO, logger=logger.name):
        log_rank_zero(logger, "from rank 0")
    assert "from rank 0" in caplog.text

    @deprecated("Use new_thing.")
    def old_thing():
        return 1

    with pytest.warns(FutureWarning, match="old_thing is deprecated and will be removed in future versions. Use new"):
        assert old_thing() == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert old_thing() == 1  # once

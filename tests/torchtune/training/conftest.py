"""Fixtures shared by the torchtune.training tests."""

import pytest

from torchtune import training


@pytest.fixture
def world_of_one(monkeypatch):
    """A gloo process group of one process on the CPU (no torchrun), destroyed afterwards."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    info = training.init_distributed("cpu")
    yield info
    training.destroy_distributed()

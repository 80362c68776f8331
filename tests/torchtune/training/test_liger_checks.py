"""liger-kernel asked for where it cannot run (off CUDA, or not installed) stops the run before anything loads,
with the same paragraph from `tune validate`, naming the plain setting."""

from __future__ import annotations

import sys

import pytest

from tests._helpers.tiny_run import build_recipe
from torchtune import config, training
from torchtune._cli.tune import main
from torchtune._errors import ConfigError

TINY = "llama2/tiny_full"
LIGER_LOSS = ["loss._component_=torchtune.modules.loss.LigerLinearCrossEntropyLoss", "~loss.num_output_chunks"]


@pytest.mark.parametrize(
    "overrides, names",
    [
        (["liger_kernels=True"], ["liger_kernels=True", "set liger_kernels=False"]),
        (LIGER_LOSS, ["LigerLinearCrossEntropyLoss", "=torchtune.modules.loss.ChunkedCrossEntropyLoss"]),
    ],
    ids=["kernels", "loss"],
)
def test_off_cuda_the_run_and_tune_validate_stop_before_loading(capsys, tmp_path, overrides, names):
    overrides = [f"output_dir={tmp_path / 'out'}", "device=cpu", *overrides]
    with pytest.raises(ConfigError) as raised:
        build_recipe(config.load_config(TINY, overrides))
    message = " ".join(str(raised.value).split())
    assert "need a CUDA GPU, but device=cpu" in message and all(n in message for n in names), message
    assert not (tmp_path / "out").exists()  # stopped before its set-up wrote anything
    assert main(["validate", TINY, *overrides]) != 0
    assert "need a CUDA GPU" in " ".join(capsys.readouterr().err.split())


def test_without_the_package_the_message_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # what an environment without it finds
    cfg = config.load_config(TINY, ["device=cuda", "liger_kernels=True", *LIGER_LOSS])
    with pytest.raises(ConfigError) as raised:
        training.check_liger(cfg)
    message = " ".join(str(raised.value).split())
    assert "liger_kernels=True and loss._component_=" in message
    assert "pip install 'plaintune[liger]'" in message and "set liger_kernels=False" in message


def test_liger_kernels_must_be_a_bool():
    with pytest.raises(ConfigError, match="liger_kernels"):
        training.check_value_types(config.load_config(TINY, ["liger_kernels=maybe"]))


def test_plain_configs_pass():
    training.check_liger(config.load_config(TINY, []))  # liger_kernels: False, the chunked loss

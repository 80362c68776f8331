"""`tune run`'s command line as torchtune's: torchrun's options before the recipe name (or after it), the
recipe's arguments after it; the checks made before anything is started."""

import pytest

from torchtune._cli import tune
from torchtune._cli.run import Run, parse_run_args


def test_torchrun_options_before_or_after_the_recipe_name():
    before = parse_run_args(["--nnodes", "1", "--nproc_per_node", "2", "full_finetune_distributed", "--config", "c"])
    after = parse_run_args(["full_finetune_distributed", "--nproc_per_node=2", "--config", "c", "--nnodes", "1", "x=1"])
    for args in (before, after):
        assert args.launcher and args.recipe == "full_finetune_distributed"
        assert args.nproc_per_node == "2" and args.nnodes == "1"
    assert before.recipe_args == ["--config", "c"] and after.recipe_args == ["--config", "c", "x=1"]
    plain = parse_run_args(["full_finetune_single_device", "--config", "c", "batch_size=2"])
    assert not plain.launcher and plain.recipe_args == ["--config", "c", "batch_size=2"]


def test_dispatch_as_torchtune_single_device_distributed_and_refusals(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(Run, "_run_single_device", lambda self, args, is_builtin: calls.append(("single", is_builtin)))
    monkeypatch.setattr(Run, "_run_distributed", lambda self, args, is_builtin: calls.append(("dist", is_builtin)))
    assert tune.main(["run", "full_finetune_single_device", "--config", "llama2/7B_full_low_memory"]) == 0
    assert tune.main(["run", "--nproc_per_node", "2", "full_finetune_distributed", "--config", "llama2/7B_full"]) == 0
    assert tune.main(["run", "my_recipe.py", "--config", "x.yaml"]) == 0  # resolved (and checked) when run
    assert calls == [("single", True), ("dist", True), ("single", False)]
    with pytest.raises(SystemExit) as info:
        tune.main(["run", "--nproc_per_node", "2", "full_finetune_single_device", "--config", "c"])
    assert info.value.code == 2 and "does not support distributed training" in capsys.readouterr().err
    assert tune.main(["run", "full_finetune_single_device", "batch_size=3"]) == 2
    assert "The '--config' argument is required" in capsys.readouterr().err
    assert tune.main(["run", "lora_finetune_single_device", "--config", "x"]) == 2
    assert "out of this library's scope" in " ".join(capsys.readouterr().err.split())

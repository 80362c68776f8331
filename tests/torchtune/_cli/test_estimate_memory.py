"""`tune estimate-memory` on a tiny model."""

from torchtune._cli.tune import main

TINY = [
    "model._component_=torchtune.models.llama2.llama2_tiny",
    "optimizer._component_=torch.optim.AdamW",
    "dtype=fp32",
]


def test_estimate_memory_prints_the_split(capsys):
    code = main(
        ["estimate-memory", "--config", "llama2/7B_full_low_memory", "--seq-len", "32", "--batch-size", "1", *TINY]
    )
    out = capsys.readouterr().out
    assert code == 0
    for label in (
        "weights",
        "gradients",
        "optimizer state",
        "activations",
        "temporaries",
        "total (device peak)",
        "paged/managed",
        "host RAM needed",
        "set-up (load weights)",
        "training steps",
        "step checkpoint save",
        "resume load",
        "whole run (device peak)",
        "attention counted as the CUDA memory-efficient SDPA kernel",  # fp32 on CUDA: no flash
    ):
        assert label in out
    assert "batch 1 x 32 tokens" in out


def test_estimate_memory_rejects_bad_numbers(capsys):
    code = main(["estimate-memory", "--config", "llama2/7B_full_low_memory", "--seq-len", "0", *TINY])
    assert code == 2
    assert "--seq-len must be at least 1" in capsys.readouterr().err


def test_estimate_memory_bad_override_is_a_config_error(capsys):
    code = main(["estimate-memory", "--config", "llama2/7B_full_low_memory", "optimizer.lrr=1"])
    assert code == 2
    assert "'lrr' (did you mean 'lr'?)" in " ".join(capsys.readouterr().err.split())


def test_steps_only_skips_the_checkpoint_phases(capsys):
    code = main(
        ["estimate-memory", "--config", "llama2/7B_full_low_memory", "--seq-len", "32", "--batch-size", "1"]
        + ["--steps-only", *TINY]
    )
    out = capsys.readouterr().out
    assert code == 0 and "total (device peak)" in out
    assert "resume load" not in out and "(2 steps on fake tensors" in out

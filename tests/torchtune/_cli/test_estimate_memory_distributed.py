"""`tune estimate-memory --world-size` on a distributed config (a tiny model)."""

import re

from torchtune._cli.tune import main

TINY = [
    "model._component_=torchtune.models.llama2.llama2_tiny",
    "optimizer._component_=torch.optim.AdamW",
    "dtype=fp32",
]
FSDP_KEYS = [
    "+fsdp_param_dtype=null",
    "+fsdp_reduce_dtype=null",
    "+fsdp_reshard_after_forward=True",
    "+fsdp_cpu_offload=False",
]


def _run(*args):
    return main(["estimate-memory", "--config", "llama2/7B_full_low_memory", "--seq-len", "32", *args, *TINY])


def test_world_sizes_print_a_table_each_and_a_per_gpu_summary(capsys):
    # large enough (21M parameters) for the GB figures to differ
    dims = ["+model.vocab_size=8192", "+model.embed_dim=512", "+model.num_layers=4"]
    # the same global batch on 1 and 2 GPUs (global_batch_size; batch_size is per process)
    assert _run("--world-size", "1,2", "+global_batch_size=4", *FSDP_KEYS, *dims) == 0
    out = capsys.readouterr().out
    assert "on 1 GPU: global batch 4 x 32 tokens (4 per GPU)" in out
    assert "on 2 GPUs: global batch 4 x 32 tokens (2 per GPU)" in out
    assert out.count("gathered weights") == 2
    one, two = (float(x) for x in re.findall(r"GPUs?: +([\d.]+) GB per GPU", out))
    assert 0.4 < two / one < 0.7


def test_world_size_needs_a_distributed_config(capsys):
    assert _run("--world-size", "2") == 2
    assert "--world-size estimates full_finetune_distributed configs" in capsys.readouterr().err


def test_bad_world_size_and_unsplittable_batch(capsys):
    assert _run("--world-size", "2,zero", *FSDP_KEYS) == 2
    assert "positive whole number" in capsys.readouterr().err
    assert _run("+global_batch_size=3", "--world-size", "2", *FSDP_KEYS) != 0
    assert "global batch 3 does not split over 2 processes" in capsys.readouterr().err
    assert _run("--batch-size", "3", "--world-size", "2", *FSDP_KEYS, "--steps-only") == 0  # 3 per process
    assert "on 2 GPUs: global batch 6 x 32 tokens (3 per GPU)" in capsys.readouterr().out

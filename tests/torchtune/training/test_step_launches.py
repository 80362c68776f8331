"""What a training step launches on the CUDA code path, counted without a GPU (meta tensors as the device):
the optimizer step's launches per parameter are pinned here so they cannot grow back unnoticed, and a step
syncs the host only when it logs, once."""

import pytest

from torchtune.config import load_config
from torchtune.training.estimate._step_launches import count_step_launches
from torchtune.training.optim import _fused_step

pytest.importorskip("bitsandbytes")

# the bf16 low-memory recipe on the tiny Llama2 (4 layers, dim 256): PagedAdamW in backward with rounding,
# activation checkpointing and offloading, logging every step
OVERRIDES = [
    "device=cuda",
    "dtype=bf16",
    "bf16_stochastic_rounding=True",
    "enable_activation_checkpointing=True",
    "enable_activation_offloading=True",
]
# 22 weights of 65,536 elements or more (embedding, output, each layer's q, o and three MLP matrices) are
# stepped one kernel each; the 17 others (k and v of dim 128 x 256, the norm scales) in one multi-tensor
# call per state kind at the end of backward: the weights, gradients and two moments concatenated (4
# launches), the kernel, the weights and moments copied back (3): 8. With PagedAdamW8bit the norm scales
# (256 elements, below bitsandbytes' min_8bit_size) keep 32-bit state (8) and k and v 8-bit state, whose
# codes and absmax are concatenated and copied back too (6 + 1 + 5 = 12)
BIG, SMALL = 22, 17
FLUSH = {"bitsandbytes.optim.PagedAdamW": 8, "bitsandbytes.optim.PagedAdamW8bit": 8 + 12}


@pytest.mark.parametrize("component", sorted(FLUSH))
def test_optimizer_step_launches_one_kernel_per_parameter(component):
    cfg = load_config("llama2/tiny_full", [*OVERRIDES, f"optimizer._component_={component}"])
    result = count_step_launches(cfg, seq_len=64, batch_size=2)
    assert result.parameters == BIG + SMALL
    unlogged, logged = result.unlogged, result.logged
    kernel = _fused_step.LAUNCHES["bnb32" if "8bit" not in component else "bnb8"]
    assert unlogged.optimizer_launches == BIG * kernel + FLUSH[component]
    assert unlogged.launches["rounding"] == 0  # the rounding is inside the kernels
    # a logged step: the same kernels also count the changed weights and sum the gradients' squares, which
    # one more launch each finishes
    groups = 1 if "8bit" not in component else 2
    assert logged.optimizer_launches == BIG * (kernel + 1) + FLUSH[component] + groups
    # host syncs: none on a step that does not log (offloading waits on streams only, the batch is pinned), one
    # on a step that does (the loss, gradient norm, weight-change count and NaN guard read at once)
    assert unlogged.syncs == 0, unlogged.host_syncs
    assert logged.syncs == 1, logged.host_syncs
    assert unlogged.h2d_pageable == 0 and unlogged.h2d_pinned > 0

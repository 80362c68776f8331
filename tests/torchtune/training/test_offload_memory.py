"""fsdp_cpu_offload's host-side plan and the pre-check before loading: the machine's figures (free RAM,
the locked-memory limit) are set by the test; the model, optimizer and plan are the real ones."""

from __future__ import annotations

import logging

import pytest
import torch
from omegaconf import OmegaConf

from torchtune import training
from torchtune._errors import TuneError
from torchtune.models.llama3_1 import llama3_1_8b
from torchtune.training.estimate import _offload_memory

GB = 1e9
ADAMW8BIT = OmegaConf.create({"_component_": "torchao.optim.AdamW8bit", "lr": 2e-5})


@pytest.fixture(scope="module")
def plan_8b():
    with torch.device("meta"):
        model = llama3_1_8b().to(torch.bfloat16)
    return training.offload_plan(model, ADAMW8BIT, world_size=1, dtype=torch.bfloat16)


def _machine(monkeypatch, available_gb, memlock_bytes):
    facts = {"available": int(available_gb * GB), "memlock": memlock_bytes}
    monkeypatch.setattr(_offload_memory, "machine_memory", lambda: facts)


def test_llama3_1_8b_plan_fits_48_gb_in_every_phase(plan_8b):
    assert plan_8b.params == pytest.approx(16.06e9, rel=1e-3)  # bf16 weights
    assert plan_8b.optimizer_state == pytest.approx(16.31e9, rel=1e-3)  # 8-bit moments + block scales
    assert plan_8b.full_copy == 2 * 128256 * 4096 * 2  # the streamed save: one embedding and its converted copy
    assert set(plan_8b.phases) == {"load", "steps", "save", "resume"}
    assert max(plan_8b.phases.values()) <= 48e9
    # forward moves every shard, backward the layers again; gradients come back once
    assert plan_8b.h2d_per_step > plan_8b.d2h_per_step == plan_8b.params


def test_cpu_adamw_8bit_state_is_counted_from_its_layout():
    """The 8B configs' CPUAdamW with 8-bit moments: a byte a moment plus an fp32 scale per 256 elements of a row
    (bf16 moments for the 1-D norms), counted from the shapes (as torchao's 8-bit state, within 0.1%)."""
    from torchtune.training.optim._cpu_optimizers import state_bytes

    cfg = OmegaConf.create({"_component_": "torchtune.training.CPUAdamW", "lr": 2e-5, "state_dtype": "8bit"})
    with torch.device("meta"):
        model = llama3_1_8b().to(torch.bfloat16)
    plan = training.offload_plan(model, cfg, world_size=1, dtype=torch.bfloat16)
    want = sum(state_bytes(tuple(p.shape), "8bit") for p in model.parameters())
    assert plan.optimizer_state == want == pytest.approx(16.31e9, rel=1e-3)
    assert state_bytes((4096, 4096), "8bit") == 2 * (4096 * 4096 + 4 * 4096 * 16)
    assert state_bytes((4096,), "8bit") == 2 * 2 * 4096  # 1-D: bf16 moments


def test_too_little_host_ram_stops_naming_both_figures_and_the_setting(monkeypatch, plan_8b):
    _machine(monkeypatch, available_gb=30, memlock_bytes=None)
    with pytest.raises(TuneError) as info:
        training.check_offload_host_memory(plan_8b, pin_memory=True)
    message = str(info.value)
    assert f"needs about {plan_8b.host_ram / GB:.1f} GB of host RAM" in message
    assert "this machine has 30.0 GB available" in message
    assert "optimizer._component_=torchtune.training.CPUAdamW optimizer.state_dtype=8bit" in message


def test_locked_memory_limit_below_the_pinned_bytes_falls_back_to_pageable_with_a_warning(monkeypatch, plan_8b, caplog):
    _machine(monkeypatch, available_gb=60, memlock_bytes=8 * 1024 * 1024)  # a common `ulimit -l` of 8 MB
    with caplog.at_level(logging.WARNING, logger="torchtune"):
        assert training.check_offload_host_memory(plan_8b, pin_memory=True) is False
    (record,) = [r for r in caplog.records if "locked-memory limit" in r.getMessage()]
    assert "pinning 16.1 GB" in record.getMessage() and "ulimit -l unlimited" in record.getMessage()


def test_enough_ram_and_no_lock_limit_pins_only_where_cuda_can(monkeypatch, plan_8b, caplog):
    _machine(monkeypatch, available_gb=60, memlock_bytes=None)
    with caplog.at_level(logging.WARNING, logger="torchtune"):
        assert training.check_offload_host_memory(plan_8b, pin_memory=False) is False  # nothing asked
        pinned = training.check_offload_host_memory(plan_8b, pin_memory=True)
    # pinning is tried for real: without a CUDA driver it fails, and says so
    assert pinned is torch.cuda.is_available()
    assert pinned or any("cannot be pinned" in r.getMessage() for r in caplog.records)


def test_machine_memory_reads_this_machine():
    facts = _offload_memory.machine_memory()
    assert facts["available"] > 0
    assert facts["memlock"] is None or facts["memlock"] >= 0


def test_plan_of_a_torch_adamw_measures_its_state_and_of_an_unmeasurable_optimizer_leaves_it_out():
    from torchtune.models.llama2 import llama2

    model = llama2(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=32)
    params = sum(p.numel() for p in model.parameters())
    adamw = OmegaConf.create({"_component_": "torch.optim.AdamW", "lr": 1e-3})
    plan = training.offload_plan(model, adamw, world_size=2, dtype=torch.float32)
    assert plan.params >= 4 * params // 2 and plan.optimizer_state >= 2 * plan.params  # two fp32 moments
    # rank 0 streams the full save: one full fp32 tensor (the largest) and its converted copy
    assert plan.full_copy == 2 * 4 * max(p.numel() for p in model.parameters())
    broken = OmegaConf.create({"_component_": "torch.optim.AdamW", "lr": 1e-3, "no_such_argument": 1})
    assert training.offload_plan(model, broken, world_size=1).optimizer_state == 0

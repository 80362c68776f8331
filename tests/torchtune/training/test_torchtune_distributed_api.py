"""torchtune 0.6.1's distributed names on this library's FSDP2 pieces, in a gloo world of one."""

import copy

import pytest
import torch
from torch.distributed.tensor import DTensor

from torchtune import training
from torchtune.models.llama2 import llama2

TINY = dict(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=32)


def _tiny_model(seed=0):
    torch.manual_seed(seed)
    return llama2(**TINY)


def test_outside_torchrun(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    assert not training.is_distributed()
    assert training.init_distributed(backend="gloo") is False  # torchtune's call: nothing to join
    assert training.get_distributed_backend("cuda") == "nccl"
    assert training.get_distributed_backend("cuda", offload_ops_to_cpu=True) == "cuda:nccl,cpu:gloo"
    assert training.get_shard_conditions("layers.3", None) and training.get_shard_conditions("tok", None, ["tok"])
    assert not training.get_shard_conditions("layers.3.attn", None)


def test_shard_conditions_gather_and_load_full_state_dicts(world_of_one):
    reference = _tiny_model()
    model = copy.deepcopy(reference)
    training.shard_model(model, [training.get_shard_conditions], cpu_offload=False, dp_mesh=world_of_one.mesh)
    assert all(type(layer).__name__.startswith("FSDP") for layer in model.layers)
    assert all(isinstance(p, DTensor) for p in model.parameters())
    full = training.gather_cpu_state_dict(model, is_rank_zero=True)
    assert full.keys() == reference.state_dict().keys()
    assert all(torch.equal(full[k], v) for k, v in reference.state_dict().items())

    with torch.device("meta"):
        fresh = llama2(**TINY)
    training.shard_model(fresh, [training.get_shard_conditions], cpu_offload=False, dp_mesh=world_of_one.mesh)
    training.load_from_full_model_state_dict(fresh, full, torch.device("cpu"))
    fresh.init_buffers(torch.device("cpu"))
    training.validate_no_params_on_meta_device(fresh)
    tokens = torch.randint(0, 64, (1, 8))
    torch.testing.assert_close(fresh(tokens), reference(tokens), rtol=0, atol=0)

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(tokens).sum().backward()
    optimizer.step()
    state = training.get_full_optimizer_state_dict(model, optimizer, is_rank_zero=True)
    other = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    training.load_from_full_optimizer_state_dict(fresh, other, state, torch.device("cpu"))
    name = next(iter(state["state"]))
    loaded = other.state[next(iter(fresh.parameters()))]["exp_avg"]
    loaded = loaded.full_tensor() if isinstance(loaded, DTensor) else loaded
    torch.testing.assert_close(loaded, state["state"][name]["exp_avg"])


def test_validate_no_params_on_meta_device_names_the_parameter():
    with torch.device("meta"):
        model = torch.nn.Linear(2, 2)
    with pytest.raises(RuntimeError, match="Unexpected param or buffer weight on meta device"):
        training.validate_no_params_on_meta_device(model)

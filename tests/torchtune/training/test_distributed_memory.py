"""The distributed memory estimate: sharding over 2 ranks halves each rank's parameter and optimizer
bytes exactly as FSDP2's dim-0 chunks predict (checked against a count from the parameter shapes),
the all-gathered layer is counted, and the fake run agrees with the same run on real tensors."""

import pytest
import torch

from torchtune.config import load_config
from torchtune.training.estimate._distributed_memory import (
    DISTRIBUTED_CATEGORIES,
    estimate_distributed_memory,
    fake_world,
    parse_world_sizes,
)

LAYERS, DIM, HEADS, VOCAB, BATCH, SEQ = 3, 128, 4, 512, 4, 64
TINY = [
    "model._component_=torchtune.models.llama2.llama2_tiny",
    f"+model.vocab_size={VOCAB}",
    f"+model.num_layers={LAYERS}",
    f"+model.embed_dim={DIM}",
    f"+model.num_heads={HEADS}",
    f"+model.num_kv_heads={HEADS}",
    "optimizer._component_=torch.optim.AdamW",
    "dtype=fp32",
    "enable_activation_offloading=False",
    # the FSDP keys of a full_finetune_distributed config
    "+fsdp_param_dtype=null",
    "+fsdp_reduce_dtype=null",
    "+fsdp_reshard_after_forward=True",
    "+fsdp_cpu_offload=False",
]


def _cfg(*extra):
    return load_config("llama2/7B_full_low_memory", [*TINY, *extra])


def _rounded(nbytes):
    return -(-nbytes // 512) * 512


def _expected_rank0_bytes(world_size):
    """(weights, AdamW state) on rank 0, from the shapes alone: FSDP2 splits dim 0 into world_size
    chunks of ceil(dim0 / world_size) rows (rank 0 holds a full one); AdamW keeps exp_avg and
    exp_avg_sq of the local shard plus a scalar step per parameter; RoPE's cache is not sharded."""
    from torchtune.models.llama2 import llama2_tiny

    with torch.device("meta"):
        model = llama2_tiny(vocab_size=VOCAB, num_layers=LAYERS, embed_dim=DIM, num_heads=HEADS, num_kv_heads=HEADS)
    weights = state = 0
    for p in model.parameters():
        rows = -(-p.shape[0] // world_size)
        shard = rows * p[0].numel() * 4
        weights += _rounded(shard)
        state += 2 * _rounded(shard) + 512
    weights += sum(_rounded(b.numel() * b.element_size()) for b in model.buffers())
    return weights, state


@pytest.fixture(scope="module")
def estimates():
    cfg = _cfg()
    return {w: estimate_distributed_memory(cfg, w, seq_len=SEQ, batch_size=BATCH) for w in (1, 2)}


@pytest.mark.parametrize("world_size", [1, 2])
def test_shards_match_an_independent_count(estimates, world_size):
    est = estimates[world_size]
    weights, state = _expected_rank0_bytes(world_size)
    assert est.breakdown["weights"] == weights
    assert est.breakdown["optimizer_state"] == state
    assert set(est.breakdown) == set(DISTRIBUTED_CATEGORIES)
    assert sum(est.breakdown.values()) == est.peak_bytes


def test_two_ranks_halve_parameters_and_optimizer_state(estimates):
    one, two = estimates[1], estimates[2]
    for category in ("weights", "optimizer_state"):
        assert 0.49 < two.breakdown[category] / one.breakdown[category] < 0.52, category
    # each rank still all-gathers a whole layer (and the root's embedding/output) to compute it
    assert two.breakdown["gathered_weights"] == one.breakdown["gathered_weights"]
    assert two.breakdown["gathered_weights"] >= 2 * VOCAB * DIM * 4
    # half the batch per rank: half the saved layer inputs
    assert two.breakdown["activations"] == one.breakdown["activations"] // 2
    assert two.peak_bytes < 0.7 * one.peak_bytes


def test_fake_estimate_matches_the_same_run_on_real_tensors(estimates):
    # a real CPU run runs the CPU's attention kernel: compare with the fake run of that kernel
    fake = estimate_distributed_memory(_cfg(), 2, seq_len=SEQ, batch_size=BATCH, attention="native")
    real = estimate_distributed_memory(_cfg(), 2, seq_len=SEQ, batch_size=BATCH, fake=False)
    assert real.peak_bytes == fake.peak_bytes
    assert real.breakdown == fake.breakdown


def test_no_reshard_after_forward_keeps_every_layer_gathered(estimates):
    kept = estimate_distributed_memory(_cfg("fsdp_reshard_after_forward=False"), 2, seq_len=SEQ, batch_size=BATCH)
    resharded = estimates[2]
    assert kept.breakdown["weights"] == resharded.breakdown["weights"]
    # after forward, all LAYERS layers stay gathered until their backward (vs one or two at a time)
    layer = (4 * DIM * DIM + 3 * DIM * _hidden_dim() + 2 * DIM) * 4
    assert kept.breakdown["gathered_weights"] - resharded.breakdown["gathered_weights"] >= (LAYERS - 2) * layer
    assert kept.peak_bytes > resharded.peak_bytes


def _hidden_dim():
    from torchtune.models.llama2 import llama2_tiny

    with torch.device("meta"):
        model = llama2_tiny(vocab_size=VOCAB, num_layers=1, embed_dim=DIM, num_heads=HEADS, num_kv_heads=HEADS)
    return model.layers[0].mlp.w1.out_features


def test_bf16_compute_gathers_half_the_bytes(estimates):
    bf16 = estimate_distributed_memory(_cfg("fsdp_param_dtype=bf16"), 2, seq_len=SEQ, batch_size=BATCH)
    assert bf16.breakdown["weights"] == estimates[2].breakdown["weights"]  # the fp32 shards stay
    ratio = bf16.breakdown["gathered_weights"] / estimates[2].breakdown["gathered_weights"]
    assert 0.45 < ratio < 0.55


def test_batch_must_split_over_the_ranks():
    with pytest.raises(Exception, match="global batch 3 does not split over 2 processes"):
        estimate_distributed_memory(_cfg(), 2, seq_len=SEQ, batch_size=3)


def test_fake_world_leaves_no_process_group():
    import torch.distributed as dist

    with fake_world(4) as mesh:
        assert dist.get_world_size() == 4 and mesh.size() == 4
    assert not dist.is_initialized()


def test_parse_world_sizes():
    assert parse_world_sizes("1,2, 8") == [1, 2, 8]
    for bad in ("0", "2,x", "-1", ""):
        with pytest.raises(Exception, match="positive whole number"):
            parse_world_sizes(bad)


def test_cpu_offload_keeps_parameters_gradients_and_optimizer_state_on_the_host(estimates):
    offloaded = estimate_distributed_memory(_cfg("fsdp_cpu_offload=True"), 1, seq_len=SEQ, batch_size=BATCH)
    on_device = estimates[1]
    weights, state = _expected_rank0_bytes(1)
    buffers = weights - sum(_rounded(p) for p in _param_bytes())
    # on the device: only RoPE's cache of the model's own tensors, no optimizer state ...
    assert offloaded.breakdown["weights"] == buffers
    assert offloaded.breakdown["optimizer_state"] == 0
    # ... but still the gathered layer being computed and its unsharded gradients
    assert offloaded.breakdown["gathered_weights"] > 0
    # the device peak drops by (at least) the parameters and optimizer state that moved
    assert offloaded.peak_bytes <= on_device.peak_bytes - (weights - buffers) - state
    # on the host: the shards, the optimizer state and the gradients copied back
    host = offloaded.host_offload_peak_bytes
    assert weights - buffers + state <= host <= weights - buffers + state + 2 * (weights - buffers)
    assert "FSDP offload" in offloaded.format()
    args = (_cfg("fsdp_cpu_offload=True"), 1)
    fake = estimate_distributed_memory(*args, seq_len=SEQ, batch_size=BATCH, attention="native")
    real = estimate_distributed_memory(*args, seq_len=SEQ, batch_size=BATCH, fake=False)
    assert (real.peak_bytes, real.breakdown, real.host_offload_peak_bytes) == (
        fake.peak_bytes,
        fake.breakdown,
        fake.host_offload_peak_bytes,
    )


def _param_bytes():
    from torchtune.models.llama2 import llama2_tiny

    with torch.device("meta"):
        model = llama2_tiny(vocab_size=VOCAB, num_layers=LAYERS, embed_dim=DIM, num_heads=HEADS, num_kv_heads=HEADS)
    return [p.numel() * 4 for p in model.parameters()]


@pytest.mark.parametrize(
    "settings",
    [
        ("optimizer_in_bwd=False",),
        # the shipped configs' way: bf16 weights rounded stochastically, stepped in backward (the state is
        # made before the step, for the whole parameter: once counted as the whole model's on every rank)
        ("dtype=bf16", "bf16_stochastic_rounding=True", "optimizer_in_bwd=True"),
    ],
    ids=["standard step", "bf16 rounded in backward"],
)
def test_torchao_8bit_state_is_counted_per_local_shard(settings):
    cfg = _cfg("optimizer._component_=torchao.optim.AdamW8bit", *settings)
    one, two = (estimate_distributed_memory(cfg, w, seq_len=SEQ, batch_size=BATCH) for w in (1, 2))
    assert 0.45 < two.breakdown["optimizer_state"] / one.breakdown["optimizer_state"] < 0.55


def test_bitsandbytes_is_refused_as_the_recipe_does():
    with pytest.raises(Exception, match="torchao.optim.AdamW8bit"):
        estimate_distributed_memory(_cfg("optimizer._component_=bitsandbytes.optim.AdamW8bit"), 2, seq_len=SEQ)


def test_host_memory_of_llama2_70b_on_8_ranks_is_one_tensor_not_the_model():
    """Hand counts from the 70B shapes (bf16): the final save's largest tensor on rank 0 is the token
    embedding (32000 x 8192), larger than a permuted q copy (2 x 8192 x 8192) or w1 (28672 x 8192); the
    load's largest in-flight rows are rank 0's 4000 embedding rows; with CPU offload the shards add an
    eighth of the model."""
    from torchtune.training.estimate._distributed_memory import estimate_host_memory

    cfg = load_config("llama2/70B_full")
    host = estimate_host_memory(cfg, 8)
    assert host.full_save_rank0 == 32000 * 8192 * 2
    assert host.load == 4000 * 8192 * 2
    assert host.full_save_other == host.steps == 0
    # a step save stages one local tensor: rank 0's embedding (or output) rows
    assert host.step_save == 4000 * 8192 * 2

    offloaded = estimate_host_memory(load_config("llama2/70B_full", ["fsdp_cpu_offload=True"]), 8)
    model_bytes = 68_976_648_192 * 2  # Llama2-70B's parameters in bf16
    assert offloaded.load - host.load == pytest.approx(model_bytes / 8, rel=1e-3)

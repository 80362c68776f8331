"""Stochastic rounding of FSDP2's sharded (DTensor) parameters, on two real gloo processes.

Each rank steps its own shard of the weight and of Adam's bf16 moments in fp32 slices and rounds them with
its own stream; the moments must decay as an fp32 run's do (the distributed configs train bf16 weights with
torch AdamW, beta2 = 0.999), the state must stay sharded (DTensor) for the sharded checkpoint, and the
saved streams of both ranks must continue exactly on resume.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from torchtune.training.optim._parameter_step import step_parameter
from torchtune.training.optim._stochastic_rounding import ShardedStochasticRounding, StochasticRounding

N, STEPS = 4096, 1000


def _gradient(i: int, dtype: torch.dtype) -> torch.Tensor:
    """The same full gradient on every rank (each keeps its shard): 200 large steps, then 100x smaller."""
    generator = torch.Generator().manual_seed(i)
    return ((1.0 if i < 200 else 0.01) * torch.randn(N, generator=generator)).to(dtype)


def _weights(dtype: torch.dtype) -> torch.Tensor:
    return (torch.rand(N, generator=torch.Generator().manual_seed(0)) + 1).to(dtype)


def _sharded_run(rank: int, world_size: int, init_file: str, results: dict) -> None:
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor, Shard, distribute_tensor, init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size)
    try:
        mesh = init_device_mesh("cpu", (world_size,))
        param = torch.nn.Parameter(distribute_tensor(_weights(torch.bfloat16), mesh, [Shard(0)]))
        opt = torch.optim.AdamW([param], lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0)
        rounding = ShardedStochasticRounding(seed=0, device=torch.device("cpu"), rank=rank, world_size=world_size)
        for i in range(STEPS):
            if i == STEPS - 10:
                saved = rounding.state_dict()  # a collective: every rank's stream
            param.grad = distribute_tensor(_gradient(i, torch.bfloat16), mesh, [Shard(0)])
            step_parameter(opt, param, rounding=rounding, in_backward=True)
        # a resume on as many ranks continues each rank's own saved stream
        resumed = ShardedStochasticRounding(seed=0, device=torch.device("cpu"), rank=rank, world_size=world_size)
        resumed.load_state_dict(saved)
        same = StochasticRounding.state_dict(resumed) == saved["per_rank"][rank]  # this rank's own part
        state = opt.state[param]
        results_here = {
            "sharded_state": all(isinstance(state[k], DTensor) for k in ("exp_avg", "exp_avg_sq")),
            "state_dtype": state["exp_avg_sq"].dtype,
            "exp_avg_sq": state["exp_avg_sq"].full_tensor().float().mean().item(),
            "weight_mean": param.full_tensor().float().mean().item(),
            "own_streams_differ": saved["per_rank"][0]["seed"] != saved["per_rank"][1]["seed"],
            "resumed_stream": same,
        }
        if rank == 0:
            results.update(results_here)
    finally:
        dist.destroy_process_group()


def _plain_run(dtype: torch.dtype, rounding) -> tuple[float, float]:
    param = torch.nn.Parameter(_weights(dtype))
    opt = torch.optim.AdamW([param], lr=1e-5, betas=(0.9, 0.999), weight_decay=0.0)
    for i in range(STEPS):
        param.grad = _gradient(i, dtype)
        step_parameter(opt, param, rounding=rounding)
    return opt.state[param]["exp_avg_sq"].float().mean().item(), param.float().mean().item()


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    init_file = str(tmp_path_factory.mktemp("sr") / "init")
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_sharded_run, args=(2, init_file, results), nprocs=2, join=True)
        return dict(results)


def test_sharded_bf16_moments_decay_as_fp32_does(sharded):
    """Rounded to nearest, exp_avg_sq would stay more than 2x above fp32's (0.999 v rounds back to v in bf16:
    see test_adamw_on_bf16_weights_decays_exp_avg_sq_as_fp32_does); each rank rounding its shard keeps it
    within 2% of the fp32 run's, and the weights' mean within 1% of the fp32 run's movement."""
    fp32_v, fp32_w = _plain_run(torch.float32, None)
    start = _weights(torch.float32).mean().item()
    assert sharded["state_dtype"] == torch.bfloat16 and sharded["sharded_state"]
    assert sharded["exp_avg_sq"] == pytest.approx(fp32_v, rel=0.02), (sharded["exp_avg_sq"], fp32_v)
    assert sharded["weight_mean"] - start == pytest.approx(fp32_w - start, rel=0.01, abs=2e-4)


def test_each_rank_has_its_own_stream_and_resumes_it(sharded):
    assert sharded["own_streams_differ"]
    assert sharded["resumed_stream"]


def test_resume_on_another_rank_count_starts_new_streams():
    saved = ShardedStochasticRounding(seed=3, device=torch.device("cpu"), rank=0, world_size=1).state_dict()
    other = ShardedStochasticRounding(seed=3, device=torch.device("cpu"), rank=1, world_size=2)
    other.load_state_dict(saved)  # saved on 1 rank, resumed on 2: a new stream, not the start's
    fresh = ShardedStochasticRounding(seed=3, device=torch.device("cpu"), rank=1, world_size=2)
    assert other.next_key() != fresh.next_key()
    # rank 0 of a world of one rounds as the single-device recipe does (same seed, same stream)
    assert saved["per_rank"][0] == StochasticRounding(3, torch.device("cpu")).state_dict()

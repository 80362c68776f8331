"""torchtune.training's distributed helpers in one process (a gloo world of one, no torchrun)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from torchtune import training
from torchtune._errors import TuneError
from torchtune.models.llama2 import llama2
from torchtune.modules.loss import ChunkedCrossEntropyLoss

TINY = dict(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=32)


def _tiny_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return llama2(**TINY)


def test_init_distributed_without_torchrun_is_a_world_of_one(world_of_one):
    assert dist.is_initialized() and dist.get_backend() == "gloo"
    assert (world_of_one.rank, world_of_one.world_size, world_of_one.device) == (0, 1, torch.device("cpu"))
    assert world_of_one.mesh.size() == 1 and training.get_world_size_and_rank() == (1, 0)
    assert training.is_rank_zero()


def test_shard_model_keeps_names_and_computes_the_same(world_of_one):
    reference = _tiny_model()
    model = copy.deepcopy(reference)
    training.shard_model(model, mesh=world_of_one.mesh)

    names = [n for n, _ in model.named_parameters()]
    assert names == [n for n, _ in reference.named_parameters()]
    assert all(isinstance(p, DTensor) for p in model.parameters())
    # each decoder layer is its own FSDP unit, and the root holds the rest
    assert all(type(layer).__name__.startswith("FSDP") for layer in model.layers)
    assert type(model).__name__.startswith("FSDP")

    tokens = torch.randint(0, TINY["vocab_size"], (2, 16), generator=torch.Generator().manual_seed(1))
    labels = tokens.roll(-1, dims=1)
    loss_fn = ChunkedCrossEntropyLoss(num_output_chunks=2, min_chunk_rows=1)
    losses = []
    for m in (reference, model):
        loss = loss_fn(m.output, m(tokens, output_hidden_states=True), labels)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=0, atol=1e-6)
    for (name, p_ref), p in zip(reference.named_parameters(), model.parameters()):
        assert isinstance(p.grad, DTensor), name
        torch.testing.assert_close(p.grad.full_tensor(), p_ref.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_shard_model_mixed_precision_casts_compute_not_storage(world_of_one):
    model = training.shard_model(_tiny_model(), mesh=world_of_one.mesh, param_dtype=torch.bfloat16)
    tokens = torch.zeros(1, 4, dtype=torch.long)
    hidden = model(tokens, output_hidden_states=True)
    assert hidden.dtype == torch.bfloat16  # the layers computed in bf16
    # the root stays gathered after forward (the loss applies model.output next), in the compute dtype
    assert model.output.weight.dtype == torch.bfloat16 and not isinstance(model.output.weight, DTensor)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()
    assert all(isinstance(p, DTensor) and p.dtype == torch.float32 for p in model.parameters())  # storage: fp32


def test_in_backward_hooks_fire_on_sharded_parameters(world_of_one):
    reference = _tiny_model()
    model = training.shard_model(copy.deepcopy(reference), mesh=world_of_one.mesh)
    cfg = {"_component_": "torch.optim.SGD", "lr": 0.1}
    optimizers = [training.build_optimizer(cfg, m, optimizer_in_bwd=True) for m in (reference, model)]
    tokens = torch.randint(0, TINY["vocab_size"], (2, 8), generator=torch.Generator().manual_seed(2))
    for m in (reference, model):
        m(tokens).sum().backward()
    for (name, p_ref), p in zip(reference.named_parameters(), model.parameters()):
        assert p.grad is None, name  # stepped and freed inside backward
        torch.testing.assert_close(p.full_tensor(), p_ref.detach(), rtol=1e-5, atol=1e-6, msg=name)
    assert len(optimizers[1].state_dict()) == len(list(model.parameters()))


def test_shard_model_refuses_a_model_without_decoder_layers(world_of_one):
    with pytest.raises(TuneError, match="no TransformerDecoderLayer"):
        training.shard_model(torch.nn.Linear(4, 4), mesh=world_of_one.mesh)


def test_shard_model_refuses_a_bad_reshard_value(world_of_one):
    with pytest.raises(TuneError, match="fsdp_reshard_after_forward"):
        training.shard_model(_tiny_model(), mesh=world_of_one.mesh, reshard_after_forward=0)


@pytest.mark.parametrize(
    "device, backend, match",
    [("cpu", "nccl", "dist_backend: nccl does not work with device: cpu"), ("mps", None, "no communication backend")],
)
def test_backend_must_fit_the_device(device, backend, match):
    with pytest.raises(TuneError, match=match):
        training.backend_for_device(device, backend)
    assert training.backend_for_device("cuda") == "nccl" and training.backend_for_device("cpu", "gloo") == "gloo"


def test_init_distributed_refuses_a_device_index():
    with pytest.raises(TuneError, match="local rank"):
        training.init_distributed("cuda:1")


def test_load_full_state_dict_into_a_meta_model_matches_the_full_model(world_of_one):
    reference = _tiny_model(seed=3)
    with torch.device("meta"):
        model = llama2(**TINY)
    training.shard_model(model, mesh=world_of_one.mesh)
    training.load_full_state_dict(model, reference.state_dict(), device=torch.device("cpu"))
    model.init_buffers(torch.device("cpu"))
    for (name, p_ref), p in zip(reference.named_parameters(), model.parameters()):
        assert isinstance(p, DTensor) and p.to_local().device.type == "cpu", name
        assert torch.equal(p.full_tensor(), p_ref.detach()), name
    tokens = torch.arange(8).unsqueeze(0)
    torch.testing.assert_close(model(tokens), reference(tokens), rtol=0, atol=1e-6)


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_ranks_batches_together_are_one_process_batches(num_replicas):
    from torch.utils.data import DataLoader

    from torchtune.training import ResumableSampler

    n, per_rank = 23, 2
    single = list(DataLoader(range(n), batch_size=per_rank * num_replicas, sampler=ResumableSampler(n, seed=5)))
    ranks = [
        list(
            DataLoader(
                range(n), batch_size=per_rank, sampler=ResumableSampler(n, seed=5, num_replicas=num_replicas, rank=r)
            )
        )
        for r in range(num_replicas)
    ]
    assert len({len(r) for r in ranks}) == 1  # the same number of batches on every rank
    steps = len(ranks[0]) - 1  # the last global batch is the partial one, which may differ
    for k in range(steps):
        together = sorted(int(i) for r in ranks for i in r[k])
        assert together == sorted(int(i) for i in single[k])
    # resuming at an example offset of the whole order gives every rank its continuation
    start = per_rank * num_replicas * 2
    for r in range(num_replicas):
        sampler = ResumableSampler(n, seed=5, num_replicas=num_replicas, rank=r)
        full = list(sampler)
        sampler.set_epoch(0, start_index=start)
        assert list(sampler) == full[start // num_replicas :]
        assert len(sampler) == len(list(sampler))


def test_grad_norm_of_sharded_gradients_is_the_global_norm(world_of_one):
    model = training.shard_model(_tiny_model(), mesh=world_of_one.mesh)
    reference = _tiny_model()
    tokens = torch.arange(8).unsqueeze(0)
    for m in (model, reference):
        m(tokens).sum().backward()
    tracker = training.GradNormTracker()
    tracker.arm(torch.device("cpu"))
    for p in model.parameters():
        tracker.add(p.grad)
    expected = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in reference.parameters()]))
    assert tracker.pop() == pytest.approx(float(expected), rel=1e-5)
    tracker.arm(torch.device("cpu"))
    training.step_optimizer(
        torch.optim.SGD(model.parameters(), lr=0.0), model.parameters(), clip_grad_norm=1e9, grad_norm=tracker
    )
    assert tracker.pop() == pytest.approx(float(expected), rel=1e-5)


@pytest.mark.parametrize("torchrun", [True, False], ids=["torchrun", "one_process"])
def test_exit_process_skips_interpreter_finalization_under_torchrun(torchrun, tmp_path):
    """gloo's worker threads outlive destroy_process_group while a device mesh or a DTensor holds the group; one
    that drops a collective's tensor after the interpreter began finalizing aborts the process ("terminate called
    without an active exception", exit -6). Under torchrun a worker ends with os._exit once its main returned, the
    status, output and traceback kept; nothing runs at finalization (an atexit hook shows whether it did)."""
    import os
    import subprocess
    import sys

    code = (
        "import atexit, sys\n"
        "from torchtune.training import exit_process\n"
        "atexit.register(lambda: print('finalized', flush=True))\n"
        "def main():\n"
        "    print('trained', flush=True)\n"
        "    raise SystemExit(143) if sys.argv[1] == 'stop' else RuntimeError('broken')\n"
        "exit_process(main)\n"
    )
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    if torchrun:
        env.update(RANK="1", WORLD_SIZE="2", LOCAL_RANK="1", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
    for arg, status in (("stop", 143), ("error", 1)):
        result = subprocess.run([sys.executable, "-c", code, arg], capture_output=True, text=True, env=env, timeout=120)
        assert result.returncode == status and result.stdout.startswith("trained"), result.stderr
        assert ("finalized" in result.stdout) != torchrun
        assert ("RuntimeError: broken" in result.stderr) == (arg == "error")

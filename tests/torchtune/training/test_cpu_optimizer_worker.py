"""The CPU optimizer worker of fsdp_cpu_offload: the same weights and state as stepping in the hooks,
errors that reach the training loop, and a bit-exact resume, on FSDP2 with ``CPUOffloadPolicy`` over
gloo in a world of one process (FSDP2's CPU offload runs on a CPU mesh too, unpinned)."""

from __future__ import annotations

import threading

import pytest
import torch
from omegaconf import OmegaConf
from torch.distributed.tensor import DTensor

from torchtune import training
from torchtune._errors import TuneError
from torchtune.models.llama2 import llama2
from torchtune.modules.loss import ChunkedCrossEntropyLoss
from torchtune.training.optim._cpu_optimizer_worker import CPUOptimizerWorker, WorkerOptimInBackward

TINY = dict(vocab_size=64, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=32)
ADAMW = OmegaConf.create({"_component_": "torch.optim.AdamW", "lr": 1e-2, "weight_decay": 0.01, "foreach": True})


def _batches(n: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(n):
        tokens = torch.randint(0, TINY["vocab_size"], (2, 16), generator=g)
        out.append((tokens, tokens.roll(-1, dims=1)))
    return out


class _Run:
    """A tiny Llama sharded with CPU offload and an in-backward AdamW, stepped with or without the worker."""

    def __init__(
        self, info, *, worker: bool, dtype=torch.float32, rounding=False, group="param", shard=True, offload=True
    ) -> None:
        torch.manual_seed(0)
        self.model = llama2(**TINY).to(dtype)
        if shard:
            training.shard_model(self.model, mesh=info.mesh, cpu_offload=offload, pin_memory=False)
        # the distributed recipe's rounding (one stream per rank) for shards, the single-device one otherwise
        world = {"info": info} if shard else {}
        self.rounding = training.build_stochastic_rounding(
            rounding, dtype=dtype, seed=3, device=torch.device("cpu"), **world
        )
        self.grad_norm = training.GradNormTracker()
        self.optimizer = training.build_optimizer(
            ADAMW,
            self.model,
            optimizer_in_bwd=True,
            in_bwd_group=group,
            grad_norm=self.grad_norm,
            rounding=self.rounding,
            cpu_worker=worker,
        )
        self.loss_fn = ChunkedCrossEntropyLoss(num_output_chunks=2, min_chunk_rows=1)

    def step(self, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
        self.grad_norm.arm(torch.device("cpu"))
        loss = self.loss_fn(self.model.output, self.model(tokens, output_hidden_states=True), labels)
        loss.backward()
        training.step_optimizer(self.optimizer, self.model.parameters(), grad_norm=self.grad_norm)
        return loss.item(), self.grad_norm.pop()

    def weights(self) -> dict[str, torch.Tensor]:
        return {n: _local(p).detach().clone() for n, p in self.model.named_parameters()}

    def state(self) -> dict[str, dict]:
        return {
            name: {k: _local(v).clone() for k, v in opt.state[p].items()}
            for (name, p), opt in zip(self.model.named_parameters(), self.optimizer.optim_map.values())
        }


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if isinstance(t, DTensor) else t


def _assert_same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        if isinstance(a[name], (dict, list)):
            _assert_same(
                dict(enumerate(a[name])) if isinstance(a[name], list) else a[name],
                dict(enumerate(b[name])) if isinstance(b[name], list) else b[name],
            )
        elif isinstance(a[name], torch.Tensor):
            assert torch.equal(a[name], b[name]), name
        else:
            assert a[name] == b[name], name


@pytest.mark.parametrize(
    "dtype,rounding,group,shard",
    [
        (torch.float32, False, "param", True),
        (torch.float32, False, "layer", True),
        (torch.bfloat16, True, "param", True),
        (torch.bfloat16, True, "layer", True),
        (torch.bfloat16, True, "param", False),
    ],
    ids=[
        "fp32-offloaded",
        "fp32-offloaded-layer",
        "bf16-rounded-offloaded",
        "bf16-rounded-offloaded-layer",
        "bf16-rounded-unsharded",
    ],
)
def test_worker_steps_bitwise_as_the_hooks_do(world_of_one, dtype, rounding, group, shard):
    runs = {}
    for worker in (False, True):
        run = _Run(world_of_one, worker=worker, dtype=dtype, rounding=rounding, group=group, shard=shard)
        assert isinstance(run.optimizer, WorkerOptimInBackward) == worker
        metrics = [run.step(*batch) for batch in _batches(3)]
        assert all(p.grad is None for p in run.model.parameters())  # every gradient freed by its step
        runs[worker] = (metrics, run.weights(), run.state(), run.rounding.state_dict() if rounding else {})
    (m0, w0, s0, r0), (m1, w1, s1, r1) = runs[False], runs[True]
    assert m1 == m0  # losses and gradient norms, exactly
    assert len(set(m0)) == 3  # the steps did change the model
    _assert_same(w1, w0)
    _assert_same(s1, s0)
    _assert_same(r1, r0)  # the rounding streams drew the same bits


def test_offloaded_worker_run_has_the_losses_of_the_run_without_offload(world_of_one):
    batches = _batches(3)
    runs = [_Run(world_of_one, worker=True), _Run(world_of_one, worker=False, offload=False)]
    losses = [[run.step(*b)[0] for b in batches] for run in runs]
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


def test_worker_runs_jobs_off_the_main_thread_in_order_and_bounds_pending_bytes():
    worker = CPUOptimizerWorker(reserve_cores=None, max_pending_bytes=10)
    release, seen = threading.Event(), []
    worker.submit(lambda: (release.wait(), seen.append(threading.current_thread().name)), nbytes=8)
    worker.submit(lambda: seen.append(2), nbytes=0)  # fits beside the first: queued, not run yet
    assert seen == []  # submit returned while the first job still waits
    release.set()
    worker.submit(lambda: seen.append(3), nbytes=8)  # over the bound: waits until the first is done
    worker.wait()
    assert seen == ["cpu-optimizer-worker", 2, 3]
    worker.close()


def test_worker_error_reaches_the_main_thread(world_of_one):
    run = _Run(world_of_one, worker=True)
    (tokens, labels), *_ = _batches(1)
    run.step(tokens, labels)
    # a real optimizer failing in its step: betas no longer a pair
    broken = run.optimizer.optim_map["layers.0.attn.q_proj.weight"]
    broken.param_groups[0]["betas"] = (0.9,)
    with pytest.raises(TuneError, match="optimizer step on the CPU worker failed: ValueError") as info:
        run.step(tokens, labels)
    assert isinstance(info.value.__cause__, ValueError)
    run.optimizer.worker.close()


def test_resume_of_the_offloaded_worker_state_is_bit_exact(world_of_one, tmp_path):
    batches = _batches(3)
    straight = _Run(world_of_one, worker=True)
    for batch in batches:
        straight.step(*batch)

    first = _Run(world_of_one, worker=True)
    for batch in batches[:2]:
        first.step(*batch)
    writer = training.ShardedCheckpointWriter(world_of_one)
    folder = writer.save(
        tmp_path / "step_2",
        model=first.model,
        optimizer=first.optimizer,
        recipe_state={},
        step=2,
        epoch=0,
        intermediate=True,
    )
    writer.finish()
    first.optimizer.worker.close()

    resumed = _Run(world_of_one, worker=True)
    with torch.no_grad():
        for p in resumed.model.parameters():
            p.to_local().zero_()  # nothing of the fresh model survives the load
    training.load_sharded_checkpoint(folder, model=resumed.model, optimizer=resumed.optimizer, info=world_of_one)
    resumed.step(*batches[2])
    _assert_same(resumed.weights(), straight.weights())
    _assert_same(resumed.state(), straight.state())


def test_torchao_adamw8bit_on_offloaded_bf16_shards_worker_and_resume_are_bit_exact(world_of_one, tmp_path):
    # torchao's compiled step fails on FSDP2's DTensor shards of bf16 parameters; the recipe steps it on
    # the local tensors (training.optim._torchao_local_step). Its own stochastic rounding draws from the
    # default generator, which the recipe saves with the RNG state: reset here for each run.
    cfg = OmegaConf.create({"_component_": "torchao.optim.AdamW8bit", "lr": 1e-2, "bf16_stochastic_round": True})

    def run(worker: bool):
        torch.manual_seed(0)
        model = llama2(**TINY).to(torch.bfloat16)
        training.shard_model(model, mesh=world_of_one.mesh, cpu_offload=True, pin_memory=False)
        optimizer = training.build_optimizer(cfg, model, optimizer_in_bwd=True, cpu_worker=worker)
        return model, optimizer

    loss_fn = ChunkedCrossEntropyLoss(num_output_chunks=2, min_chunk_rows=1)

    def step(model, optimizer, tokens, labels):
        loss = loss_fn(model.output, model(tokens, output_hidden_states=True), labels)
        loss.backward()
        training.step_optimizer(optimizer, model.parameters())
        return loss.item()

    batches = _batches(3)
    results = {}
    for worker in (False, True):
        model, optimizer = run(worker)
        torch.manual_seed(7)
        losses = [step(model, optimizer, *b) for b in batches]
        results[worker] = (losses, {n: _local(p).clone() for n, p in model.named_parameters()})
    assert results[True][0] == results[False][0] and len(set(results[True][0])) == 3
    _assert_same(results[True][1], results[False][1])
    big = optimizer.optim_map["layers.0.mlp.w1.weight"].state[model.layers[0].mlp.w1.weight]
    assert type(_local(big["exp_avg"])).__name__ == "OptimState8bit"  # the 8-bit state, sharded as a DTensor

    model, optimizer = run(True)
    torch.manual_seed(7)
    for b in batches[:2]:
        step(model, optimizer, *b)
    rng = torch.get_rng_state()
    writer = training.ShardedCheckpointWriter(world_of_one)
    folder = writer.save(
        tmp_path / "step_2", model=model, optimizer=optimizer, recipe_state={}, step=2, epoch=0, intermediate=True
    )
    optimizer.worker.close()
    model, optimizer = run(True)
    training.load_sharded_checkpoint(folder, model=model, optimizer=optimizer, info=world_of_one)
    torch.set_rng_state(rng)
    assert step(model, optimizer, *batches[2]) == results[True][0][2]
    _assert_same({n: _local(p) for n, p in model.named_parameters()}, results[True][1])


@pytest.mark.parametrize(
    "component,extra",
    [("torchao.optim.AdamW8bit", {}), ("torchtune.training.CPUAdamW", {"state_dtype": "8bit"})],
    ids=["torchao-8bit", "cpu-adamw-8bit"],
)
def test_worker_with_activation_checkpointing_is_deterministic_and_resumes_bit_exactly(
    world_of_one, tmp_path, component, extra
):
    # The 8B 16 GB configs' set-up: offloaded bf16 shards, an 8-bit AdamW stepped on the worker with the
    # run's stochastic rounding, activation checkpointing on. Checkpoint recompute forks and restores the
    # global generator on the main thread while the worker steps: a worker whose rounding touched that
    # generator (torchao's own) gave other weights on every repeat.
    cfg = OmegaConf.create({"_component_": component, "lr": 1e-2, **extra})
    batches = _batches(4)
    loss_fn = ChunkedCrossEntropyLoss(num_output_chunks=2, min_chunk_rows=1)

    def build(worker: bool, state=None):
        torch.manual_seed(0)
        model = llama2(**TINY).to(torch.bfloat16)
        training.set_activation_checkpointing(model, {type(model.layers[0])})
        training.shard_model(model, mesh=world_of_one.mesh, cpu_offload=True, pin_memory=False)
        rounding = training.build_stochastic_rounding(
            True, dtype=torch.bfloat16, seed=3, device=torch.device("cpu"), info=world_of_one, state=state
        )
        optimizer = training.build_optimizer(cfg, model, optimizer_in_bwd=True, rounding=rounding, cpu_worker=worker)
        return model, optimizer, rounding

    def step(model, optimizer, tokens, labels):
        loss = loss_fn(model.output, model(tokens, output_hidden_states=True), labels)
        loss.backward()
        training.step_optimizer(optimizer, model.parameters())
        return loss.item()

    def weights(model):
        return {n: _local(p).detach().clone() for n, p in model.named_parameters()}

    results = []
    for worker in (False, True, True, True):
        model, optimizer, _ = build(worker)
        torch.manual_seed(7)
        losses = [step(model, optimizer, *b) for b in batches]
        results.append((losses, weights(model), torch.get_rng_state()))
        if worker:
            optimizer.worker.close()
    for losses, w, rng in results[1:]:
        assert losses == results[0][0]
        _assert_same(w, results[0][1])
        assert torch.equal(rng, results[0][2])  # the global generator is where the main thread left it

    model, optimizer, rounding = build(True)
    torch.manual_seed(7)
    for b in batches[:2]:
        step(model, optimizer, *b)
    rng, stream = torch.get_rng_state(), rounding.state_dict()
    writer = training.ShardedCheckpointWriter(world_of_one)
    folder = writer.save(
        tmp_path / "step_2", model=model, optimizer=optimizer, recipe_state={}, step=2, epoch=0, intermediate=True
    )
    writer.finish()
    optimizer.worker.close()
    model, optimizer, _ = build(True, state=stream)
    with torch.no_grad():
        for p in model.parameters():
            p.to_local().zero_()  # nothing of the fresh model survives the load
    training.load_sharded_checkpoint(folder, model=model, optimizer=optimizer, info=world_of_one)
    torch.set_rng_state(rng)
    assert [step(model, optimizer, *b) for b in batches[2:]] == results[0][0][2:]
    _assert_same(weights(model), results[0][1])
    if component.startswith("torchtune"):  # the 8-bit state, sharded as the parameter is
        state = optimizer.optim_map["layers.0.mlp.w1.weight"].state[model.layers[0].mlp.w1.weight]
        assert _local(state["exp_avg"]).dtype == torch.uint8 and isinstance(state["exp_avg_scale"], DTensor)
    optimizer.worker.close()

"""On a real GPU: the distributed recipe's CPU-offloaded step (FSDP2 ``CPUOffloadPolicy``, pinned host
shards, the optimizer stepped on the CPU worker thread during backward) gives the losses of the same
run without offload, and its device peak is what ``tune estimate-memory`` says.

Run with ``make test-gpu``; skipped with the reason where PyTorch sees no CUDA GPU.
"""

import pytest
import torch
from omegaconf import OmegaConf

from torchtune import training
from torchtune.config import load_config
from torchtune.models.llama2 import llama2
from torchtune.modules.loss import ChunkedCrossEntropyLoss
from torchtune.training.estimate._distributed_memory import estimate_distributed_memory
from torchtune.training.optim._cpu_optimizer_worker import WorkerOptimInBackward

pytestmark = pytest.mark.gpu

BATCH, SEQ, STEPS = 2, 512, 3
# ~0.2B parameters: big enough that the allocator's own few MB stay inside the tolerance
SMALL = dict(vocab_size=32000, num_layers=4, num_heads=16, num_kv_heads=16, embed_dim=2048, max_seq_len=SEQ)
ADAMW = OmegaConf.create({"_component_": "torch.optim.AdamW", "lr": 1e-4, "weight_decay": 0.0})


@pytest.fixture
def world(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    info = training.init_distributed("cuda")
    yield info
    training.destroy_distributed()


def _run(info, offload: bool):
    device = info.device
    torch.manual_seed(0)
    model = llama2(**SMALL)  # fp32: the losses are compared at 1e-5
    if not offload:
        model.to(device)
    training.shard_model(model, mesh=info.mesh, cpu_offload=offload, sum_gradients=True)
    model.init_buffers(device)
    optimizer = training.build_optimizer(ADAMW, model, optimizer_in_bwd=True, cpu_worker=offload)
    assert isinstance(optimizer, WorkerOptimInBackward) == offload
    loss_fn = ChunkedCrossEntropyLoss(num_output_chunks=4)
    generator = torch.Generator().manual_seed(1)
    batches = [torch.randint(0, SMALL["vocab_size"], (BATCH, SEQ), generator=generator) for _ in range(STEPS)]
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    start = torch.cuda.memory_allocated()
    losses = []
    for tokens in batches:
        tokens = tokens.to(device)
        loss = loss_fn(model.output, model(tokens, output_hidden_states=True), tokens.roll(-1, dims=1))
        loss.backward()
        training.step_optimizer(optimizer, model.parameters())
        losses.append(loss.item())
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - start
    if offload:
        optimizer.worker.close()
    return losses, peak


def test_offloaded_step_matches_the_device_run_and_its_peak_matches_the_estimate(world):
    offloaded, peak = _run(world, offload=True)
    on_device, _ = _run(world, offload=False)
    assert offloaded == pytest.approx(on_device, abs=1e-5)
    assert offloaded[-1] < offloaded[0]

    overrides = [f"+model.{k}={v}" for k, v in SMALL.items()]
    cfg = load_config(
        "llama3_1/8B_full_16gb",
        [
            "model._component_=torchtune.models.llama2.llama2",
            *overrides,
            "dtype=fp32",
            "optimizer._component_=torch.optim.AdamW",
            "~optimizer.state_dtype",
            "enable_activation_checkpointing=False",
            "loss.num_output_chunks=4",
        ],
    )
    estimate = estimate_distributed_memory(cfg, 1, seq_len=SEQ, batch_size=BATCH)
    # the measured peak counts from after set-up (the host shards' first copy to the device included)
    assert abs(peak - estimate.peak_bytes) <= 0.10 * estimate.peak_bytes, (
        f"measured {peak / 1e9:.3f} GB, estimated {estimate.peak_bytes / 1e9:.3f} GB\n{estimate.format()}"
    )


def test_tune_run_with_cpu_offload_on_one_gpu_matches_and_resumes_exactly(tmp_path):
    """The recipe itself, one process (plain `tune run`): fsdp_cpu_offload=True gives the losses of the run
    without offload, and a resume from its step checkpoint continues with exactly the same losses."""
    from tests._helpers.tiny_run import distributed_config, make_tiny_run, read_losses, run_tune

    single = make_tiny_run(tmp_path, max_steps_per_epoch=3, save_every_n_steps=2)
    config = distributed_config(single, tmp_path / "dist.yaml")
    common = ["device=cuda", "dtype=fp32", "optimizer_in_bwd=True", "optimizer._component_=torch.optim.AdamW"]

    def tune(out, *extra):
        result = run_tune(
            ["run", "full_finetune_distributed", "--config", str(config), f"output_dir={out}", *common, *extra],
            timeout=600,
        )
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-6000:]
        return result

    offloaded = tune(tmp_path / "offload", "fsdp_cpu_offload=True")
    assert "with CPU offload" in offloaded.stderr + offloaded.stdout
    tune(tmp_path / "device", "fsdp_cpu_offload=False")
    full = read_losses(tmp_path / "offload")
    assert full == pytest.approx(read_losses(tmp_path / "device"), abs=1e-5)

    state = tmp_path / "offload" / "step_2" / "recipe_state.pt"
    tune(
        tmp_path / "resumed",
        "fsdp_cpu_offload=True",
        "resume_from_checkpoint=True",
        f"checkpointer.recipe_checkpoint={state}",
        "seed=null",
    )
    resumed = read_losses(tmp_path / "resumed")
    assert resumed and resumed == full[len(full) - len(resumed) :]

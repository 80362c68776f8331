"""optimizer_on_cpu: weights on the device, each parameter stepped on the host by the CPU optimizer worker. On a
CPU device the same path runs with synchronous copies: it trains as the in-device in-backward step does and
resumes bit-exactly; the gradient ring hands out and takes back buffers first in, first out."""

import threading

import pytest
import torch

from tests._helpers.tiny_run import build_recipe, make_tiny_run, read_losses
from torchtune.training.optim._host_optimizer import GradientRing


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # embed_dim 64: the weight matrices reach the 8-bit state's 4,096 elements
    return make_tiny_run(
        tmp_path_factory.mktemp("host"),
        num_examples=12,
        model_dims={"embed_dim": 64},
        epochs=1,
        batch_size=4,
        **{
            "optimizer._component_": "torchtune.training.CPUAdamW",
            "optimizer.state_dtype": "fp32",
            "lr_scheduler.num_warmup_steps": 1,
            "enable_activation_checkpointing": True,
        },
    )


def _train(tiny, out, **overrides):
    recipe = build_recipe(tiny, output_dir=str(out), **overrides)
    try:
        recipe.train()
        weights = {n: p.detach().clone() for n, p in recipe._model.named_parameters()}
    finally:
        recipe.cleanup()
    return recipe, weights


@pytest.mark.parametrize("dtype,state_dtype", [("fp32", "fp32"), ("bf16", "8bit")])
def test_host_step_trains_as_the_in_device_step_does(tiny, tmp_path, dtype, state_dtype):
    runs = {}
    for on_cpu in (False, True):
        over = {"dtype": dtype, "optimizer.state_dtype": state_dtype, "optimizer_on_cpu": on_cpu}
        recipe, weights = _train(tiny, tmp_path / str(on_cpu), **over)
        assert type(recipe._optimizer).__name__ == ("HostStepOptimInBackward" if on_cpu else "OptimInBackwardWrapper")
        runs[on_cpu] = (read_losses(tmp_path / str(on_cpu)), weights)
    (l0, w0), (l1, w1) = runs[False], runs[True]
    assert len(l0) == 3 and len(set(l0)) == 3
    assert l1 == pytest.approx(l0, abs=1e-6, rel=0)
    for name in w0:
        torch.testing.assert_close(w1[name].float(), w0[name].float(), atol=1e-6, rtol=0)


def test_host_step_resumes_bit_exactly(tiny, tmp_path):
    run = {"dtype": "bf16", "optimizer.state_dtype": "8bit", "optimizer_on_cpu": True, "batch_size": 3}
    out = tmp_path / "full"
    _, final = _train(tiny, out, save_every_n_steps=2, **run)
    resume = {"resume_from_checkpoint": True, "checkpointer.recipe_checkpoint": str(out / "step_2" / "recipe_state.pt")}
    recipe, resumed = _train(tiny, tmp_path / "res", **run, **resume)
    assert recipe.global_step == 4
    assert read_losses(tmp_path / "res") == read_losses(out)[2:]
    assert all(torch.equal(resumed[n], final[n]) for n in final)


def test_gradient_ring_is_first_in_first_out_and_waits_when_full():
    ring = GradientRing(256, pin=False)
    a, b = ring.take(100), ring.take(100)  # 128 bytes each once aligned
    assert a.data_ptr() == ring.buffer.data_ptr() and b.data_ptr() == ring.buffer.data_ptr() + 128
    taken = []
    waiter = threading.Thread(target=lambda: taken.append(ring.take(64)))
    waiter.start()
    waiter.join(0.2)
    assert not taken  # full: waits for the oldest to be given back
    ring.give()
    waiter.join(5)
    assert taken and taken[0].data_ptr() == ring.buffer.data_ptr()  # wrapped into the oldest's place
    ring.give()
    ring.give()
    assert ring.take(256).data_ptr() == ring.buffer.data_ptr()  # empty again: the whole ring
    with pytest.raises(ValueError, match="larger than the ring"):
        ring.take(257)


@pytest.mark.timeout(600)
def test_llama2_7b_cpu_optimizer_config_fits_16_gb_with_nothing_paged_as_its_header_says():
    """The device holds the weights, activations and each gradient until its copy: at most 15 GB at batch 2 x 512
    (the config's), no paged or managed memory; host RAM and PCIe bytes from the shapes; the header states them."""
    import re

    from torchtune import training
    from torchtune.config import load_config
    from torchtune.config._load import resolve_config_path
    from torchtune.training.estimate._memory_estimator import estimate_recipe_memory
    from torchtune.training.estimate._offload_memory import device_side_config, host_step_plan

    name = "llama2/7B_full_16gb_cpu_optimizer"
    cfg = load_config(name, [])
    assert cfg.optimizer_on_cpu and cfg.optimizer._component_ == "torchtune.training.CPUAdamW"
    estimate = estimate_recipe_memory(device_side_config(cfg), seq_len=512, batch_size=2)
    assert estimate.peak_bytes <= 15e9 and estimate.paged_optimizer_bytes == 0
    assert estimate.breakdown["optimizer_state"] == 0
    model = training.build_model(cfg.model, device=torch.device("meta"), dtype=torch.bfloat16)
    plan = host_step_plan(model, cfg.optimizer, dtype=torch.bfloat16, activations=estimate.host_offload_peak_bytes)
    weights = 2 * sum(p.numel() for p in model.parameters())
    assert plan.h2d_per_step == plan.d2h_per_step == weights + plan.activations and plan.params == weights
    header = resolve_config_path(name).read_text()
    assert f"device peak: {estimate.peak_bytes / 1e9:.2f} GB in the steps" in header
    figures = re.search(r"host RAM: ([\d.]+) GB load, ([\d.]+) GB steps, ([\d.]+) GB save and resume", header)
    phases = plan.phases
    assert [float(x) for x in figures.groups()] == [
        pytest.approx(phases[k] / 1e9, abs=0.011) for k in ("load", "steps", "save")
    ]
    assert phases["steps"] <= 32e9  # a 32 GB desktop's RAM
    assert f"{plan.optimizer_state / 1e9:.2f} GB of 8-bit AdamW state" in header

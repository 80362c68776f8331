"""Every optimizer the configs may name runs in backward on CPU, changes the weights, and resumes."""

import pytest
import torch

from tests._helpers.tiny_run import build_recipe as _recipe
from tests._helpers.tiny_run import make_tiny_run, read_losses

OPTIMIZERS = [
    "bitsandbytes.optim.PagedAdamW",
    "bitsandbytes.optim.PagedAdamW8bit",
    "bitsandbytes.optim.AdamW8bit",
    "torchao.optim.AdamW8bit",
    "torchao.optim.AdamW4bit",
    "torch.optim.AdamW",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # embed_dim 64 so every weight matrix is large enough for the 8/4-bit block layouts.
    return make_tiny_run(
        tmp_path_factory.mktemp("opt"), num_examples=8, model_dims={"embed_dim": 64}, epochs=1, batch_size=4
    )


@pytest.mark.parametrize("component", OPTIMIZERS)
def test_two_in_backward_steps_change_the_weights(tiny, tmp_path, component):
    recipe = _recipe(tiny, output_dir=str(tmp_path / "o"), **{"optimizer._component_": component})
    before = {n: p.detach().clone() for n, p in recipe._model.named_parameters()}
    recipe.train()  # 8 examples / batch 4 = 2 steps
    recipe.cleanup()
    assert recipe.global_step == 2
    changed = [n for n, p in recipe._model.named_parameters() if not torch.equal(p, before[n])]
    # The first step runs at LR 0 (warm-up); the second moves every parameter.
    assert len(changed) == len(before), sorted(set(before) - set(changed))
    assert all(p.grad is None for p in recipe._model.parameters())  # freed in the hooks
    inner = next(iter(recipe._optimizer.optim_map.values()))
    assert type(inner).__module__.split(".")[0] == component.split(".")[0]
    losses = read_losses(tmp_path / "o")
    assert len(losses) == 2 and all(x == x for x in losses)


@pytest.mark.parametrize("component", ["bitsandbytes.optim.PagedAdamW8bit", "torchao.optim.AdamW8bit"])
def test_low_bit_state_survives_a_resume(tiny, tmp_path, monkeypatch, component):
    # 4 steps of batch 2, warm-up of 1: step 1 at half the LR, steps 2-4 at full LR. Resuming after step 2, a
    # step that moved the weights with a state built over two steps, the last two steps (and so their
    # losses and the final weights) depend on the restored 8-bit state.
    run = {"optimizer._component_": component, "batch_size": 2, "lr_scheduler.num_warmup_steps": 1}
    out = tmp_path / "full"
    _run_to_end(tiny, output_dir=str(out), save_every_n_steps=2, **run)
    resume = {"resume_from_checkpoint": True, "checkpointer.recipe_checkpoint": str(out / "step_2" / "recipe_state.pt")}
    _run_to_end(tiny, output_dir=str(tmp_path / "res"), **run, **resume)
    assert read_losses(tmp_path / "res") == read_losses(out)[2:]
    final = _weights(out)
    assert _weights(tmp_path / "res").keys() == final.keys()
    assert all(torch.equal(w, final[n]) for n, w in _weights(tmp_path / "res").items())
    # The same resume with the optimizer state left out ends elsewhere: the test sees a lost state.
    from torchtune import training

    monkeypatch.setattr(training, "load_optimizer_state", lambda optimizer, state: None)
    _run_to_end(tiny, output_dir=str(tmp_path / "lost"), **run, **resume)
    assert any(not torch.equal(w, final[n]) for n, w in _weights(tmp_path / "lost").items())


def _run_to_end(config, **overrides):
    recipe = _recipe(config, **overrides)
    recipe.train()
    recipe.cleanup()


def _weights(output_dir):
    from safetensors.torch import load_file

    return load_file(str(output_dir / "epoch_0" / "model-00001-of-00001.safetensors"))


def test_resumed_paged_state_goes_back_into_paged_buffers(tiny, tmp_path):
    """The restored bitsandbytes state is re-allocated through get_state_buffer (paged on CUDA)."""
    import bitsandbytes as bnb

    from torchtune.utils import keep_optimizer_state_paged

    param = torch.nn.Parameter(torch.randn(512, 256))
    opt = bnb.optim.PagedAdamW8bit([param], lr=1e-3)
    param.grad = torch.randn_like(param)
    opt.step()
    saved = {k: v.clone() if torch.is_tensor(v) else v for k, v in opt.state[param].items()}

    fresh = bnb.optim.PagedAdamW8bit([param], lr=1e-3)
    fresh.load_state_dict(opt.state_dict())
    loaded = {k: fresh.state[param][k] for k in ("state1", "state2")}
    allocated = []
    original = fresh.get_state_buffer
    fresh.get_state_buffer = lambda p, dtype=torch.float32: allocated.append(dtype) or original(p, dtype=dtype)
    keep_optimizer_state_paged(fresh)
    assert allocated == [torch.uint8, torch.uint8]
    for key in ("state1", "state2"):
        assert fresh.state[param][key] is not loaded[key]  # a new buffer from the optimizer...
        assert torch.equal(fresh.state[param][key], saved[key])  # ...holding the saved values

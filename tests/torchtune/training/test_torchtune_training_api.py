"""torchtune 0.6.1's torchtune.training functions on this library's implementation: precision, seed, memory,
optimizer in backward, LR schedule, activation checkpointing, profiler and the small helpers."""

import os
import random

import numpy as np
import pytest
import torch
from torch import nn

from torchtune import training
from torchtune._errors import TuneError
from torchtune.models.llama2 import llama2
from torchtune.utils import OptimInBackwardWrapper


def _model():
    torch.manual_seed(0)
    return llama2(vocab_size=64, num_layers=4, num_heads=2, num_kv_heads=2, embed_dim=16, max_seq_len=32)


# --- precision -----------------------------------------------------------------------------------------


def test_get_dtype_is_torchtunes_and_bf16_needs_support(monkeypatch):
    assert training.get_dtype() is torch.float32
    assert training.get_dtype("fp16") is torch.float16 and training.get_dtype(torch.half) is torch.float16
    assert training.get_dtype("float64") is torch.float64 and training.get_dtype("bf16", torch.device("cpu"))
    with pytest.raises(ValueError, match="must be one of fp16, bf16, fp32, fp64"):
        training.get_dtype("int8")
    monkeypatch.setattr(training.precision, "verify_bf16_support", lambda: False)
    with pytest.raises(RuntimeError, match="bf16 precision was requested but not available") as info:
        training.get_dtype("bf16")  # no device: an accelerator is assumed
    assert isinstance(info.value, TuneError)
    monkeypatch.setattr(training.precision, "verify_bf16_support", lambda: True)
    assert training.get_dtype("bfloat16") is torch.bfloat16


def test_validate_expected_param_dtype_names_the_parameter():
    layer = nn.Linear(2, 2)
    with pytest.raises(ValueError, match="Parameter weight has dtype torch.float32, but expected torch.bfloat16"):
        training.validate_expected_param_dtype(layer.named_parameters(), torch.bfloat16)
    training.validate_expected_param_dtype(
        layer.named_parameters(), torch.bfloat16, exclude_param_names=["weight", "bias"]
    )


# --- seed ----------------------------------------------------------------------------------------------


def test_set_seed_seeds_python_numpy_and_torch_and_checks_the_range():
    assert training.set_seed(11) == 11
    drawn = (random.random(), np.random.rand(), torch.rand(1).item())
    training.set_seed(11)
    assert drawn == (random.random(), np.random.rand(), torch.rand(1).item())
    for bad in (-1, 2**32):
        with pytest.raises(ValueError, match="Invalid seed value provided"):
            training.set_seed(bad)
    assert 0 <= training.set_seed(None) < 2**32


def test_set_seed_debug_mode(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark, torch.get_deterministic_debug_mode())
    try:
        training.set_seed(1, debug_mode="warn")
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        training.set_seed(1, debug_mode=0)
        assert not torch.are_deterministic_algorithms_enabled() and torch.backends.cudnn.benchmark
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[:2]
        torch.set_deterministic_debug_mode(before[2])


# --- optimizer in backward -----------------------------------------------------------------------------


def test_optimizer_in_backward_wrapper_is_ours_with_torchtunes_methods():
    assert training.OptimizerInBackwardWrapper is OptimInBackwardWrapper
    model = nn.Linear(3, 1)
    optim_dict = {p: torch.optim.SGD([p], lr=0.5) for p in model.parameters()}
    training.register_optim_in_bwd_hooks(model, optim_dict)  # torchtune keys the dict by parameter
    wrapper = training.create_optim_in_bwd_wrapper(model, optim_dict)
    assert sorted(wrapper.optim_map) == ["bias", "weight"] and wrapper.get_optim_key("lr") == 0.5
    before = model.weight.detach().clone()
    model(torch.ones(2, 3)).sum().backward()
    assert model.weight.grad is None and not torch.equal(model.weight, before)  # stepped inside backward
    with pytest.raises(RuntimeError, match="Call set_lr_scheduler first"):
        wrapper.get_last_lr()
    # torchtune builds the scheduler on one inner optimizer; the wrapper spreads its LR to all
    scheduler = training.get_cosine_schedule_with_warmup(optim_dict[model.bias], 2, 10)
    wrapper.set_lr_scheduler(scheduler)
    wrapper.step_lr_scheduler()
    assert wrapper.get_last_lr() == 0.25 and optim_dict[model.weight].param_groups[0]["lr"] == 0.25
    assert training.get_lr(wrapper) == 0.25


def test_get_lr_refuses_groups_with_different_lrs():
    a, b = nn.Parameter(torch.ones(1)), nn.Parameter(torch.ones(1))
    with pytest.raises(RuntimeError, match="different"):
        training.get_lr(torch.optim.SGD([{"params": [a], "lr": 0.1}, {"params": [b], "lr": 0.2}]))


@pytest.mark.parametrize(
    ("warmup_from_zero", "expected"),
    [(True, [0.0, 0.25, 0.5, 0.75, 1.0]), (False, [0.2, 0.4, 0.6, 0.8, 1.0])],
)
def test_cosine_warmup_is_torchtunes_with_ours_one_switch_away(warmup_from_zero, expected):
    optimizer = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1.0)
    scheduler = training.get_cosine_schedule_with_warmup(optimizer, 4, 8, warmup_from_zero=warmup_from_zero)
    seen = []
    for _ in range(9):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    cosine = [0.5 * (1 + np.cos(np.pi * k / 4)) for k in range(1, 5)]
    assert seen == pytest.approx([*expected, *cosine], abs=1e-12)


# --- activation checkpointing and offloading -----------------------------------------------------------


def test_set_activation_checkpointing_takes_torchtunes_policies():
    from torchtune.modules import TransformerDecoderLayer
    from torchtune.training.activations import is_activation_checkpointed

    model = _model()
    names = [n for n, _ in model.named_parameters()]

    def policy(module, recurse, **kwargs):
        return recurse or isinstance(module, TransformerDecoderLayer)

    assert training.set_activation_checkpointing(model, auto_wrap_policy=policy) == 4
    assert [n for n, _ in model.named_parameters()] == names  # patched in place: no wrapper, same names
    assert training.set_activation_checkpointing(model, {TransformerDecoderLayer}) == 0
    with pytest.raises(TypeError, match="checkpoint_wrapper_fn"):
        training.set_activation_checkpointing(model, {nn.Linear}, checkpoint_wrapper_fn=None)
    other = _model()
    assert training.apply_selective_activation_checkpointing(other, "selective", 2) == 2
    assert [is_activation_checkpointed(layer) for layer in other.layers] == [False, True, False, True]
    assert training.apply_selective_activation_checkpointing(_model(), "none", None) == 0
    with pytest.raises(NotImplementedError):
        training.apply_selective_activation_checkpointing(_model(), "op", None)


# --- profiler ------------------------------------------------------------------------------------------


def test_profiler_off_is_a_dummy_and_on_writes_a_trace(tmp_path):
    prof, cfg = training.setup_torch_profiler(enabled=False)
    assert isinstance(prof, training.DummyProfiler) and cfg == {"enabled": False}
    with prof as p:
        p.step()
    prof, cfg = training.setup_torch_profiler(
        enabled=True,
        cuda=False,
        xpu=False,
        wait_steps=0,
        warmup_steps=0,
        active_steps=1,
        num_cycles=1,
        output_dir=str(tmp_path / "prof"),
    )
    assert (cfg.wait_steps, cfg.active_steps, cfg.record_shapes, cfg.cuda) == (0, 1, True, False)
    with prof:
        for _ in range(2):
            torch.ones(8, 8) @ torch.ones(8, 8)
            prof.step()
    assert (tmp_path / "prof" / "iteration_1" / "rank0_key_averages.txt").is_file()


# --- small helpers -------------------------------------------------------------------------------------


def test_small_helpers():
    mask = torch.tensor([[False, False, True, True], [False, False, False, True], [False] * 4])
    assert training.get_unmasked_sequence_lengths(mask).tolist() == [1, 2, 3]
    model = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.3))
    with pytest.warns(UserWarning, match="Setting to zero"):
        training.disable_dropout(model)
    assert model[1].p == 0
    model(torch.ones(1, 2)).sum().backward()
    grad = model[0].weight.grad.clone()
    training.scale_grads(model, torch.tensor(0.5))
    torch.testing.assert_close(model[0].weight.grad, grad * 0.5)
    training.cleanup_before_training()  # no accelerator here: collects garbage only
    stats = training.get_memory_stats(torch.device("cpu"))
    assert set(stats) == {"host_peak_rss", "host_rss"}  # GB; torchtune raises on a CPU
    assert training.compile_loss(nn.MSELoss(), verbose=False) is not None

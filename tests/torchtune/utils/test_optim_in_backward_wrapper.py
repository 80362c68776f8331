"""OptimInBackwardWrapper: state round trip, strictness, the optimizer interface, and LR reaching every
inner optimizer."""

import io
import warnings

import pytest
import torch
from torch import nn

from torchtune import TuneError
from torchtune.training.lr_schedulers import build_lr_scheduler, get_cosine_schedule_with_warmup
from torchtune.utils import OptimInBackwardWrapper


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))


def _wrapper(model: nn.Module, lr: float = 1e-2) -> OptimInBackwardWrapper:
    return OptimInBackwardWrapper(
        {n: torch.optim.AdamW([p], lr=lr, weight_decay=0.1) for n, p in model.named_parameters()}
    )


def _step(model: nn.Module, wrapper: OptimInBackwardWrapper, seed: int) -> None:
    torch.manual_seed(seed)
    model(torch.randn(3, 4)).square().mean().backward()
    for name, _ in model.named_parameters():
        wrapper.optim_map[name].step()
        wrapper.optim_map[name].zero_grad(set_to_none=True)


def _saved_and_loaded(state_dict):
    # Through bytes, as a checkpoint goes: torch's load_state_dict keeps references to the
    # tensors it is given, so an in-memory dict would share state between the two optimizers.
    buffer = io.BytesIO()
    torch.save(state_dict, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)


def test_state_dict_is_keyed_by_parameter_name():
    model = _model()
    wrapper = _wrapper(model)
    _step(model, wrapper, seed=1)
    sd = wrapper.state_dict()
    assert set(sd) == {"0.weight", "0.bias", "2.weight", "2.bias"}
    assert sd["0.weight"]["state"][0]["exp_avg"].shape == (8, 4)


def test_round_trip_into_fresh_optimizers_continues_identically():
    model_a = _model()
    wrapper_a = _wrapper(model_a)
    _step(model_a, wrapper_a, seed=1)

    model_b = _model()
    model_b.load_state_dict(model_a.state_dict())
    wrapper_b = _wrapper(model_b)
    wrapper_b.load_state_dict(_saved_and_loaded(wrapper_a.state_dict()))

    _step(model_a, wrapper_a, seed=2)
    _step(model_b, wrapper_b, seed=2)
    for (name, pa), pb in zip(model_a.named_parameters(), model_b.parameters()):
        assert torch.equal(pa, pb), name
    sa, sb = wrapper_a.state_dict(), wrapper_b.state_dict()
    for name in sa:
        assert torch.equal(sa[name]["state"][0]["exp_avg_sq"], sb[name]["state"][0]["exp_avg_sq"])
        assert float(sa[name]["state"][0]["step"]) == float(sb[name]["state"][0]["step"]) == 2.0


def test_load_is_strict_about_missing_and_unexpected_names():
    model = _model()
    wrapper = _wrapper(model)
    _step(model, wrapper, seed=1)
    sd = wrapper.state_dict()
    sd["extra.weight"] = sd.pop("2.bias")
    with pytest.raises(TuneError) as err:
        _wrapper(_model()).load_state_dict(sd)
    assert isinstance(err.value, RuntimeError)  # torchtune's OptimizerInBackwardWrapper raises RuntimeError
    assert "Expected to load optimizer state for params 2.bias" in str(err.value)
    assert "unexpected params extra.weight" in str(err.value)


def test_standard_optimizer_state_is_refused_with_the_setting_to_use():
    model = _model()
    standard = torch.optim.AdamW(model.parameters())
    with pytest.raises(TuneError, match="optimizer_in_bwd=False"):
        _wrapper(model).load_state_dict(standard.state_dict())


def _advance(wrapper: OptimInBackwardWrapper, scheduler) -> None:
    # What the recipe does after every step, in either optimizer mode.
    wrapper.step()
    wrapper.zero_grad()
    scheduler.step()


@pytest.mark.parametrize("warmup_from_zero", [True, False])
def test_lr_scheduler_sets_lr_on_every_inner_optimizer(warmup_from_zero):
    model = _model()
    wrapper = _wrapper(model, lr=1.0)
    assert isinstance(wrapper, torch.optim.Optimizer)
    scheduler = get_cosine_schedule_with_warmup(
        wrapper, num_warmup_steps=2, num_training_steps=6, warmup_from_zero=warmup_from_zero
    )
    # torchtune's warm-up starts at 0; warmup_from_zero=False one step above it; the cosine part is the same
    warmup = [0.0, 0.5] if warmup_from_zero else [1 / 3, 2 / 3]
    expected = [*warmup, 1.0, 0.8535533905932737, 0.5, 0.14644660940672627, 0.0]
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # e.g. torch's "lr_scheduler.step() before optimizer.step()"
        for _ in range(7):
            # Read the inner optimizers' own param_groups, not the wrapper's.
            lrs = {opt.param_groups[0]["lr"] for opt in wrapper.optim_map.values()}
            assert len(lrs) == 1
            seen.append(lrs.pop())
            assert wrapper.param_groups[0]["lr"] == seen[-1]
            _advance(wrapper, scheduler)
    assert seen == pytest.approx(expected)


def test_param_groups_are_the_inner_optimizers_dicts():
    model = _model()
    wrapper = _wrapper(model)
    inner = [g for opt in wrapper.optim_map.values() for g in opt.param_groups]
    assert len(wrapper.param_groups) == len(inner) == 4
    assert all(a is b for a, b in zip(wrapper.param_groups, inner))
    wrapper.param_groups[2]["lr"] = 0.5
    assert wrapper.optim_map["2.weight"].param_groups[0]["lr"] == 0.5


def test_step_and_zero_grad_leave_the_parameters_alone():
    # The steps happen in backward; the wrapper's own step must not step anything a second time.
    model = _model()
    wrapper = _wrapper(model)
    model(torch.randn(3, 4)).square().mean().backward()
    before = [p.detach().clone() for p in model.parameters()]
    grads = [p.grad.clone() for p in model.parameters()]
    wrapper.step()
    wrapper.zero_grad()
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))


def test_lr_scheduler_state_round_trip():
    model = _model()
    wrapper = _wrapper(model, lr=1.0)
    scheduler = get_cosine_schedule_with_warmup(wrapper, 2, 10)
    for _ in range(4):
        _advance(wrapper, scheduler)
    assert scheduler.state_dict()["last_epoch"] == 4

    # Restored into a fresh wrapper + scheduler, the schedule continues where it was.
    restored = _wrapper(_model(), lr=1.0)
    restored.load_state_dict(_saved_and_loaded(wrapper.state_dict()))
    scheduler_b = build_lr_scheduler(
        {"_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup", "num_warmup_steps": 2},
        restored,
        num_training_steps=10,
        state_dict=_saved_and_loaded(scheduler.state_dict()),
    )
    assert restored.param_groups[0]["lr"] == pytest.approx(wrapper.param_groups[0]["lr"])
    for _ in range(3):
        _advance(wrapper, scheduler)
        _advance(restored, scheduler_b)
        assert restored.param_groups[0]["lr"] == pytest.approx(wrapper.param_groups[0]["lr"])


def test_lr_scheduler_still_applies_after_loading_state():
    # Loading replaces each inner optimizer's param-group dicts; the wrapper's groups must follow.
    model = _model()
    saved = _wrapper(model, lr=1.0)
    _step(model, saved, seed=1)
    wrapper = _wrapper(model, lr=1.0)
    groups = wrapper.param_groups
    wrapper.load_state_dict(_saved_and_loaded(saved.state_dict()))
    assert wrapper.param_groups is groups  # the same list, now holding the new dicts
    scheduler = get_cosine_schedule_with_warmup(wrapper, 4, 8)
    for expected in (0.0, 0.25, 0.5):
        assert {o.param_groups[0]["lr"] for o in wrapper.optim_map.values()} == {expected}
        _advance(wrapper, scheduler)

"""A hyper-parameter given on resume (``optimizer.lr=1e-4``, ``optimizer.weight_decay=...``) takes effect and is
logged, and the optimizer's state is kept; with an LR schedule the new LR is the new base the schedule goes on
from, at the same step. Both modes (one optimizer, one per parameter in backward)."""

from __future__ import annotations

import logging

import pytest
import torch

from torchtune import training
from torchtune.training.lr_schedulers import get_cosine_schedule_with_warmup

SCHEDULE = {"_component_": "torchtune.training.lr_schedulers.get_cosine_schedule_with_warmup", "num_warmup_steps": 2}
TOTAL = 10


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))


def _optimizer(model, in_bwd: bool, **hyper):
    cfg = {"_component_": "torch.optim.AdamW", "lr": 2e-3, "weight_decay": 0.01, **hyper}
    return training.build_optimizer(cfg, model, optimizer_in_bwd=in_bwd)


def _train(model, optimizer, scheduler, steps: int) -> None:
    for i in range(steps):
        model(torch.full((2, 4), float(i + 1))).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        scheduler.step()


def _saved(in_bwd: bool):
    """(model, optimizer state, scheduler state) after 3 steps at lr 2e-3 on the cosine schedule."""
    model = _model()
    optimizer = _optimizer(model, in_bwd)
    scheduler = training.build_lr_scheduler(SCHEDULE, optimizer, num_training_steps=TOTAL)
    _train(model, optimizer, scheduler, 3)
    return model, optimizer.state_dict(), scheduler.state_dict()


def _moments(optimizer) -> list:
    state = optimizer.state_dict()
    per_name = state.values() if "state" not in state else [state]
    return [s["exp_avg"].clone() for sd in per_name for s in sd["state"].values()]


@pytest.mark.parametrize("in_bwd", [False, True], ids=["standard", "in_backward"])
def test_a_new_lr_and_weight_decay_on_resume_take_effect_and_the_state_is_kept(in_bwd, caplog):
    model, opt_state, sched_state = _saved(in_bwd)
    resumed = _optimizer(model, in_bwd, lr=1e-4, weight_decay=0.1)
    with caplog.at_level(logging.INFO, logger="torchtune"):
        training.load_optimizer_state(resumed, opt_state)
        scheduler = training.build_lr_scheduler(SCHEDULE, resumed, num_training_steps=TOTAL, state_dict=sched_state)
    # the schedule at step 3 of a run whose peak is 1e-4
    probe = torch.optim.SGD([torch.zeros(1)], lr=1e-4)
    want = get_cosine_schedule_with_warmup(probe, 2, TOTAL)
    for _ in range(3):
        probe.step()
        want.step()
    for group in resumed.param_groups:
        assert group["lr"] == pytest.approx(want.get_last_lr()[0], rel=1e-12) and group["initial_lr"] == 1e-4
        assert group["weight_decay"] == 0.1 and group["betas"] == (0.9, 0.999)
    assert scheduler.get_last_lr() == pytest.approx([want.get_last_lr()[0]] * len(resumed.param_groups))
    saved = _optimizer(_model(), in_bwd)
    saved.load_state_dict(opt_state)
    assert all(torch.equal(a, b) for a, b in zip(_moments(resumed), _moments(saved)))  # moments as saved
    text = caplog.text
    assert "optimizer.lr=0.0001 (the checkpoint's run had 0.002)" in text
    assert "optimizer.weight_decay=0.1 (the checkpoint's run had 0.01)" in text
    assert text.count("optimizer.lr=") == 1  # once, not once per parameter
    scheduler.step()
    want.step()
    assert resumed.param_groups[0]["lr"] == pytest.approx(want.get_last_lr()[0], rel=1e-12)  # and goes on from it


def test_an_unchanged_config_resumes_at_the_saved_lr_without_a_word(caplog):
    model, opt_state, sched_state = _saved(in_bwd=True)
    saved_lrs = [g["lr"] for g in opt_state["0.weight"]["param_groups"]]
    resumed = _optimizer(model, True)
    with caplog.at_level(logging.INFO, logger="torchtune"):
        training.load_optimizer_state(resumed, opt_state)
        training.build_lr_scheduler(SCHEDULE, resumed, num_training_steps=TOTAL, state_dict=sched_state)
    assert resumed.param_groups[0]["lr"] == saved_lrs[0] and "Resuming with" not in caplog.text


def test_without_a_schedule_the_new_lr_is_the_lr(caplog):
    model = _model()
    optimizer = _optimizer(model, False)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    resumed = _optimizer(model, False, lr=5e-4)
    with caplog.at_level(logging.INFO, logger="torchtune"):
        training.load_optimizer_state(resumed, optimizer.state_dict())
    assert resumed.param_groups[0]["lr"] == 5e-4 and "initial_lr" not in resumed.param_groups[0]
    assert resumed.state_dict()["state"][0]["step"] == 1
    assert "optimizer.lr=0.0005 (the checkpoint's run had 0.002)" in caplog.text

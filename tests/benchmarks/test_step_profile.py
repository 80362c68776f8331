"""benchmarks/step_profile.py: the phases it computes from timestamps, and the hooks that take them in a
real (tiny) training loop, with the optimizer stepped inside backward and after it."""

import time
import types

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from benchmarks.step_profile import PHASES, StepProfile, split_steps


def _events(*spec):
    """``(kind, wall)`` pairs -> events whose CPU time is half the wall time."""
    return [(kind, wall, wall / 2) for kind, wall in spec]


def test_phases_of_hand_made_steps():
    events = _events(
        ("forward0", 0.0),
        ("head", 1.0),  # the loss starts inside the model's forward...
        ("forward1", 2.0),
        ("loss0", 2.0),  # ...and goes on in a loss module
        ("loss1", 3.0),
        ("backward0", 3.0),
        ("optimizer0_in_backward", 4.0),  # a wrapper's step calling an optimizer's: counted once
        ("optimizer0_in_backward", 4.5),
        ("optimizer1", 5.0),
        ("optimizer1", 5.5),
        ("backward1", 6.0),
        ("optimizer0", 6.5),
        ("optimizer1", 7.0),
        ("data0", 7.5),
        ("data1", 8.0),
        ("forward0", 9.0),
        ("forward1", 10.0),
        ("data0", 12.0),  # after the epoch's end: left out
        ("data1", 12.5),
    )
    steps = split_steps(events, end=(11.0, 5.5))
    assert steps["step"]["wall"] == [9.0, 2.0]
    first = {phase: steps[phase]["wall"][0] for phase in PHASES}
    assert first == {"forward": 1.0, "loss": 2.0, "backward": 1.5, "optimizer": 2.0, "data": 0.5, "other": 2.0}
    assert {phase: steps[phase]["cpu"][0] for phase in PHASES} == {k: v / 2 for k, v in first.items()}
    second = {phase: steps[phase]["wall"][1] for phase in PHASES}
    assert second == {"forward": 1.0, "loss": 0.0, "backward": 0.0, "optimizer": 0.0, "data": 0.0, "other": 1.0}


class _Net(nn.Module):
    """Embedding and one linear layer (the "backbone"), an output projection, and, like transformers'
    models, the loss inside the forward when labels are given."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Embedding(32, 16), nn.Linear(16, 16))
        self.output = nn.Linear(16, 32)

    def forward(self, tokens, labels=None):
        logits = self.output(self.body(tokens))
        return logits if labels is None else F.cross_entropy(logits.flatten(0, 1), labels.flatten())


class _Loss(nn.Module):
    def forward(self, logits, labels):
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _train(profile: StepProfile, model: _Net, loss_fn: nn.Module | None) -> tuple:
    """Three steps: the embedding's optimizer steps inside backward (optimizer in backward), the rest
    after it. Returns the epoch's end as ``(wall, cpu)``."""
    embed, rest = model.body[0].weight, [p for n, p in model.named_parameters() if not n.startswith("body.0")]
    in_backward, after = torch.optim.AdamW([embed]), torch.optim.AdamW(rest)

    def step_in_backward(param: torch.Tensor) -> None:
        in_backward.step()
        in_backward.zero_grad()

    embed.register_post_accumulate_grad_hook(step_in_backward)
    tokens = torch.randint(0, 32, (6, 2, 8), generator=torch.Generator().manual_seed(0))
    for batch in DataLoader(list(tokens), batch_size=None):
        if loss_fn is None:
            loss = model(batch, labels=batch)
        else:
            loss = loss_fn(model(batch), batch)
        loss.backward()
        after.step()
        after.zero_grad()
    return time.perf_counter(), time.process_time()


def _check(steps, profile: StepProfile, model: _Net) -> None:
    assert len(steps["step"]["wall"]) == 6
    for phase in (*PHASES, "step"):
        for clock in ("wall", "cpu"):
            assert all(t >= -1e-6 for t in steps[phase][clock]), (phase, clock, steps[phase][clock])
    for phase in ("forward", "loss", "backward", "optimizer"):
        assert all(t > 0 for t in steps[phase]["wall"]), phase
    assert all(t > 0 for t in steps["data"]["wall"][:-1])  # each step but the last fetches the next batch
    kinds = [k for k, _, _ in profile.events]
    first_backward = kinds[kinds.index("backward0") : kinds.index("backward1")]
    assert "optimizer0_in_backward" in first_backward and "optimizer0" not in first_backward
    after_backward = kinds.index("backward1")
    assert "optimizer0" in kinds[after_backward : kinds.index("forward0", after_backward)]
    # detached: every hook and wrapper is gone
    profile.detach()
    for wrapped in (torch.Tensor.backward, torch.autograd.backward, _BaseDataLoaderIter.__next__):
        assert not hasattr(wrapped, "__wrapped__"), wrapped
    count = len(profile.events)
    model(torch.zeros(1, 4, dtype=torch.long)).sum().backward()
    torch.optim.SGD(model.parameters()).step()
    assert len(profile.events) == count


def test_loss_module_outside_the_model():
    torch.manual_seed(0)
    model, loss_fn = _Net(), _Loss()
    profile = StepProfile().attach(model, loss=loss_fn)
    end = _train(profile, model, loss_fn)
    _check(split_steps(profile.events, end), profile, model)


def test_loss_inside_the_model_after_its_backbone():
    torch.manual_seed(0)
    model = _Net()
    profile = StepProfile().attach(model, head=model.body, head_event="post")
    model.eval()  # a validation forward (litgpt checks its settings so) is no step
    with torch.no_grad():
        model(torch.zeros(1, 4, dtype=torch.long))
    model.train()
    end = _train(profile, model, None)
    steps = split_steps(profile.events, end)
    assert "loss0" not in [k for k, _, _ in profile.events]  # the loss is only the in-model part here
    _check(steps, profile, model)


def test_loss_and_optimizer_functions_count_as_their_phase():
    """A loss function called outside the model (litgpt's) is loss time; a function wrapping
    ``Optimizer.step()`` (ours: fp32 copies, step, stochastic rounding) is optimizer time as a whole,
    its own ``step()`` inside it not counted twice."""
    torch.manual_seed(0)
    model = _Net()
    owner = types.SimpleNamespace(step=lambda opt: opt.step(), loss=lambda logits, y: _Loss()(logits, y))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    profile = StepProfile().attach(model, loss_calls=[(owner, "loss")], optimizer_calls=[(owner, "step")])
    tokens = torch.zeros(1, 4, dtype=torch.long)
    owner.loss(model(tokens), tokens).backward()
    owner.step(opt)
    end = (profile.events[-1][1], profile.events[-1][2])
    profile.detach()
    kinds = [k for k, _, _ in profile.events]
    assert kinds[2:4] == ["loss0", "loss1"]
    assert kinds[-4:] == ["optimizer0", "optimizer0", "optimizer1", "optimizer1"]
    steps = split_steps(profile.events, end)
    assert steps["loss"]["wall"] == [profile.events[3][1] - profile.events[2][1]]
    assert steps["optimizer"]["wall"] == [profile.events[-1][1] - profile.events[-4][1]]
    assert not hasattr(owner.step, "__wrapped__") and not hasattr(owner.loss, "__wrapped__")

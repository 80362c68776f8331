"""Where a training step's time goes, measured the same way in any PyTorch trainer, cheaply.

A :class:`StepProfile` records a wall and CPU timestamp (``time.perf_counter``, ``time.process_time``)
at a few points of every step, from hooks that work alike in our recipe, torchtune's and transformers'
``Trainer``: forward pre-/post-hooks on the model, on the part that computes the output projection and
on a loss module; a wrapper of ``torch.Tensor.backward`` / ``torch.autograd.backward``; torch.optim's
global step hooks (which also fire for the per-parameter optimizers stepped inside backward); and a
wrapper of the data loader iterator's ``__next__``. A step makes a few dozen timestamps (one or two
per optimizer step), microseconds against a step of milliseconds or more: no per-op profiler.

:func:`split_steps` turns them into phases per step. A step runs from one forward's start to the
next one's (the last to ``end``), so its phases add up to the epoch:

- ``forward``: the model's forward, less the loss computed inside it;
- ``loss``: output projection and cross-entropy forward: a loss module's forward, plus the part of the
  model's forward from where its output projection starts (``head``) to the forward's end;
- ``backward``: backward, less the optimizer steps taken inside it (optimizer in backward);
- ``optimizer``: every ``Optimizer.step()``, inside backward or after it;
- ``data``: fetching and collating the next batch (the data loader's ``next()``);
- ``other``: the rest (logging, metrics, moving the batch, gradient clipping, the loop itself).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import nn

PHASES = ("forward", "loss", "backward", "optimizer", "data", "other")

Event = Tuple[str, float, float]  # (kind, wall seconds, process CPU seconds)


def _data_iterator_classes() -> List[type]:
    """The iterator classes whose ``__next__`` a training loop's ``next(batch)`` reaches: torch's, and
    torchdata's stateful one (torchtune 0.6's data loader), which overrides ``__next__``."""
    from torch.utils.data.dataloader import _BaseDataLoaderIter

    classes: List[type] = [_BaseDataLoaderIter]
    try:
        from torchdata.stateful_dataloader.stateful_dataloader import _StatefulBaseDataLoaderIter
    except ImportError:
        pass
    else:
        classes.append(_StatefulBaseDataLoaderIter)
    return classes


class StepProfile:
    """Timestamps of a training run's phases; see the module docstring.

    ``attach(model, head=..., head_event=..., loss=...)`` before training, ``detach()`` after it, then
    ``split_steps(profile.events, end)``. ``head`` is the module where the output projection begins
    inside the model's forward: ``head_event="pre"`` marks its first call (torchtune's output projection,
    called once per chunk), ``"post"`` the end of a backbone the projection follows (TRL's fused LM
    head, which runs after the decoder stack without calling ``lm_head`` as a module). ``loss`` is a
    loss module called outside the model (ours, which computes the projection in it; torchtune's);
    ``loss_calls`` are ``(owner, name)`` of loss functions called outside it (litgpt's).
    ``optimizer_calls`` are ``(owner, name)`` of further functions whose calls are optimizer time, such
    as a step that casts to fp32 around ``Optimizer.step()`` and rounds back (ours with bf16 stochastic
    rounding); without them that work would count as backward. Forwards in eval mode are no steps.
    """

    def __init__(self) -> None:
        self.events: List[Event] = []
        self._undo: List[Callable[[], None]] = []
        self._depth = {"backward": 0, "data": 0}  # calls of the wrapped functions now running

    def mark(self, kind: str) -> None:
        self.events.append((kind, time.perf_counter(), time.process_time()))

    def attach(
        self,
        model: nn.Module,
        *,
        head: Optional[nn.Module] = None,
        head_event: str = "pre",
        loss: Optional[nn.Module] = None,
        loss_calls: Sequence[Tuple[Any, str]] = (),
        optimizer_calls: Sequence[Tuple[Any, str]] = (),
    ) -> "StepProfile":
        if head_event not in ("pre", "post"):
            raise ValueError(f"head_event must be 'pre' or 'post', not {head_event!r}")

        def training(kind: str) -> Callable[..., None]:
            # a forward in eval mode (a trainer's validation, litgpt's sanity check) is no training step
            return lambda module, *a: self.mark(kind) if module.training else None

        handles = [
            model.register_forward_pre_hook(training("forward0")),
            model.register_forward_hook(training("forward1")),
        ]
        if head is not None:
            register = head.register_forward_pre_hook if head_event == "pre" else head.register_forward_hook
            handles.append(register(training("head")))
        if loss is not None:
            handles += [
                loss.register_forward_pre_hook(lambda *a: self.mark("loss0")),
                loss.register_forward_hook(lambda *a: self.mark("loss1")),
            ]
        for owner, name in loss_calls:
            self._patch(owner, name, lambda: self.mark("loss0"), lambda: self.mark("loss1"))
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

        handles.append(register_optimizer_step_pre_hook(lambda *a: self._optimizer_start()))
        handles.append(register_optimizer_step_post_hook(lambda *a: self.mark("optimizer1")))
        self._undo += [h.remove for h in handles]
        for owner, name in optimizer_calls:  # nested steps: split_steps counts the outermost call
            self._patch(owner, name, self._optimizer_start, lambda: self.mark("optimizer1"))
        # Tensor.backward calls torch.autograd.backward: only the outermost call is timed
        for owner in (torch.Tensor, torch.autograd):
            self._patch(owner, "backward", lambda: self.mark("backward0"), lambda: self.mark("backward1"), "backward")
        for cls in _data_iterator_classes():
            self._patch(cls, "__next__", lambda: self.mark("data0"), lambda: self.mark("data1"), "data")
        return self

    def _optimizer_start(self) -> None:
        # a step inside backward (optimizer in backward) is told apart: backward's figure leaves it out
        self.mark("optimizer0_in_backward" if self._depth["backward"] else "optimizer0")

    def _patch(
        self, owner: Any, name: str, enter: Callable[[], None], leave: Callable[[], None], depth: str = ""
    ) -> None:
        """Wrap ``owner.name`` so that it calls ``enter`` and ``leave`` around itself; with ``depth``,
        only around its outermost call (a call from within another wrapped one is not marked)."""
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        depths = self._depth

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            outermost = not depth or depths[depth] == 0
            if depth:
                depths[depth] += 1
            if outermost:
                enter()
            try:
                return original(*args, **kwargs)
            finally:
                if depth:
                    depths[depth] -= 1
                if outermost:
                    leave()

        setattr(owner, name, timed)
        self._undo.append(lambda: setattr(owner, name, original))

    def detach(self) -> None:
        while self._undo:
            self._undo.pop()()


def _spans(events: Sequence[Event], start: Tuple[str, ...], stop: str) -> List[Tuple[Event, Event]]:
    """The outermost (start, ``stop``) pairs, a start being any kind in ``start`` (an optimizer wrapper's
    ``step()`` calls its optimizers')."""
    pairs, depth, opened = [], 0, None
    for event in events:
        if event[0] in start:
            depth += 1
            if depth == 1:
                opened = event
        elif event[0] == stop and depth:
            depth -= 1
            if depth == 0:
                pairs.append((opened, event))
    return pairs


def _length(a: Event, b: Event) -> Tuple[float, float]:
    return b[1] - a[1], b[2] - a[2]


def _total(spans: Sequence[Tuple[float, float]]) -> Tuple[float, float]:
    return sum(s[0] for s in spans), sum(s[1] for s in spans)


def _minus(a: Tuple[float, float], b: Tuple[float, float]) -> Tuple[float, float]:
    return a[0] - b[0], a[1] - b[1]


def _phases_of_step(events: Sequence[Event], start: Event, stop: Event) -> Dict[str, Tuple[float, float]]:
    """``{phase: (wall seconds, CPU seconds)}`` of the step from ``start`` to ``stop``, ``events`` being
    those in between."""
    none = (0.0, 0.0)
    forward_end = next((e for e in events if e[0] == "forward1"), None)
    forward = _length(start, forward_end) if forward_end is not None else none
    # the loss computed inside the model: from where its output projection begins to the forward's end
    head = next((e for e in events if e[0] == "head"), None)
    inside = forward_end is not None and head is not None and head[1] <= forward_end[1]
    in_model_loss = _length(head, forward_end) if inside else none
    steps = _spans(events, ("optimizer0", "optimizer0_in_backward"), "optimizer1")
    optimizer = [_length(a, b) for a, b in steps]
    in_backward = [_length(a, b) for a, b in steps if a[0] == "optimizer0_in_backward"]
    phases = {
        "forward": _minus(forward, in_model_loss),
        "loss": _total([in_model_loss] + [_length(a, b) for a, b in _spans(events, ("loss0",), "loss1")]),
        "backward": _minus(
            _total([_length(a, b) for a, b in _spans(events, ("backward0",), "backward1")]), _total(in_backward)
        ),
        "optimizer": _total(optimizer),
        "data": _total([_length(a, b) for a, b in _spans(events, ("data0",), "data1")]),
    }
    step = _length(start, stop)
    phases["other"] = _minus(step, _total(list(phases.values())))
    phases["step"] = step
    return phases


def split_steps(events: Sequence[Event], end: Tuple[float, float]) -> Dict[str, Dict[str, List[float]]]:
    """Per-step phase times from a run's events: ``{phase: {"wall": [...], "cpu": [...]}}`` for each of
    ``PHASES`` and ``"step"``, one entry per step. A step starts at a model forward's start and ends at
    the next one's, the last at ``end`` (``(wall, cpu)`` of the epoch's end); events after it are left out."""
    events = [e for e in events if e[1] <= end[0]]
    starts = [i for i, e in enumerate(events) if e[0] == "forward0"]
    result: Dict[str, Dict[str, List[float]]] = {p: {"wall": [], "cpu": []} for p in (*PHASES, "step")}
    for n, i in enumerate(starts):
        last = n + 1 == len(starts)
        stop = ("end", *end) if last else events[starts[n + 1]]
        inside = events[i + 1 : len(events) if last else starts[n + 1]]
        for phase, (wall, cpu) in _phases_of_step(inside, events[i], stop).items():
            result[phase]["wall"].append(wall)
            result[phase]["cpu"].append(cpu)
    return result

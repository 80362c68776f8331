"""Logits only where labels exist: the same losses and gradients as projecting every position."""

import copy
import random

import pytest
import torch
from omegaconf import OmegaConf

from torchtune import config, training
from torchtune.datasets import PackedDataset, packed_collate, padded_collate
from torchtune.models.llama2 import llama2
from torchtune.modules.loss import CROSS_ENTROPY_IGNORE_IDX as IGNORE

VOCAB = 97
LOSSES = ["torchtune.modules.loss.CrossEntropyLoss", "torchtune.modules.loss.ChunkedCrossEntropyLoss"]


def _make_loss(component):
    # chunks of any size, so that these few rows are cut into the default 8 chunks as a long batch is
    extra = {"min_chunk_rows": 1} if "Chunked" in component else {}
    return config.instantiate({"_component_": component, **extra})


def _examples(n: int, seed: int = 0) -> list:
    """Instruction-style examples: a prompt whose labels are ignored (train_on_input=False), then a response."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = [1] + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 12))]
        response = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(2, 8))] + [2]
        out.append({"tokens": prompt + response, "labels": [IGNORE] * len(prompt) + response})
    return out


def _batches(kind: str) -> list:
    examples = _examples(40)
    if kind == "padded":
        return [padded_collate(examples[i : i + 4]) for i in range(0, 20, 4)]
    packs = PackedDataset(examples, max_seq_len=32)
    return [packed_collate([packs[i], packs[i + 1]]) for i in range(0, 10, 2)]


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return llama2(vocab_size=VOCAB, num_layers=2, num_heads=4, num_kv_heads=2, embed_dim=32, max_seq_len=64)


def test_label_positions_are_the_labelled_ones_and_none_when_all_are():
    labels = torch.tensor([[IGNORE, 5, 6], [7, IGNORE, IGNORE]])
    assert training.label_positions(labels).tolist() == [1, 2, 3]
    assert training.label_positions(torch.tensor([[1, 2], [3, 4]])) is None


def test_output_positions_gather_the_rows_of_the_full_output():
    model = _model()
    tokens = torch.randint(0, VOCAB, (2, 9))
    positions = torch.tensor([0, 4, 9, 17])
    full = model(tokens).reshape(-1, VOCAB)
    torch.testing.assert_close(model(tokens, output_positions=positions), full[positions], rtol=0, atol=1e-6)


@pytest.mark.parametrize("kind", ["padded", "packed"])
@pytest.mark.parametrize("loss", LOSSES)
def test_same_first_five_losses_with_and_without_selection(kind, loss):
    batches = _batches(kind)
    # prompt and padding positions exist, so the selection does leave positions out
    assert all(training.label_positions(training.shift_labels(b["labels"])) is not None for b in batches)
    losses = {}
    for select in (True, False):
        model = _model()
        opt_cfg = OmegaConf.create({"_component_": "torch.optim.AdamW", "lr": 1e-2, "weight_decay": 0.0})
        optimizer = training.build_optimizer(opt_cfg, model, optimizer_in_bwd=True)
        step = training.TrainStep(
            model,
            optimizer,
            _make_loss(loss),
            device=torch.device("cpu"),
            select_label_positions=select,
        )
        losses[select] = [float(step(batch)) for batch in batches]
    assert losses[True][0] > 1.0  # a real loss, not a degenerate zero
    assert losses[True][-1] < losses[True][0]  # and the steps trained
    for with_selection, without in zip(losses[True], losses[False]):
        assert abs(with_selection - without) <= 1e-6, (losses[True], losses[False])


@pytest.mark.parametrize("kind", ["padded", "packed"])
@pytest.mark.parametrize("loss", LOSSES)
def test_same_gradients_with_and_without_selection(kind, loss):
    batch = _batches(kind)[0]
    loss_fn = _make_loss(loss)
    base = _model()
    grads = {}
    for select in (True, False):
        model = copy.deepcopy(base)
        training.forward_backward(model, loss_fn, batch, device=torch.device("cpu"), select_label_positions=select)
        grads[select] = {name: p.grad for name, p in model.named_parameters()}
    for name, grad in grads[False].items():
        assert grad.abs().sum() > 0, name  # every parameter, the output projection included, got a gradient
        torch.testing.assert_close(grads[True][name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_validation_loss_uses_the_selection_and_matches_the_full_loss():
    batch = _batches("packed")[0]
    model = _model()
    loss_fn = _make_loss(LOSSES[1])
    with torch.no_grad():
        selected = training.forward_loss(model, loss_fn, batch, device=torch.device("cpu"))
        full = training.forward_loss(model, loss_fn, batch, device=torch.device("cpu"), select_label_positions=False)
    assert abs(float(selected) - float(full)) <= 1e-6


@pytest.mark.parametrize("loss", LOSSES)
def test_a_batch_without_labels_selects_nothing_and_gives_zero(loss):
    model = _model()
    batch = {"tokens": torch.randint(0, VOCAB, (2, 8)), "labels": torch.full((2, 8), IGNORE)}
    assert training.label_positions(training.shift_labels(batch["labels"])).numel() == 0
    value = training.forward_backward(model, _make_loss(loss), batch, device=torch.device("cpu"))
    assert float(value) == 0.0
    assert all(float(p.grad.abs().sum()) == 0.0 for p in model.parameters() if p.grad is not None)

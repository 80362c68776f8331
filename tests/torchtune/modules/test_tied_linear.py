"""Tied embeddings: one Parameter through meta construction and loading, gradients of both uses summed
before the one in-backward hook fires, the chunked loss equal to the plain one on the tied weight."""

import pytest
import torch

from torchtune.models.llama3_2 import llama3_2
from torchtune.modules import TiedLinear
from torchtune.modules.loss import ChunkedCrossEntropyLoss, CrossEntropyLoss

VOCAB = 96


def _tiny(seed: int = 0, tied: bool = True):
    torch.manual_seed(seed)
    return llama3_2(VOCAB, 2, 4, 2, 32, 64, intermediate_dim=64, tie_word_embeddings=tied, old_context_len=16)


def _batch():
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (2, 12), generator=g)
    labels = torch.randint(0, VOCAB, (2, 12), generator=g)
    labels[0, :4] = -100
    return tokens, labels


def test_one_parameter_no_output_weight_in_the_state_dict():
    model = _tiny()
    assert isinstance(model.output, TiedLinear) and model.output.weight is model.tok_embeddings.weight
    assert "output.weight" not in model.state_dict() and not any("output." in k for k in model.state_dict())
    names = [n for n, _ in model.named_parameters()]
    assert names.count("tok_embeddings.weight") == 1 and not any(n.startswith("output") for n in names)
    untied = _tiny(tied=False)
    assert sum(p.numel() for p in untied.parameters()) - sum(p.numel() for p in model.parameters()) == VOCAB * 32


def test_tie_survives_meta_construction_and_loading():
    reference = _tiny(seed=3)
    with torch.device("meta"):
        model = _tiny()
    model.to_empty(device="cpu")
    model.load_state_dict(reference.state_dict())
    model.init_buffers()
    assert model.output.weight is model.tok_embeddings.weight
    with torch.no_grad():
        model.tok_embeddings.weight.add_(1.0)  # an update through one end is seen by the other
    assert torch.equal(model.output.weight, reference.tok_embeddings.weight + 1.0)
    assign = _tiny()
    assign.load_state_dict(reference.state_dict(), assign=True)
    assert assign.output.weight is assign.tok_embeddings.weight
    tokens, _ = _batch()
    with torch.no_grad():
        torch.testing.assert_close(assign(tokens), reference(tokens))


@pytest.mark.parametrize("loss_cls", [CrossEntropyLoss, ChunkedCrossEntropyLoss])
def test_hook_fires_once_with_both_gradient_contributions(loss_cls):
    """What optimizer in backward relies on: one post-accumulate-grad call per step, after the lookup's
    and the projection's gradients are summed."""
    tokens, labels = _batch()
    reference = _tiny(tied=False)
    with torch.no_grad():
        reference.output.weight.copy_(reference.tok_embeddings.weight)
    hidden = reference(tokens, output_hidden_states=True)
    CrossEntropyLoss()(reference.output, hidden, labels).backward()
    expected = reference.tok_embeddings.weight.grad + reference.output.weight.grad
    assert reference.output.weight.grad.abs().sum() > 0 and reference.tok_embeddings.weight.grad.abs().sum() > 0

    model = _tiny(tied=True)
    seen = []
    model.tok_embeddings.weight.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.clone()))
    hidden = model(tokens, output_hidden_states=True)
    loss_fn = loss_cls(num_output_chunks=3, min_chunk_rows=1) if loss_cls is ChunkedCrossEntropyLoss else loss_cls()
    loss_fn(model.output, hidden, labels).backward()
    assert len(seen) == 1
    torch.testing.assert_close(seen[0], expected, rtol=1e-5, atol=1e-7)


def test_tied_logits_use_the_embedding():
    model = _tiny().eval()
    tokens, _ = _batch()
    with torch.no_grad():
        hidden = model(tokens, output_hidden_states=True)
        torch.testing.assert_close(model(tokens), hidden @ model.tok_embeddings.weight.T)

"""TransformerDecoder, attention, RoPE, RMSNorm, KV cache and the loss on a tiny Llama2."""

import pytest
import torch
from torch import nn

from torchtune import TuneError
from torchtune.models.llama2 import llama2_tiny
from torchtune.modules import CrossEntropyLoss, RMSNorm, RotaryPositionalEmbeddings

VOCAB = 512


@pytest.fixture
def model() -> nn.Module:
    torch.manual_seed(0)
    return llama2_tiny().eval()


def _tokens(bsz: int, seq_len: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, VOCAB, (bsz, seq_len), generator=torch.Generator().manual_seed(seed))


def test_default_causal_equals_explicit_causal_mask(model):
    tokens = _tokens(2, 17)
    mask = torch.tril(torch.ones(17, 17, dtype=torch.bool)).expand(2, 17, 17)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens), model(tokens, mask=mask), atol=1e-5, rtol=0)


def test_output_depends_only_on_the_past(model):
    tokens = _tokens(1, 12)
    changed = tokens.clone()
    changed[0, 8:] = (changed[0, 8:] + 1) % VOCAB
    with torch.no_grad():
        torch.testing.assert_close(model(tokens)[:, :8], model(changed)[:, :8], atol=1e-6, rtol=0)


def test_packed_sequence_equals_separate_examples(model):
    lengths = [5, 7, 4]
    examples = [_tokens(1, n, seed=i) for i, n in enumerate(lengths)]
    packed = torch.cat(examples, dim=1)
    total = sum(lengths)
    mask = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for n in lengths:
        mask[start : start + n, start : start + n] = torch.tril(torch.ones(n, n, dtype=torch.bool))
        start += n
    input_pos = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
    with torch.no_grad():
        packed_logits = model(packed, mask=mask.unsqueeze(0), input_pos=input_pos)
        separate = torch.cat([model(e) for e in examples], dim=1)
    torch.testing.assert_close(packed_logits, separate, atol=1e-5, rtol=0)


def _cache_mask(input_pos: torch.Tensor, slots: int) -> torch.Tensor:
    """Causal over the cache: a query at position p sees the slots 0..p (torchtune's decoders need it given)."""
    return torch.arange(slots)[None, None, :] <= input_pos[..., None]


def test_kv_cache_decoding_equals_full_forward(model):
    tokens = _tokens(2, 10)
    with torch.no_grad():
        full = model(tokens)
        model.setup_caches(batch_size=2, dtype=torch.float32)
        assert model.caches_are_enabled()
        first = torch.arange(6).expand(2, 6)
        steps = [model(tokens[:, :6], mask=_cache_mask(first, model.max_seq_len), input_pos=first)]
        for pos in range(6, 10):
            step = torch.full((2, 1), pos)
            steps.append(model(tokens[:, pos : pos + 1], mask=_cache_mask(step, model.max_seq_len), input_pos=step))
        torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=0)
        # A reset cache starts a new generation with the same result.
        model.reset_caches()
        again = model(tokens[:, :6], mask=_cache_mask(first, model.max_seq_len), input_pos=first)
        torch.testing.assert_close(again, full[:, :6], atol=1e-5, rtol=0)
        # torchtune's contract: with caches, the mask and the positions are required
        with pytest.raises(ValueError, match="masks must be provided"):
            model(tokens[:, :1], input_pos=first[:, :1])
        with pytest.raises(ValueError, match="input positions must be provided"):
            model(tokens[:, :1], mask=_cache_mask(first[:, :1], model.max_seq_len))


def test_too_long_sequence_names_the_key(model):
    with pytest.raises(TuneError, match="max_seq_len"):
        model(_tokens(1, 257))


def test_hidden_states_feed_the_loss(model):
    tokens = _tokens(2, 9)
    labels = tokens.roll(-1, dims=1)
    labels[:, -1] = -100
    hidden = model(tokens, output_hidden_states=True)
    assert hidden.shape == (2, 9, 64)
    loss = CrossEntropyLoss()(model.output, hidden, labels)
    expected = nn.functional.cross_entropy(model(tokens).reshape(-1, VOCAB), labels.reshape(-1))
    torch.testing.assert_close(loss, expected)
    assert loss.dtype == torch.float32
    # A random model is close to uniform: ln(512) ~ 6.24
    assert 5.5 < loss.item() < 7.0


def test_loss_with_every_label_ignored_is_zero_and_differentiable(model):
    tokens = _tokens(1, 5)
    hidden = model(tokens, output_hidden_states=True)
    loss = CrossEntropyLoss()(model.output, hidden, torch.full((1, 5), -100))
    assert loss.item() == 0.0
    loss.backward()
    assert model.output.weight.grad is not None
    assert torch.count_nonzero(model.output.weight.grad) == 0


def test_rope_matches_complex_rotation():
    torch.manual_seed(0)
    rope = RotaryPositionalEmbeddings(dim=8, max_seq_len=32)
    x = torch.randn(2, 6, 3, 8)
    out = rope(x)
    # Meta's reference: pairs (2i, 2i+1) as complex numbers times exp(i * pos * theta_i)
    theta = 1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8))
    freqs = torch.polar(torch.ones(6, 4), torch.outer(torch.arange(6).float(), theta))
    ref = torch.view_as_real(torch.view_as_complex(x.reshape(2, 6, 3, 4, 2)) * freqs[None, :, None]).flatten(-2)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
    # explicit positions pick rows of the cache
    pos = torch.tensor([[3, 4, 5, 0, 1, 2]] * 2)
    torch.testing.assert_close(
        rope(x, input_pos=pos)[:, :3], rope(torch.cat([x[:, 3:], x[:, :3]], 1))[:, 3:], atol=0, rtol=0
    )


def test_rmsnorm_upcasts_bf16():
    torch.manual_seed(0)
    norm = RMSNorm(16, eps=1e-5)
    x = torch.randn(4, 16) * 100
    ref = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(norm(x), ref)
    out = norm.bfloat16()(x.bfloat16())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), ref, atol=2e-2, rtol=1e-2)


def test_bf16_model_runs_and_keeps_fp32_rope(model):
    tokens = _tokens(1, 8)
    with torch.no_grad():
        ref = model(tokens)
        model.to(torch.bfloat16)
        assert model.layers[0].attn.pos_embeddings.cache.dtype == torch.float32
        out = model(tokens)
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert (out - ref).abs().max() < 0.1


def test_meta_device_build_then_to_empty_or_assign(model):
    tokens = _tokens(1, 8)
    with torch.no_grad():
        ref = model(tokens)
    with torch.device("meta"):
        meta_model = llama2_tiny().eval()
    assert all(p.is_meta for p in meta_model.parameters())
    assert "layers.0.attn.pos_embeddings.cache" not in meta_model.state_dict()
    # path 1: to_empty rebuilds the RoPE cache, then load real weights
    empty = meta_model.to_empty(device="cpu")
    empty.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(empty(tokens), ref, atol=0, rtol=0)
    # path 2: assign=True keeps the checkpoint tensors; init_buffers rebuilds the cache
    with torch.device("meta"):
        assigned = llama2_tiny().eval()
    assigned.load_state_dict({k: v.clone() for k, v in model.state_dict().items()}, assign=True)
    assigned.init_buffers()
    with torch.no_grad():
        torch.testing.assert_close(assigned(tokens), ref, atol=0, rtol=0)


def test_build_under_default_dtype():
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        m = llama2_tiny()
    finally:
        torch.set_default_dtype(previous)
    assert {p.dtype for p in m.parameters()} == {torch.bfloat16}
    assert m.layers[0].attn.pos_embeddings.cache.dtype == torch.float32

"""torchtune 0.6.1's module API on our modules: signatures, defaults and behaviour its code relies on (KV cache
appending, attention over a second input, chunked output, cache context managers, packed-sequence masks)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from torchtune.modules import (
    FeedForward,
    Fp32LayerNorm,
    KVCache,
    MultiHeadAttention,
    RMSNorm,
    RotaryPositionalEmbeddings,
    TanhGate,
    TransformerCrossAttentionLayer,
    TransformerDecoder,
    TransformerSelfAttentionLayer,
    VisionRotaryPositionalEmbeddings,
    delete_kv_caches,
    disable_kv_cache,
    local_kv_cache,
)
from torchtune.modules.attention_utils import (
    _get_document_ids_from_seq_lens,
    create_block_causal_mask,
    packed_block_causal_mask,
)
from torchtune.modules.common_utils import slice_str_to_array
from torchtune.modules.loss import CEWithChunkedOutputLoss, CrossEntropyLoss

DIM, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 32, 4, 2, 8, 50


def _attention(rope: bool = True, **kwargs) -> MultiHeadAttention:
    return MultiHeadAttention(
        embed_dim=DIM,
        num_heads=HEADS,
        num_kv_heads=KV_HEADS,
        head_dim=HEAD_DIM,
        q_proj=nn.Linear(DIM, HEADS * HEAD_DIM, bias=False),
        k_proj=nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False),
        v_proj=nn.Linear(DIM, KV_HEADS * HEAD_DIM, bias=False),
        output_proj=nn.Linear(HEADS * HEAD_DIM, DIM, bias=False),
        pos_embeddings=RotaryPositionalEmbeddings(HEAD_DIM, max_seq_len=32) if rope else None,
        max_seq_len=32,
        **kwargs,
    )


def _decoder(num_layers: int = 2) -> TransformerDecoder:
    torch.manual_seed(0)
    layer = TransformerSelfAttentionLayer(
        _attention(),
        FeedForward(gate_proj=nn.Linear(DIM, 48), down_proj=nn.Linear(48, DIM), up_proj=nn.Linear(DIM, 48)),
        sa_norm=RMSNorm(DIM),
        mlp_norm=RMSNorm(DIM),
    )
    return TransformerDecoder(
        tok_embeddings=nn.Embedding(VOCAB, DIM),
        layers=layer,
        num_layers=num_layers,
        max_seq_len=32,
        num_heads=HEADS,
        head_dim=HEAD_DIM,
        norm=RMSNorm(DIM),
        output=nn.Linear(DIM, VOCAB, bias=False),
        output_hidden_states=[1],
    ).eval()


def test_kv_cache_appends_in_order_and_resets():
    cache = KVCache(batch_size=2, max_seq_len=6, num_kv_heads=1, head_dim=2, dtype=torch.float32)
    k = torch.arange(2 * 4 * 2, dtype=torch.float32).view(2, 1, 4, 2)
    cache.update(k[:, :, :3], k[:, :, :3])
    k_out, _ = cache.update(k[:1, :, 3:], k[:1, :, 3:])  # a smaller batch uses the first rows
    assert cache.size == 4 and k_out.shape == (1, 1, 6, 2)
    torch.testing.assert_close(k_out[:, :, :4], k[:1])
    with pytest.raises(AssertionError):
        cache.update(k, k)  # 4 more do not fit in the 2 slots left
    with pytest.raises(ValueError, match="batch"):
        cache.update(k.repeat(2, 1, 1, 1), k.repeat(2, 1, 1, 1))
    cache.reset()
    assert cache.size == 0 and not cache.k_cache.any()


def test_attention_over_a_second_input_and_without_causality():
    torch.manual_seed(0)
    attn = _attention(rope=False, is_causal=False).eval()
    x, y = torch.randn(2, 5, DIM), torch.randn(2, 7, DIM)
    with torch.no_grad():
        cross = attn(x, y)
        # the same, by hand: every query sees every key of y
        q = attn.q_proj(x).view(2, 5, HEADS, HEAD_DIM).transpose(1, 2)
        k = attn.k_proj(y).view(2, 7, KV_HEADS, HEAD_DIM).transpose(1, 2).repeat_interleave(2, dim=1)
        v = attn.v_proj(y).view(2, 7, KV_HEADS, HEAD_DIM).transpose(1, 2).repeat_interleave(2, dim=1)
        weights = torch.softmax(q @ k.transpose(-1, -2) / HEAD_DIM**0.5, dim=-1)
        want = attn.output_proj((weights @ v).transpose(1, 2).reshape(2, 5, -1))
    torch.testing.assert_close(cross, want, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="Must provide y"):
        attn(x)
    with pytest.raises(ValueError, match="set together"):
        _attention(q_norm=RMSNorm(HEAD_DIM))


def test_decoder_clones_layers_returns_requested_hidden_states_and_chunks():
    model = _decoder()
    assert len(model.layers) == 2 and model.layers[0] is not model.layers[1]
    tokens = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(0))
    labels = torch.randint(0, VOCAB, (2, 8), generator=torch.Generator().manual_seed(1))
    labels[0, :3] = -100
    with torch.no_grad():
        hidden_1, logits = model(tokens)
        assert hidden_1.shape == (2, 8, DIM)
        model.set_num_output_chunks(4)
        _, chunks = model(tokens)
        hidden = model(tokens, output_hidden_states=True)[-1]
    assert len(chunks) == 4
    torch.testing.assert_close(torch.cat(chunks, dim=1).float(), logits)
    loss = CEWithChunkedOutputLoss(num_output_chunks=4)
    want = nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
    torch.testing.assert_close(loss(chunks, labels), want)
    torch.testing.assert_close(loss(model.output, hidden, labels), want)  # our recipes' call
    torch.testing.assert_close(CrossEntropyLoss()(model.output, hidden, labels), want)


def test_cache_context_managers():
    model = _decoder()
    model.output_hidden_states = []
    tokens = torch.randint(0, VOCAB, (1, 6), generator=torch.Generator().manual_seed(0))
    positions = torch.arange(6)[None]
    mask = torch.arange(32)[None, None, :] <= positions[..., None]
    with torch.no_grad():
        full = model(tokens)
        with local_kv_cache(model, batch_size=1, device=torch.device("cpu"), dtype=torch.float32):
            assert model.caches_are_setup() and model.caches_are_enabled()
            torch.testing.assert_close(model(tokens, mask=mask, input_pos=positions), full, atol=1e-5, rtol=0)
            with disable_kv_cache(model):
                assert model.caches_are_setup() and not model.caches_are_enabled()
                torch.testing.assert_close(model(tokens), full)  # a plain forward, the cache untouched
            assert model.layers[0].attn.kv_cache.size == 6
        assert not model.caches_are_setup() and model.layers[0].attn.kv_cache is None
        with pytest.raises(ValueError, match="delete model caches"):
            delete_kv_caches(model)


def test_packed_masks_and_slices():
    lengths = [torch.tensor([2, 3, 1]), torch.tensor([4, 2])]
    assert _get_document_ids_from_seq_lens(lengths).tolist() == [[0, 0, 1, 1, 1, 2], [0, 0, 0, 0, 1, 1]]
    mask = create_block_causal_mask(lengths)
    assert mask.dtype == torch.bool and mask.shape == (2, 6, 6)
    assert mask[0, 4].tolist() == [False, False, True, True, True, False]
    if not torch.cuda.is_available():
        assert torch.equal(packed_block_causal_mask(lengths), mask)  # no flex attention without CUDA
    assert slice_str_to_array("1::2", 5) == [False, True, False, True, False]
    assert slice_str_to_array("0,3", 4) == [True, False, False, True]
    with pytest.raises(AssertionError):
        slice_str_to_array("9", 4)


def test_small_modules():
    norm = RMSNorm(8)
    assert norm.eps == 1e-6  # torchtune's default (the Llama builders pass 1e-5)
    x16 = torch.randn(3, 8, dtype=torch.float16)
    assert norm(x16).dtype == torch.float16  # an fp32 scale does not promote the output
    ungated = FeedForward(gate_proj=nn.Linear(4, 6), down_proj=nn.Linear(6, 4), activation=nn.GELU())
    x = torch.randn(2, 4)
    torch.testing.assert_close(ungated(x), ungated.w2(nn.functional.gelu(ungated.w1(x))))
    assert not ungated.is_swiglu and FeedForward(gate_proj=nn.Linear(4, 6), down_proj=nn.Linear(6, 4)).w3 is None
    gate = TanhGate()
    assert not gate(torch.ones(2)).any()
    ln = Fp32LayerNorm(8, eps=1e-6)
    torch.testing.assert_close(ln(x16).float(), nn.LayerNorm(8, eps=1e-6)(x16.float()), atol=1e-3, rtol=1e-3)
    assert ln(x16).dtype == torch.float16


def test_half_layout_rope_is_transformers_rotation():
    """``interleaved=False`` is transformers' ``apply_rotary_pos_emb`` (Qwen2, Phi-3), positions included."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import rotate_half

    rope = RotaryPositionalEmbeddings(16, max_seq_len=32, base=500.0, interleaved=False)
    x = torch.randn(2, 5, 3, 16)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 0, 1]])
    inv = 1.0 / 500.0 ** (torch.arange(0, 16, 2).float() / 16)
    angles = positions[..., None].float() * inv
    emb = torch.cat([angles, angles], dim=-1)[:, :, None, :]
    want = x * emb.cos() + rotate_half(x) * emb.sin()
    torch.testing.assert_close(rope(x, input_pos=positions), want, atol=1e-6, rtol=1e-6)
    assert transformers is not None


def test_rope_built_on_meta_gets_real_tables_from_rope_init():
    with torch.device("meta"):
        rope = RotaryPositionalEmbeddings(8, max_seq_len=16)
    assert rope.cache.is_meta
    rope.rope_init()
    torch.testing.assert_close(rope.cache, RotaryPositionalEmbeddings(8, max_seq_len=16).cache)


def test_cross_attention_layer_skips_tokens_that_see_nothing():
    torch.manual_seed(0)
    layer = TransformerCrossAttentionLayer(
        _attention(rope=False, is_causal=False),
        FeedForward(gate_proj=nn.Linear(DIM, 48), down_proj=nn.Linear(48, DIM), up_proj=nn.Linear(DIM, 48)),
        ca_norm=RMSNorm(DIM),
        mlp_norm=RMSNorm(DIM),
    ).eval()
    x, encoded = torch.randn(1, 3, DIM), torch.randn(1, 4, DIM)
    mask = torch.ones(1, 3, 4, dtype=torch.bool)
    mask[:, 0] = False
    with torch.no_grad():
        out = layer(x, encoder_input=encoded, encoder_mask=mask)
    torch.testing.assert_close(out[:, 0], x[:, 0])
    assert not torch.allclose(out[:, 1:], x[:, 1:])
    torch.testing.assert_close(layer(x), x)  # no encoder input, no cache: nothing to attend to


def test_vision_rope_leaves_the_cls_token_alone():
    rope = VisionRotaryPositionalEmbeddings(patch_size=2, tile_size=4, max_num_tiles=2, dim=4)
    x = torch.randn(1, 2 * 5, 1, 8)
    out = rope(x)
    assert out.shape == x.shape
    torch.testing.assert_close(out[:, 4], x[:, 4])  # each tile's last token is its CLS
    torch.testing.assert_close(out[:, 9], x[:, 9])
    with pytest.raises(ValueError, match="does not match"):
        rope(torch.randn(1, 2 * 6, 1, 8))

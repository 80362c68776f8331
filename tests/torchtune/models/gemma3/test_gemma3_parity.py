"""Gemma 3 against transformers' Gemma3ForCausalLM on random tiny configs with every shape feature on.

Each case: transformers builds the model from a config.json, its weights (norms included) are set to
random values and saved as an HF folder; our model is built from that folder's config.json
(``builder_args``), loaded through ``hf_to_tune``, and must give the same fp32 logits at 1e-5. Then our
weights go back through ``tune_to_hf`` into a fresh transformers model, which must give them too.
"""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402

from torchtune._errors import TuneError  # noqa: E402
from torchtune.models.gemma3 import gemma3, hf_to_tune, tune_to_hf  # noqa: E402
from torchtune.models.gemma3._hf import builder_args, check_model  # noqa: E402
from torchtune.modules.sliding_window import attention, sliding_window_attention  # noqa: E402

TINY = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=24,  # not hidden_size / heads
    query_pre_attn_scalar=20,  # not head_dim
    sliding_window=7,  # shorter than the sequence
    max_position_embeddings=128,
    rms_norm_eps=1e-6,
    pad_token_id=0,
)


def _hf_model(config_dict):
    config = transformers.Gemma3TextConfig(**config_dict)
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)  # norms too: HF initialises them at 0 (= scale 1)
    return model


def _our_model(folder):
    config = json.loads((folder / "config.json").read_text())
    args = builder_args(config, folder / "config.json")
    model = gemma3(**args, max_seq_len=config["max_position_embeddings"]).eval()
    check_model(config, folder / "config.json", model)
    sd = {}
    for f in sorted(folder.glob("*.safetensors")):
        sd.update(load_file(f))
    attn = model.layers[0].attn
    model.load_state_dict(
        hf_to_tune(sd, num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads, head_dim=attn.head_dim)
    )
    return model


CASES = {
    # 4 layers: local, local, global, local (pattern 3); global RoPE scaled linearly (transformers 4 spelling)
    "pattern_linear_rope": dict(sliding_window_pattern=3, rope_scaling={"rope_type": "linear", "factor": 8.0}),
    # explicit layer_types, untied, transformers 5's rope_parameters
    "layer_types_untied": dict(
        layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
        tie_word_embeddings=False,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 50_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1_000.0},
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_both_directions(tmp_path, case):
    config = {**TINY, **CASES[case]}
    hf = _hf_model(config)
    hf.save_pretrained(tmp_path / "hf")
    tokens = torch.randint(0, TINY["vocab_size"], (2, 23))
    with torch.no_grad():
        expected = hf(tokens).logits
        ours = _our_model(tmp_path / "hf")
        got = ours(tokens)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
    assert ("lm_head.weight" in load_file(tmp_path / "hf" / "model.safetensors")) == (not hf.config.tie_word_embeddings)

    attn = ours.layers[0].attn
    back = tune_to_hf(ours.state_dict(), num_heads=attn.num_heads, num_kv_heads=attn.num_kv_heads, head_dim=24)
    fresh = transformers.Gemma3ForCausalLM(hf.config).eval()
    missing, unexpected = fresh.load_state_dict(back, strict=False)
    assert not unexpected and all(k == "lm_head.weight" for k in missing)  # tied: lm_head is the embedding
    if hf.config.tie_word_embeddings:
        fresh.tie_weights()
    with torch.no_grad():
        torch.testing.assert_close(fresh(tokens).logits, expected, atol=1e-5, rtol=1e-5)


def test_bf16_embedding_scale_is_rounded_as_transformers_does(tmp_path):
    config = {**TINY, "hidden_size": 48, "head_dim": 16, "sliding_window_pattern": 2}  # sqrt(48) is not exact
    hf = _hf_model(config)
    hf.save_pretrained(tmp_path / "hf")
    ours = _our_model(tmp_path / "hf")
    tokens = torch.randint(0, TINY["vocab_size"], (1, 5))
    with torch.no_grad():
        expected = hf.model.embed_tokens.to(torch.bfloat16)(tokens)
        got = ours.tok_embeddings.to(torch.bfloat16)(tokens)
    assert torch.equal(got, expected)


def test_soft_capped_attention_matches_transformers_eager_attention():
    # transformers' Gemma 3 ignores attn_logit_softcapping (config.json with it is refused); the
    # builder's hidden_capping_value caps as Gemma 2's eager attention does
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 4, 9, 8), torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    causal = torch.ones(9, 9, dtype=torch.bool).tril()
    additive = torch.zeros(9, 9).masked_fill(~causal, torch.finfo(torch.float32).min)[None, None]
    module = torch.nn.Module()
    module.num_key_value_groups, module.head_dim, module.training = 2, 8, False
    expected, _ = eager_attention_forward(module, q, k, v, additive, scaling=0.4, softcap=2.0)
    got = attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=0.4, softcap=2.0)
    torch.testing.assert_close(got.transpose(1, 2), expected, atol=1e-6, rtol=1e-6)


def test_config_with_features_transformers_does_not_compute_is_refused(tmp_path):
    path = tmp_path / "config.json"
    for extra, key in (
        (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
        (dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
    ):
        with pytest.raises(TuneError, match=key):
            builder_args({**TINY, "model_type": "gemma3_text", **extra}, path)


@pytest.mark.parametrize("softcap", [None, 3.0])
def test_chunked_sliding_window_equals_the_plain_mask(softcap):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 37, 8, requires_grad=True) for _ in range(3))
    packed = torch.ones(2, 1, 37, 37, dtype=torch.bool).tril()
    packed[1, :, 20:, :20] = False  # two documents in the second row
    for mask in (None, packed):
        outs, grads = [], []
        for chunked in (False, True):
            out = sliding_window_attention(q, k, v, window=5, mask=mask, scale=0.3, softcap=softcap, chunked=chunked)
            (g,) = torch.autograd.grad(out.square().sum(), q)
            outs.append(out)
            grads.append(g)
        torch.testing.assert_close(outs[1], outs[0], atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(grads[1], grads[0], atol=1e-5, rtol=1e-5)


def test_kv_cache_decoding_equals_the_full_forward_past_the_window():
    from torchtune.models.gemma3 import gemma3_tiny

    torch.manual_seed(0)
    model = gemma3_tiny(max_seq_len=64).eval()  # window 16: decoding runs well past it
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.1 if name.endswith("scale") else 0.05)
    tokens = torch.randint(0, 512, (1, 40))
    with torch.no_grad():
        full = model(tokens)
        model.setup_caches(1, torch.float32)

        def step(chunk: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
            mask = torch.arange(model.max_seq_len)[None, None, :] <= positions[..., None]
            return model(chunk, mask=mask, input_pos=positions)

        steps = [step(tokens[:, :20], torch.arange(20)[None])]
        steps += [step(tokens[:, i : i + 1], torch.tensor([[i]])) for i in range(20, 40)]
    torch.testing.assert_close(torch.cat(steps, 1), full, atol=1e-5, rtol=1e-5)

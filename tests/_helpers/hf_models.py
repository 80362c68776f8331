"""Tiny random transformers models for parity tests, and torchtune 0.6.1's checkpoint format written from
their weights the way torchtune's own converters write it (spelled out here, independently of ours)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Dict, Optional

import torch

BASE = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=80,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    rms_norm_eps=1e-6,
    rope_theta=1000.0,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=None,
)


def make_hf_model(config_class: str, extra: dict, seed: int = 0, attn_implementation: str = "sdpa"):
    """A transformers model of ``config_class`` (``BASE`` updated with ``extra``) with every weight random
    (norms scaling by about 1, biases too), so a mixed-up norm, bias or channel order cannot hide. Gemma's
    norm weights are offsets from 1 (it scales by ``1 + weight``): drawn around 0."""
    import transformers

    config = getattr(transformers, config_class)(**{**BASE, **extra})
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation)
    model = model.float().eval()
    offset = 0.0 if config_class.startswith("Gemma") else 1.0
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * 0.2 + (offset if "norm" in name else 0.0))
    return model


def make_hf_folder(folder: Path, config_class: str, extra: dict, seed: int = 0, attn_implementation: str = "sdpa"):
    """:func:`make_hf_model`, saved as a Hugging Face folder (safetensors) at ``folder``."""
    model = make_hf_model(config_class, extra, seed, attn_implementation)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def hf_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(tokens).logits.float()


# torchtune 0.6.1's names of the Llama-shaped Hugging Face tensors (its convert_weights / qwen2 / phi3 tables)
_NAMES = {
    r"model\.embed_tokens\.weight": "tok_embeddings.weight",
    r"model\.norm\.weight": "norm.scale",
    r"lm_head\.weight": "output.weight",
    r"model\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)": r"layers.\1.attn.\2_proj.\3",
    r"model\.layers\.(\d+)\.self_attn\.o_proj\.weight": r"layers.\1.attn.output_proj.weight",
    r"model\.layers\.(\d+)\.mlp\.gate_proj\.weight": r"layers.\1.mlp.w1.weight",
    r"model\.layers\.(\d+)\.mlp\.up_proj\.weight": r"layers.\1.mlp.w3.weight",
    r"model\.layers\.(\d+)\.mlp\.down_proj\.weight": r"layers.\1.mlp.w2.weight",
    r"model\.layers\.(\d+)\.input_layernorm\.weight": r"layers.\1.sa_norm.scale",
    r"model\.layers\.(\d+)\.post_attention_layernorm\.weight": r"layers.\1.mlp_norm.scale",
}
# Gemma 2's extra norms (torchtune's gemma2 table) and its final norm inside the capping module
_GEMMA2_NAMES = {
    **_NAMES,
    r"model\.norm\.weight": "norm.rms_norm.scale",
    r"model\.layers\.(\d+)\.post_attention_layernorm\.weight": r"layers.\1.sa_scale.scale",
    r"model\.layers\.(\d+)\.pre_feedforward_layernorm\.weight": r"layers.\1.mlp_norm.scale",
    r"model\.layers\.(\d+)\.post_feedforward_layernorm\.weight": r"layers.\1.mlp_scale.scale",
}


def _interleave(w: torch.Tensor, heads: int, head_dim: int) -> torch.Tensor:
    """Rows of each head from HF's halves order to Meta's interleaved pairs (torchtune's ``_permute`` inverse)."""
    rest = w.shape[1:]
    return w.reshape(heads, 2, head_dim // 2, *rest).transpose(1, 2).reshape(heads * head_dim, *rest)


def torchtune_format(
    hf_model,
    *,
    interleave: bool,
    fused: bool = False,
    gemma2: bool = False,
    tied: Optional[bool] = None,
) -> Dict[str, torch.Tensor]:
    """The state dict torchtune 0.6.1's ``FullModelHFCheckpointer`` hands its builders for ``hf_model``'s
    weights (what its ``FullModelTorchTuneCheckpointer`` then saves): renamed; q/k rows interleaved for the
    families whose torchtune RoPE pairs ``(2i, 2i+1)`` (``interleave``: Llama, Mistral, Gemma) and left in
    HF's order for Qwen2 and Phi-3; Phi-3's fused ``qkv_proj`` / ``gate_up_proj`` split (``fused``); no
    ``output.weight`` when the embeddings are tied."""
    config = hf_model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    tied = config.tie_word_embeddings if tied is None else tied
    names = _GEMMA2_NAMES if gemma2 else _NAMES
    out: Dict[str, torch.Tensor] = {}
    for key, value in hf_model.state_dict().items():
        value = value.detach().clone()
        layer = re.match(r"model\.layers\.(\d+)\.", key)
        if fused and key.endswith("qkv_proj.weight"):
            q, k, v = value.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim])
            for part, t in zip("qkv", (q, k, v)):
                out[f"layers.{layer.group(1)}.attn.{part}_proj.weight"] = t
            continue
        if fused and key.endswith("gate_up_proj.weight"):
            gate, up = value.chunk(2)
            out[f"layers.{layer.group(1)}.mlp.w1.weight"] = gate
            out[f"layers.{layer.group(1)}.mlp.w3.weight"] = up
            continue
        if key == "lm_head.weight" and tied:
            continue
        new = next((re.sub(p, r, key) for p, r in names.items() if re.fullmatch(p, key)), None)
        assert new is not None, f"no torchtune name for {key}"
        out[new] = value
    if interleave:
        for key in list(out):
            for proj, n in (("q_proj", heads), ("k_proj", kv_heads)):
                if f"attn.{proj}." in key:
                    out[key] = _interleave(out[key], n, head_dim)
    return out

"""The Llama families' registrations (``torchtune.models._hf_family``): Llama 2, Llama 3 / 3.1 and the
tied Llama 3.2 share config.json's ``model_type: llama`` and are told apart by RoPE and tying."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict

from torchtune.models._hf_family import HFFamily, ModelShape, config_optional_int


def _llama_family(config: Dict[str, Any]) -> str:
    from torchtune.models._hf_config import HFModelConfig

    return HFModelConfig.from_dict(config, Path("config.json")).family()


def _shape(config: Dict[str, Any], path: Path) -> ModelShape:
    from torchtune.models._hf_config import HFModelConfig

    parsed = HFModelConfig.from_dict(config, path)  # RoPE scaling is checked by HFModelConfig.check_model
    return ModelShape(
        vocab_size=config_optional_int(config, "vocab_size", path),
        num_layers=config_optional_int(config, "num_hidden_layers", path),
        num_heads=parsed.num_heads,
        num_kv_heads=parsed.num_kv_heads,
        embed_dim=parsed.dim,
        head_dim=parsed.head_dim,
        intermediate_dim=config_optional_int(config, "intermediate_size", path),
        norm_eps=float(config["rms_norm_eps"]) if config.get("rms_norm_eps") is not None else None,
        rope_base=parsed.rope.theta,
        tie_word_embeddings=parsed.tied,
        qkv_bias=bool(config.get("attention_bias", False)),
        output_bias=bool(config.get("attention_bias", False)),
    )


def _family(model_type: str, name: str, builder: str, aliases: tuple = ()) -> HFFamily:
    return HFFamily(
        model_type=model_type,
        name=name,
        hf_model_types=("llama",),
        architectures=("LlamaForCausalLM",),
        builder=builder,
        shape=_shape,
        matches=lambda config: _llama_family(config) == model_type,
        aliases=aliases,
    )


FAMILIES = (
    _family("LLAMA2", "Llama 2", "torchtune.models.llama2.llama2_7b"),
    _family("LLAMA3", "Llama 3 / 3.1", "torchtune.models.llama3_1.llama3_1_8b"),
    _family("LLAMA3_2", "Llama 3.2 1B/3B", "torchtune.models.llama3_2.llama3_2_1b"),
)

"""What a Hugging Face Gemma 3 ``config.json`` says about the text model, and the checks that use it.

Two forms: ``Gemma3ForCausalLM`` (``model_type: gemma3_text``, the 1B) and
``Gemma3ForConditionalGeneration`` (``model_type: gemma3``, 4B/12B/27B) whose ``text_config`` holds the
text model. The published ``text_config`` entries list only what differs from transformers'
``Gemma3TextConfig`` defaults (the 4B's names six keys), so missing keys take those defaults, as
transformers does. RoPE comes in both spellings: transformers 4's ``rope_theta`` /
``rope_local_base_freq`` / ``rope_scaling`` and transformers 5's per-layer-type ``rope_parameters``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, Optional

from torch import nn

from torchtune._errors import TuneError
from torchtune.models.gemma3._component_builders import FULL, SLIDING, gemma3_layer_types

HF_MODEL_TYPES = ("gemma3_text", "gemma3")
ARCHITECTURES = ("Gemma3ForCausalLM", "Gemma3ForConditionalGeneration")

# transformers' Gemma3TextConfig defaults (the same in transformers 4.50+ and 5)
_DEFAULTS: Dict[str, Any] = {
    "vocab_size": 262_208,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "max_position_embeddings": 131_072,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "rope_local_base_freq": 10_000.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "sliding_window_pattern": 6,
    "attn_logit_softcapping": None,
    "final_logit_softcapping": None,
    "attention_bias": False,
    "use_bidirectional_attention": False,
    "tie_word_embeddings": True,
}

# builder argument -> the config.json key it comes from, for messages
CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "embed_dim": "hidden_size",
    "head_dim": "head_dim",
    "intermediate_dim": "intermediate_size",
    "norm_eps": "rms_norm_eps",
    "rope_base": "rope_theta (full_attention)",
    "rope_scale_factor": "rope_scaling.factor (full_attention)",
    "local_rope_base": "rope_local_base_freq (sliding_attention rope_theta)",
    "sliding_window_size": "sliding_window",
    "layer_types": "layer_types / sliding_window_pattern",
    "query_pre_attn_scalar": "query_pre_attn_scalar",
    "hidden_capping_value": "attn_logit_softcapping",
    "tie_word_embeddings": "tie_word_embeddings",
}


def is_gemma3(config: Dict[str, Any]) -> bool:
    """Whether ``config`` (a parsed config.json) describes a Gemma 3 model, in either form."""
    archs = config.get("architectures") or []
    return config.get("model_type") in HF_MODEL_TYPES or any(a in ARCHITECTURES for a in archs)


def text_config(config: Dict[str, Any], path: Path) -> Dict[str, Any]:
    """The text model's settings of a Gemma 3 ``config.json``, with transformers' defaults filled in."""
    if config.get("model_type") == "gemma3" or "text_config" in config:
        text = config.get("text_config")
        if not isinstance(text, dict):
            raise TuneError(
                f"{path} is a Gemma3ForConditionalGeneration config without a text_config object; use the "
                "config.json that came with the weights."
            )
        text = dict(text)
        # the tie is a top-level setting of the multimodal config
        text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", True))
    else:
        text = dict(config)
    return {**_DEFAULTS, **{k: v for k, v in text.items() if v is not None or k in _DEFAULTS}}


def _rope(text: Dict[str, Any], path: Path) -> tuple[float, float, float]:
    """``(global base, global linear factor, local base)`` from either RoPE spelling."""
    params = text.get("rope_parameters")
    if isinstance(params, dict) and (FULL in params or SLIDING in params):
        full = params.get(FULL) or {}
        local = params.get(SLIDING) or {}
        full_theta = float(full.get("rope_theta", text["rope_theta"]))
        local_theta = float(local.get("rope_theta", text["rope_local_base_freq"]))
    else:
        full = params if isinstance(params, dict) else (text.get("rope_scaling") or {})
        local = {}
        full_theta = float(full.get("rope_theta", text["rope_theta"]))
        local_theta = float(text["rope_local_base_freq"])
    if not isinstance(full, dict) or not isinstance(local, dict):
        raise TuneError(f"{path}: rope_parameters / rope_scaling must be objects, got {full!r} / {local!r}.")
    full_type = full.get("rope_type", full.get("type", "default"))
    local_type = local.get("rope_type", local.get("type", "default"))
    if full_type not in ("default", "linear") or local_type != "default":
        raise TuneError(
            f"{path} asks for RoPE of type '{full_type}' on the global layers and '{local_type}' on the local "
            "ones; the Gemma 3 models here implement what the published checkpoints use: plain RoPE on the "
            "local layers, plain or 'linear' scaling on the global ones. Use a Gemma 3 checkpoint's config.json."
        )
    factor = float(full.get("factor", 1.0)) if full_type == "linear" else 1.0
    return full_theta, factor, local_theta


def builder_args(config: Dict[str, Any], path: Path) -> Dict[str, Any]:
    """The :func:`~torchtune.models.gemma3.gemma3` arguments that ``config.json`` (at ``path``) describes.

    Raises:
        TuneError: naming a config.json setting the Gemma 3 models here do not implement.
    """
    text = text_config(config, path)
    unsupported = {
        "final_logit_softcapping": text["final_logit_softcapping"] is not None,
        "attention_bias": bool(text["attention_bias"]),
        "use_bidirectional_attention": bool(text["use_bidirectional_attention"]),
        "hidden_activation": text["hidden_activation"] != "gelu_pytorch_tanh",
        # transformers' Gemma3Attention never passes attn_logit_softcapping to its attention (Gemma 2's
        # does): a folder that sets it computes without it there, so its meaning is ambiguous.
        "attn_logit_softcapping": text["attn_logit_softcapping"] is not None,
    }
    bad = [k for k, v in unsupported.items() if v]
    if bad:
        raise TuneError(
            f"{path} sets {', '.join(f'{k}={text[k]!r}' for k in bad)}; the Gemma 3 models here are the published "
            "ones (no logit soft-capping, no attention biases, causal attention, tanh GELU), which is what "
            "transformers' defaults give (its Gemma 3 ignores attn_logit_softcapping; the builder's "
            "hidden_capping_value applies a cap where wanted). Use a Gemma 3 checkpoint's config.json."
        )
    rope_base, rope_scale_factor, local_rope_base = _rope(text, path)
    num_layers = int(text["num_hidden_layers"])
    layer_types = text.get("layer_types") or gemma3_layer_types(num_layers, int(text["sliding_window_pattern"]))
    if len(layer_types) != num_layers or set(layer_types) - {SLIDING, FULL}:
        raise TuneError(
            f"{path}: layer_types must list '{SLIDING}' or '{FULL}' for each of the {num_layers} layers "
            f"(num_hidden_layers), got {layer_types}."
        )
    try:
        return dict(
            vocab_size=int(text["vocab_size"]),
            num_layers=num_layers,
            num_heads=int(text["num_attention_heads"]),
            num_kv_heads=int(text["num_key_value_heads"]),
            embed_dim=int(text["hidden_size"]),
            head_dim=int(text["head_dim"]),
            intermediate_dim=int(text["intermediate_size"]),
            norm_eps=float(text["rms_norm_eps"]),
            rope_base=rope_base,
            rope_scale_factor=rope_scale_factor,
            local_rope_base=local_rope_base,
            sliding_window_size=int(text["sliding_window"]),
            layer_types=list(layer_types),
            query_pre_attn_scalar=float(text["query_pre_attn_scalar"]),
            hidden_capping_value=None,  # refused above otherwise
            tie_word_embeddings=bool(text["tie_word_embeddings"]),
        )
    except (TypeError, ValueError) as exc:
        raise TuneError(f"{path}: a Gemma 3 size entry is not a number ({exc}); use the weights' config.json.") from exc


def model_args(model: nn.Module) -> Dict[str, Any]:
    """The same description (:func:`builder_args`, less ``max_seq_len``) of a built Gemma 3 model."""
    from torchtune.modules import LinearScaledRoPE, TiedLinear

    layers = list(model.layers)
    attn = layers[0].attn
    local = next((layer.attn for layer in layers if layer.attn.sliding_window is not None), None)
    full = next((layer.attn for layer in layers if layer.attn.sliding_window is None), None)
    global_rope = full.pos_embeddings if full is not None else None
    return dict(
        vocab_size=model.tok_embeddings.num_embeddings,
        num_layers=len(layers),
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
        embed_dim=attn.embed_dim,
        head_dim=attn.head_dim,
        intermediate_dim=layers[0].mlp.w1.out_features,
        norm_eps=float(layers[0].sa_norm.eps),
        rope_base=float(global_rope.base) if global_rope is not None else None,
        rope_scale_factor=None
        if global_rope is None
        else float(global_rope.scale_factor)
        if isinstance(global_rope, LinearScaledRoPE)
        else 1.0,
        local_rope_base=float(local.pos_embeddings.base) if local is not None else None,
        sliding_window_size=local.sliding_window if local is not None else None,
        layer_types=[SLIDING if layer.attn.sliding_window is not None else FULL for layer in layers],
        query_pre_attn_scalar=float(attn.scale) ** -2 if attn.scale is not None else float(attn.head_dim),
        hidden_capping_value=attn.softcap,
        tie_word_embeddings=isinstance(model.output, TiedLinear),
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def check_model(config: Dict[str, Any], path: Path, model: nn.Module) -> None:
    """Raise ``TuneError`` naming every config.json key on which ``model`` differs (before any weight is read).

    A model with no local (or no global) layer is compared on the keys it has.
    """
    want = builder_args(config, path)
    have = model_args(model)
    problems = []
    for key, value in want.items():
        ours = have.get(key)
        if ours is None and key in ("rope_base", "rope_scale_factor", "local_rope_base", "sliding_window_size"):
            continue  # no layer of that kind in either (layer_types is compared too)
        if not _same(value, ours):
            shown_want = _show(value)
            shown_have = _show(ours)
            problems.append(
                f"{CONFIG_KEYS[key]}: config.json {shown_want}, model {shown_have} (builder argument {key})"
            )
    if problems:
        raise TuneError(
            f"The model built from model._component_ does not fit {path}: " + "; ".join(problems) + ". Use the "
            "Gemma 3 builder of this size (torchtune.models.gemma3.gemma3_1b / gemma3_4b / gemma3_12b / "
            "gemma3_27b) or set those builder arguments (model.<argument>=...) to the config.json values, or "
            "point checkpointer.checkpoint_dir at the weights this builder is for."
        )


def causal_lm_config(config: Dict[str, Any], path: Path) -> Dict[str, Any]:
    """The ``config.json`` of a ``Gemma3ForCausalLM`` folder holding the text model of ``config``.

    A ``Gemma3ForCausalLM`` config is returned as it is; a ``Gemma3ForConditionalGeneration`` one
    becomes its ``text_config`` (with the top-level tie and dtype), which is what a folder of the text
    weights alone must say to load in transformers.
    """
    if not (config.get("model_type") == "gemma3" or "text_config" in config):
        return dict(config)
    text = dict(config.get("text_config") or {})
    for key in ("torch_dtype", "dtype", "tie_word_embeddings", "bos_token_id", "eos_token_id", "pad_token_id"):
        if key in config and key not in text:
            text[key] = config[key]
    text["model_type"] = "gemma3_text"
    text["architectures"] = ["Gemma3ForCausalLM"]
    return text


def _show(value: Optional[Any]) -> str:
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    if isinstance(value, list) and len(value) > 8:
        return f"[{', '.join(v.replace('_attention', '') for v in value)}]"
    return str(value)


class Gemma3Folder:
    """What the Hugging Face checkpointer does differently for a Gemma 3 folder: config.json reading and
    checks, weight conversion both ways, and the ``config.json`` of a saved folder.

    Args:
        config: the folder's parsed ``config.json``.
        path: its path, for messages.

    Raises:
        TuneError: a config.json that is not Gemma 3's, or sets what the models here do not implement.
    """

    model_type = "GEMMA3"

    def __init__(self, config: Dict[str, Any], path: Path) -> None:
        if not is_gemma3(config):
            raise TuneError(
                f"checkpointer.model_type=GEMMA3 does not match {path}: its model_type is "
                f"{config.get('model_type')!r} and architectures {config.get('architectures')}, while a Gemma 3 "
                f"folder says model_type 'gemma3_text' (Gemma3ForCausalLM) or 'gemma3' "
                "(Gemma3ForConditionalGeneration). Set checkpointer.model_type to the folder's family, or point "
                "checkpointer.checkpoint_dir at a Gemma 3 folder."
            )
        self.config = config
        self.path = path
        self.args = builder_args(config, path)  # refuses unsupported settings before any weight is read
        self.tied = self.args["tie_word_embeddings"]
        self.multimodal = config.get("model_type") == "gemma3" or "text_config" in config
        self._shape = dict(
            num_heads=self.args["num_heads"], num_kv_heads=self.args["num_kv_heads"], head_dim=self.args["head_dim"]
        )

    def check_model(self, model: nn.Module) -> None:
        check_model(self.config, self.path, model)

    def hf_name(self, key: str) -> str:
        """The name a tensor of the input folder has in a saved (``Gemma3ForCausalLM``) folder."""
        from torchtune.models.gemma3._convert_weights import text_name

        return text_name(key)

    def to_tune(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        from torchtune.models.gemma3._convert_weights import hf_to_tune

        return hf_to_tune(state_dict, **self._shape)

    def sources(self, hf_shapes: Dict[str, Any]) -> Dict[str, Any]:
        """``{torchtune name: RowSource}`` of the stored tensors (``{stored name: shape}``), for a load
        that reads one tensor, or one rank's rows of it, at a time."""
        from torchtune.models.gemma3._convert_weights import hf_sources

        return hf_sources(hf_shapes, **self._shape)

    def hf_names(self, keys) -> Dict[str, str]:
        from torchtune.models.gemma3._convert_weights import tune_to_hf_names

        return tune_to_hf_names(keys)

    def hf_tensor(self, key: str, tensor):
        from torchtune.models.gemma3._convert_weights import tune_to_hf_tensor

        return tune_to_hf_tensor(key, tensor, **self._shape)

    @classmethod
    def config_json(cls, model: nn.Module) -> Dict[str, Any]:
        """The ``config.json`` of a ``Gemma3ForCausalLM`` folder for ``model`` (``tune estimate-memory``
        simulates saves from a model alone)."""
        args = model_args(model)
        config = {
            "architectures": ["Gemma3ForCausalLM"],
            "model_type": "gemma3_text",
            "vocab_size": args["vocab_size"],
            "hidden_size": args["embed_dim"],
            "intermediate_size": args["intermediate_dim"],
            "num_hidden_layers": args["num_layers"],
            "num_attention_heads": args["num_heads"],
            "num_key_value_heads": args["num_kv_heads"],
            "head_dim": args["head_dim"],
            "query_pre_attn_scalar": args["query_pre_attn_scalar"],
            "layer_types": args["layer_types"],
            "sliding_window": args["sliding_window_size"] or _DEFAULTS["sliding_window"],
            "rope_theta": args["rope_base"] or _DEFAULTS["rope_theta"],
            "rope_local_base_freq": args["local_rope_base"] or _DEFAULTS["rope_local_base_freq"],
            "max_position_embeddings": model.max_seq_len,
            "rms_norm_eps": args["norm_eps"],
            "tie_word_embeddings": args["tie_word_embeddings"],
        }
        if args["rope_scale_factor"] not in (None, 1.0):
            config["rope_scaling"] = {"rope_type": "linear", "factor": args["rope_scale_factor"]}
        return config

    def saved_config(self) -> Dict[str, Any]:
        """``config.json`` of the saved folder: the text model as ``Gemma3ForCausalLM`` (the vision tower
        of a multimodal folder is not trained or saved)."""
        return causal_lm_config(self.config, self.path)


def _shape(config: Dict[str, Any], path: Path):
    """The registration's :class:`~torchtune.models._hf_family.ModelShape` (for messages and tools that
    read one); the checkpointer checks a Gemma 3 model with :func:`check_model`, which covers more."""
    from torchtune.models._hf_family import ModelShape

    args = builder_args(config, path)
    return ModelShape(
        vocab_size=args["vocab_size"],
        num_layers=args["num_layers"],
        num_heads=args["num_heads"],
        num_kv_heads=args["num_kv_heads"],
        embed_dim=args["embed_dim"],
        head_dim=args["head_dim"],
        intermediate_dim=args["intermediate_dim"],
        norm_eps=args["norm_eps"],
        rope_base=args["rope_base"],
        tie_word_embeddings=args["tie_word_embeddings"],
        qk_norm=True,
        sliding_window=args["sliding_window_size"],
    )


def _family():
    from torchtune.models._hf_family import HFFamily

    return HFFamily(
        model_type="GEMMA3",
        name="Gemma 3",
        hf_model_types=HF_MODEL_TYPES,
        architectures=ARCHITECTURES,
        builder="torchtune.models.gemma3.gemma3_1b",
        shape=_shape,
        folder=Gemma3Folder,
    )


FAMILY = _family()

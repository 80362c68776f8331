"""What a Hugging Face Gemma 2 ``config.json`` says about the model, the checks that use it, and the weight
conversion (Gemma 3's names, less the q/k norms: ``torchtune.models.gemma3._convert_weights``).

The published config.json files give every setting; a missing key takes transformers' ``Gemma2Config``
default, as transformers does. RoPE comes in both spellings (``rope_theta`` / transformers 5's
``rope_parameters``); only plain RoPE is implemented, as every published Gemma 2 uses.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Dict, List, Optional

from torch import nn

from torchtune._errors import TuneError

SLIDING, FULL = "sliding_attention", "full_attention"
FAMILY_NAME = "Gemma 2"

# transformers' Gemma2Config defaults (transformers 4.42+ and 5)
_DEFAULTS: Dict[str, Any] = {
    "vocab_size": 256_000,
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10_000.0,
    "query_pre_attn_scalar": 256,
    "sliding_window": 4096,
    "final_logit_softcapping": 30.0,
    "attn_logit_softcapping": 50.0,
    "attention_bias": False,
    "tie_word_embeddings": True,
}

# builder argument -> config.json key, for messages
CONFIG_KEYS = {
    "vocab_size": "vocab_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "num_kv_heads": "num_key_value_heads",
    "embed_dim": "hidden_size",
    "head_dim": "head_dim",
    "intermediate_dim": "intermediate_size",
    "norm_eps": "rms_norm_eps",
    "rope_base": "rope_theta",
    "sliding_window_size": "sliding_window",
    "layer_types": "layer_types",
    "query_pre_attn_scalar": "query_pre_attn_scalar",
    "hidden_capping_value": "attn_logit_softcapping",
    "final_capping_value": "final_logit_softcapping",
    "soft_cap_hidden_states": "final_logit_softcapping (capped logits, not hidden states)",
}


def _alternating(num_layers: int) -> List[str]:
    """transformers' default Gemma 2 ``layer_types``: local (sliding) layers at even indices."""
    return [SLIDING if i % 2 == 0 else FULL for i in range(num_layers)]


def builder_args(config: Dict[str, Any], path: Path) -> Dict[str, Any]:
    """The :func:`~torchtune.models.gemma2.gemma2` arguments that ``config.json`` (at ``path``) describes.

    Raises:
        TuneError: naming a setting the Gemma 2 models here do not implement.
    """
    text = {**_DEFAULTS, **{k: v for k, v in config.items() if v is not None or k in _DEFAULTS}}
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    rope_type = params.get("rope_type", params.get("type", "default")) if isinstance(params, dict) else "?"
    num_layers = int(text["num_hidden_layers"])
    layer_types = list(text.get("layer_types") or _alternating(num_layers))
    problems = {
        "hidden_activation": text.get("hidden_act", text["hidden_activation"]) not in ("gelu", "gelu_pytorch_tanh"),
        "attention_bias": bool(text["attention_bias"]),
        "use_bidirectional_attention": bool(text.get("use_bidirectional_attention")),
        "rope_parameters / rope_scaling": rope_type != "default",
        "layer_types": layer_types != _alternating(num_layers),
    }
    bad = [k for k, v in problems.items() if v]
    if bad:
        raise TuneError(
            f"{path} sets {', '.join(bad)} to what the Gemma 2 models here do not implement: they are the published "
            "ones (tanh GELU, no attention biases, causal attention, plain RoPE, local and global layers "
            "alternating from a local first one). Use a Gemma 2 checkpoint's config.json."
        )
    theta = params.get("rope_theta", text["rope_theta"]) if isinstance(params, dict) else text["rope_theta"]
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
            rope_base=float(theta),
            sliding_window_size=int(text["sliding_window"]),
            layer_types=layer_types,
            query_pre_attn_scalar=float(text["query_pre_attn_scalar"]),
            hidden_capping_value=_optional_float(text["attn_logit_softcapping"]),
            final_capping_value=_optional_float(text["final_logit_softcapping"]),
            soft_cap_hidden_states=False,
            tie_word_embeddings=bool(text["tie_word_embeddings"]),
        )
    except (TypeError, ValueError) as exc:
        raise TuneError(f"{path}: a Gemma 2 size entry is not a number ({exc}); use the weights' config.json.") from exc


def _optional_float(value: Any) -> Optional[float]:
    return None if value is None else float(value)


def model_args(model: nn.Module) -> Dict[str, Any]:
    """The same description (:func:`builder_args`) of a built Gemma 2 model."""
    from torchtune.models.gemma2._component_builders import Gemma2FinalNorm
    from torchtune.modules import TiedLinear

    layers = list(model.layers)
    attn = layers[0].attn
    local = next((layer.attn for layer in layers if layer.attn.sliding_window is not None), None)
    output_cap = getattr(model.output, "softcap", None)
    hidden_cap = model.norm.capping_value if isinstance(model.norm, Gemma2FinalNorm) else None
    norm = model.norm.rms_norm if isinstance(model.norm, Gemma2FinalNorm) else model.norm
    return dict(
        vocab_size=model.tok_embeddings.num_embeddings,
        num_layers=len(layers),
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
        embed_dim=attn.embed_dim,
        head_dim=attn.head_dim,
        intermediate_dim=layers[0].mlp.w1.out_features,
        norm_eps=float(norm.eps),
        rope_base=float(attn.pos_embeddings.base),
        sliding_window_size=local.sliding_window if local is not None else None,
        layer_types=[SLIDING if layer.attn.sliding_window is not None else FULL for layer in layers],
        query_pre_attn_scalar=float(attn.scale) ** -2 if attn.scale is not None else float(attn.head_dim),
        hidden_capping_value=attn.softcap,
        final_capping_value=output_cap if hidden_cap is None else hidden_cap,
        soft_cap_hidden_states=hidden_cap is not None,
        tie_word_embeddings=isinstance(model.output, TiedLinear),
    )


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-6)
    return a == b


def check_model(config: Dict[str, Any], path: Path, model: nn.Module) -> None:
    """Raise ``TuneError`` naming every config.json key on which ``model`` differs (before any weight is read)."""
    want, have = builder_args(config, path), model_args(model)
    problems = []
    for key, value in want.items():
        ours = have.get(key)
        if key == "sliding_window_size" and ours is None:
            continue  # no local layer in the model: layer_types names it
        if not _same(value, ours):
            problems.append(f"{CONFIG_KEYS.get(key, key)}: config.json {value}, model {ours} (builder argument {key})")
    if problems:
        raise TuneError(
            f"The model built from model._component_ does not fit {path}: " + "; ".join(problems) + ". Use the "
            "Gemma 2 builder of this size (torchtune.models.gemma2.gemma2_2b / gemma2_9b / gemma2_27b) or set those "
            "builder arguments (model.<argument>=...) to the config.json values, or point "
            "checkpointer.checkpoint_dir at the weights this builder is for."
        )


class Gemma2Folder:
    """What the Hugging Face checkpointer does for a Gemma 2 folder: config.json checks, weight conversion both
    ways, the saved folder's ``config.json`` (the input's).

    Args:
        config: the folder's parsed ``config.json``.
        path: its path, for messages.
    """

    model_type = "GEMMA2"

    def __init__(self, config: Dict[str, Any], path: Path) -> None:
        self.config = config
        self.path = path
        self.args = builder_args(config, path)  # refuses unsupported settings before any weight is read
        self.tied = self.args["tie_word_embeddings"]
        self._shape = dict(
            num_heads=self.args["num_heads"], num_kv_heads=self.args["num_kv_heads"], head_dim=self.args["head_dim"]
        )

    def check_model(self, model: nn.Module) -> None:
        check_model(self.config, self.path, model)

    def hf_name(self, key: str) -> str:
        return key

    def to_tune(self, state_dict: Dict[str, Any]) -> Dict[str, Any]:
        from torchtune.models.gemma3._convert_weights import hf_to_tune

        return hf_to_tune(state_dict, **self._shape, family=FAMILY_NAME, model_type=self.model_type)

    def sources(self, hf_shapes: Dict[str, Any]) -> Dict[str, Any]:
        from torchtune.models.gemma3._convert_weights import hf_sources

        return hf_sources(hf_shapes, **self._shape, family=FAMILY_NAME, model_type=self.model_type)

    def hf_names(self, keys) -> Dict[str, str]:
        from torchtune.models.gemma3._convert_weights import tune_to_hf_names

        return tune_to_hf_names(keys, family=FAMILY_NAME)

    def hf_tensor(self, key: str, tensor):
        from torchtune.models.gemma3._convert_weights import tune_to_hf_tensor

        return tune_to_hf_tensor(key, tensor, **self._shape)

    @classmethod
    def config_json(cls, model: nn.Module) -> Dict[str, Any]:
        """The ``config.json`` of a ``Gemma2ForCausalLM`` folder for ``model`` (saves simulated from a model alone)."""
        args = model_args(model)
        return {
            "architectures": ["Gemma2ForCausalLM"],
            "model_type": "gemma2",
            "vocab_size": args["vocab_size"],
            "hidden_size": args["embed_dim"],
            "intermediate_size": args["intermediate_dim"],
            "num_hidden_layers": args["num_layers"],
            "num_attention_heads": args["num_heads"],
            "num_key_value_heads": args["num_kv_heads"],
            "head_dim": args["head_dim"],
            "query_pre_attn_scalar": args["query_pre_attn_scalar"],
            "sliding_window": args["sliding_window_size"] or _DEFAULTS["sliding_window"],
            "layer_types": args["layer_types"],
            "rope_theta": args["rope_base"],
            "attn_logit_softcapping": args["hidden_capping_value"],
            "final_logit_softcapping": args["final_capping_value"],
            "max_position_embeddings": model.max_seq_len,
            "rms_norm_eps": args["norm_eps"],
            "tie_word_embeddings": args["tie_word_embeddings"],
        }

    def saved_config(self) -> Dict[str, Any]:
        return dict(self.config)


def _shape(config: Dict[str, Any], path: Path):
    """The registration's :class:`~torchtune.models._hf_family.ModelShape` (for messages and tools that read
    one); the checkpointer checks a Gemma 2 model with :func:`check_model`, which covers more."""
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
        sliding_window=args["sliding_window_size"],
        gemma=True,
    )


def _family():
    from torchtune.models._hf_family import HFFamily

    return HFFamily(
        model_type="GEMMA2",
        name=FAMILY_NAME,
        hf_model_types=("gemma2",),
        architectures=("Gemma2ForCausalLM",),
        builder="torchtune.models.gemma2.gemma2_2b",
        shape=_shape,
        folder=Gemma2Folder,
    )


FAMILY = _family()

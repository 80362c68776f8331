"""What a Hugging Face Llama ``config.json`` says about the model, and the checks that use it.

Reads both spellings of the RoPE settings: the hub's folders (transformers 4.x) have a top-level
``rope_theta`` and ``rope_scaling: {rope_type: llama3, factor, low_freq_factor, high_freq_factor,
original_max_position_embeddings}`` (``null`` for Llama2); transformers 5 writes them all into
``rope_parameters`` (with ``rope_type: default`` for plain RoPE).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional

from torch import nn

from torchtune._errors import TuneError

# Family of each model_type, for messages; LLAMA3 covers Llama 3 and 3.1 (one format).
MODEL_TYPES = {
    "LLAMA2": ("Llama 2", "torchtune.models.llama2.llama2_7b"),
    "LLAMA3": ("Llama 3 / 3.1", "torchtune.models.llama3_1.llama3_1_8b"),
    "LLAMA3_2": ("Llama 3.2 1B/3B", "torchtune.models.llama3_2.llama3_2_1b"),
}
_LLAMA3_ROPE_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")
_LLAMA3_ROPE_THETA = 500_000.0


@dataclass(frozen=True)
class RopeSettings:
    """RoPE as config.json gives it: the base, and Llama 3.1's scaling (``None`` for plain RoPE)."""

    theta: float
    scaling: Optional[Dict[str, float]] = None

    def describe(self) -> str:
        if self.scaling is None:
            return f"rope_theta={_num(self.theta)}, no scaling"
        parts = ", ".join(f"{k}={_num(self.scaling[k])}" for k in _LLAMA3_ROPE_KEYS)
        return f"rope_theta={_num(self.theta)}, llama3 scaling ({parts})"


@dataclass(frozen=True)
class HFModelConfig:
    """The parts of a Llama ``config.json`` that weight conversion and the model checks need."""

    path: Path
    num_heads: int
    num_kv_heads: int
    dim: int
    head_dim: int
    tied: bool
    rope: RopeSettings

    @classmethod
    def from_file(cls, path: Path) -> "HFModelConfig":
        """Parse ``path``; raises ``TuneError`` naming the entry that is missing or not understood."""
        try:
            config = json.loads(path.read_text())
        except ValueError as exc:
            raise TuneError(f"{path} is not valid JSON ({exc}); use the config.json of the weights.") from exc
        return cls.from_dict(config, path)

    @classmethod
    def from_dict(cls, config: Dict[str, Any], path: Path) -> "HFModelConfig":
        """Parse a ``config.json`` already read from ``path``."""
        try:
            num_heads = int(config["num_attention_heads"])
            dim = int(config["hidden_size"])
        except KeyError as exc:
            raise TuneError(f"{path} has no {exc} entry; is this a Llama config.json?") from exc
        return cls(
            path=path,
            num_heads=num_heads,
            num_kv_heads=int(config.get("num_key_value_heads") or num_heads),
            dim=dim,
            head_dim=int(config.get("head_dim") or dim // num_heads),
            tied=bool(config.get("tie_word_embeddings", False)),
            rope=_read_rope(config, path),
        )

    def family(self) -> str:
        """The model_type these settings belong to: llama3 RoPE scaling means Llama 3.1 (3.2 when
        tied), an unscaled base of 500000 Llama 3, anything else Llama 2."""
        if self.rope.scaling is not None:
            return "LLAMA3_2" if self.tied else "LLAMA3"
        if math.isclose(self.rope.theta, _LLAMA3_ROPE_THETA):
            return "LLAMA3"
        return "LLAMA2"

    def check_model_type(self, model_type: str) -> None:
        """Raise unless ``model_type`` (checkpointer.model_type) names the family of this config."""
        family = self.family()
        if model_type == family:
            return
        name, builder = MODEL_TYPES[family]
        raise TuneError(
            f"checkpointer.model_type={model_type} does not match {self.path}: it describes a {name} model "
            f"({self.rope.describe()}, tie_word_embeddings={str(self.tied).lower()}), whose model_type is "
            f"{family}. Set checkpointer.model_type={family} and a matching model._component_ (e.g. "
            f"{builder}), or point checkpointer.checkpoint_dir at a {MODEL_TYPES[model_type][0]} checkpoint."
        )

    def check_model(self, model: nn.Module) -> None:
        """Raise if ``model`` splits heads or turns positions differently from this config.

        Shapes cannot show either: the same width splits into other head counts, and RoPE has no
        weights. Both would load without error and compute something else.
        """
        attn = model.layers[0].attn
        if (self.num_heads, self.num_kv_heads) != (attn.num_heads, attn.num_kv_heads):
            raise TuneError(
                f"The checkpoint's config.json says num_attention_heads={self.num_heads}, "
                f"num_key_value_heads={self.num_kv_heads}, but the model built from model._component_ has "
                f"{attn.num_heads} heads and {attn.num_kv_heads} key/value heads. Use the model builder "
                f"that matches these weights (or fix {self.path})."
            )
        ours = _model_rope(attn.pos_embeddings)
        if ours is not None and not _same_rope(ours, self.rope):
            raise TuneError(
                f"The checkpoint's config.json ({self.path}) has {self.rope.describe()}, but the model built "
                f"from model._component_ has {ours.describe()}: it would see token positions differently "
                "from how it was trained. Use the model builder for these weights, or set its rope_base / "
                "scale_factor (model.rope_base=..., model.scale_factor=...; +model.rope_base=... when the model node "
                "has no such key) to the values of config.json."
            )


def _read_rope(config: Dict[str, Any], path: Path) -> RopeSettings:
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise TuneError(f"{path}: rope_parameters / rope_scaling must be an object, got {params!r}.")
    theta = float(params.get("rope_theta", config.get("rope_theta", 10_000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return RopeSettings(theta)
    if rope_type != "llama3":
        raise TuneError(
            f"{path} asks for RoPE of type '{rope_type}'; the Llama models here implement plain RoPE and "
            "Llama 3.1's 'llama3' scaling only. Use a checkpoint of a Llama 2 or Llama 3.x model."
        )
    scaling = {}
    for key in _LLAMA3_ROPE_KEYS:
        value = params.get(key)
        if value is None and key == "original_max_position_embeddings":
            value = config.get("max_position_embeddings")  # transformers' fallback
        if value is None:
            raise TuneError(f"{path}: the llama3 RoPE scaling has no '{key}'; use the config.json of the weights.")
        scaling[key] = float(value)
    return RopeSettings(theta, scaling)


def _model_rope(rope: nn.Module) -> Optional[RopeSettings]:
    from torchtune.modules import Llama3ScaledRoPE

    base = getattr(rope, "base", None)
    if base is None:
        return None  # a RoPE module this check does not know
    if isinstance(rope, Llama3ScaledRoPE):
        values = (rope.scale_factor, rope.low_freq_factor, rope.high_freq_factor, rope.old_context_len)
        return RopeSettings(float(base), {k: float(v) for k, v in zip(_LLAMA3_ROPE_KEYS, values)})
    return RopeSettings(float(base))


def _same_rope(a: RopeSettings, b: RopeSettings) -> bool:
    if not math.isclose(a.theta, b.theta, rel_tol=1e-6):
        return False
    if (a.scaling is None) != (b.scaling is None):
        return False
    return a.scaling is None or all(math.isclose(a.scaling[k], b.scaling[k], rel_tol=1e-6) for k in _LLAMA3_ROPE_KEYS)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)

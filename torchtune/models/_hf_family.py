"""Model families as Hugging Face folders describe them: one small registration per family.

A family's registration (an :class:`HFFamily` named ``FAMILY`` or ``FAMILIES`` in its folder's ``_hf.py``)
says which ``config.json`` it reads (``model_type`` / ``architectures``), how ``config.json`` turns into
the shape a builder must have (:class:`ModelShape`), and whether the weights need the fused-projection
conversion. The Hugging Face checkpointer finds the family of a folder here, checks it against
``checkpointer.model_type`` and the model built from ``model._component_`` before any weight is read,
and converts the weights with :mod:`torchtune.models._hf_convert`. A new family adds its ``_hf.py``
module to ``FAMILY_MODULES``.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass, fields
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from torch import nn

from torchtune._errors import TuneError

# One module per family folder; each defines FAMILY (an HFFamily) or FAMILIES (a tuple of them).
FAMILY_MODULES = (
    "torchtune.models.llama2._hf",
    "torchtune.models.qwen3._hf",
    "torchtune.models.qwen2_5._hf",
    "torchtune.models.mistral._hf",
    "torchtune.models.phi4._hf",
    "torchtune.models.gemma._hf",
    "torchtune.models.gemma2._hf",
    "torchtune.models.gemma3._hf",
)


@dataclass(frozen=True)
class ModelShape:
    """What must agree between ``config.json`` and the model a builder makes, beyond the weight shapes:
    a wrong head split, RoPE base, norm epsilon, tie, bias, q/k norm or window loads without a shape
    error and computes something else."""

    vocab_size: Optional[int]
    num_layers: Optional[int]
    num_heads: int
    num_kv_heads: int
    embed_dim: int
    head_dim: int
    intermediate_dim: Optional[int]
    norm_eps: Optional[float]
    rope_base: float
    tie_word_embeddings: bool
    qkv_bias: bool = False
    output_bias: bool = False
    qk_norm: bool = False
    sliding_window: Optional[int] = None
    # Channels of each head that RoPE rotates when fewer than head_dim (partial_rotary_factor); None: all.
    rotary_dim: Optional[int] = None
    # LongRoPE's settings as sorted (key, value) pairs (lists as tuples); None: no RoPE scaling.
    rope_scaling: Optional[Tuple[Tuple[str, Any], ...]] = None
    # The family builders' RoPE layout (not in config.json): interleaved channel pairs (Llama, Mistral), whose
    # q/k rows are permuted from HF's order on load, or HF's halves (Qwen2, Phi-3), copied as they are.
    rope_interleaved: bool = True
    # Gemma's embedding scale sqrt(hidden_size), ``1 + weight`` RMSNorms and tanh-GELU feed-forward.
    gemma: bool = False


# Fields a config.json may leave out (older converted Llama folders): then not compared.
_MAY_BE_UNKNOWN = ("vocab_size", "num_layers", "intermediate_dim", "norm_eps")

# The config.json key (and the builder argument) each ModelShape field comes from, for messages.
CONFIG_KEYS = {
    "vocab_size": ("vocab_size", "vocab_size"),
    "num_layers": ("num_hidden_layers", "num_layers"),
    "num_heads": ("num_attention_heads", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "embed_dim": ("hidden_size", "embed_dim"),
    "head_dim": ("head_dim", "head_dim"),
    "intermediate_dim": ("intermediate_size", "intermediate_dim"),
    "norm_eps": ("rms_norm_eps", "norm_eps"),
    "rope_base": ("rope_theta", "rope_base"),
    "tie_word_embeddings": ("tie_word_embeddings", "tie_word_embeddings"),
    "qkv_bias": ("attention_bias / the family's q/k/v biases", "the builder"),
    "output_bias": ("attention_bias", "the builder"),
    "qk_norm": ("the family's q/k norm", "the builder"),
    "sliding_window": ("sliding_window", "sliding_window"),
    "rotary_dim": ("partial_rotary_factor x head_dim", "rotary_dim"),
    "rope_scaling": ("rope_scaling / rope_parameters", "rope_short_factor, rope_long_factor, ..."),
    "rope_interleaved": ("the family's RoPE channel layout (interleaved pairs or halves)", "the family's builder"),
    "gemma": ("model_type gemma (embedding scale, 1 + weight norms, GELU)", "a Gemma builder"),
}


@dataclass(frozen=True)
class HFFamily:
    """One family's registration.

    Args:
        model_type: ``checkpointer.model_type`` (``"QWEN3"``).
        name: for messages (``"Qwen3"``).
        hf_model_types: the ``model_type`` values of its ``config.json`` (``"qwen3"``).
        architectures: its ``architectures`` values (``"Qwen3ForCausalLM"``).
        builder: an example model builder, for messages.
        shape: ``(config, path) -> ModelShape``; raises ``TuneError`` for a config.json feature the
            family's builders do not implement (a RoPE scaling, a sliding window), naming the key.
        fused_projections: the folder stores ``qkv_proj`` and ``gate_up_proj`` fused (Phi-3/Phi-4).
        matches: for families that share a ``model_type`` (Llama 2 / 3 / 3.2): whether ``config`` is this one.
        aliases: other spellings of ``model_type`` accepted in the YAML (torchtune's ``QWEN2_5``).
        config_json: ``ModelShape -> config.json`` of this family, for a folder made from a model alone
            (``tune estimate-memory`` simulates a save; a real save writes the input's config.json).
        folder: for a family whose folders do not convert like the Llama-shaped ones (Gemma 3: other
            weight names, post-norms, two config.json forms), a class built from ``(config, path)`` that
            does it all: ``check_model(model)``, ``hf_name(key)`` (a stored name as saves write it),
            ``to_tune(state_dict)``, ``sources(hf_shapes)`` (per-tensor reading), ``hf_names(keys)``,
            ``hf_tensor(key, tensor)``, ``saved_config()``, ``tied``, and the classmethod
            ``config_json(model)``. ``shape`` and ``config_json`` are then not used by the checkpointer.
    """

    model_type: str
    name: str
    hf_model_types: Tuple[str, ...]
    architectures: Tuple[str, ...]
    builder: str
    shape: Callable[[Dict[str, Any], Path], ModelShape]
    fused_projections: bool = False
    matches: Optional[Callable[[Dict[str, Any]], bool]] = None
    aliases: Tuple[str, ...] = ()
    config_json: Optional[Callable[[ModelShape], Dict[str, Any]]] = None
    folder: Optional[type] = None


@lru_cache(maxsize=None)
def _registered() -> Tuple[HFFamily, ...]:
    found: List[HFFamily] = []
    for module_name in FAMILY_MODULES:
        module = importlib.import_module(module_name)
        found.extend(getattr(module, "FAMILIES", None) or (module.FAMILY,))
    return tuple(found)


def families() -> Dict[str, HFFamily]:
    """``{model_type: HFFamily}`` of every registered family."""
    return {f.model_type: f for f in _registered()}


def canonical_model_type(model_type: str) -> Optional[str]:
    """The registered ``model_type`` that ``model_type`` (any case, or an alias) names; ``None`` if none."""
    wanted = str(model_type).upper()
    for family in _registered():
        if wanted == family.model_type or wanted in family.aliases:
            return family.model_type
    return None


def supported_model_types() -> str:
    return ", ".join(f"{f.model_type} ({f.name})" for f in _registered())


def detect_family(config: Dict[str, Any], path: Path) -> HFFamily:
    """The family of the folder whose ``config.json`` (at ``path``) is ``config``.

    Read from ``model_type``, else from ``architectures``; a config with neither is taken as Llama, as
    the oldest converted Llama folders are.

    Raises:
        TuneError: naming what config.json says, the supported families and the closest of them.
    """
    hf_type = config.get("model_type")
    architectures = config.get("architectures") or []
    if isinstance(architectures, str):
        architectures = [architectures]
    if hf_type is not None:
        candidates = [f for f in _registered() if hf_type in f.hf_model_types]
    elif architectures:
        candidates = [f for f in _registered() if any(a in f.architectures for a in architectures)]
    else:
        candidates = [f for f in _registered() if "llama" in f.hf_model_types]
    if not candidates:
        said = f"model_type '{hf_type}'" if hf_type is not None else f"architectures {architectures}"
        known = [t for f in _registered() for t in (*f.hf_model_types, *f.architectures)]
        close = difflib.get_close_matches(str(hf_type or (architectures or [""])[0]), known, n=1, cutoff=0.3)
        closest = ""
        if close:
            family = next(f for f in _registered() if close[0] in (*f.hf_model_types, *f.architectures))
            closest = (
                f" The closest supported one is {family.name} ('{close[0]}', "
                f"checkpointer.model_type={family.model_type})."
            )
        raise TuneError(
            f"{path} describes a model of {said}, which this library does not implement. Supported families "
            f"(checkpointer.model_type): {supported_model_types()}.{closest} Use the weights of a supported "
            "family, or a family folder whose config.json says so."
        )
    if len(candidates) > 1:
        matching = [f for f in candidates if f.matches is None or f.matches(config)]
        candidates = matching or candidates
    return candidates[0]


def check_yaml_model_type(model_type: str, family: HFFamily, path: Path) -> str:
    """The canonical ``checkpointer.model_type``; raises ``TuneError`` if it is not ``family``'s."""
    canonical = canonical_model_type(model_type)
    if canonical is None:
        raise TuneError(
            f"checkpointer.model_type={model_type} is not supported; use one of {supported_model_types()}. "
            f"{path} describes a {family.name} model: checkpointer.model_type={family.model_type}."
        )
    if canonical != family.model_type:
        raise TuneError(
            f"checkpointer.model_type={model_type} does not match {path}: it describes a {family.name} model "
            f"(model_type '{_config_model_type(path)}'), whose model_type is {family.model_type}. Set "
            f"checkpointer.model_type={family.model_type} and a matching model._component_ (e.g. "
            f"{family.builder}), or point checkpointer.checkpoint_dir at a {families()[canonical].name} checkpoint."
        )
    return canonical


def _config_model_type(path: Path) -> str:
    import json

    try:
        return str(json.loads(Path(path).read_text()).get("model_type"))
    except (OSError, ValueError):
        return "?"


# --- reading config.json ---------------------------------------------------------------------------


def config_int(config: Dict[str, Any], key: str, path: Path, default: Any = None) -> int:
    value = config.get(key, default)
    if value is None:
        raise TuneError(f"{path} has no '{key}' entry; use the config.json that came with the weights.")
    try:
        return int(value)
    except (TypeError, ValueError) as exc:
        raise TuneError(f"{path}: '{key}' is {value!r}, not a whole number.") from exc


def config_optional_int(config: Dict[str, Any], key: str, path: Path) -> Optional[int]:
    """``config[key]`` as a whole number, or ``None`` where config.json leaves it out (then not compared)."""
    return config_int(config, key, path) if config.get(key) is not None else None


def rope_theta(config: Dict[str, Any], path: Path, family: str, default: float = 10_000.0) -> float:
    """The RoPE base of a family that implements plain RoPE only; refuses any scaling."""
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise TuneError(f"{path}: rope_parameters / rope_scaling must be an object, got {params!r}.")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise TuneError(
            f"{path} asks for RoPE scaling of type '{rope_type}' (rope_scaling / rope_parameters); the {family} "
            "models here implement plain RoPE, as the published checkpoints use it. Remove the rope_scaling "
            "entry (it only extends the context past max_position_embeddings) or use a checkpoint without it."
        )
    if float(params.get("partial_rotary_factor", config.get("partial_rotary_factor", 1.0)) or 1.0) != 1.0:
        raise TuneError(
            f"{path} rotates only part of each head (partial_rotary_factor); the {family} models here rotate "
            "the whole head. Use a checkpoint with full rotary embeddings."
        )
    return float(params.get("rope_theta", config.get("rope_theta", default)))


def longrope_scaling(
    short_factor: Sequence[float],
    long_factor: Sequence[float],
    original_max_position_embeddings: int,
    factor: float,
    attention_factor: float,
) -> Tuple[Tuple[str, Any], ...]:
    """:attr:`ModelShape.rope_scaling` of LongRoPE, from config.json or from a model alike."""
    return (
        ("attention_factor", float(attention_factor)),
        ("factor", float(factor)),
        ("long_factor", tuple(float(f) for f in long_factor)),
        ("original_max_position_embeddings", int(original_max_position_embeddings)),
        ("rope_type", "longrope"),
        ("short_factor", tuple(float(f) for f in short_factor)),
    )


def llama_like_shape(
    config: Dict[str, Any],
    path: Path,
    *,
    family: str,
    qkv_bias: bool = False,
    output_bias: bool = False,
    qk_norm: bool = False,
    sliding_window: Optional[int] = None,
    default_rope_theta: float = 10_000.0,
) -> ModelShape:
    """The :class:`ModelShape` of a Llama-shaped ``config.json`` with the given family features. The sizes
    the weights' shapes show anyway (vocabulary, layers, feed-forward width) and the epsilon may be left out,
    as in the minimal config.json files of torchtune's tests: then they are not compared."""
    num_heads = config_int(config, "num_attention_heads", path)
    embed_dim = config_int(config, "hidden_size", path)
    head_dim = config.get("head_dim")
    eps = config.get("rms_norm_eps")
    return ModelShape(
        vocab_size=config_optional_int(config, "vocab_size", path),
        num_layers=config_optional_int(config, "num_hidden_layers", path),
        num_heads=num_heads,
        num_kv_heads=config_int(config, "num_key_value_heads", path, num_heads),
        embed_dim=embed_dim,
        head_dim=int(head_dim) if head_dim else embed_dim // num_heads,
        intermediate_dim=config_optional_int(config, "intermediate_size", path),
        norm_eps=float(eps) if eps is not None else None,
        rope_base=rope_theta(config, path, family, default_rope_theta),
        tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
        qkv_bias=qkv_bias,
        output_bias=output_bias,
        qk_norm=qk_norm,
        sliding_window=sliding_window,
    )


def llama_like_config(shape: ModelShape, *, hf_model_type: str, architecture: str, **extra: Any) -> Dict[str, Any]:
    """The ``config.json`` entries of a Llama-shaped family for ``shape`` (the inverse of
    :func:`llama_like_shape`), with the family's ``model_type`` / ``architectures`` and ``extra`` keys."""
    config: Dict[str, Any] = {
        "architectures": [architecture],
        "model_type": hf_model_type,
        "hidden_size": shape.embed_dim,
        "intermediate_size": shape.intermediate_dim,
        "num_attention_heads": shape.num_heads,
        "num_key_value_heads": shape.num_kv_heads,
        "head_dim": shape.head_dim,
        "num_hidden_layers": shape.num_layers,
        "vocab_size": shape.vocab_size,
        "rms_norm_eps": shape.norm_eps,
        "rope_theta": shape.rope_base,
        "tie_word_embeddings": shape.tie_word_embeddings,
        "sliding_window": shape.sliding_window,
    }
    config.update(extra)
    return config


# --- comparing with a built model --------------------------------------------------------------------


def shape_of_model(model: nn.Module) -> ModelShape:
    """The :class:`ModelShape` of a decoder built by one of the Llama-shaped builders (meta device is fine)."""
    from torchtune.modules import LongRoPE, ScaledEmbedding, TiedLinear

    attn = model.layers[0].attn
    rms = model.layers[0].sa_norm
    rope = attn.pos_embeddings
    rotary_dim = getattr(rope, "dim", attn.head_dim)
    inner = getattr(rope, "rope", rope)  # the RoPE of a PartialRotaryEmbeddings (or of a LigerRoPE)
    inner = getattr(inner, "rope", inner)
    return ModelShape(
        vocab_size=model.tok_embeddings.num_embeddings,
        num_layers=len(model.layers),
        num_heads=attn.num_heads,
        num_kv_heads=attn.num_kv_heads,
        embed_dim=attn.embed_dim,
        head_dim=attn.head_dim,
        intermediate_dim=model.layers[0].mlp.w1.out_features,
        norm_eps=float(getattr(rms, "eps", 0.0)),
        rope_base=float(getattr(attn.pos_embeddings, "base", 0.0)),
        tie_word_embeddings=isinstance(model.output, TiedLinear),
        qkv_bias=attn.q_proj.bias is not None,
        output_bias=attn.output_proj.bias is not None,
        qk_norm=getattr(attn, "q_norm", None) is not None,
        sliding_window=getattr(attn, "sliding_window", None),
        rotary_dim=None if rotary_dim == attn.head_dim else rotary_dim,
        rope_scaling=longrope_scaling(
            inner.short_factor,
            inner.long_factor,
            inner.original_max_seq_len,
            inner.scale_factor,
            inner.attention_factor,
        )
        if isinstance(inner, LongRoPE)
        else None,
        rope_interleaved=bool(getattr(inner, "interleaved", True)),
        gemma=isinstance(model.tok_embeddings, ScaledEmbedding),
    )


def check_shape(expected: ModelShape, model: nn.Module, path: Path, family: HFFamily) -> None:
    """Raise ``TuneError`` naming every key where ``model`` differs from ``config.json`` (at ``path``)."""
    ours = shape_of_model(model)
    problems = []
    for field in fields(ModelShape):
        want, have = getattr(expected, field.name), getattr(ours, field.name)
        if want is None and field.name in _MAY_BE_UNKNOWN:
            continue
        same = abs(want - have) <= 1e-6 * abs(want) if isinstance(want, float) else want == have
        if not same:
            key, arg = CONFIG_KEYS[field.name]
            problems.append(f"{key}: config.json {_show(want)}, model {_show(have)} (builder argument {arg})")
    if problems:
        raise TuneError(
            f"The model built from model._component_ does not fit {path}: " + "; ".join(problems) + ". Use the "
            f"{family.name} builder of this size (e.g. {family.builder} for its smallest size) or set those "
            "builder arguments (model.<argument>=...) to the config.json values, or point "
            "checkpointer.checkpoint_dir at the weights this builder is for."
        )


def _show(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower() if value is not None else "none"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else f"{value:g}"
    return str(value)

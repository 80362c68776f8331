"""Hugging Face <-> torchtune weights of every Llama-shaped family (Llama 2/3.x, Qwen2/2.5, Qwen3, Mistral,
Phi-3/Phi-4, Gemma): names, HF's rotary permutation, and the fused projections of Phi-3/Phi-4.

The Llama, Mistral, Qwen3 and Gemma builders rotate channel pairs ``(2i, 2i+1)`` (as torchtune's do); HF
rotates halves, so for them every tensor whose rows (or entries) are query/key channels is re-indexed: the
q/k projection weights, their biases and the per-head q/k norm scales (Qwen3, one ``head_dim`` vector
shared by the heads). The Qwen2 and Phi-3 builders rotate halves, as torchtune's and HF's do
(``ModelShape.rope_interleaved`` False): their tensors are copied as they are. With partial rotary
(Phi-4-mini) only the rotated first channels of each head count. A Phi-4 folder stores
``qkv_proj`` (q, k, v rows stacked) and ``gate_up_proj`` (gate rows, then up rows): loading splits them
into torchtune's separate projections and saving stacks them again. Every step is re-indexing, so both
directions are exact.
"""

from __future__ import annotations

import re
from typing import Dict, Iterable, List, Optional, Sequence

import torch

from torchtune._errors import TuneError
from torchtune.models._hf_family import ModelShape
from torchtune.models.llama2._convert_weights import (
    _DERIVABLE_HF,
    _FROM_HF,
    RowSource,
    _permute,
    _rename,
    _rotary_reorder,
)

_FROM_HF_ALL = {
    **_FROM_HF,
    "model.layers.{}.self_attn.q_proj.bias": "layers.{}.attn.q_proj.bias",
    "model.layers.{}.self_attn.k_proj.bias": "layers.{}.attn.k_proj.bias",
    "model.layers.{}.self_attn.v_proj.bias": "layers.{}.attn.v_proj.bias",
    "model.layers.{}.self_attn.o_proj.bias": "layers.{}.attn.output_proj.bias",
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attn.q_norm.scale",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attn.k_norm.scale",
}
_TO_HF_ALL = {v: k for k, v in _FROM_HF_ALL.items()}

# Fused HF tensor -> the torchtune tensors stacked in it, in row order.
_FUSED = {
    "model.layers.{}.self_attn.qkv_proj.weight": (
        "layers.{}.attn.q_proj.weight",
        "layers.{}.attn.k_proj.weight",
        "layers.{}.attn.v_proj.weight",
    ),
    "model.layers.{}.mlp.gate_up_proj.weight": ("layers.{}.mlp.w1.weight", "layers.{}.mlp.w3.weight"),
}
_FUSED_PARTS = {part: fused for fused, parts in _FUSED.items() for part in parts}
_LAYER = re.compile(r"\.(\d+)\.")


def _template(key: str) -> tuple[str, Optional[str]]:
    match = _LAYER.search(key)
    if match is None:
        return key, None
    return key[: match.start()] + ".{}." + key[match.end() :], match.group(1)


def _rows(shape: ModelShape, tune_template: str) -> Optional[int]:
    if tune_template.endswith("q_proj.weight"):
        return shape.num_heads * shape.head_dim
    if tune_template.endswith(("k_proj.weight", "v_proj.weight")):
        return shape.num_kv_heads * shape.head_dim
    return shape.intermediate_dim  # w1 / w3


def _to_hf_layout(key: str, t: torch.Tensor, shape: ModelShape) -> torch.Tensor:
    """torchtune -> HF order of the q/k channels (inverse of :meth:`RowSource.read`)."""
    if not shape.rope_interleaved:
        return t
    if key.endswith(("attn.q_proj.weight", "attn.q_proj.bias")):
        heads = shape.num_heads
    elif key.endswith(("attn.k_proj.weight", "attn.k_proj.bias")):
        heads = shape.num_kv_heads
    elif key.endswith(("attn.q_norm.scale", "attn.k_norm.scale")):
        heads = 1
    else:
        return t
    rows = t.unsqueeze(-1) if t.dim() == 1 else t
    out = _rotary_reorder(rows, heads, shape.head_dim, shape.rotary_dim, _permute)
    return out.squeeze(-1) if t.dim() == 1 else out


def _has_feature(tune_key: str, shape: ModelShape) -> bool:
    """Biases and q/k norms belong to the checkpoint only if its config.json switches them on."""
    if tune_key.endswith(("q_proj.bias", "k_proj.bias", "v_proj.bias")):
        return shape.qkv_bias
    if tune_key.endswith("output_proj.bias"):
        return shape.output_bias
    if tune_key.endswith(("q_norm.scale", "k_norm.scale")):
        return shape.qk_norm
    return True


def _unknown(keys: List[str], source: str, family: str) -> TuneError:
    shown = ", ".join(keys[:20]) + (f" (and {len(keys) - 20} more)" if len(keys) > 20 else "")
    return TuneError(
        f"The checkpoint has parameters that a {family} {source} checkpoint does not have: {shown}. Check that "
        f"checkpointer.checkpoint_files name a {family} checkpoint and that checkpointer.model_type matches it."
    )


def _permuted_rows(tune_key: str, shape: ModelShape) -> Optional[int]:
    """Rows of ``tune_key`` that HF stores in its rotary half-split order (``None``: not permuted)."""
    if not shape.rope_interleaved:
        return None
    if tune_key.endswith(("attn.q_proj.weight", "attn.q_proj.bias")):
        return shape.num_heads * shape.head_dim
    if tune_key.endswith(("attn.k_proj.weight", "attn.k_proj.bias")):
        return shape.num_kv_heads * shape.head_dim
    if tune_key.endswith(("attn.q_norm.scale", "attn.k_norm.scale")):
        return shape.head_dim
    return None


def hf_sources(
    hf_shapes: Dict[str, Sequence[int]], shape: ModelShape, *, fused: bool = False, family: str = "Llama"
) -> Dict[str, RowSource]:
    """``{torchtune name: where its rows are}`` for the HF tensors of ``hf_shapes`` (``{HF name: shape}``,
    read from the files' headers: no weight is touched). ``fused``: the folder stores ``qkv_proj`` /
    ``gate_up_proj``.

    Raises:
        TuneError: names that belong to no checkpoint of the family; a q/k or fused tensor whose rows do
            not fit the sizes in config.json.
    """
    out: Dict[str, RowSource] = {}
    unknown = []
    for key, hf_shape in hf_shapes.items():
        template, layer = _template(key)
        if fused and template in _FUSED:
            parts = [p.format(layer) for p in _FUSED[template]]
            sizes = [_rows(shape, p) for p in _FUSED[template]]
            if None in sizes:  # gate_up_proj of a config.json without intermediate_size: two equal halves
                sizes = [hf_shape[0] // 2] * 2
            if sum(sizes) != hf_shape[0]:
                raise _bad_rows(key, hf_shape[0], " + ".join(map(str, sizes)))
            offset = 0
            for part, rows in zip(parts, sizes):
                out[part] = _source(key, part, offset, rows, shape)
                offset += rows
            continue
        new_key = _rename(key, _FROM_HF_ALL)
        if new_key is not None and not _has_feature(new_key, shape):
            new_key = None
        if new_key is None:
            if not any(p.match(key) for p in _DERIVABLE_HF):
                unknown.append(key)
            continue
        out[new_key] = _source(key, new_key, 0, hf_shape[0] if len(hf_shape) else 1, shape)
    if unknown:
        raise _unknown(unknown, "Hugging Face", family)
    return out


def _source(hf_key: str, tune_key: str, offset: int, rows: int, shape: ModelShape) -> RowSource:
    permuted = _permuted_rows(tune_key, shape)
    if permuted is not None and permuted != rows:
        raise _bad_rows(hf_key, rows, str(permuted))
    if permuted is None:
        return RowSource(hf_key, offset, rows)
    return RowSource(hf_key, offset, rows, shape.head_dim, shape.rotary_dim)


def _bad_rows(hf_key: str, rows: int, expected: str) -> TuneError:
    return TuneError(
        f"{hf_key} has {rows} rows, but config.json's sizes (hidden_size, num_attention_heads, "
        f"num_key_value_heads, head_dim, intermediate_size) make {expected}. Use the config.json that came with "
        "these weights, or check checkpointer.checkpoint_files."
    )


def hf_to_tune(
    state_dict: Dict[str, torch.Tensor], shape: ModelShape, *, fused: bool = False, family: str = "Llama"
) -> Dict[str, torch.Tensor]:
    """HF names and layout -> torchtune's (``fused``: the folder stores ``qkv_proj`` / ``gate_up_proj``);
    each tensor converted as :func:`hf_sources` says, the way a sharded load converts its rows.

    Raises:
        TuneError: as :func:`hf_sources`.
    """
    sources = hf_sources({k: t.shape for k, t in state_dict.items()}, shape, fused=fused, family=family)
    return {key: source.read(state_dict[source.hf_key]) for key, source in sources.items()}


def tune_to_hf_plan(keys: Iterable[str], *, fused: bool = False, family: str = "Llama") -> Dict[str, List[str]]:
    """``{HF name: [torchtune names it is made of]}`` (one name, or the parts of a fused tensor in order).

    Raises:
        TuneError: a torchtune name of no such checkpoint, or a fused tensor with a part missing.
    """
    plan: Dict[str, List[str]] = {}
    unknown = []
    for key in keys:
        template, layer = _template(key)
        if fused and template in _FUSED_PARTS:
            plan.setdefault(_FUSED_PARTS[template].format(layer), []).append(key)
            continue
        hf_key = _rename(key, _TO_HF_ALL)
        if hf_key is None:
            unknown.append(key)
        else:
            plan[hf_key] = [key]
    if unknown:
        raise _unknown(unknown, "torchtune", family)
    for hf_key, parts in plan.items():
        template, layer = _template(hf_key)
        if template in _FUSED:
            order = [p.format(layer) for p in _FUSED[template]]
            if sorted(parts) != sorted(order):
                raise TuneError(f"{hf_key} is stacked from {order}, but the model has only {parts}.")
            plan[hf_key] = order
    return plan


def tune_to_hf_tensor(hf_key: str, parts: Dict[str, torch.Tensor], shape: ModelShape) -> torch.Tensor:
    """One HF tensor on the host from its torchtune part(s) (``{torchtune name: tensor}`` in row order).

    Each part is moved to the host before it is permuted or stacked: those copies then cost host memory
    only, one tensor at a time, never device memory at save time.
    """
    hosted = [_to_hf_layout(k, t.detach().to("cpu"), shape) for k, t in parts.items()]
    return hosted[0] if len(hosted) == 1 else torch.cat(hosted, dim=0)

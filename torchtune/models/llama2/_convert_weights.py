"""Convert Llama state dicts between Meta, Hugging Face and torchtune parameter names.

Llama2 and Llama 3.x share these names and layouts, so one conversion serves every family. A model
with tied embeddings has no ``output.weight`` / ``lm_head.weight`` and converts without one.

torchtune uses Meta's interleaved rotary layout (channel pairs ``(2i, 2i+1)`` rotate together);
Hugging Face's Llama rotates halves (``i`` with ``i + head_dim/2``), so its q/k projection rows are
permuted. :func:`hf_to_tune` undoes HF's permutation and :func:`tune_to_hf` applies it again, which
makes both directions exact (pure re-indexing, no arithmetic).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Optional

import torch

from torchtune._errors import TuneError

# Keys are templates: "{}" stands for the layer index.
_FROM_META = {
    "tok_embeddings.weight": "tok_embeddings.weight",
    "norm.weight": "norm.scale",
    "output.weight": "output.weight",
    "layers.{}.attention.wq.weight": "layers.{}.attn.q_proj.weight",
    "layers.{}.attention.wk.weight": "layers.{}.attn.k_proj.weight",
    "layers.{}.attention.wv.weight": "layers.{}.attn.v_proj.weight",
    "layers.{}.attention.wo.weight": "layers.{}.attn.output_proj.weight",
    "layers.{}.attention_norm.weight": "layers.{}.sa_norm.scale",
    "layers.{}.ffn_norm.weight": "layers.{}.mlp_norm.scale",
    "layers.{}.feed_forward.w1.weight": "layers.{}.mlp.w1.weight",
    "layers.{}.feed_forward.w2.weight": "layers.{}.mlp.w2.weight",
    "layers.{}.feed_forward.w3.weight": "layers.{}.mlp.w3.weight",
}

_FROM_HF = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.scale",
    "lm_head.weight": "output.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attn.q_proj.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attn.k_proj.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attn.v_proj.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attn.output_proj.weight",
    "model.layers.{}.input_layernorm.weight": "layers.{}.sa_norm.scale",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.mlp_norm.scale",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.mlp.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.mlp.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.mlp.w2.weight",
}

# Buffers that checkpoints sometimes carry but that the model recomputes (RoPE frequencies).
_DERIVABLE_META = [re.compile(r"^rope\.freqs$")]
_DERIVABLE_HF = [
    re.compile(r"^model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq$"),
    re.compile(r"^model\.rotary_emb\.inv_freq$"),
]

_LAYER = re.compile(r"\.(\d+)\.")


def _rename(key: str, mapping: dict[str, str]) -> Optional[str]:
    match = _LAYER.search(key)
    if match is None:
        return mapping.get(key)
    template = key[: match.start()] + ".{}." + key[match.end() :]
    target = mapping.get(template)
    return None if target is None else target.format(match.group(1))


def _rename_all(
    keys: Iterable[str], mapping: dict[str, str], derivable: list[re.Pattern], source: str
) -> dict[str, str]:
    """``{old name: new name}`` of every key that converts; derivable buffers are left out.

    Raises:
        TuneError: listing the keys that belong to no Llama checkpoint of ``source`` format.
    """
    names, unknown = {}, []
    for key in keys:
        new_key = _rename(key, mapping)
        if new_key is not None:
            names[key] = new_key
        elif not any(p.match(key) for p in derivable):
            unknown.append(key)
    if unknown:
        shown = ", ".join(unknown[:20]) + (f" (and {len(unknown) - 20} more)" if len(unknown) > 20 else "")
        raise TuneError(
            f"The checkpoint has parameters that a Llama (2 or 3.x) {source} checkpoint does not have: "
            f"{shown}. Check that checkpointer.checkpoint_files name a Llama checkpoint in {source} format "
            f"and that checkpointer.model_type matches it."
        )
    return names


def _convert(
    state_dict: dict[str, torch.Tensor], mapping: dict[str, str], derivable: list[re.Pattern], source: str
) -> dict[str, torch.Tensor]:
    names = _rename_all(state_dict, mapping, derivable, source)
    return {new: state_dict[old] for old, new in names.items()}


def _permute(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """Meta (interleaved) -> HF (half-split) row order of a q/k projection, as in HF's conversion script."""
    dim_in = w.shape[1]
    return w.view(n_heads, head_dim // 2, 2, dim_in).transpose(1, 2).reshape(n_heads * head_dim, dim_in)


def _unpermute(w: torch.Tensor, n_heads: int, head_dim: int) -> torch.Tensor:
    """HF (half-split) -> Meta (interleaved); the inverse of :func:`_permute`."""
    dim_in = w.shape[1]
    return w.view(n_heads, 2, head_dim // 2, dim_in).transpose(1, 2).reshape(n_heads * head_dim, dim_in)


@dataclass(frozen=True)
class RowSource:
    """Where one torchtune tensor's rows are in a Hugging Face tensor, so that a rank can read just the rows
    of its shard: rows ``offset : offset + rows`` of ``hf_key`` (``offset`` > 0 for the parts of a fused
    projection), in HF's half-split order of q/k channels when ``head_dim`` is set.

    HF permutes rows only within each head, so any whole number of heads converts on its own: a row
    range is read widened to whole heads (at most two heads more), converted, and cut to size.
    """

    hf_key: str
    offset: int
    rows: int
    head_dim: Optional[int] = None
    # Partial rotary (Phi-4-mini): only the first rotary_dim rows of each head are half-split; None: all.
    rotary_dim: Optional[int] = None

    def read(self, source: Any, start: int = 0, stop: Optional[int] = None) -> torch.Tensor:
        """Rows ``start:stop`` (default: all) of the torchtune tensor, from ``source``: the HF tensor or
        anything sliced like one along dim 0 (a safetensors ``get_slice``, a memory-mapped tensor)."""
        stop = self.rows if stop is None else stop
        block = self.head_dim or 1
        lo, hi = start // block * block, -(-stop // block) * block
        t = source[self.offset + lo : self.offset + hi]
        if self.head_dim is not None:
            flat = t.unsqueeze(-1) if t.dim() == 1 else t
            heads = flat.shape[0] // self.head_dim
            t = _rotary_reorder(flat, heads, self.head_dim, self.rotary_dim, _unpermute).reshape(t.shape)
        return t[start - lo : stop - lo]


def _rotary_reorder(
    w: torch.Tensor, n_heads: int, head_dim: int, rotary_dim: Optional[int], fn: Callable
) -> torch.Tensor:
    """``fn`` (:func:`_permute` or :func:`_unpermute`) on the rotated rows of each head of ``w``: all of them,
    or the first ``rotary_dim`` (partial rotary: HF splits only those in halves, the rest stay in place)."""
    if rotary_dim is None or rotary_dim == head_dim:
        return fn(w, n_heads, head_dim)
    per_head = w.reshape(n_heads, head_dim, w.shape[-1])
    turned = fn(per_head[:, :rotary_dim].reshape(n_heads * rotary_dim, -1), n_heads, rotary_dim)
    return torch.cat([turned.view(n_heads, rotary_dim, -1), per_head[:, rotary_dim:]], dim=1).reshape(w.shape)


def meta_to_tune(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Meta's ``consolidated.00.pth`` names -> torchtune names (same tensors; ``rope.freqs`` dropped)."""
    return _convert(state_dict, _FROM_META, _DERIVABLE_META, "Meta")


def tune_to_meta(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """torchtune names -> Meta's names."""
    return _convert(state_dict, {v: k for k, v in _FROM_META.items()}, [], "torchtune")


def hf_to_tune(
    state_dict: dict[str, torch.Tensor],
    num_heads: int = 32,
    num_kv_heads: int = 32,
    dim: int = 4096,
    head_dim: Optional[int] = None,
) -> dict[str, torch.Tensor]:
    """Hugging Face Llama names -> torchtune names, undoing HF's q/k rotary permutation.

    Args:
        state_dict: HF state dict (``model.layers.0.self_attn.q_proj.weight`` ...).
        num_heads: ``num_attention_heads`` from config.json.
        num_kv_heads: ``num_key_value_heads`` from config.json.
        dim: ``hidden_size`` from config.json.
        head_dim: ``head_dim`` from config.json; default ``dim // num_heads``.
    """
    head_dim = dim // num_heads if head_dim is None else head_dim
    converted = _convert(state_dict, _FROM_HF, _DERIVABLE_HF, "Hugging Face")
    for key in converted:
        if key.endswith("attn.q_proj.weight"):
            converted[key] = _unpermute(converted[key], num_heads, head_dim)
        elif key.endswith("attn.k_proj.weight"):
            converted[key] = _unpermute(converted[key], num_kv_heads, head_dim)
    return converted


_TO_HF = {v: k for k, v in _FROM_HF.items()}


def tune_to_hf_names(keys: Iterable[str]) -> dict[str, str]:
    """``{torchtune name: Hugging Face name}`` for ``keys``; raises ``TuneError`` for names of no Llama."""
    return _rename_all(keys, _TO_HF, [], "torchtune")


def tune_to_hf_tensor(
    hf_key: str, tensor: torch.Tensor, *, num_heads: int, num_kv_heads: int, head_dim: int
) -> torch.Tensor:
    """One tensor in Hugging Face layout, on the host.

    The tensor is moved to the host *before* the q/k permutation: the permutation's reshape makes
    a copy, and made on the device it would cost device memory at save time (for Llama2-7B, every
    q/k weight at once if a whole state dict were converted there).
    """
    host = tensor.detach().to("cpu")
    if hf_key.endswith("self_attn.q_proj.weight"):
        return _permute(host, num_heads, head_dim)
    if hf_key.endswith("self_attn.k_proj.weight"):
        return _permute(host, num_kv_heads, head_dim)
    return host


def iter_tune_to_hf(
    state_dict: dict[str, torch.Tensor],
    num_heads: int = 32,
    num_kv_heads: int = 32,
    dim: int = 4096,
    head_dim: Optional[int] = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(Hugging Face name, host tensor)`` pairs, converted one at a time as they are consumed.

    Names are checked for all keys before the first tensor is converted. Arguments as for
    :func:`hf_to_tune`.
    """
    head_dim = dim // num_heads if head_dim is None else head_dim
    for key, hf_key in tune_to_hf_names(state_dict).items():
        yield (
            hf_key,
            tune_to_hf_tensor(
                hf_key, state_dict[key], num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim
            ),
        )


def tune_to_hf(
    state_dict: dict[str, torch.Tensor],
    num_heads: int = 32,
    num_kv_heads: int = 32,
    dim: int = 4096,
    head_dim: Optional[int] = None,
) -> dict[str, torch.Tensor]:
    """torchtune names -> Hugging Face Llama names, re-applying HF's q/k rotary permutation.

    Returns host tensors (see :func:`tune_to_hf_tensor`); a save streams :func:`iter_tune_to_hf`
    instead, so that only one converted tensor exists at a time. Arguments as for :func:`hf_to_tune`.
    """
    return dict(iter_tune_to_hf(state_dict, num_heads, num_kv_heads, dim, head_dim))

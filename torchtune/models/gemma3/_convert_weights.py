"""Convert Gemma 3 (text) and Gemma 2 state dicts between Hugging Face and torchtune parameter names (Gemma 2
has the same names, less the q/k norms, and one folder form).

Gemma 3 folders come in two forms: ``Gemma3ForCausalLM`` (1B; ``model.layers.0...``) and
``Gemma3ForConditionalGeneration`` (4B/12B/27B, text and vision), whose language model is stored under
``language_model.model.`` (the published files) or ``model.language_model.`` (what transformers 5
writes). Both read here; the vision tower and projector are not part of the text model and are left
out. Saves write the ``Gemma3ForCausalLM`` names.

As for Llama, torchtune rotates channel pairs ``(2i, 2i+1)`` and HF rotates halves, so the q/k
projection rows are permuted, and so are the q/k norm scales (one ``head_dim`` vector applied to every
head before RoPE): pure re-indexing, exact both ways. The norms' ``1 + scale`` convention is the same
on both sides, so their tensors are copied as they are.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, Sequence

import torch

from torchtune._errors import TuneError
from torchtune.models.llama2._convert_weights import RowSource, _permute, _rename

_FROM_HF = {
    "model.embed_tokens.weight": "tok_embeddings.weight",
    "model.norm.weight": "norm.scale",
    "lm_head.weight": "output.weight",
    "model.layers.{}.self_attn.q_proj.weight": "layers.{}.attn.q_proj.weight",
    "model.layers.{}.self_attn.k_proj.weight": "layers.{}.attn.k_proj.weight",
    "model.layers.{}.self_attn.v_proj.weight": "layers.{}.attn.v_proj.weight",
    "model.layers.{}.self_attn.o_proj.weight": "layers.{}.attn.output_proj.weight",
    "model.layers.{}.self_attn.q_norm.weight": "layers.{}.attn.q_norm.scale",
    "model.layers.{}.self_attn.k_norm.weight": "layers.{}.attn.k_norm.scale",
    "model.layers.{}.input_layernorm.weight": "layers.{}.sa_norm.scale",
    "model.layers.{}.post_attention_layernorm.weight": "layers.{}.sa_scale.scale",
    "model.layers.{}.pre_feedforward_layernorm.weight": "layers.{}.mlp_norm.scale",
    "model.layers.{}.post_feedforward_layernorm.weight": "layers.{}.mlp_scale.scale",
    "model.layers.{}.mlp.gate_proj.weight": "layers.{}.mlp.w1.weight",
    "model.layers.{}.mlp.up_proj.weight": "layers.{}.mlp.w3.weight",
    "model.layers.{}.mlp.down_proj.weight": "layers.{}.mlp.w2.weight",
}
_TO_HF = {v: k for k, v in _FROM_HF.items()}

# The language model's prefixes in a Gemma3ForConditionalGeneration folder -> Gemma3ForCausalLM's.
_TEXT_PREFIXES = (
    ("language_model.model.", "model."),
    ("model.language_model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
# Weights of the image side of a Gemma3ForConditionalGeneration folder (not part of the text model).
VISION = re.compile(r"^(model\.)?(vision_tower|multi_modal_projector)\.")
_DERIVABLE = re.compile(r"^model\.(layers\.\d+\.self_attn\.)?rotary_emb\..*inv_freq$")


def text_name(hf_key: str) -> str:
    """The ``Gemma3ForCausalLM`` name of a language-model tensor of either folder form."""
    for prefix, replacement in _TEXT_PREFIXES:
        if hf_key.startswith(prefix):
            return replacement + hf_key[len(prefix) :]
    return hf_key


def is_vision(hf_key: str) -> bool:
    """Whether ``hf_key`` belongs to the vision tower or projector of a multimodal folder."""
    return VISION.match(hf_key) is not None


def _permutation(key: str, num_heads: int, num_kv_heads: int):
    if key.endswith("attn.q_proj.weight"):
        return num_heads
    if key.endswith("attn.k_proj.weight"):
        return num_kv_heads
    if key.endswith(("attn.q_norm.scale", "attn.k_norm.scale")):
        return 1
    return None


def hf_sources(
    hf_shapes: dict[str, Sequence[int]],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    family: str = "Gemma 3",
    model_type: str = "GEMMA3",
) -> dict[str, RowSource]:
    """``{torchtune name: where its rows are}`` for the HF tensors of ``hf_shapes`` (``{name as stored in
    either folder form: shape}``, from the files' headers). Vision weights and RoPE buffers are left out.

    Raises:
        TuneError: listing the keys that belong to no Gemma 3 checkpoint.
    """
    out: dict[str, RowSource] = {}
    unknown = []
    for key, shape in hf_shapes.items():
        if is_vision(key):
            continue
        name = text_name(key)
        new_key = _rename(name, _FROM_HF)
        if new_key is None:
            if not _DERIVABLE.match(name):
                unknown.append(key)
            continue
        permuted = _permutation(new_key, num_heads, num_kv_heads) is not None
        out[new_key] = RowSource(key, 0, shape[0], head_dim if permuted else None)
    if unknown:
        shown = ", ".join(unknown[:20]) + (f" (and {len(unknown) - 20} more)" if len(unknown) > 20 else "")
        raise TuneError(
            f"The checkpoint has parameters that a {family} Hugging Face checkpoint does not have: {shown}. "
            f"Check that checkpointer.checkpoint_files name a {family} checkpoint and that "
            f"checkpointer.model_type={model_type} is meant."
        )
    return out


def hf_to_tune(
    state_dict: dict[str, torch.Tensor],
    *,
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    family: str = "Gemma 3",
    model_type: str = "GEMMA3",
) -> dict[str, torch.Tensor]:
    """Hugging Face Gemma 3 names (either folder form) -> torchtune names, undoing HF's rotary layout;
    each tensor converted as :func:`hf_sources` says, the way a sharded load converts its rows.

    Raises:
        TuneError: listing the keys that belong to no Gemma 3 checkpoint.
    """
    shapes = {k: t.shape for k, t in state_dict.items()}
    sources = hf_sources(
        shapes, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, family=family, model_type=model_type
    )
    return {key: source.read(state_dict[source.hf_key]) for key, source in sources.items()}


def tune_to_hf_names(keys: Iterable[str], family: str = "Gemma 3") -> dict[str, str]:
    """``{torchtune name: Gemma3ForCausalLM (Gemma2ForCausalLM) name}``; raises ``TuneError`` for a name of no
    model of ``family``."""
    names, unknown = {}, []
    for key in keys:
        hf_key = _rename(key, _TO_HF)
        if hf_key is None:
            unknown.append(key)
        else:
            names[key] = hf_key
    if unknown:
        raise TuneError(f"These parameters are not part of a {family} model: {', '.join(unknown[:20])}.")
    return names


def tune_to_hf_tensor(
    key: str, tensor: torch.Tensor, *, num_heads: int, num_kv_heads: int, head_dim: int
) -> torch.Tensor:
    """One tensor (torchtune name ``key``) in Hugging Face layout, on the host (moved there before the
    permutation copies it, so a save costs no device memory)."""
    host = tensor.detach().to("cpu")
    heads = _permutation(key, num_heads, num_kv_heads)
    if heads is None:
        return host
    if host.dim() == 1:
        return _permute(host.unsqueeze(-1), heads, head_dim).squeeze(-1)
    return _permute(host, heads, head_dim)


def iter_tune_to_hf(
    state_dict: dict[str, torch.Tensor], *, num_heads: int, num_kv_heads: int, head_dim: int
) -> Iterator[tuple[str, torch.Tensor]]:
    """``(Hugging Face name, host tensor)`` pairs, converted one at a time as they are consumed."""
    for key, hf_key in tune_to_hf_names(state_dict).items():
        yield (
            hf_key,
            tune_to_hf_tensor(key, state_dict[key], num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim),
        )


def tune_to_hf(
    state_dict: dict[str, torch.Tensor], *, num_heads: int, num_kv_heads: int, head_dim: int
) -> dict[str, torch.Tensor]:
    """torchtune names -> ``Gemma3ForCausalLM`` names and layout (host tensors)."""
    return dict(iter_tune_to_hf(state_dict, num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim))

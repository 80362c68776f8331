"""Fixed-size Phi-4 models (the published shapes, as their config.json files give them) and the tokenizer."""

from __future__ import annotations

from typing import Any, Optional

from torchtune.models.phi4._component_builders import phi4
from torchtune.modules import TransformerDecoder


def phi4_14b(**overrides: Any) -> TransformerDecoder:
    """Phi-4 14B: 40 layers, 40 query / 10 key-value heads, width 5120, feed-forward
    17920, untied embeddings, RoPE base 250000, 16384 tokens; the folder's fused ``qkv_proj`` /
    ``gate_up_proj`` are split on load. ``overrides`` replace any argument."""
    kwargs = dict(
        vocab_size=100_352,
        num_layers=40,
        num_heads=40,
        num_kv_heads=10,
        embed_dim=5_120,
        intermediate_dim=17_920,
        max_seq_len=16_384,
        norm_eps=1e-05,
        rope_base=250000.0,
        tie_word_embeddings=False,
    )
    return phi4(**{**kwargs, **overrides})


def phi4_tokenizer(path: str, max_seq_len: Optional[int] = None):
    """Phi-4's tokenizer from the model folder's ``tokenizer.json`` (``path``), with the special tokens,
    BOS/EOS behaviour and chat template of the folder's ``tokenizer_config.json`` / ``chat_template.jinja``.
    No BOS; ``<|im_end|>`` ends a chat turn.

    Args:
        path: the ``tokenizer.json`` file (config key ``tokenizer.path``).
        max_seq_len: stored as ``tokenizer.max_seq_len`` (datasets truncate to it); ``None`` for no limit.
    """
    from torchtune.modules.tokenizers import HFModelTokenizer

    return HFModelTokenizer(path, max_seq_len=max_seq_len)

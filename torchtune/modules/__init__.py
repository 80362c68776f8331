"""Building blocks of the Llama models: attention, RoPE, RMSNorm, feed-forward, decoder, losses."""

from torchtune.modules.attention import MultiHeadAttention
from torchtune.modules.feed_forward import FeedForward
from torchtune.modules.kv_cache import KVCache
from torchtune.modules.loss import CrossEntropyLoss
from torchtune.modules.position_embeddings import (
    LinearScaledRoPE,
    Llama3ScaledRoPE,
    LongRoPE,
    PartialRotaryEmbeddings,
    RotaryPositionalEmbeddings,
)
from torchtune.modules.rms_norm import GemmaRMSNorm, RMSNorm
from torchtune.modules.scaled_embedding import ScaledEmbedding
from torchtune.modules.tied_linear import TiedLinear
from torchtune.modules.transformer import TransformerDecoder, TransformerDecoderLayer

__all__ = [
    "CrossEntropyLoss",
    "FeedForward",
    "GemmaRMSNorm",
    "KVCache",
    "LinearScaledRoPE",
    "Llama3ScaledRoPE",
    "LongRoPE",
    "MultiHeadAttention",
    "PartialRotaryEmbeddings",
    "RMSNorm",
    "RotaryPositionalEmbeddings",
    "ScaledEmbedding",
    "TiedLinear",
    "TransformerDecoder",
    "TransformerDecoderLayer",
]

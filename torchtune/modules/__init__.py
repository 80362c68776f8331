"""Building blocks of the Llama2 model: attention, RoPE, RMSNorm, feed-forward, decoder, losses."""

from torchtune.modules.attention import MultiHeadAttention
from torchtune.modules.feed_forward import FeedForward
from torchtune.modules.kv_cache import KVCache
from torchtune.modules.loss import CrossEntropyLoss
from torchtune.modules.position_embeddings import RotaryPositionalEmbeddings
from torchtune.modules.rms_norm import RMSNorm
from torchtune.modules.transformer import TransformerDecoder, TransformerDecoderLayer

__all__ = [
    "CrossEntropyLoss",
    "FeedForward",
    "KVCache",
    "MultiHeadAttention",
    "RMSNorm",
    "RotaryPositionalEmbeddings",
    "TransformerDecoder",
    "TransformerDecoderLayer",
]

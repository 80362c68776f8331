"""Building blocks of the models: attention, RoPE, RMSNorm, feed-forward, decoder, losses (torchtune's names
at torchtune's paths, and ours beside them)."""

from torchtune.modules.attention import MultiHeadAttention
from torchtune.modules.attention_utils import create_block_causal_mask, packed_block_causal_mask
from torchtune.modules.common_utils import (
    delete_kv_caches,
    disable_kv_cache,
    local_kv_cache,
    reparametrize_as_dtype_state_dict_post_hook,
)
from torchtune.modules.feed_forward import FeedForward
from torchtune.modules.kv_cache import KVCache
from torchtune.modules.layer_norm import Fp32LayerNorm
from torchtune.modules.loss import CrossEntropyLoss
from torchtune.modules.position_embeddings import (
    LinearScaledRoPE,
    Llama3ScaledRoPE,
    LongRoPE,
    PartialRotaryEmbeddings,
    RotaryPositionalEmbeddings,
    VisionRotaryPositionalEmbeddings,
)
from torchtune.modules.rms_norm import GemmaRMSNorm, RMSNorm
from torchtune.modules.scaled_embedding import ScaledEmbedding
from torchtune.modules.tanh_gate import TanhGate
from torchtune.modules.tied_linear import TiedLinear
from torchtune.modules.transformer import (
    TransformerCrossAttentionLayer,
    TransformerDecoder,
    TransformerDecoderLayer,
    TransformerSelfAttentionLayer,
)

__all__ = [
    "CrossEntropyLoss",
    "FeedForward",
    "Fp32LayerNorm",
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
    "TanhGate",
    "TiedLinear",
    "TransformerCrossAttentionLayer",
    "TransformerDecoder",
    "TransformerDecoderLayer",
    "TransformerSelfAttentionLayer",
    "VisionRotaryPositionalEmbeddings",
    "create_block_causal_mask",
    "delete_kv_caches",
    "disable_kv_cache",
    "local_kv_cache",
    "packed_block_causal_mask",
    "reparametrize_as_dtype_state_dict_post_hook",
]

"""The decoder-only transformer: embeddings, pre-norm decoder layers, final norm, output projection
(torchtune's ``TransformerDecoder``, ``TransformerSelfAttentionLayer`` and ``TransformerCrossAttentionLayer``:
their arguments, defaults and forward; plus what our recipes add, see :meth:`TransformerDecoder.forward`)."""

from __future__ import annotations

import copy
from typing import Any, Callable, List, Optional, Union

import torch
from torch import nn

from torchtune._errors import TuneError
from torchtune.modules.attention import MultiHeadAttention
from torchtune.modules.attention_utils import _MaskType


class TransformerSelfAttentionLayer(nn.Module):
    """``h = x + sa_scale(attn(sa_norm(x))); out = h + mlp_scale(mlp(mlp_norm(h)))``.

    Args:
        attn: the self-attention block.
        mlp: the feed-forward block.
        sa_norm: norm applied before attention; ``None`` for none.
        mlp_norm: norm applied before the feed-forward block; ``None`` for none.
        sa_scale: applied to the attention's output before the residual add (Gemma 2 and 3's
            post-attention norm); ``None`` for none (Llama).
        mlp_scale: applied to the feed-forward output before the residual add (Gemma 2 and 3's
            post-feed-forward norm); ``None`` for none.
    """

    def __init__(
        self,
        attn: MultiHeadAttention,
        mlp: nn.Module,
        *,
        sa_norm: Optional[nn.Module] = None,
        mlp_norm: Optional[nn.Module] = None,
        sa_scale: Optional[nn.Module] = None,
        mlp_scale: Optional[nn.Module] = None,
    ) -> None:
        super().__init__()
        self.sa_norm = sa_norm or nn.Identity()
        self.attn = attn
        self.mlp_norm = mlp_norm or nn.Identity()
        self.mlp = mlp
        self.sa_scale = sa_scale or nn.Identity()
        self.mlp_scale = mlp_scale or nn.Identity()

    def setup_caches(
        self,
        batch_size: int,
        dtype: torch.dtype,
        *,
        encoder_max_seq_len: Optional[int] = None,
        decoder_max_seq_len: Optional[int] = None,
        device: Optional[torch.device] = None,
    ) -> None:
        """A KV cache of ``decoder_max_seq_len`` slots (default: the attention's ``max_seq_len``);
        ``encoder_max_seq_len`` is not used by a self-attention layer."""
        self.attn.setup_cache(batch_size, dtype, max_seq_len=decoder_max_seq_len, device=device)

    def caches_are_setup(self) -> bool:
        """Whether the attention has a KV cache."""
        return self.attn.kv_cache is not None

    def caches_are_enabled(self) -> bool:
        """Whether forward writes to the attention's KV cache."""
        return self.attn.cache_enabled

    def reset_cache(self) -> None:
        """Empty the attention's KV cache."""
        self.attn.reset_cache()

    def forward(
        self,
        x: torch.Tensor,
        *,
        mask: Optional[_MaskType] = None,
        input_pos: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``x``: ``[b, s, embed_dim]``; ``mask`` / ``input_pos`` as for ``MultiHeadAttention``; other
        keyword arguments (a cross-attention layer's ``encoder_input``) are ignored."""
        h = self.sa_norm(x)
        h = x + self.sa_scale(self.attn(h, h, mask=mask, input_pos=input_pos))
        return h + self.mlp_scale(self.mlp(self.mlp_norm(h)))


# Our name for the same layer, kept for code written against it.
TransformerDecoderLayer = TransformerSelfAttentionLayer


class TransformerCrossAttentionLayer(nn.Module):
    """Cross-attention from the tokens to an encoder's output, pre-norm like
    :class:`TransformerSelfAttentionLayer` (torchtune's multimodal decoders; no model here uses it).
    Tokens whose ``encoder_mask`` row is all ``False`` skip the layer.

    Args:
        attn: attention without positional embeddings (queries and keys are different sequences).
        mlp: the feed-forward block.
        ca_norm, mlp_norm: norms before the attention / the feed-forward block; ``None`` for none.
        ca_scale, mlp_scale: applied to their outputs before the residual adds (e.g. ``TanhGate``).

    Raises:
        AssertionError: ``attn`` has positional embeddings.
    """

    def __init__(
        self,
        attn: MultiHeadAttention,
        mlp: nn.Module,
        *,
        ca_norm: Optional[nn.Module] = None,
        mlp_norm: Optional[nn.Module] = None,
        ca_scale: Optional[nn.Module] = None,
        mlp_scale: Optional[nn.Module] = None,
    ) -> None:
        super().__init__()
        if attn.pos_embeddings is not None:
            raise AssertionError("Cross-attention takes no positional embeddings: q and k are different sequences.")
        self.attn = attn
        self.mlp = mlp
        self.ca_norm = ca_norm or nn.Identity()
        self.mlp_norm = mlp_norm or nn.Identity()
        self.ca_scale = ca_scale or nn.Identity()
        self.mlp_scale = mlp_scale or nn.Identity()

    def setup_caches(
        self,
        batch_size: int,
        dtype: torch.dtype,
        *,
        encoder_max_seq_len: Optional[int] = None,
        decoder_max_seq_len: Optional[int] = None,
        device: Optional[torch.device] = None,
    ) -> None:
        """A KV cache of ``encoder_max_seq_len`` slots for the encoder's keys and values."""
        self.attn.setup_cache(batch_size, dtype, max_seq_len=encoder_max_seq_len, device=device)

    def caches_are_setup(self) -> bool:
        return self.attn.kv_cache is not None

    def caches_are_enabled(self) -> bool:
        return self.attn.cache_enabled

    def reset_cache(self) -> None:
        self.attn.reset_cache()

    @staticmethod
    def _skip_mask(mask: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
        """``[b, s, 1]``: ``True`` for the tokens that may attend to no encoder position."""
        if mask is None:
            return None
        blocked = ~mask if mask.dtype == torch.bool else torch.isneginf(mask)
        return blocked.all(dim=-1, keepdim=True)

    def forward(
        self,
        x: torch.Tensor,
        *,
        encoder_input: Optional[torch.Tensor] = None,
        encoder_mask: Optional[torch.Tensor] = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """``x``: ``[b, s, embed_dim]``; ``encoder_input``: ``[b, s_e, embed_dim]`` (``None`` once it is in
        the KV cache); ``encoder_mask``: boolean ``[b, s, s_e]``."""
        empty_cache = not self.caches_are_enabled() or self.attn.kv_cache.size == 0
        if encoder_input is None and empty_cache:
            return x
        skip = self._skip_mask(encoder_mask)
        if encoder_mask is not None:
            # a fully masked row would give NaN in SDPA's softmax; its output is zeroed below anyway
            encoder_mask = encoder_mask.masked_fill(skip, True)
        attn_out = self.attn(self.ca_norm(x), encoder_input, mask=encoder_mask)
        if skip is not None:
            attn_out = attn_out.masked_fill(skip, 0)
        h = x + self.ca_scale(attn_out)
        mlp_out = self.mlp(self.mlp_norm(h))
        if skip is not None:
            mlp_out = mlp_out.masked_fill(skip, 0)
        return h + self.mlp_scale(mlp_out)


class TransformerDecoder(nn.Module):
    """A Llama2-style decoder.

    Args:
        tok_embeddings: token embedding (``nn.Embedding(vocab_size, dim)``).
        layers: the decoder layers: an ``nn.ModuleList``, a list, or one layer copied ``num_layers`` times.
        max_seq_len: longest sequence the model accepts (RoPE cache and KV cache size).
        num_heads: query heads per layer.
        head_dim: channels per head.
        norm: final norm.
        output: output projection to the vocabulary: an ``nn.Linear``, or a ``TiedLinear`` that reuses
            ``tok_embeddings.weight`` (Llama 3.2 1B/3B, Qwen2 0.5B/1.5B, Gemma).
        num_layers: copies of ``layers`` when it is a single layer.
        output_hidden_states: indices of the layers whose inputs forward returns too, before the logits
            (a list then).

    Raises:
        AssertionError: ``layers`` is one module without ``num_layers``.
    """

    def __init__(
        self,
        *,
        tok_embeddings: nn.Embedding,
        layers: Union[nn.Module, List[nn.Module], nn.ModuleList],
        max_seq_len: int,
        num_heads: int,
        head_dim: int,
        norm: nn.Module,
        output: Union[nn.Linear, Callable],
        num_layers: Optional[int] = None,
        output_hidden_states: Optional[List[int]] = None,
    ) -> None:
        super().__init__()
        if isinstance(layers, list):
            layers = nn.ModuleList(layers)
        elif not isinstance(layers, nn.ModuleList):
            if num_layers is None:
                raise AssertionError("num_layers is not defined, layers must be a list")
            layers = nn.ModuleList([copy.deepcopy(layers) for _ in range(num_layers)])
        self.tok_embeddings = tok_embeddings
        self.layers = layers
        self.norm = norm
        self.output = output
        self.output_hidden_states = list(output_hidden_states or [])
        self.max_seq_len = max_seq_len
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.num_output_chunks = 0
        self.encoder_max_cache_seq_len: Optional[int] = None
        self.decoder_max_cache_seq_len: Optional[int] = None

    def set_num_output_chunks(self, num_output_chunks: int) -> None:
        """Return the logits as a list of ``num_output_chunks`` chunks along the sequence, for
        :class:`~torchtune.modules.loss.CEWithChunkedOutputLoss` (each chunk is cast to fp32 there, one at a
        time); 0 returns one fp32 tensor."""
        self.num_output_chunks = num_output_chunks

    # --- generation -------------------------------------------------------------------------------
    def setup_caches(
        self,
        batch_size: int,
        dtype: torch.dtype,
        *,
        encoder_max_seq_len: Optional[int] = None,
        decoder_max_seq_len: Optional[int] = None,
        device: Optional[torch.device] = None,
    ) -> None:
        """Allocate a KV cache in every layer, of ``decoder_max_seq_len`` slots (default ``max_seq_len``);
        forward then needs ``mask`` and ``input_pos``. ``device``: where the caches live (default: each
        layer's weights')."""
        has_self = any(isinstance(m, TransformerSelfAttentionLayer) for m in self.modules())
        has_cross = any(isinstance(m, TransformerCrossAttentionLayer) for m in self.modules())
        if has_cross:
            self.encoder_max_cache_seq_len = encoder_max_seq_len or self.max_seq_len
        if has_self:
            self.decoder_max_cache_seq_len = decoder_max_seq_len or self.max_seq_len
        for layer in self.layers:
            layer.setup_caches(
                batch_size,
                dtype,
                encoder_max_seq_len=self.encoder_max_cache_seq_len,
                decoder_max_seq_len=self.decoder_max_cache_seq_len,
                device=device,
            )

    def caches_are_setup(self) -> bool:
        """Whether :meth:`setup_caches` has given the layers their KV caches."""
        return self.layers[0].caches_are_setup()

    def caches_are_enabled(self) -> bool:
        """Whether forward writes to the KV caches (``torchtune.modules.disable_kv_cache`` turns that off
        for a while)."""
        return self.layers[0].caches_are_enabled()

    def reset_caches(self) -> None:
        """Empty the KV caches (start a new generation); they stay allocated.

        Raises:
            RuntimeError: no caches are set up.
        """
        if not self.caches_are_enabled():
            raise RuntimeError("Key value caches are not setup. Call model.setup_caches first.")
        for layer in self.layers:
            layer.reset_cache()

    # --- meta-device construction ----------------------------------------------------------------
    def init_buffers(self, device: Optional[torch.device] = None) -> None:
        """Rebuild the non-persistent buffers (RoPE cos/sin) on ``device``.

        Needed after building on the meta device and loading weights with
        ``load_state_dict(assign=True)``: the weights become real but the RoPE cache stays on meta.
        Default device: that of the token embedding.
        """
        if device is None:
            device = self.tok_embeddings.weight.device
        for module in self.modules():
            if hasattr(module, "rope_init"):
                module.rope_init(device)

    # --- forward ---------------------------------------------------------------------------------
    # torchtune wraps this in @torch.compiler.disable; applying that decorator imports the compiler stack (a
    # second) when this module loads, and the recipes compile layer by layer, never this method.
    def chunked_output(self, last_hidden_state: torch.Tensor) -> List[torch.Tensor]:
        """The output projection of ``[b, s, dim]`` in ``num_output_chunks`` chunks along the sequence."""
        return [self.output(chunk) for chunk in last_hidden_state.chunk(self.num_output_chunks, dim=1)]

    def unembed(self, h: torch.Tensor) -> Union[torch.Tensor, List[torch.Tensor]]:
        """Final norm and output projection: fp32 logits, or their chunks (see :meth:`set_num_output_chunks`)."""
        h = self.norm(h)
        if self.num_output_chunks > 0:
            return self.chunked_output(h)
        return self.output(h).float()

    def _validate_inputs(
        self,
        seq_len: int,
        mask: Optional[_MaskType],
        encoder_input: Optional[torch.Tensor],
        encoder_mask: Optional[torch.Tensor],
        input_pos: Optional[torch.Tensor],
    ) -> None:
        if seq_len > self.max_seq_len:
            raise TuneError(
                f"A batch has sequences of {seq_len} tokens, longer than the model's max_seq_len "
                f"({self.max_seq_len}). Lower the dataset's max_seq_len (tokenizer.max_seq_len / "
                f"dataset.max_seq_len in the config) to at most {self.max_seq_len}, or build the model "
                f"with a larger max_seq_len."
            )
        if self.caches_are_enabled():
            if mask is None:
                raise ValueError(
                    "KV-caches for self-attention layers are setup for inference mode, causal masks must be "
                    "provided! Use the `mask` arg to provide a causal mask."
                )
            if encoder_input is not None and encoder_mask is None:
                raise ValueError(
                    "KV-caches for cross-attention/fusion layers are setup for inference mode and you seem to "
                    "be using encoder_input, causal masks must be provided! Use the `encoder_mask` arg to "
                    "provide a causal mask."
                )
            if input_pos is None:
                raise ValueError("KV-caches are setup for inference mode, input positions must be provided!")

    def forward(
        self,
        tokens: torch.Tensor,
        *,
        mask: Optional[_MaskType] = None,
        encoder_input: Optional[torch.Tensor] = None,
        encoder_mask: Optional[torch.Tensor] = None,
        input_pos: Optional[torch.Tensor] = None,
        output_hidden_states: bool = False,
        output_positions: Optional[torch.Tensor] = None,
    ) -> Union[torch.Tensor, List[torch.Tensor]]:
        """Run the model.

        Args:
            tokens: ``[b, s]`` token ids.
            mask: "may attend" mask ``[b, s, s]`` (``[b, s, cache size]`` with KV caches, where it is
                required), boolean or additive, or a flex-attention ``BlockMask``; ``None`` is causal.
            encoder_input: ``[b, s_e, d_e]`` for cross-attention layers (none in the models here).
            encoder_mask: boolean ``[b, s, s_e]`` for cross-attention layers.
            input_pos: ``[b, s]`` positions, e.g. restarting at 0 for each packed example; required with KV
                caches. ``None`` means ``0..s-1``.
            output_hidden_states: (ours) return the final-normed hidden states ``[b, s, dim]`` instead of
                logits, so the loss can apply ``self.output`` chunk by chunk. Not to be confused with the
                constructor's ``output_hidden_states`` (torchtune's list of layer indices).
            output_positions: (ours) flat indices into the ``b * s`` positions (row-major, on the model's
                device): only these rows go through the final norm and the output projection, e.g. the
                positions that have a label (``torchtune.training.label_positions``). The others cost
                nothing there, and gradients are the same as if the rows had been taken from the full
                output.

        Returns:
            fp32 logits ``[b, s, vocab_size]`` (a list of chunks after :meth:`set_num_output_chunks`), or
            hidden states in the model's dtype; with ``output_positions``, ``[n, vocab_size]`` or
            ``[n, dim]`` for its ``n`` positions; with the constructor's ``output_hidden_states``, a list of
            the requested layers' inputs followed by the output.
        """
        seq_len = tokens.shape[1]
        self._validate_inputs(seq_len, mask, encoder_input, encoder_mask, input_pos)
        h = self.tok_embeddings(tokens)
        hidden = []
        for i, layer in enumerate(self.layers):
            if i in self.output_hidden_states:
                hidden.append(h)
            if encoder_input is None and encoder_mask is None:
                h = layer(h, mask=mask, input_pos=input_pos)
            else:
                h = layer(h, mask=mask, encoder_input=encoder_input, encoder_mask=encoder_mask, input_pos=input_pos)
        if output_positions is not None:
            # A gather with a known index: the shape comes from the index, so nothing is read back
            # from the device. Backward scatters into zeros, which is what the unselected rows got.
            h = h.reshape(-1, h.size(-1)).index_select(0, output_positions)
        if output_hidden_states:
            out = self.norm(h)
        else:
            out = self.unembed(h)
        return [*hidden, out] if hidden else out

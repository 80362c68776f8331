"""The decoder-only transformer: embeddings, pre-norm decoder layers, final norm, output projection."""

from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from torchtune._errors import TuneError
from torchtune.modules.attention import MultiHeadAttention


class TransformerDecoderLayer(nn.Module):
    """``h = x + sa_scale(attn(sa_norm(x))); out = h + mlp_scale(mlp(mlp_norm(h)))``.

    Args:
        attn: the self-attention block.
        mlp: the feed-forward block.
        sa_norm: norm applied before attention.
        mlp_norm: norm applied before the feed-forward block.
        sa_scale: applied to the attention's output before the residual add (Gemma's post-attention
            norm); ``None`` for none (Llama).
        mlp_scale: applied to the feed-forward output before the residual add (Gemma's
            post-feed-forward norm); ``None`` for none.
    """

    def __init__(
        self,
        attn: MultiHeadAttention,
        mlp: nn.Module,
        sa_norm: nn.Module,
        mlp_norm: nn.Module,
        sa_scale: Optional[nn.Module] = None,
        mlp_scale: Optional[nn.Module] = None,
    ) -> None:
        super().__init__()
        self.sa_norm = sa_norm
        self.attn = attn
        self.mlp_norm = mlp_norm
        self.mlp = mlp
        self.sa_scale = sa_scale
        self.mlp_scale = mlp_scale

    def forward(
        self, x: torch.Tensor, *, mask: Optional[torch.Tensor] = None, input_pos: Optional[torch.Tensor] = None
    ) -> torch.Tensor:
        attn_out = self.attn(self.sa_norm(x), mask=mask, input_pos=input_pos)
        h = x + (attn_out if self.sa_scale is None else self.sa_scale(attn_out))
        mlp_out = self.mlp(self.mlp_norm(h))
        return h + (mlp_out if self.mlp_scale is None else self.mlp_scale(mlp_out))


class TransformerDecoder(nn.Module):
    """A Llama2-style decoder.

    Args:
        tok_embeddings: token embedding (``nn.Embedding(vocab_size, dim)``).
        layers: the decoder layers.
        norm: final norm.
        output: output projection to the vocabulary: an ``nn.Linear``, or a ``TiedLinear`` that reuses
            ``tok_embeddings.weight`` (Llama 3.2 1B/3B).
        max_seq_len: longest sequence the model accepts (RoPE cache and KV cache size).
        num_heads: query heads per layer.
        head_dim: channels per head.
    """

    def __init__(
        self,
        tok_embeddings: nn.Embedding,
        layers: nn.ModuleList,
        norm: nn.Module,
        output: nn.Module,
        max_seq_len: int,
        num_heads: int,
        head_dim: int,
    ) -> None:
        super().__init__()
        self.tok_embeddings = tok_embeddings
        self.layers = layers
        self.norm = norm
        self.output = output
        self.max_seq_len = max_seq_len
        self.num_heads = num_heads
        self.head_dim = head_dim
        self._caches_enabled = False

    # --- generation -------------------------------------------------------------------------------
    def _attention_modules(self) -> list[MultiHeadAttention]:
        return [m for m in self.modules() if isinstance(m, MultiHeadAttention)]

    def setup_caches(self, batch_size: int, dtype: torch.dtype, device: Optional[torch.device] = None) -> None:
        """Allocate a KV cache in every layer; forward then needs ``input_pos`` after the first call."""
        if device is None:
            device = self.tok_embeddings.weight.device
        for attn in self._attention_modules():
            attn.setup_cache(batch_size, dtype, device)
        self._caches_enabled = True

    def reset_caches(self) -> None:
        """Empty the KV caches (start a new generation); they stay allocated."""
        if not self._caches_enabled:
            raise RuntimeError("reset_caches() needs caches: call setup_caches() first")
        for attn in self._attention_modules():
            attn.reset_cache()

    def caches_are_enabled(self) -> bool:
        return self._caches_enabled

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
    def forward(
        self,
        tokens: torch.Tensor,
        *,
        mask: Optional[torch.Tensor] = None,
        input_pos: Optional[torch.Tensor] = None,
        output_hidden_states: bool = False,
        output_positions: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Run the model.

        Args:
            tokens: ``[b, s]`` token ids.
            mask: boolean "may attend" mask ``[b, s, s]`` (``[b, s, max_seq_len]`` with KV caches);
                ``None`` is causal (or, with KV caches, causal over the cache by ``input_pos``).
            input_pos: ``[b, s]`` positions, e.g. restarting at 0 for each packed example; with KV
                caches, where in the cache these tokens go. ``None`` means ``0..s-1``.
            output_hidden_states: return the final-normed hidden states ``[b, s, dim]`` instead of
                logits, so the loss can apply ``self.output`` chunk by chunk.
            output_positions: flat indices into the ``b * s`` positions (row-major, on the model's
                device): only these rows go through the final norm and the output projection, e.g.
                the positions that have a label (``torchtune.training.label_positions``). The others
                cost nothing there, and gradients are the same as if the rows had been taken from the
                full output.

        Returns:
            fp32 logits ``[b, s, vocab_size]``, or hidden states in the model's dtype; with
            ``output_positions``, ``[n, vocab_size]`` or ``[n, dim]`` for its ``n`` positions.
        """
        bsz, seq_len = tokens.shape
        if seq_len > self.max_seq_len:
            raise TuneError(
                f"A batch has sequences of {seq_len} tokens, longer than the model's max_seq_len "
                f"({self.max_seq_len}). Lower the dataset's max_seq_len (tokenizer.max_seq_len / "
                f"dataset.max_seq_len in the config) to at most {self.max_seq_len}, or build the model "
                f"with a larger max_seq_len."
            )
        if self._caches_enabled:
            if input_pos is None:
                input_pos = torch.arange(seq_len, device=tokens.device).expand(bsz, seq_len)
            if mask is None:
                # Causal over the cache: a query at position p sees cache slots 0..p. Built from tensors
                # only, so decoding never syncs with the host.
                slots = torch.arange(self.max_seq_len, device=tokens.device)
                mask = slots.view(1, 1, -1) <= input_pos.reshape(-1, seq_len, 1)
                mask = mask.expand(bsz, seq_len, self.max_seq_len)

        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h, mask=mask, input_pos=input_pos)
        if output_positions is not None:
            # A gather with a known index: the shape comes from the index, so nothing is read back
            # from the device. Backward scatters into zeros, which is what the unselected rows got.
            h = h.reshape(-1, h.size(-1)).index_select(0, output_positions)
        h = self.norm(h)
        if output_hidden_states:
            return h
        return self.output(h).float()

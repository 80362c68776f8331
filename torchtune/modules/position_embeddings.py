"""Rotary position embeddings (RoPE): Llama2's, Llama 3.1's scaled one, linear scaling (Gemma 3), LongRoPE
(Phi-4-mini), and partial rotation of each head (Phi-4-mini), each in either channel layout: Meta's interleaved
pairs ``(2i, 2i+1)`` (Llama, Mistral, Gemma) or Hugging Face's halves ``(i, i + dim/2)`` (Qwen2, Phi-3), as
torchtune's builders of each family use them, so that their state dicts load here unchanged."""

from __future__ import annotations

import math
from typing import Any, Callable, Optional, Sequence

import torch
from torch import nn


class RotaryPositionalEmbeddings(nn.Module):
    """Llama2's rotary embeddings: channel pairs ``(2i, 2i+1)`` of each head rotate by ``pos * base^(-2i/dim)``
    (``interleaved=False``: the pairs ``(i, i + dim/2)``, Hugging Face's ``rotate_half``).

    cos/sin are cached for ``max_seq_len`` positions in a ``persistent=False`` buffer, so they are not
    in the state dict. The cache is always fp32 and always real data: after ``to_empty()``, ``.to()``
    or ``.half()`` it is rebuilt on the new device (cheap: ``max_seq_len * dim`` numbers). A model built
    on the meta device and then given weights with ``load_state_dict(assign=True)`` still holds a meta
    cache; call :meth:`rope_init` (or ``TransformerDecoder.init_buffers``) once it is on its device.

    Args:
        dim: the head dimension (channels rotated per head).
        max_seq_len: number of positions cached.
        base: the frequency base (10000 for Llama2).
        interleaved: which channels pair up. ``True`` (Meta's layout, torchtune's Llama, Mistral and Gemma):
            ``(2i, 2i+1)``, the whole rotation in fp32. ``False`` (torchtune's Qwen2 and Phi-3, and every
            Hugging Face model): ``(i, i + dim/2)``, with cos/sin cast to the input's dtype first, as
            transformers computes it. Weights trained with one layout compute something else with the
            other: Hugging Face checkpoints are converted to the layout of the family's builder.
    """

    def __init__(self, dim: int, max_seq_len: int = 4096, base: float = 10_000, *, interleaved: bool = True) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"RoPE needs an even head dimension, got {dim}")
        self.dim = dim
        self.max_seq_len = max_seq_len
        self.base = base
        self.interleaved = interleaved
        self.register_buffer("cache", torch.empty(max_seq_len, dim // 2, 2, dtype=torch.float32), persistent=False)
        self.rope_init()

    def rope_init(self, device: Optional[torch.device] = None) -> None:
        """(Re)build the cos/sin cache on ``device``; default: where the cache lies now, or, for a cache on
        the meta device, the default device (so a module built under ``torch.device("meta")`` gets real
        tables from ``rope_init()``, as torchtune's do)."""
        device = self._init_device(device)
        if device.type == "meta":
            self.cache = torch.empty(self.max_seq_len, self.dim // 2, 2, dtype=torch.float32, device=device)
            return
        self.cache = self._cos_sin(self.inverse_frequencies(device))

    def _init_device(self, device: Optional[torch.device]) -> torch.device:
        if device is not None:
            return torch.device(device)
        if self.cache.device.type == "meta":
            return torch.get_default_device()
        return self.cache.device

    def _cos_sin(self, theta: torch.Tensor) -> torch.Tensor:
        """The ``[max_seq_len, dim // 2, 2]`` table of cos/sin of ``position * theta``."""
        # Computed in fp32 whatever the default dtype is: bf16 angles are wrong beyond a few hundred positions.
        positions = torch.arange(self.max_seq_len, device=theta.device, dtype=torch.float32)
        angles = torch.outer(positions, theta)
        return torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)

    def inverse_frequencies(self, device: torch.device) -> torch.Tensor:
        """The ``dim // 2`` rotation frequencies ``base^(-2i/dim)`` in fp32 (subclasses rescale them)."""
        exponents = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)[: self.dim // 2] / self.dim
        return 1.0 / (self.base**exponents)

    def reset_parameters(self) -> None:
        """:meth:`rope_init` where the cache lies (meta stays meta), for code that re-initialises modules
        generically."""
        self.rope_init(self.cache.device)

    def _apply(self, fn: Callable, recurse: bool = True):  # type: ignore[override]
        # Every device/dtype move (including to_empty, which leaves garbage) rebuilds the cache so it
        # stays fp32 and correct; this is what makes meta-device construction + to_empty() just work.
        super()._apply(fn, recurse)
        if self.cache.device.type != "meta":
            self.rope_init(self.cache.device)
        return self

    def forward(self, x: torch.Tensor, *, input_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rotate ``x`` of shape ``[b, s, n_heads, head_dim]``.

        Args:
            x: queries or keys.
            input_pos: positions ``[b, s]`` (or ``[s]``); ``None`` means ``0..s-1``.
        """
        seq_len = x.size(1)
        table = self._table(seq_len, input_pos)
        if not self.interleaved:
            return _rotate_halves(x, table)
        rotated = _rotate_on_cpu(x, table)
        if rotated is not None:
            return rotated
        rope = table.view(-1, seq_len, 1, self.dim // 2, 2)
        x_pairs = x.float().reshape(*x.shape[:-1], self.dim // 2, 2)
        x0, x1 = x_pairs[..., 0], x_pairs[..., 1]
        cos, sin = rope[..., 0], rope[..., 1]
        out = torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)
        return out.flatten(-2).type_as(x)

    def _table(self, seq_len: int, input_pos: Optional[torch.Tensor]) -> torch.Tensor:
        """The cos/sin rows of positions ``0..seq_len-1`` or of ``input_pos``."""
        return self.cache[:seq_len] if input_pos is None else self.cache[input_pos]


def _rotate_halves(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``x * cos + rotate_half(x) * sin`` in ``x``'s dtype, the cos/sin rows (``[..., s, dim/2, 2]`` fp32) cast
    to it first: transformers' ``apply_rotary_pos_emb`` (and torchtune's Qwen2 RoPE), op for op."""
    seq_len, half = x.size(1), x.size(-1) // 2
    rope = table.view(-1, seq_len, 1, half, 2).to(x.dtype)
    cos = torch.cat([rope[..., 0], rope[..., 0]], dim=-1)
    sin = torch.cat([rope[..., 1], rope[..., 1]], dim=-1)
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class _RotateOnCPU(torch.autograd.Function):
    """The rotation by one C loop each way (``torchtune.modules._native_kernels.rope``): the same bits as the
    PyTorch ops of ``RotaryPositionalEmbeddings.forward`` and their autograd, forward and backward, in one
    pass where those make ten; nothing saved but the (shared) cos/sin rows."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, table: torch.Tensor, table_stride: int) -> torch.Tensor:
        from torchtune.modules import _native_kernels

        ctx.save_for_backward(table)
        ctx.table_stride = table_stride
        return _native_kernels.rope(x, table, table_stride, inverse=False)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        from torchtune.modules import _native_kernels

        (table,) = ctx.saved_tensors
        # the gradient of a rotation is the rotation by minus the angle
        return _native_kernels.rope(grad.contiguous(), table, ctx.table_stride, inverse=True), None, None


def _rotate_on_cpu(x: torch.Tensor, table: torch.Tensor) -> Optional[torch.Tensor]:
    """``x`` rotated by the C kernel where it applies (a contiguous bf16/fp32 ``[b, s, h, d]`` on a CPU, eager,
    the C kernels built: ``TUNE_NATIVE_KERNELS=0`` turns them off); None for the PyTorch ops."""
    from torchtune.modules import _native_kernels

    if (
        type(x) is not torch.Tensor  # a fake (the memory estimator's), functional or distributed tensor
        or x.device.type != "cpu"
        or x.dtype not in (torch.bfloat16, torch.float32)
        or x.dim() != 4
        or not x.is_contiguous()
        or table.requires_grad
        or torch.compiler.is_compiling()
        or _native_kernels.library() is None
    ):
        return None
    batch, seq = x.shape[:2]
    table = table.reshape(-1, seq, *table.shape[-2:])
    if table.shape[-2:] != (x.size(-1) // 2, 2) or table.size(0) not in (1, batch):
        return None
    table = table.contiguous()
    stride = seq if table.size(0) > 1 else 0  # one row of positions per sequence, or one for all
    return _RotateOnCPU.apply(x, table, stride)


class Llama3ScaledRoPE(RotaryPositionalEmbeddings):
    """Llama 3.1's rotary embeddings: Llama2's, with the low frequencies slowed down for long context.

    Llama 3 was pretrained on ``old_context_len`` (8192) tokens. To reach 128K tokens, Llama 3.1 keeps
    every frequency whose wavelength ``2*pi/freq`` is shorter than ``old_context_len /
    high_freq_factor``, divides those with a wavelength longer than ``old_context_len /
    low_freq_factor`` by ``scale_factor``, and blends the two linearly in between. This is the
    ``rope_type: llama3`` of Hugging Face's ``rope_scaling`` / ``rope_parameters``; Llama 3.1 uses
    ``scale_factor=8``, Llama 3.2 ``scale_factor=32``.

    Args:
        dim: the head dimension.
        max_seq_len: number of positions cached (torchtune's default 4096; the Llama 3.x builders pass
            131072).
        base: the frequency base (torchtune's default 10000; the Llama 3.x builders pass 500000).
        scale_factor: how much slower the low frequencies turn (``factor``).
        low_freq_factor: ``old_context_len / low_freq_factor`` is the wavelength above which
            frequencies are fully scaled (``low_freq_factor``).
        high_freq_factor: ``old_context_len / high_freq_factor`` is the wavelength below which
            frequencies are kept (``high_freq_factor``).
        old_context_len: the pretraining context (``original_max_position_embeddings``).
        interleaved: the channel layout, as for :class:`RotaryPositionalEmbeddings`.
    """

    def __init__(
        self,
        dim: int,
        max_seq_len: int = 4096,
        base: float = 10_000,
        scale_factor: float = 8.0,
        low_freq_factor: float = 1.0,
        high_freq_factor: float = 4.0,
        old_context_len: int = 8192,
        *,
        interleaved: bool = True,
    ) -> None:
        if high_freq_factor <= low_freq_factor:
            # The blend divides by their difference; Llama 3.1 uses 4 and 1.
            raise ValueError(
                f"high_freq_factor ({high_freq_factor}) must be larger than low_freq_factor ({low_freq_factor})"
            )
        if scale_factor <= 0 or old_context_len <= 0:
            raise ValueError(f"scale_factor ({scale_factor}) and old_context_len ({old_context_len}) must be positive")
        # Set before the base class builds the cache, which calls inverse_frequencies.
        self.scale_factor = float(scale_factor)
        self.low_freq_factor = float(low_freq_factor)
        self.high_freq_factor = float(high_freq_factor)
        self.old_context_len = int(old_context_len)
        super().__init__(dim=dim, max_seq_len=max_seq_len, base=base, interleaved=interleaved)

    def inverse_frequencies(self, device: torch.device) -> torch.Tensor:
        freqs = super().inverse_frequencies(device)
        wavelen = 2 * math.pi / freqs
        low_freq_wavelen = self.old_context_len / self.low_freq_factor
        high_freq_wavelen = self.old_context_len / self.high_freq_factor
        # 0 at the low-frequency end of the blend, 1 at the high-frequency end
        smooth = (self.old_context_len / wavelen - self.low_freq_factor) / (
            self.high_freq_factor - self.low_freq_factor
        )
        blended = (1 - smooth) * freqs / self.scale_factor + smooth * freqs
        scaled = torch.where(wavelen > low_freq_wavelen, freqs / self.scale_factor, blended)
        return torch.where(wavelen < high_freq_wavelen, freqs, scaled)


class LinearScaledRoPE(RotaryPositionalEmbeddings):
    """Rotary embeddings with every frequency divided by ``scale_factor`` (position interpolation).

    This is the ``rope_type: linear`` of Hugging Face's ``rope_scaling`` / ``rope_parameters``
    (``inv_freq / factor``): Gemma 3 4B/12B/27B use it with factor 8 on their global layers to reach
    128K tokens.

    Args:
        dim: the head dimension.
        max_seq_len: number of positions cached.
        base: the frequency base.
        scale_factor: how much slower every frequency turns (``factor``).
        interleaved: the channel layout, as for :class:`RotaryPositionalEmbeddings`.
    """

    def __init__(
        self,
        dim: int,
        max_seq_len: int = 4096,
        base: float = 10_000,
        scale_factor: float = 1.0,
        *,
        interleaved: bool = True,
    ) -> None:
        if scale_factor <= 0:
            raise ValueError(f"scale_factor must be positive, got {scale_factor}")
        self.scale_factor = float(scale_factor)  # set before the base class builds the cache
        super().__init__(dim=dim, max_seq_len=max_seq_len, base=base, interleaved=interleaved)

    def inverse_frequencies(self, device: torch.device) -> torch.Tensor:
        return super().inverse_frequencies(device) / self.scale_factor


def longrope_attention_factor(scale_factor: float, original_max_seq_len: int) -> float:
    """LongRoPE's default cos/sin scale, as transformers computes it when ``rope_scaling`` gives no
    ``attention_factor``: ``sqrt(1 + ln(factor) / ln(original_max_position_embeddings))``, 1 without scaling."""
    if scale_factor <= 1.0:
        return 1.0
    return math.sqrt(1 + math.log(scale_factor) / math.log(original_max_seq_len))


class LongRoPE(RotaryPositionalEmbeddings):
    """LongRoPE (``rope_type: longrope``, Phi-3.5 / Phi-4-mini): frequency ``i`` is divided by its own
    rescale factor, ``short_factor[i]`` while the sequence fits the pretraining context
    (``original_max_seq_len``) and ``long_factor[i]`` beyond it, and cos/sin are multiplied by
    ``attention_factor``. As transformers does it, the choice is made per forward call from the largest
    position in it (``max(input_pos) + 1``, or the sequence length), for every position of that call.

    Both tables are cached (``max_seq_len * dim`` fp32 numbers each). With ``input_pos`` the choice is
    made on the device (``torch.where``), so the step does not wait for the host.

    Args:
        dim: channels rotated per head (``head_dim * partial_rotary_factor``).
        max_seq_len: number of positions cached.
        base: the frequency base (``rope_theta``).
        short_factor: ``dim // 2`` rescale factors up to ``original_max_seq_len`` tokens.
        long_factor: ``dim // 2`` rescale factors beyond it.
        original_max_seq_len: the pretraining context (``original_max_position_embeddings``).
        scale_factor: the context extension (``factor``, else ``max_position_embeddings /
            original_max_position_embeddings``); it sets the default ``attention_factor``.
        attention_factor: cos/sin scale; ``None`` for :func:`longrope_attention_factor`.
        interleaved: the channel layout, as for :class:`RotaryPositionalEmbeddings`.
    """

    def __init__(
        self,
        dim: int,
        max_seq_len: int,
        base: float,
        short_factor: Sequence[float],
        long_factor: Sequence[float],
        original_max_seq_len: int,
        scale_factor: float,
        attention_factor: Optional[float] = None,
        *,
        interleaved: bool = True,
    ) -> None:
        for name, factors in (("short_factor", short_factor), ("long_factor", long_factor)):
            if len(factors) != dim // 2:
                raise ValueError(f"{name} needs {dim // 2} values (one per rotated channel pair), got {len(factors)}")
        # Set before the base class builds the tables, which reads them.
        self.short_factor = tuple(float(f) for f in short_factor)
        self.long_factor = tuple(float(f) for f in long_factor)
        self.original_max_seq_len = int(original_max_seq_len)
        self.scale_factor = float(scale_factor)
        self.attention_factor = float(
            attention_factor
            if attention_factor is not None
            else longrope_attention_factor(self.scale_factor, self.original_max_seq_len)
        )
        super().__init__(dim=dim, max_seq_len=max_seq_len, base=base, interleaved=interleaved)

    def rope_init(self, device: Optional[torch.device] = None) -> None:
        device = self._init_device(device)
        if device.type == "meta":
            short = torch.empty(self.max_seq_len, self.dim // 2, 2, dtype=torch.float32, device=device)
            long = torch.empty_like(short)
        else:
            freqs = self.inverse_frequencies(device)
            short = self._cos_sin(freqs / torch.tensor(self.short_factor, device=device)) * self.attention_factor
            long = self._cos_sin(freqs / torch.tensor(self.long_factor, device=device)) * self.attention_factor
        self.cache = short
        if "long_cache" in self._buffers:
            self.long_cache = long
        else:
            self.register_buffer("long_cache", long, persistent=False)

    def _table(self, seq_len: int, input_pos: Optional[torch.Tensor]) -> torch.Tensor:
        if input_pos is None:
            return (self.long_cache if seq_len > self.original_max_seq_len else self.cache)[:seq_len]
        long = input_pos.max() + 1 > self.original_max_seq_len
        return torch.where(long, self.long_cache[input_pos], self.cache[input_pos])


class PartialRotaryEmbeddings(nn.Module):
    """Rotates the first ``rope.dim`` channels of each head with ``rope`` and passes the others through
    unchanged (``partial_rotary_factor`` of Phi-4-mini: 96 of 128 channels), as transformers'
    ``apply_rotary_pos_emb`` does with a ``cos`` narrower than the head.

    Args:
        rope: the rotary embeddings of the rotated channels (its ``dim`` is their number).
        head_dim: channels per head.
    """

    def __init__(self, rope: RotaryPositionalEmbeddings, head_dim: int) -> None:
        super().__init__()
        if not 0 < rope.dim < head_dim:
            raise ValueError(f"the rotated channels ({rope.dim}) must be fewer than the head's ({head_dim})")
        self.rope = rope
        self.head_dim = head_dim

    @property
    def dim(self) -> int:
        return self.rope.dim

    @property
    def base(self) -> float:
        return self.rope.base

    def forward(self, x: torch.Tensor, *, input_pos: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Rotate the first ``dim`` channels of ``x`` (``[b, s, n_heads, head_dim]``)."""
        rotated = self.rope(x[..., : self.dim], input_pos=input_pos)
        return torch.cat([rotated, x[..., self.dim :]], dim=-1)


class VisionRotaryPositionalEmbeddings(nn.Module):
    """Two-dimensional RoPE of image patches (torchtune's, for its vision encoders; no model here uses it):
    the first half of each head's channel pairs rotate by the patch's column (``1 + x``), the second half
    by its row (``1 + y``), with frequencies ``base^(-2i/dim)``; every tile of a sequence of
    ``max_num_tiles`` tiles gets the same rotations, and the CLS token (after each tile's patches, or
    before with ``append_cls_token=False``) is not rotated.

    Args:
        patch_size: pixels per patch side.
        tile_size: pixels per tile side (``(tile_size // patch_size) ** 2`` patches per tile).
        max_num_tiles: tiles per sequence.
        dim: channel pairs per axis, ``head_dim // 2``.
        base: the frequency base.
        append_cls_token: the CLS token ends each tile (``False``: starts it).
    """

    def __init__(
        self,
        patch_size: int,
        tile_size: int,
        max_num_tiles: int,
        dim: int,
        base: float = 10_000,
        append_cls_token: bool = True,
    ) -> None:
        super().__init__()
        self.patch_grid_size = tile_size // patch_size
        self.max_num_tiles = max_num_tiles
        self.dim = dim
        self.base = base
        self.append_cls_token = append_cls_token
        self.register_buffer("cache", torch.empty(0), persistent=False)
        self.rope_init()

    def rope_init(self, device: Optional[torch.device] = None) -> None:
        """(Re)build the ``[patches + 1, dim, 2]`` cos/sin table (device: as ``RotaryPositionalEmbeddings``)."""
        if device is None:
            device = torch.get_default_device() if self.cache.device.type == "meta" else self.cache.device
        exponents = torch.arange(0, self.dim, 2, device=device, dtype=torch.float32)[: self.dim // 2] / self.dim
        theta = 1.0 / (self.base**exponents)
        patch = torch.arange(self.patch_grid_size**2, device=device, dtype=torch.float32)
        cls = torch.full((1,), -1.0, device=device)
        patch = torch.cat([patch, cls] if self.append_cls_token else [cls, patch])
        x_angles = torch.outer(patch % self.patch_grid_size + 1, theta)
        y_angles = torch.outer(torch.div(patch, self.patch_grid_size, rounding_mode="floor") + 1, theta)
        angles = torch.cat([x_angles, y_angles], dim=-1).masked_fill(patch.unsqueeze(-1) < 0, 0.0)
        self.cache = torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1)

    def forward(self, x: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        """Rotate ``x`` (``[b, max_num_tiles * (patches + 1), n_heads, head_dim]``).

        Raises:
            ValueError: the tiles of ``x`` are not ``patches + 1`` tokens long.
        """
        bsz, _, n_heads, head_dim = x.shape
        pairs = x.float().reshape(bsz, self.max_num_tiles, -1, n_heads, head_dim // 2, 2)
        seq_len = pairs.size(2)
        if seq_len != self.cache.shape[0]:
            raise ValueError(
                f"Input sequence length {seq_len} does not match 2D RoPE cache sequence length {self.cache.shape[0]}."
            )
        rope = self.cache.view(1, 1, seq_len, 1, head_dim // 2, 2)
        x0, x1 = pairs[..., 0], pairs[..., 1]
        cos, sin = rope[..., 0], rope[..., 1]
        out = torch.stack([x0 * cos - x1 * sin, x1 * cos + x0 * sin], dim=-1)
        return out.reshape(bsz, self.max_num_tiles * seq_len, n_heads, head_dim).type_as(x)

"""Collate functions: a list of samples from a dataset -> one batch of tensors.

``padded_collate_sft`` (right padding of ``tokens`` and ``labels``) and ``padded_collate_packed`` (packs
from ``PackedDataset`` with their block-causal attention mask) are what fine-tuning uses; the others are
torchtune's generic padding, left padding for generation, preference (DPO) pairs, and image batches.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import torch
import torch.nn.functional as F
from torch.nn.utils.rnn import pad_sequence

from torchtune._errors import TuneValueError
from torchtune.data._common import CROSS_ENTROPY_IGNORE_IDX, PACK_TYPE


def _long(x: Any) -> torch.Tensor:
    return torch.as_tensor(x, dtype=torch.long)


def left_pad_sequence(
    sequences: Sequence[torch.Tensor], batch_first: bool = False, padding_value: float = 0
) -> torch.Tensor:
    """``torch.nn.utils.rnn.pad_sequence`` with the padding on the left: each sequence ends at the last
    position (``[T, B, *]``, or ``[B, T, *]`` with ``batch_first``), as generation from a batch needs."""
    reversed_padded = pad_sequence(
        [torch.flip(s, dims=[0]) for s in sequences], batch_first=True, padding_value=padding_value
    )
    padded = torch.flip(reversed_padded, dims=[1])
    return padded if batch_first else padded.transpose(0, 1)


def padded_collate(
    batch: List[Dict[str, Any]],
    *,
    pad_direction: str,
    keys_to_pad: List[str],
    padding_idx: Union[int, Dict[str, int]],
) -> Dict[str, torch.Tensor]:
    """Pad the sequences under ``keys_to_pad`` to the longest in the batch, from the left or the right;
    every other key is stacked as it is (one value per sample, e.g. a classifier's label).

    Args:
        batch: the samples.
        pad_direction: ``"left"`` or ``"right"``.
        keys_to_pad: the keys holding sequences (at least one).
        padding_idx: one padding value for all of them, or ``{key: value}`` for exactly ``keys_to_pad``.

    Raises:
        TuneValueError: an unknown direction, no keys to pad, keys missing from the samples, or a
            ``padding_idx`` mapping whose keys differ from ``keys_to_pad``.
    """
    if pad_direction not in ("left", "right"):
        raise TuneValueError(f"pad_direction should be one of 'left' or 'right' but found {pad_direction!r}")
    if not isinstance(keys_to_pad, list) or not keys_to_pad:
        raise TuneValueError(
            f"keys_to_pad should be a list of strings with at least one element, but found {keys_to_pad}"
        )
    if isinstance(padding_idx, Mapping) and set(padding_idx) != set(keys_to_pad):
        raise TuneValueError(
            f"padding_idx was provided as a dictionary, but its keys ({sorted(padding_idx)}) are not the same as "
            f"keys_to_pad ({sorted(keys_to_pad)})"
        )
    missing = [k for k in keys_to_pad if k not in batch[0]]
    if missing:
        raise TuneValueError(
            f"keys_to_pad should be a subset of the keys in the batch, but {missing} are not among {sorted(batch[0])}"
        )
    pad = pad_sequence if pad_direction == "right" else left_pad_sequence
    out = {key: torch.tensor([sample[key] for sample in batch]) for key in batch[0] if key not in keys_to_pad}
    for key in keys_to_pad:
        value = padding_idx[key] if isinstance(padding_idx, Mapping) else padding_idx
        out[key] = pad([torch.as_tensor(sample[key]) for sample in batch], batch_first=True, padding_value=value)
    return out


def padded_collate_sft(
    batch: Sequence[Mapping[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
) -> Dict[str, torch.Tensor]:
    """Right-pad ``tokens`` with ``padding_idx`` and ``labels`` with ``ignore_idx`` to the longest of either
    in the batch: ``{"tokens": Long[b, s], "labels": Long[b, s]}``. The padded labels are ignored by the
    loss, so padding never trains the model."""
    tokens = [_long(sample["tokens"]) for sample in batch]
    labels = [_long(sample["labels"]) for sample in batch]
    length = max(len(x) for x in tokens + labels)
    return {
        "tokens": torch.stack([F.pad(x, (0, length - len(x)), value=padding_idx) for x in tokens]),
        "labels": torch.stack([F.pad(x, (0, length - len(x)), value=ignore_idx) for x in labels]),
    }


def _collate_packs(batch: Sequence[PACK_TYPE], mask: Callable[[List[torch.Tensor]], Any]) -> Dict[str, Any]:
    """Stack packs (already of one length) and build their attention mask from the ``seq_lens`` of each."""
    out: Dict[str, Any] = {
        key: torch.stack([_long(p[key]) for p in batch]) for key in ("tokens", "labels", "input_pos")
    }
    out["mask"] = mask([_long(p["seq_lens"]) for p in batch])
    return out


def padded_collate_packed(batch: List[PACK_TYPE]) -> Dict[str, Any]:
    """Packs from ``PackedDataset`` as a batch: ``tokens``, ``labels``, ``input_pos`` stacked (``Long[b, s]``)
    and ``mask``, the block-causal mask that keeps attention inside each sample of a pack
    (``torchtune.modules.attention_utils.packed_block_causal_mask``: a flex-attention ``BlockMask`` on a
    GPU that runs flex attention, else ``Bool[b, s, s]``, True where a position may attend)."""
    # Imported here: attention_utils imports flex attention, which imports the compiler and FSDP.
    from torchtune.modules import attention_utils

    return _collate_packs(batch, attention_utils.packed_block_causal_mask)


def padded_collate_dpo(
    batch: List[Dict[str, List[int]]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Preference pairs as one batch: the chosen sequences of every sample, then the rejected ones, right
    padded together; returns ``(input_ids, labels)``, each ``[2 * b, s]``."""
    ids = [_long(s["chosen_input_ids"]) for s in batch] + [_long(s["rejected_input_ids"]) for s in batch]
    labels = [_long(s["chosen_labels"]) for s in batch] + [_long(s["rejected_labels"]) for s in batch]
    return (
        pad_sequence(ids, batch_first=True, padding_value=padding_idx),
        pad_sequence(labels, batch_first=True, padding_value=ignore_idx),
    )


def padded_collate_tiled_images_and_mask(
    batch: List[Dict[str, Any]],
    padding_idx: int = 0,
    ignore_idx: int = CROSS_ENTROPY_IGNORE_IDX,
    pad_direction: str = "right",
    pad_max_tiles: Optional[int] = None,
    pad_max_images: Optional[int] = None,
) -> Dict[str, Any]:
    """A batch of text with tiled images (torchtune's vision models): text padded as
    ``padded_collate_sft`` (right) or left-padded without labels (``pad_direction="left"``, generation);
    each image's tiles padded with zeros to the most tiles of the batch (or ``pad_max_tiles``); samples
    given empty images up to the most images (or ``pad_max_images``), with aspect ratio (1, 1); each
    image's cross-attention mask ``[text_len, tiles * tokens_per_tile]`` padded to match, and the masks
    of a sample laid out as torchtune does (see the comment in the code).

    Raises:
        TuneValueError: an unknown ``pad_direction``, or an image with more tiles than ``pad_max_tiles``.
    """
    if pad_direction not in ("left", "right"):
        raise TuneValueError(f"pad_direction should be one of 'left' or 'right' but found {pad_direction!r}")
    if pad_direction == "right":
        text = padded_collate_sft(batch, padding_idx, ignore_idx)
    else:
        text = {
            "tokens": left_pad_sequence(
                [_long(s["tokens"]) for s in batch], batch_first=True, padding_value=padding_idx
            )
        }
    text_len = text["tokens"].shape[-1]
    most_tiles = max(image.shape[0] for s in batch for image in s["encoder_input"]["images"])
    if pad_max_tiles is not None:
        if pad_max_tiles < most_tiles:
            raise TuneValueError(f"More tiles in image {most_tiles}, than pad_max_tiles {pad_max_tiles}")
        most_tiles = pad_max_tiles
    images, masks, ratios = [], [], []
    tokens_per_tile = 0
    for sample in batch:
        sample_images, sample_masks = [], []
        for image, mask in zip(sample["encoder_input"]["images"], sample["encoder_mask"]):
            tiles = image.shape[0]
            tokens_per_tile = mask.shape[1] // tiles
            extra_text = text_len - mask.shape[0]
            top, bottom = (extra_text, 0) if pad_direction == "left" else (0, extra_text)
            sample_images.append(F.pad(image, (0, 0, 0, 0, 0, 0, 0, most_tiles - tiles)))
            sample_masks.append(F.pad(mask, (0, (most_tiles - tiles) * tokens_per_tile, top, bottom)))
        images.append(torch.stack(sample_images))
        masks.append(torch.stack(sample_masks))
        ratios.append(torch.stack(sample["encoder_input"]["aspect_ratio"]))
    batch_images = pad_sequence(images, batch_first=True, padding_value=0)
    batch_masks = pad_sequence(masks, batch_first=True, padding_value=0)  # [b, images, text_len, image_len]
    batch_ratios = pad_sequence(ratios, batch_first=True, padding_value=1)
    # torchtune's layout: the [images, text_len, image_len] block of each sample read as [text_len, -1]
    # (a reshape, not a join along the image axis); kept so its vision models get the masks they expect.
    joined = batch_masks.reshape(len(batch), text_len, -1)
    if pad_max_images is not None:
        joined = F.pad(joined, (0, pad_max_images * most_tiles * tokens_per_tile - joined.shape[-1]))
    out: Dict[str, Any] = {
        "tokens": text["tokens"],
        "encoder_input": {"images": batch_images, "aspect_ratio": batch_ratios},
        "encoder_mask": joined,
    }
    if "labels" in text:
        out["labels"] = text["labels"]
    return out

"""Small helpers of the message layer: cutting a sequence to a length, and images in message content."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, List, Optional, Union
from urllib import request

from torchtune._errors import TuneValueError


def truncate(
    tokens: List[Any], max_seq_len: int, eos_id: Optional[Any] = None, truncation_type: str = "right"
) -> List[Any]:
    """``tokens`` cut to ``max_seq_len`` items; with ``eos_id``, the last item kept is set to it (unless it
    already is), so a cut sequence still ends like a whole one. Works for masks as well as ids:
    ``truncate(mask, n, True)`` keeps the replaced end masked.

    Args:
        tokens: token ids (or mask flags).
        max_seq_len: the most items to keep.
        eos_id: the value the last kept item becomes; ``None`` keeps it as it is.
        truncation_type: ``"right"`` keeps the first ``max_seq_len`` items, ``"left"`` the last ones.

    Returns:
        A new list of at most ``max_seq_len`` items.

    Raises:
        TuneValueError: ``truncation_type`` is neither ``"left"`` nor ``"right"``.
    """
    if truncation_type == "right":
        kept = list(tokens[:max_seq_len])
    elif truncation_type == "left":
        kept = list(tokens[len(tokens) - max_seq_len :]) if len(tokens) > max_seq_len else list(tokens)
    else:
        raise TuneValueError(
            f"truncation_type must be 'left' or 'right', got {truncation_type!r} (config key "
            "tokenizer.truncation_type)."
        )
    if eos_id is not None and kept and kept[-1] != eos_id:
        kept[-1] = eos_id
    return kept


def load_image(image_loc: Union[Path, str]) -> "PIL.Image.Image":  # noqa: F821
    """Open the image at a local path, or at an ``http(s)`` address, as a ``PIL.Image.Image``.

    Raises:
        TuneValueError: the address cannot be fetched, or the file is not an image Pillow can open.
    """
    from PIL import Image  # Pillow is needed only by multimodal data

    source: Any = image_loc
    if isinstance(image_loc, str) and image_loc.startswith("http"):
        try:
            source = request.urlopen(image_loc)
        except Exception as err:
            raise TuneValueError(f"Failed to load image from {image_loc}: {err}") from err
    try:
        return Image.open(source)
    except Exception as err:
        raise TuneValueError(
            f"Failed to open image as PIL.Image from {image_loc}: {err}. Check that the path exists, is "
            "readable and holds an image."
        ) from err


def format_content_with_images(content: str, *, image_tag: str, images: List[Any]) -> List[Dict[str, Any]]:
    """Split ``content`` at each ``image_tag`` into a message content list, each tag replaced by the
    next of ``images``: ``"a<image>b"`` -> ``[{text a}, {image}, {text b}]`` (empty texts left out).

    Raises:
        TuneValueError: the number of images differs from the number of tags.
    """
    pieces = content.split(image_tag)
    if len(images) != len(pieces) - 1:
        raise TuneValueError(
            f"Number of images ({len(images)}) does not match number of image tags ({len(pieces) - 1}) in "
            f"content: {content}"
        )
    remaining = list(images)
    result: List[Dict[str, Any]] = []
    for i, piece in enumerate(pieces):
        if piece:
            result.append({"type": "text", "content": piece})
        if i < len(pieces) - 1:
            result.append({"type": "image", "content": remaining.pop(0)})
    return result

"""Checkpoint files written tensor by tensor, hashed while they are written.

A save must not need a second copy of the weights anywhere, and its manifest must not need a second
read of the bytes: ``HashingFile`` feeds every chunk to the manifest's checksum (XXH3-128, see
``_manifest.py``) as it goes to the disk, ``write_safetensors`` writes the header from the tensors'
shapes and dtypes and then each tensor's bytes as the caller produces it, and ``save_torch`` streams
``torch.save`` through the same file object (``torch.save`` moves one storage at a time to the host).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterable, Iterator, Optional, Sequence

import torch

from torchtune.utils._checkpointing._manifest import new_hash

# safetensors' dtype names (https://github.com/huggingface/safetensors, format description).
_SAFETENSORS_DTYPES = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
}


class HashingFile:
    """A binary file opened for writing that computes the manifest checksum of what is written, in
    the same pass (the hash reads each chunk right after or before the write does, while it is in
    the CPU's cache).

    Use as a context manager; ``digest`` (hex) and ``size`` are final once it is closed.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.size = 0
        self.digest = ""
        self._hash = new_hash()
        self._file = open(self.path, "wb")

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._hash.update(view)
        self._file.write(view)
        self.size += len(view)
        return len(view)

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()
            self.digest = self._hash.hexdigest()

    def __enter__(self) -> "HashingFile":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def tensor_bytes(t: torch.Tensor) -> memoryview:
    """The bytes of a host tensor in memory order, without a copy when it is contiguous."""
    t = t.detach().contiguous()
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())


def safetensors_dtype(dtype: torch.dtype) -> str:
    try:
        return _SAFETENSORS_DTYPES[dtype]
    except KeyError:
        raise ValueError(f"safetensors cannot store tensors of dtype {dtype}") from None


def safetensors_order(specs: Iterable[tuple[str, torch.dtype, Sequence[int]]]) -> list[tuple[str, torch.dtype, tuple]]:
    """The order the tensors go into the file: widest dtype first, then by name, as safetensors' own
    writer does, so that every tensor starts at an offset aligned to its element size."""
    items = [(name, dtype, tuple(shape)) for name, dtype, shape in specs]
    return sorted(items, key=lambda s: (-torch.empty((), dtype=s[1]).element_size(), s[0]))


def write_safetensors(
    path: Path,
    specs: Sequence[tuple[str, torch.dtype, Sequence[int]]],
    tensors: Iterable[torch.Tensor],
    metadata: Optional[dict[str, str]] = None,
) -> HashingFile:
    """Write a safetensors file whose tensors arrive one at a time.

    Args:
        path: the file to write.
        specs: ``(name, dtype, shape)`` of every tensor, in the order ``tensors`` yields them (use
            :func:`safetensors_order`); the header is written from these before any data.
        tensors: host tensors, one per spec; each is released by the caller's iterator before the
            next is produced, so at most one converted tensor exists at a time.
        metadata: the header's ``__metadata__`` (string values).

    Returns:
        The closed ``HashingFile`` (``size`` and ``digest`` of what was written).

    Raises:
        ValueError: a tensor differs from its spec (shape or dtype), or there are more or fewer
            tensors than specs.
    """
    header: dict[str, Any] = {"__metadata__": dict(metadata or {"format": "pt"})}
    offset = 0
    for name, dtype, shape in specs:
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        header[name] = {
            "dtype": safetensors_dtype(dtype),
            "shape": list(shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
    encoded += b" " * (-len(encoded) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with HashingFile(path) as out:
        out.write(struct.pack("<Q", len(encoded)))
        out.write(encoded)
        produced: Iterator[torch.Tensor] = iter(tensors)
        for name, dtype, shape in specs:
            t = next(produced, None)
            if t is None:
                raise ValueError(f"{path}: no tensor was produced for {name}")
            if t.dtype != dtype or tuple(t.shape) != tuple(shape):
                raise ValueError(
                    f"{path}: {name} was announced as {dtype} {tuple(shape)} but is {t.dtype} {tuple(t.shape)}"
                )
            out.write(tensor_bytes(t))
            del t
        if next(produced, None) is not None:
            raise ValueError(f"{path}: more tensors were produced than the header lists")
    return out


def save_torch(obj: Any, path: Path) -> HashingFile:
    """``torch.save(obj)`` into ``path``, hashed as it is written; returns the closed ``HashingFile``.

    ``torch.save`` copies one storage at a time to the host while writing, so device tensors in
    ``obj`` need no device memory and one storage's worth of host memory.
    """
    with HashingFile(path) as out:
        torch.save(obj, out)
    return out

"""Read back what a Weights & Biases run wrote in offline mode (``run-*.wandb``), without the network.

The file is a LevelDB-style log: a 7-byte header (``:W&B``, magic, version), then 32 KiB blocks of
records, each a 7-byte header (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) and a piece of a
protobuf ``Record`` (``wandb.proto.wandb_internal_pb2``). A block's last < 7 bytes are padding.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Dict, List, Tuple

_BLOCK = 32768
_HEADER = 7


def _records(path: Path) -> List[bytes]:
    raw = path.read_bytes()
    assert raw[:4] == b":W&B", f"{path} is not a W&B run file"
    records, partial, pos = [], b"", _HEADER
    while pos + _HEADER <= len(raw):
        left = _BLOCK - pos % _BLOCK
        if left < _HEADER:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + _HEADER])
        if kind == 0 and length == 0:  # zero padding to the end of the block
            pos += left
            continue
        data, pos = raw[pos + _HEADER : pos + _HEADER + length], pos + _HEADER + length
        if kind == 1:
            records.append(data)
        elif kind == 2:
            partial = data
        elif kind == 3:
            partial += data
        elif kind == 4:
            records.append(partial + data)
    return records


def read_offline_run(run_dir: Path) -> Tuple[List[Dict[str, object]], Dict[str, object]]:
    """(history rows, config) of the offline run in ``run_dir`` (``.../wandb/offline-run-*``)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = Path(run_dir).glob("run-*.wandb")
    history, config = [], {}
    for data in _records(path):
        record = pb.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "history":
            history.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in record.history.item})
        elif kind == "config":
            config.update({i.key: json.loads(i.value_json) for i in record.config.update})
    return history, config
